"""Orchard envs behind OpenEnv's own server (its `create_app`, WebSocket sessions, reaper),
driven by OpenEnv's own client; and an OpenEnv server as `gym.make("Orchard/OpenEnv-v0")`.
Rewards must equal `gym.make`'s for the same actions; sessions end with their sandbox."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading

import gymnasium as gym
import httpx
import pytest

from adapter_helpers import gym_reward, live_sandboxes
from conftest import require_module, wait_until

require_module("integrations", "openenv")
uvicorn = require_module("server", "uvicorn")

from openenv.core.generic_client import GenericEnvClient  # noqa: E402
from openenv.core.mcp_client import MCPToolClient  # noqa: E402

import orchard_gym  # noqa: E402, F401
from orchard_gym.envs.swe.tasks import load_tasks  # noqa: E402
from orchard_gym.integrations.openenv import create_app  # noqa: E402

CLAW_TASK = "calendar-answer-001"
SWE_TASK = "semver-3.0.2"
SWE = load_tasks("builtin")[SWE_TASK]
SWE_GOLD = [{"name": "bash", "arguments": {"command": f"git apply <<'EOF_PATCH'\n{SWE.patch}\nEOF_PATCH"}},
            {"name": "submit", "arguments": {}}]
SWE_KWARGS = {"tasks": {SWE_TASK: SWE}, "grade_in_place": True}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """uvicorn serving the app on a thread of this process (so the test sees the hub)."""

    def __init__(self, app):
        self.app, self.port = app, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_until(lambda: self.server.started, timeout=30)

    def close(self):
        self.server.should_exit = True
        self.thread.join(30)


def openenv_episode(url, task_id, actions):
    """A whole episode through OpenEnv's own sync client; returns (reward, done, last observation)."""
    with GenericEnvClient(base_url=url).sync() as client:
        first = client.reset(task_id=task_id)
        assert first.observation["task_id"] == task_id and first.observation["tools"]
        for action in actions:
            result = client.step({"tool": action["name"], "arguments": action.get("arguments", {})})
        return result.reward, result.done, result.observation


@pytest.fixture
def backend(local_root):
    return {"type": "local", "root": str(local_root)}


def test_claw_episode_through_openenv_client(backend):
    env = gym.make("Orchard/Claw-v0").unwrapped
    oracle = env.get_task(CLAW_TASK).oracle + [{"name": "submit", "arguments": {}}]
    nothing = [{"name": "submit", "arguments": {}}]
    server = Server(create_app("Orchard/Claw-v0", backend=backend, max_sessions=2))
    try:
        schema = httpx.get(f"{server.url}/schema").json()
        assert "tool" in schema["action"]["properties"]
        assert httpx.get(f"{server.url}/health").status_code == 200
        rewards = []
        for actions in (oracle, nothing):
            reward, done, obs = openenv_episode(server.url, CLAW_TASK, actions)
            assert done and obs["error"] is None
            assert reward == gym_reward("Orchard/Claw-v0", CLAW_TASK, actions, backend=backend)
            rewards.append(reward)
        assert rewards[0] == 1.0 > rewards[1]  # the oracle, then doing nothing
        wait_until(lambda: server.app.state.orchard_hub.live_sandboxes() == 0, timeout=10)
    finally:
        server.close()
    assert live_sandboxes(backend) == []


@pytest.mark.slow
def test_swe_episode_through_openenv_client_and_gym_make(backend):
    """SWE through OpenEnv's client, and the same server as `gym.make("Orchard/OpenEnv-v0")`."""
    gold, kwargs = SWE_GOLD, SWE_KWARGS
    server = Server(create_app("Orchard/SWE-v0", backend=backend, max_sessions=2, **kwargs))
    try:
        reward, done, _ = openenv_episode(server.url, SWE_TASK, gold)
        assert done and reward == 1.0 == gym_reward("Orchard/SWE-v0", SWE_TASK, gold, backend=backend, **kwargs)
        env = gym.make("Orchard/OpenEnv-v0", url=server.url)
        obs, info = env.reset(options={"task_id": SWE_TASK})
        assert SWE.problem_statement[:40] in obs and info["tools"]
        _, reward, terminated, _, info = env.step({"name": "submit", "arguments": {}})
        assert terminated and reward == 0.0 and info["error"] is None  # nothing changed: graded 0.0
        env.close()
    finally:
        server.close()
    assert live_sandboxes(backend) == []


def test_sessions_are_capped_and_reaped(backend):
    """A third concurrent session is refused; an idle one is reaped and its sandbox deleted."""
    server = Server(create_app("Orchard/Claw-v0", backend=backend, max_sessions=2, session_timeout=2))
    hub = server.app.state.orchard_hub
    try:
        clients = [GenericEnvClient(base_url=server.url).sync() for _ in range(3)]
        for c in clients[:2]:
            c.connect()
            c.reset(task_id=CLAW_TASK)
        assert hub.live_sandboxes() == 2
        with pytest.raises(Exception, match="(?i)capacity|session"):
            clients[2].connect()
            clients[2].reset(task_id=CLAW_TASK)
        wait_until(lambda: hub.live_sandboxes() == 0, timeout=30)  # idle past session_timeout: reaped
        for c in clients:
            try:
                c.close()
            except Exception:
                pass
    finally:
        server.close()
    assert live_sandboxes(backend) == []


@pytest.mark.slow
def test_serve_env_cli(backend, tmp_path):
    """`orchard serve-env` starts OpenEnv's server for an env id, its tools as MCP tools."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "orchard_gym.cli", "serve-env", "Orchard/Toy-v0", "--port",
                             str(port), "--max-sessions", "1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        def up():
            try:
                return httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, timeout=60)
        assert "tool" in httpx.get(f"http://127.0.0.1:{port}/schema").json()["action"]["properties"]
        with MCPToolClient(base_url=f"http://127.0.0.1:{port}").sync() as mcp:  # and its tools over /mcp
            assert [t.name for t in mcp.list_tools()] == ["bash", "submit"]
    finally:
        proc.terminate()
        proc.wait(10)


def test_errored_episode_ends_without_a_reward(backend):
    """The sandbox dies mid-episode: the client sees done, reward None and the error, not 0.0."""
    server = Server(create_app("Orchard/Claw-v0", backend=backend, max_sessions=1))
    hub = server.app.state.orchard_hub
    try:
        with GenericEnvClient(base_url=server.url).sync() as client:
            client.reset(task_id=CLAW_TASK)
            episode = hub.episodes[-1]
            hub.run(episode.env.sandbox.delete())
            result = client.step({"tool": "submit", "arguments": {}})
            assert result.done and result.reward is None and result.observation["error"]
    finally:
        server.close()
    assert live_sandboxes(backend) == []
