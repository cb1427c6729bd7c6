"""An Orchard env's tools as MCP tools on OpenEnv's server (`/mcp` tools/list, tools/call),
driven by OpenEnv's own MCP client (`MCPToolClient`): the tools are the env's own, a whole
episode through them gets `gym.make`'s reward, each session's calls run in its own sandbox
only, sessions are capped and reaped, and garbage gets clear errors and changes nothing."""

from __future__ import annotations

import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import gymnasium as gym
import httpx
import pytest

from adapter_helpers import gym_reward, live_sandboxes
from conftest import require_module, wait_until

require_module("integrations", "openenv")
require_module("server", "uvicorn")

from openenv.core.env_server.mcp_types import CallToolAction  # noqa: E402
from openenv.core.generic_client import GenericEnvClient  # noqa: E402
from openenv.core.mcp_client import MCPToolClient  # noqa: E402
from test_integrations_openenv import CLAW_TASK, SWE_GOLD, SWE_KWARGS, SWE_TASK, Server  # noqa: E402
from websockets.sync.client import connect as ws_connect  # noqa: E402

import orchard_gym  # noqa: E402, F401
from orchard_gym.envs.toy.env import ToyEnv  # noqa: E402
from orchard_gym.integrations.openenv import create_app  # noqa: E402

ORACLE = gym.make("Orchard/Claw-v0").unwrapped.get_task(CLAW_TASK).oracle + [{"name": "submit", "arguments": {}}]
NOTHING = [{"name": "submit", "arguments": {}}]


@pytest.fixture
def backend(local_root):
    return {"type": "local", "root": str(local_root)}


@pytest.fixture
def claw(backend):
    server = Server(create_app("Orchard/Claw-v0", backend=backend, max_sessions=3))
    yield server
    server.close()
    assert live_sandboxes(backend) == []


def rpc(url: str, method: str, params: dict | None = None, body: str | None = None) -> dict:
    """One JSON-RPC request to the server's HTTP /mcp, as the MCP client sends it."""
    data = body if body is not None else json.dumps({"jsonrpc": "2.0", "method": method, "params": params or {},
                                                     "id": 1})
    return httpx.post(f"{url}/mcp", content=data, headers={"content-type": "application/json"}).json()


def reset_session(server, task_id: str) -> str:
    """An MCP session as MCPToolClient opens one (openenv/session/create, its WebSocket attached), reset
    on `task_id`; then the WebSocket goes away (the session stays, as after a client that died)."""
    session = rpc(server.url, "openenv/session/create")["result"]["session_id"]
    with ws_connect(f"ws://127.0.0.1:{server.port}/ws?session_id={session}") as ws:
        ws.send(json.dumps({"type": "reset", "data": {"task_id": task_id}}))
        assert json.loads(ws.recv(timeout=60))["data"]["observation"]["task_id"] == task_id
    return session


def mcp_episode(client, task_id, actions) -> dict:
    """A whole episode through MCPToolClient (reset over its WebSocket, tools over /mcp); the last
    call's result (the step's observation: text, done, reward, error, report)."""
    first = client.reset(task_id=task_id)
    assert first.observation.metadata["task_id"] == task_id and first.observation.metadata["text"]
    for action in actions:
        result = client.call_tool(action["name"], **action.get("arguments", {}))
    return result


def test_tools_are_the_envs_own(claw):
    """tools/list gives each tool of the env with its description and JSON schema (env.tool_schemas)."""
    schemas = gym.make("Orchard/Claw-v0").unwrapped.tool_schemas
    with MCPToolClient(base_url=claw.url).sync() as client:
        tools = client.list_tools()
    assert [(t.name, t.description, t.input_schema) for t in tools] == [
        (s["function"]["name"], s["function"]["description"], s["function"]["parameters"]) for s in schemas]


def test_claw_episode_through_mcp_client(claw, backend):
    """The oracle and doing nothing, each through MCP tool calls: the rewards are gym.make's."""
    rewards = []
    for actions in (ORACLE, NOTHING):
        with MCPToolClient(base_url=claw.url).sync() as client:
            result = mcp_episode(client, CLAW_TASK, actions)
        assert result["done"] and result["error"] is None and result["report"]
        assert result["reward"] == gym_reward("Orchard/Claw-v0", CLAW_TASK, actions, backend=backend)
        rewards.append(result["reward"])
    assert rewards[0] == 1.0 > rewards[1]
    hub = claw.app.state.orchard_hub
    assert wait_until(lambda: hub.live_sandboxes() == 0 and hub.episodes == [], timeout=10)  # closed: nothing kept


