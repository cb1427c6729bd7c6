"""Codex CLI in a docker sandbox (Podman): a blocked sandbox (internal network, the host
guard open only at the proxy's port) reaching the recording proxy over TCP and nothing
else; the harness's static binary shipped in (the task image gets nothing added). The
scripted policy solves the task (1.0), a do-nothing policy fails it (0.0); an egress probe
run by the harness's own shell tool shows the proxy answers and other addresses do not."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import gymnasium as gym
import pytest

from conftest import docker_engine, needs, require, require_module

require_module("server", "fastapi")
require("harnesses", None if shutil.which("npm") else "npm is not installed")

import orchard_gym  # noqa: E402,F401
from orchard_gym._loop import LoopThread  # noqa: E402
from orchard_gym.envs.swe.tasks import load_tasks  # noqa: E402
from orchard_gym.wrappers.harness import get_harness  # noqa: E402
from orchard_gym.wrappers.harness.baked import BAKED_ROOT  # noqa: E402
from orchard_gym.wrappers.proxy import ProxyConfig, RecordingProxy  # noqa: E402

TASK = "semver-3.0.2"
SPEC = load_tasks("builtin")[TASK]


def succeeds(box, command: str) -> bool:
    """Whether `command` exits 0 in the (async) sandbox `box`."""
    return LoopThread.shared().run(box.exec(command, timeout=60)).exit_code == 0


def _missing() -> str | None:
    gateway, why_not = docker_engine()
    if gateway is None:
        return why_not
    if subprocess.run(["podman", "image", "exists", SPEC.image], capture_output=True).returncode != 0:
        return f"{SPEC.image} is missing (python scripts/build_swe_images.py)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


class _Decoy(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"DECOY")

    def log_message(self, *a):
        pass


PROBE = r'''python3 - <<'PY'
import os, socket, urllib.request
base = os.environ["OPENAI_BASE_URL"].split("/r/")[0]
try:
    print("PROXY", urllib.request.urlopen(base + "/health", timeout=5).status)
except Exception as e:
    print("PROXY-FAILED", e)
for name, addr in [("HOST-OTHER-PORT", (os.environ["PROBE_HOST"], int(os.environ["PROBE_PORT"]))),
                   ("OUTSIDE", ("1.1.1.1", 80)), ("OUTSIDE-DNS", ("8.8.8.8", 53))]:
    s = socket.socket(); s.settimeout(4)
    try:
        s.connect(addr); print(name, "REACHED")
    except OSError as e:
        print(name, "BLOCKED", type(e).__name__)
    finally:
        s.close()
PY'''


@pytest.fixture(scope="module")
def docker_proxy():
    port = _free_port()
    proxy = RecordingProxy(ProxyConfig(host="0.0.0.0", port=port))
    decoy = ThreadingHTTPServer(("0.0.0.0", 0), _Decoy)  # a host service a sandbox must not reach
    threading.Thread(target=decoy.serve_forever, daemon=True).start()
    yield proxy, {"type": "docker", "host_guard_allow_ports": [port]}, decoy.server_address[1]
    decoy.shutdown()
    decoy.server_close()
    if proxy.loop is not None:  # started by the first env, on the shared loop
        LoopThread.shared().run(proxy.stop())


@pytest.mark.docker
@pytest.mark.timeout(900)
@needs("swe-images", _missing())
def test_codex_in_docker_solves_fails_and_reaches_only_the_proxy(docker_proxy):
    proxy, backend, decoy_port = docker_proxy
    env = gym.make("Orchard/SWE-v0", harness="codex", backend=backend, proxy=proxy, network="proxy",
                   max_seconds=600, bake_payloads=False)  # its payload uploaded and unpacked at each reset
    try:
        obs, info = env.reset(options={"task_id": TASK})
        assert info["endpoint"] == "responses" and info["request"]["stream"] is True
        box = env.unwrapped.task_env.sandbox
        assert box.record.image == SPEC.image and not succeeds(box, f"test -e {BAKED_ROOT}")  # nothing baked
        host = box.record.details["host_address"]
        gold = f"git apply <<'ORCHARD_EOF'\n{SPEC.patch}\nORCHARD_EOF\necho applied-$?"
        probe = f"export PROBE_HOST={host} PROBE_PORT={decoy_port}\n{PROBE}"
        obs, reward, terminated, truncated, info = env.step(
            {"role": "assistant", "content": None, "tool_calls": [{"name": "exec_command", "arguments": {"cmd": probe}},
                                                                  {"name": "exec_command", "arguments": {"cmd": gold}}]})
        assert not (terminated or truncated), info
        outputs = [m["content"] for m in json.loads(obs)["messages"] if m["role"] == "tool"]
        text = "\n".join(outputs)
        assert "PROXY 200" in text, text
        assert "HOST-OTHER-PORT BLOCKED" in text and "OUTSIDE BLOCKED" in text and "OUTSIDE-DNS BLOCKED" in text, text
        assert "applied-0" in text
        obs, reward, terminated, truncated, info = env.step("The fix is applied.")
        assert (reward, terminated, truncated) == (1.0, True, False), info
        record = env.unwrapped.record
        assert record.status == "finished" and len(record.calls) == 2 and all(c.ok and c.stream for c in record.calls)
        # the same harness, doing nothing: 0.0
        obs, info = env.reset(options={"task_id": TASK})
        obs, reward, terminated, truncated, info = env.step("Nothing to do.")
        assert (reward, terminated, truncated) == (0.0, True, False) and "error" not in info, info
        assert env.unwrapped.record.reward == 0.0 and len(env.unwrapped.record.calls) == 1
    finally:
        env.close()


@pytest.mark.docker
@pytest.mark.timeout(900)
@needs("swe-images", _missing())
@pytest.mark.parametrize("name", ["claude-code", "mini-swe-agent", "openhands"])
def test_harness_in_docker_solves_with_a_scripted_policy_and_fails_doing_nothing(docker_proxy, name):
    """Claude Code (its native binary shipped in), mini-swe-agent (its host venv shipped
    in and relinked to the image's own python3.11) and OpenHands (its venv shipped in with its
    own trixie python3.13, the image has none) in a blocked docker sandbox: gold patch
    through the harness's own shell tool -> 1.0, the finishing answer at once -> 0.0."""
    proxy, backend, _ = docker_proxy
    harness = get_harness(name)
    env = gym.make("Orchard/SWE-v0", harness=name, backend=backend, proxy=proxy, network="proxy", max_seconds=600)
    try:
        env.reset(options={"task_id": TASK})
        box = env.unwrapped.task_env.sandbox
        assert box.record.backend == "docker"
        baked = box.record.image
        assert baked.startswith(f"localhost/orchard/harness-{name}:"), baked  # the task's image, harness baked in
        # a policy's write to the baked-in harness stays in its own sandbox (checked in the next one)
        assert succeeds(box, f"touch {BAKED_ROOT}/TAMPERED && ls {BAKED_ROOT}")
        gold = f"git apply <<'ORCHARD_EOF'\n{SPEC.patch}\nORCHARD_EOF\necho applied-$?"
        obs, reward, terminated, truncated, info = env.step(harness.shell(gold))
        assert not (terminated or truncated), info
        assert "applied-0" in json.dumps(json.loads(obs)["messages"][-1]), obs[-2000:]  # it ran in the sandbox
        obs, reward, terminated, truncated, info = env.step(harness.finish)
        assert (reward, terminated, truncated) == (1.0, True, False), info
        assert info["report"]["status"] == "RESOLVED_FULL"
        record = env.unwrapped.record
        assert record.status == "finished" and len(record.calls) == 2
        for call in record.calls:  # every model call recorded with the request as sent and the answer it got
            assert call.ok and call.request and call.response and call.message
        obs, info = env.reset(options={"task_id": TASK})
        box = env.unwrapped.task_env.sandbox
        assert box.record.image == baked and succeeds(box, f"test -d {BAKED_ROOT} && ! test -e {BAKED_ROOT}/TAMPERED")
        obs, reward, terminated, truncated, info = env.step(harness.finish)
        assert (reward, terminated, truncated) == (0.0, True, False) and "error" not in info, info
        record = env.unwrapped.record
        assert record.reward == 0.0 and len(record.calls) == 1 and record.calls[0].response
    finally:
        env.close()


