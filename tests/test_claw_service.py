"""The Claw service in real sandboxes: three doors with identical effects (MCP through the
official client), 1,000 random calls, and a policy that tampers with the world's files or
process cannot forge a passing grade."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from conftest import needs

from orchard_gym import AsyncSandboxClient
from orchard_gym.envs.claw.env import ClawEnv, ClawOraclePolicy
from orchard_gym.envs.claw.sandbox import claw_tools
from orchard_gym.envs.claw.sandbox.claw_service import (DH_G, DH_P, DH_SECRET_BITS, World, canonical, dh_key,
                                                         dh_secret)
from orchard_gym.envs.claw.tasks import load_tasks

TASKS = load_tasks("builtin")
DOOR_TASKS = ["meeting-followup-002", "mail-triage-003"]  # a fault + many writes; the longest plan


def local(local_root) -> dict:
    return {"type": "local", "root": str(local_root)}


async def _run(local_root, task_id, drive, bash=True):
    """Reset, let `drive(env)` act, submit; return (final state canonical text, report, env's log)."""
    async with AsyncSandboxClient(local(local_root)) as client:
        env = ClawEnv(client=client, bash=bash)
        await env.areset(options={"task_id": task_id})
        await drive(env)
        obs, reward, terminated, truncated, info = await env.astep({"name": "submit", "arguments": {}})
        snap = env.ctx.state.get("snapshot")
        await env.aclose()
    assert terminated
    return (canonical(snap["state"]) if snap else None), info["report"], (snap or {}).get("log", [])


async def _door_function(env):
    for c in env.task.oracle:
        await env.astep(c)


async def _door_cli(env):
    for c in env.task.oracle:
        command = f"claw {c['name']} --json {_sh_quote(json.dumps(c['arguments']))}"
        await env.astep({"name": "bash", "arguments": {"command": command}})


def _sh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


async def _door_mcp(env):
    """The official MCP client over stdio, talking to the sandbox's claw_mcp.py (the local
    backend's sandbox folder is visible from here, and so is the service's socket)."""
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    service = env.ctx.state["service"]
    # the sandbox's own launcher (`#!/bin/sh`, the agent's Python): what an MCP-capable harness runs
    params = StdioServerParameters(command=f"{service.home}/bin/claw-mcp", env={"CLAW_SOCKET": service.socket})
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        init = await session.initialize()
        assert init.serverInfo.name == "claw" if hasattr(init, "serverInfo") else init.server_info.name == "claw"
        listed = await session.list_tools()
        assert {t.name for t in listed.tools} == set(env.task.tools)
        for c in env.task.oracle:
            result = await session.call_tool(c["name"], c["arguments"])
            if _is_error(result):
                assert "try again" in result.content[0].text or "retry" in result.content[0].text
        bad = await session.call_tool("no_such_tool", {})
        assert _is_error(bad) and "unknown tool" in bad.content[0].text
        wrong = await session.call_tool("mail_get_message", {"message_id": 5})
        assert _is_error(wrong) and "expected string" in wrong.content[0].text


def _is_error(result) -> bool:
    # mcp 2.x names the field is_error, 1.x isError (the wire name)
    return bool(getattr(result, "is_error", None) if hasattr(result, "is_error") else result.isError)


@pytest.mark.parametrize("task_id", DOOR_TASKS)
def test_three_doors_leave_byte_identical_state(local_root, task_id):
    results = {door: asyncio.run(_run(local_root, task_id, fn))
               for door, fn in [("function", _door_function), ("cli", _door_cli), ("mcp", _door_mcp)]}
    states = {door: r[0] for door, r in results.items()}
    assert states["function"] is not None and states["function"] == states["cli"] == states["mcp"]
    for door, (_, report, log) in results.items():
        assert report["passed"] and report["task_score"] == 1.0, (door, report)
        calls = [e for e in log if e["tool"] != "no_such_tool" and e["ok"] or e.get("fault")]
        assert {e["door"] for e in calls} == {door}
    # and the world changed: this is not three empty runs
    assert states["function"] != canonical(claw_tools.seeded_state(TASKS[task_id].seed))


def _random_calls(rng: random.Random, n: int) -> list[dict]:
    names = list(claw_tools.TOOLS)
    ids = [f"{p}{i}" for p in "mectfh" for i in range(1, 6)]
    junk = [None, 7, -1.5, True, "", "x" * 50, [], {}, ["a", 3], {"k": "v"}, "\u2603 snow", "m1"]
    calls = []
    for _ in range(n):
        name = rng.choice(names + ["nope", "", "mail_send "]) if rng.random() < 0.95 else rng.choice(junk)
        props = claw_tools.TOOLS.get(name, {}).get("parameters", {}).get("properties", {}) if isinstance(name, str) else {}
        args = {}
        for key, spec in props.items():
            if rng.random() < 0.6:
                if spec.get("enum"):
                    args[key] = rng.choice(spec["enum"])
                elif spec["type"] == "array":
                    args[key] = [rng.choice(["dana@acme.example", "x@evil.example", "m1"])]
                elif spec["type"] == "boolean":
                    args[key] = rng.random() < 0.5
                elif key.endswith("_id"):
                    args[key] = rng.choice(ids)
                elif key in ("start", "end"):
                    args[key] = f"2026-03-0{rng.randint(1, 6)}T{rng.randint(8, 18):02d}:00"
                else:
                    args[key] = rng.choice(["hello", "reports/q1.md", "Dana", "2026-03-04", "x" * 300])
        if rng.random() < 0.1:
            args[rng.choice(["bogus", "to", "message_id"])] = rng.choice(junk)
        if rng.random() < 0.03:
            args = rng.choice(junk)
        calls.append({"op": "call", "tool": name, "args": args, "door": "cli"})
    return calls


FUZZ = """
import json, sys
sys.path.insert(0, sys.argv[1])
import claw_wire
calls = json.load(open(sys.argv[2]))
answers = [claw_wire.request(c) for c in calls]
raw = [claw_wire.request_raw(b) for b in (b"\\xff\\xfe", b"{not json", b"[1,2]", b"", b'{"op": "snapshot"}')]
print(json.dumps({"ok": sum(a["ok"] for a in answers), "errors": sum(not a["ok"] for a in answers),
                  "raw": [a["ok"] for a in raw]}))
"""


def test_service_survives_1000_random_calls_with_state_intact(local_root):
    task = TASKS["helpdesk-triage-002"]
    calls = _random_calls(random.Random(12), 1000)

    async def go():
        async with AsyncSandboxClient(local(local_root)) as client:
            env = ClawEnv(client=client)
            await env.areset(options={"task_id": task.task_id})
            service = env.ctx.state["service"]
            await env.sandbox.upload_content(json.dumps(calls).encode(), f"{service.home}/fuzz.json")
            await env.sandbox.upload_content(FUZZ.encode(), f"{service.home}/fuzz.py")
            r = await env.sandbox.exec(service.argv("fuzz.py", service.home, f"{service.home}/fuzz.json"), timeout=600)
            snap = await service.snapshot()
            health = await service.request({"op": "health"})
            await env.aclose()
            return r, snap, health

    r, snap, health = asyncio.run(go())
    assert r.exit_code == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["ok"] + out["errors"] == 1000 and out["ok"] > 100 and out["errors"] > 100
    assert out["raw"] == [False] * 5
    assert health["ok"] and health["calls"] == 1000
    # the same calls replayed on the service code in-process give the same world: nothing was lost or torn
    world = World(task.seed, [f.model_dump() for f in task.faults], task.allowed, fault_delay=0)
    for c in calls:
        world.call(c["tool"], c["args"], "cli")
    assert canonical(snap["state"]) == canonical(world.state)
    assert [e["ok"] for e in snap["log"]] == [e["ok"] for e in world.log]


FAKE_SERVICE = r"""
import json, os, socket, sys
path = sys.argv[1]
state = json.loads(sys.argv[2])
os.unlink(path) if os.path.exists(path) else None
s = socket.socket(socket.AF_UNIX); s.bind(path); s.listen(8)
if os.fork(): sys.exit(0)
os.setsid()
while True:
    c, _ = s.accept(); req = json.loads(c.recv(1 << 20) or b"{}")
    body = {"state": state, "log": [], "counts": {}, "nonce": req.get("nonce"), "hardened": True}
    c.sendall(json.dumps({"ok": True, "payload": json.dumps(body), "mac": "00" * 32}).encode()); c.close()
"""


def test_a_policy_cannot_forge_the_graded_world(local_root):
    """Kill the service and put a fake one on its socket, serving the oracle's final world:
    the grade is 0 with a signature error. Editing the world's files changes nothing either."""
    task_id = "todo-cleanup-001"
    task = TASKS[task_id]
    solved = World(task.seed, [], task.allowed)
    for c in task.oracle:
        solved.call(c["name"], c["arguments"])

    async def forge(env):
        service = env.ctx.state["service"]
        pid = (await service.request({"op": "health"}))["pid"]
        await env.sandbox.upload_content(FAKE_SERVICE.encode(), f"{env.ctx.cwd}/fake.py")
        py = " ".join(service.python)
        # the policy can read neither the service's memory nor its environment (non-dumpable)
        obs, *_ = await env.astep({"name": "bash", "arguments": {"command": f"cat /proc/{pid}/environ; head -c 8 /proc/{pid}/mem"}})
        assert "Permission denied" in obs or "No such" in obs, obs
        state = _sh(canonical(solved.state))
        await env.astep({"name": "bash", "arguments": {"command": (
            f"echo 'print(1)' > .claw/claw_service.py; kill -9 {pid}; sleep 0.3; "
            f"{py} fake.py {service.socket} {state}")}})

    state, report, log = asyncio.run(_run(local_root, task_id, forge))
    assert state is None and report["task_score"] == 0.0 and not report["passed"]
    assert "signature" in report["service_error"]

    async def edit_files(env):
        await env.astep({"name": "bash", "arguments": {"command": "echo '{}' > .claw/claw_tools.py; rm -f .claw/SKILL.md"}})
        for c in env.task.oracle[:1]:
            await env.astep(c)

    state, report, log = asyncio.run(_run(local_root, task_id, edit_files))
    assert not report["passed"] and report["completion"] < 1 and not report.get("service_error")


def _sh(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def test_oracle_policy_plays_calls_then_submits():
    policy = ClawOraclePolicy(calls=[{"name": "todo_list", "arguments": {}}])
    first = asyncio.run(policy([{"role": "user", "content": "x"}], []))
    after = asyncio.run(policy([{"role": "user", "content": "x"}, {"role": "assistant", "content": ""}], []))
    assert first["name"] == "todo_list" and after["name"] == "submit"


def _docker_why_not() -> str | None:
    from conftest import docker_engine

    gateway, why_not = docker_engine()
    return None if gateway is not None else why_not


@pytest.mark.docker
@needs("docker", _docker_why_not())
@pytest.mark.parametrize("image", ["localhost/orchard/busybox:latest", "localhost/orchard/bookworm:latest"])
def test_docker_oracle_passes_idle_fails_and_cli_matches_function(image):
    """In containers (busybox: no Python, no glibc; the service runs on the agent bundle's
    Python): the oracle passes, doing nothing fails, doors 1 and 2 leave the same world."""
    task_id = "meeting-followup-002"

    async def run(drive):
        async with AsyncSandboxClient({"type": "docker"}) as client:
            env = ClawEnv(client=client, bash=True, image=image)
            await env.areset(options={"task_id": task_id})
            await drive(env)
            obs, reward, terminated, truncated, info = await env.astep({"name": "submit", "arguments": {}})
            snap = env.ctx.state.get("snapshot")
            await env.aclose()
        return canonical(snap["state"]), info["report"]

    async def nothing(env):
        pass

    state_fn, report_fn = asyncio.run(run(_door_function))
    state_cli, report_cli = asyncio.run(run(_door_cli))
    _, idle = asyncio.run(run(nothing))
    assert report_fn["passed"] and report_fn["hardened"] and report_cli["passed"]
    assert state_fn == state_cli
    assert not idle["passed"] and idle["completion"] == 0.0


def test_the_key_exchange_agrees_on_a_key_from_short_secrets_and_refuses_degenerate_values():
    """Both sides' private exponents are 256-bit (NIST SP 800-56A's floor for group 14 is 224),
    drawn afresh each time; the shared key is the same on both sides; a public value the policy
    could force the key with (1, p-1, 0, p) is refused."""
    ours, theirs = dh_secret(), dh_secret()
    assert ours != theirs and all(2 <= x < 2 ** DH_SECRET_BITS for x in (ours, theirs))
    assert max(dh_secret().bit_length() for _ in range(64)) > DH_SECRET_BITS - 8  # not a narrow range
    assert dh_key(pow(DH_G, theirs, DH_P), ours) == dh_key(pow(DH_G, ours, DH_P), theirs)
    for bad in (0, 1, DH_P - 1, DH_P):
        with pytest.raises(ValueError, match="Diffie-Hellman"):
            dh_key(bad, ours)