@pytest.mark.slow
def test_swe_episode_through_mcp_client(backend):
    gold, kwargs = SWE_GOLD, SWE_KWARGS
    server = Server(create_app("Orchard/SWE-v0", backend=backend, max_sessions=2, **kwargs))
    try:
        for actions, expected in ((gold, 1.0), (NOTHING, 0.0)):
            with MCPToolClient(base_url=server.url).sync() as client:
                result = mcp_episode(client, SWE_TASK, actions)
            assert result["done"] and result["error"] is None
            assert result["reward"] == expected == gym_reward("Orchard/SWE-v0", SWE_TASK, actions, backend=backend,
                                                               **kwargs)
    finally:
        server.close()
    assert live_sandboxes(backend) == []


def test_a_session_cannot_reach_another_sessions_sandbox(claw, backend):
    """Red team: B answers the task and A does nothing, their calls interleaved; each gets the reward
    of its own actions only. A forged session id reaches nothing, and a call without one no sandbox."""
    a, b = MCPToolClient(base_url=claw.url).sync(), MCPToolClient(base_url=claw.url).sync()
    with a, b:
        a.reset(task_id=CLAW_TASK)
        b.reset(task_id=CLAW_TASK)
        for action in ORACLE[:-1]:  # B's calls run in B's sandbox: A's has no answer
            b.call_tool(action["name"], **action.get("arguments", {}))
            a.call_tool("mail_list_messages")
        forged = rpc(claw.url, "tools/call", {"name": "submit", "arguments": {}, "session_id": str(uuid.uuid4())})
        assert "Unknown session_id" in forged["error"]["message"]
        anonymous = rpc(claw.url, "tools/call", {"name": "submit", "arguments": {}})
        assert "reset first" in anonymous["error"]["message"]
        a_result = a.call_tool("submit")
        b_result = b.call_tool("submit")
    assert a_result["reward"] == gym_reward("Orchard/Claw-v0", CLAW_TASK,
                                            [{"name": "mail_list_messages", "arguments": {}}] * 2 + NOTHING,
                                            backend=backend) < 1.0
    assert b_result["reward"] == 1.0


def test_garbage_gets_clear_errors_and_loses_nothing(claw, backend):
    """Unknown tools, bad arguments, calls before reset and after the end, non-JSON, unknown methods:
    each a clear error; none is a step, and the oracle afterwards still earns 1.0."""
    url = claw.url
    assert rpc(url, "", body="{not json")["error"]["code"] == -32700
    assert "Method not found" in rpc(url, "tools/dance")["error"]["message"]
    assert "Missing 'name'" in rpc(url, "tools/call", {"arguments": {}})["error"]["message"]
    with MCPToolClient(base_url=claw.url).sync() as client:
        with pytest.raises(RuntimeError, match="reset first"):
            client.call_tool("submit")
        client.reset(task_id=CLAW_TASK)
        with pytest.raises(RuntimeError, match="Unknown tool: 'rm_rf'"):
            client.call_tool("rm_rf")
        with pytest.raises(RuntimeError, match="bad arguments for calendar_list_events: date: 3 is not of type"):
            client.call_tool("calendar_list_events", date=3)
        with pytest.raises(RuntimeError, match="bad arguments for submit_answer"):
            client.call_tool("submit_answer")
        with pytest.raises(RuntimeError, match="Invalid message"):  # MCP actions are not /ws steps (the session goes on)
            client.step(CallToolAction(tool_name="submit"))
        assert client.state().step_count == 0  # nothing above was a step
        result = None
        for action in ORACLE:
            result = client.call_tool(action["name"], **action.get("arguments", {}))
        assert result["reward"] == 1.0 and client.state().step_count == len(ORACLE)
        with pytest.raises(RuntimeError, match="the episode is over"):
            client.call_tool("submit")
    assert wait_until(lambda: claw.app.state.orchard_hub.episodes == [], timeout=10)  # sessionless calls kept none