@pytest.mark.docker
@pytest.mark.timeout(1200)
@needs("docker", docker_engine()[1])
def test_openclaw_in_docker_solves_a_claw_task_through_the_skill_and_fails_doing_nothing(docker_proxy):
    """OpenClaw (its npm prefix, Node 26 included, shipped in) in a blocked docker sandbox of
    the default image: the Claw tools through its SKILL.md and `claw` in its `exec` tool -> 1.0,
    the finishing answer at once -> 0.0."""
    proxy, backend, _ = docker_proxy
    harness = get_harness("openclaw")
    env = gym.make("Orchard/Claw-v0", harness="openclaw", bash=True, backend=backend, proxy=proxy, network="proxy",
                   max_seconds=900)
    try:
        obs, info = env.reset(options={"task_id": "todo-cleanup-001"})
        assert env.unwrapped.task_env.sandbox.record.backend == "docker"
        assert env.unwrapped.task_env.sandbox.record.image.startswith("localhost/orchard/harness-openclaw:")
        assert "claw-tools" in json.loads(obs)["messages"][0]["content"]  # the skill, in its own prompt
        oracle = env.unwrapped.task_env.task.oracle
        for call in oracle:
            obs, reward, terminated, truncated, info = env.step(
                harness.shell(f"claw {call['name']} --json '{json.dumps(call['arguments'])}'"))
            assert not (terminated or truncated), info
        obs, reward, terminated, truncated, info = env.step(harness.finish)
        assert (reward, terminated, truncated) == (1.0, True, False), info
        assert info["report"]["doors"] == {"cli": len(oracle)}
        assert [s.reward for s in env.unwrapped.samples()] == [1.0] * (len(oracle) + 1)
        obs, info = env.reset(options={"task_id": "todo-cleanup-001"})
        obs, reward, terminated, truncated, info = env.step(harness.finish)
        assert (reward, terminated, truncated) == (0.0, True, False) and "error" not in info, info
        assert env.unwrapped.record.reward == 0.0 and len(env.unwrapped.record.calls) == 1
    finally:
        env.close()


def test_proxy_network_mode_refuses_what_cannot_work():
    env = gym.make("Orchard/SWE-v0", harness="codex", backend={"type": "local"}, network="proxy")
    with pytest.raises(gym.error.Error, match="needs a started proxy"):
        env.reset(options={"task_id": TASK})
    env.close()
    with pytest.raises(gym.error.Error, match="network must be"):
        gym.make("Orchard/SWE-v0", harness="codex", network="everywhere")