def test_mcp_sessions_are_capped_and_reaped(backend):
    """MCP sessions count against max_sessions; one its client abandons (its WebSocket gone, never
    closed) is reaped after session_timeout and its sandbox deleted; its id then reaches nothing."""
    server = Server(create_app("Orchard/Claw-v0", backend=backend, max_sessions=1, session_timeout=2))
    hub = server.app.state.orchard_hub
    try:
        session = reset_session(server, CLAW_TASK)  # its WebSocket gone after the reset
        listing = rpc(server.url, "tools/call", {"name": "calendar_list_events", "session_id": session,
                                                 "arguments": {"date": "2026-03-03"}})
        assert "Rita Gomez" in listing["result"]["data"]["text"] and hub.live_sandboxes() == 1
        with pytest.raises(RuntimeError, match="(?i)capacity|maximum"):
            with MCPToolClient(base_url=server.url).sync():
                pass
        with pytest.raises(Exception, match="(?i)capacity|maximum"):  # nor over /ws
            with GenericEnvClient(base_url=server.url).sync() as other:
                other.reset(task_id=CLAW_TASK)
        assert wait_until(lambda: hub.live_sandboxes() == 0 and hub.episodes == [], timeout=30)  # idle: reaped
        gone = rpc(server.url, "tools/call", {"name": "submit", "arguments": {}, "session_id": session})
        assert "Unknown session_id" in gone["error"]["message"]
    finally:
        server.close()
    assert live_sandboxes(backend) == []


class NoToolsEnv(ToyEnv):
    """A sandbox env whose actions are not tool calls."""

    def make_tools(self):
        return []


def test_an_env_without_tools_says_so(backend):
    gym.register("OrchardTest/NoTools-v0", entry_point=NoToolsEnv)
    server = Server(create_app("OrchardTest/NoTools-v0", backend=backend, max_sessions=1))
    try:
        for method in ("tools/list", "tools/call"):
            answer = rpc(server.url, method, {"name": "bash", "arguments": {}})
            assert answer["error"]["message"] == "Environment does not support MCP"
        step = httpx.post(f"{server.url}/step", json={"action": {"type": "call_tool", "tool_name": "bash"}})
        assert step.status_code == 422 and "/mcp" in step.text
    finally:
        server.close()
        gym.registry.pop("OrchardTest/NoTools-v0")



def test_calls_of_one_session_are_steps_one_at_a_time(backend):
    """Eight tools/call requests of one session at once run as eight steps in turn, as gym.make's
    steps do: each sees the appends of the calls before it, never one still running; of four
    submits at once one is graded and three are refused (not steps of an ended episode)."""
    server = Server(create_app("Orchard/Toy-v0", backend=backend, max_sessions=1, max_steps=20))
    try:
        session = reset_session(server, "write-003")

        def call(i):
            return rpc(server.url, "tools/call", {"session_id": session, "name": "bash", "arguments": {
                "command": f"echo {i} >> calls.txt; sleep 0.3; wc -l < calls.txt"}})

        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(call, range(8)))
        counts = sorted(int(a["result"]["data"]["text"].split()[0]) for a in answers)
        assert counts == list(range(1, 9))
        with ThreadPoolExecutor(5) as pool:  # four submits while a step runs: one ends the episode
            slow = pool.submit(call, "slow; sleep 1")
            time.sleep(0.3)
            submits = list(pool.map(lambda _: rpc(server.url, "tools/call", {
                "session_id": session, "name": "submit", "arguments": {}}), range(4)))
        assert "result" in slow.result()
        [graded] = [a["result"]["data"] for a in submits if "result" in a]
        assert graded["done"] and graded["reward"] == 0.0 and graded["error"] is None  # (nothing written)
        assert sum("the episode is over" in a.get("error", {}).get("message", "") for a in submits) == 3
        assert rpc(server.url, "openenv/session/close", {"session_id": session})["result"]["closed"]
    finally:
        server.close()
    assert live_sandboxes(backend) == []


def test_mcp_messages_on_a_ws_session_call_its_tools(claw):
    """OpenEnv's other door: a `{"type": "mcp"}` JSON-RPC message on a /ws session runs in that session."""
    with ws_connect(f"ws://127.0.0.1:{claw.port}/ws") as ws:
        ws.send(json.dumps({"type": "reset", "data": {"task_id": CLAW_TASK}}))
        assert json.loads(ws.recv(timeout=60))["data"]["observation"]["task_id"] == CLAW_TASK
        ws.send(json.dumps({"type": "mcp", "data": {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
            "name": "calendar_list_events", "arguments": {"date": "2026-03-03"}}}}))
        answer = json.loads(ws.recv(timeout=60))
        assert answer["type"] == "mcp" and "Rita Gomez" in answer["data"]["result"]["data"]["text"]
        assert claw.app.state.orchard_hub.live_sandboxes() == 1
