"""The recording proxy: real uvicorn servers on loopback (the proxy and a stub upstream),
driven with the official `openai` client and raw HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from conftest import require_module, wait_until

openai = require_module("openai", "openai")
require_module("server", "fastapi")

from orchard_gym.wrappers.proxy import ProxyConfig, RecordingProxy  # noqa: E402
from orchard_gym.wrappers.proxy.reconstruct import drop_errors, reconstruct, to_trajectory  # noqa: E402
from orchard_gym.wrappers.proxy.records import load_jsonl  # noqa: E402
from orchard_gym.wrappers.proxy.stub import StubUpstream  # noqa: E402

TOOLS = [{"type": "function", "function": {"name": "bash", "description": "run a command",
                                           "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def stub():
    s = StubUpstream().start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def proxy(stub, tmp_path_factory):
    sock = str(tmp_path_factory.mktemp("px") / "proxy.sock")
    p = RecordingProxy(ProxyConfig(upstream=stub.url, uds=sock, upstream_timeout=2.0)).start_in_thread()
    yield p
    p.stop_in_thread()


class Admin:
    def __init__(self, proxy: RecordingProxy):
        self.http = httpx.Client(base_url=proxy.url, headers={"Authorization": f"Bearer {proxy.admin_key}"}, timeout=30)

    def open(self, **body) -> dict:
        r = self.http.post("/rollouts", json=body)
        assert r.status_code == 201, r.text
        return r.json()

    def record(self, rollout_id: str) -> dict:
        r = self.http.get(f"/rollouts/{rollout_id}")
        assert r.status_code == 200, r.text
        return r.json()

    def finish(self, rollout_id: str, **body) -> httpx.Response:
        return self.http.post(f"/rollouts/{rollout_id}/finish", json=body)


@pytest.fixture
def admin(proxy):
    a = Admin(proxy)
    yield a
    a.http.close()


def client_for(rollout: dict, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=rollout["base_url"], api_key=rollout["token"], max_retries=0, **kw)


def user(text: str) -> list[dict]:
    return [{"role": "system", "content": "be brief"}, {"role": "user", "content": text}]


# ----------------------------------------------------------------------------- upstream mode
def test_openai_client_non_streaming_and_streaming_are_recorded(admin):
    rollout = admin.open(metadata={"task": "t1"})
    assert rollout["mode"] == "upstream" and rollout["base_url"].endswith(f"/r/{rollout['rollout_id']}/v1")
    c = client_for(rollout)
    out = c.chat.completions.create(model="stub", messages=user("hello there"), temperature=0.3, max_tokens=50,
                                    logprobs=True, extra_body={"return_token_ids": True})
    assert out.choices[0].message.content == "echo: hello there"
    chunks = list(c.chat.completions.create(model="stub-tool", messages=user("list files"), tools=TOOLS,
                                            tool_choice="required", stream=True,
                                            stream_options={"include_usage": True}))
    calls = [tc for ch in chunks for choice in ch.choices for tc in (choice.delta.tool_calls or [])]
    assert calls[0].function.name == "bash"
    text = "".join(choice.delta.content or "" for ch in list(c.chat.completions.create(
        model="stub", messages=user("streamed words"), stream=True)) for choice in ch.choices)
    assert text == "echo: streamed words"
    assert [m.id for m in c.models.list()] == ["orchard-policy"]

    record = admin.record(rollout["rollout_id"])
    assert record["metadata"] == {"task": "t1"} and record["status"] == "open"
    first, second, third = record["calls"]
    assert first["request"]["temperature"] == 0.3 and first["request"]["max_tokens"] == 50
    assert first["messages"] == user("hello there") and not first["stream"] and first["error"] is None
    assert first["message"]["content"] == "echo: hello there"
    assert first["completion_token_ids"] and first["prompt_token_ids"]  # vLLM-style token ids kept
    assert [lp["token"] for lp in first["logprobs"]] == ["echo:", "hello", "there"]
    assert first["usage"]["completion_tokens"] == 3
    assert first["latency"] > 0 and first["upstream_latency"] > 0 and first["ended_at"] >= first["started_at"]
    assert second["stream"] and second["tools"] == TOOLS and second["request"]["tool_choice"] == "required"
    assert second["message"]["tool_calls"][0]["function"] == {"name": "bash", "arguments": '{"echo": "list files"}'}
    assert second["finish_reason"] == "tool_calls" and second["usage"]["total_tokens"] > 0
    assert third["message"] == {"role": "assistant", "content": "echo: streamed words"}


def test_responses_api_streaming_and_not(admin):
    rollout = admin.open()
    c = client_for(rollout)
    resp = c.responses.create(model="stub", instructions="be brief", input="what is up",
                              tools=[{"type": "function", "name": "bash", "parameters": {"type": "object"}}])
    assert resp.output_text == "echo: what is up"
    with c.responses.stream(model="stub", input=[{"role": "user", "content": "streaming responses"}]) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == "echo: streaming responses"
    calls = admin.record(rollout["rollout_id"])["calls"]
    assert [c["endpoint"] for c in calls] == ["responses", "responses"] and calls[1]["stream"]
    assert calls[0]["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is up"}]
    assert calls[0]["tools"][0]["function"]["name"] == "bash"
    assert calls[1]["message"]["content"] == "echo: streaming responses" and calls[1]["usage"]["prompt_tokens"] == 2


@pytest.mark.parametrize("model, status, words", [
    ("stub-500", 502, "the upstream answered 500"),
    ("stub-garbage", 502, "not valid"),
    ("stub-shape", 502, "not a chat completion"),
    ("stub-400", 400, "maximum context length"),
])
def test_upstream_failures_get_clear_errors_and_are_recorded(admin, model, status, words):
    rollout = admin.open()
    with pytest.raises(openai.APIStatusError) as e:
        client_for(rollout).chat.completions.create(model=model, messages=user("x"))
    assert e.value.status_code == status and words in str(e.value)
    (call,) = admin.record(rollout["rollout_id"])["calls"]
    assert call["status_code"] == status and words in call["error"] and call["message"] is None


@pytest.mark.parametrize("model, words", [("stub-broken-stream", "not JSON"), ("stub-cut-stream", "stream broke")])
def test_broken_upstream_streams_end_with_an_error_and_are_recorded(admin, model, words):
    rollout = admin.open()
    with pytest.raises((openai.APIError, httpx.HTTPError)):
        list(client_for(rollout).chat.completions.create(model=model, messages=user("x"), stream=True))
    (call,) = admin.record(rollout["rollout_id"])["calls"]
    assert words in call["error"] and call["message"] is None


def test_unreachable_and_slow_upstreams(stub):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]  # nothing listens here once closed
    p = RecordingProxy(ProxyConfig(upstream=f"http://127.0.0.1:{dead}/v1")).start_in_thread()
    slow = RecordingProxy(ProxyConfig(upstream=stub.url, upstream_timeout=0.5)).start_in_thread()
    try:
        for proxy, model, status, words in [(p, "stub", 502, "cannot reach the upstream"),
                                            (slow, "stub-slow-3", 504, "timed out")]:
            a = Admin(proxy)
            rollout = a.open()
            with pytest.raises(openai.APIStatusError) as e:
                client_for(rollout).chat.completions.create(model=model, messages=user("x"))
            assert e.value.status_code == status and words in str(e.value)
            assert words in a.record(rollout["rollout_id"])["calls"][0]["error"]
            a.http.close()
    finally:
        p.stop_in_thread()
        slow.stop_in_thread()


# ----------------------------------------------------------------------------- access
def test_unknown_rollout_wrong_token_and_after_finish(admin, proxy):
    rollout = admin.open()
    other = admin.open()
    c = client_for(rollout)
    c.chat.completions.create(model="stub", messages=user("one"))

    with pytest.raises(openai.NotFoundError, match="no rollout 'nope'"):
        openai.OpenAI(base_url=f"{proxy.url}/r/nope/v1", api_key=rollout["token"], max_retries=0) \
            .chat.completions.create(model="stub", messages=user("x"))
    # a sandbox holding one rollout's token can neither write to nor read another's
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=other["base_url"], api_key=rollout["token"], max_retries=0) \
            .chat.completions.create(model="stub", messages=user("sneaky"))
    for path in (f"/rollouts/{rollout['rollout_id']}", f"/rollouts/{other['rollout_id']}", "/rollouts", "/export"):
        assert httpx.get(proxy.url + path, headers={"Authorization": f"Bearer {rollout['token']}"}).status_code == 401
    assert httpx.post(proxy.url + "/rollouts", json={}).status_code == 401

    assert admin.finish(rollout["rollout_id"], reward=1.0).json()["status"] == "finished"
    with pytest.raises(openai.ConflictError, match="is finished"):
        c.chat.completions.create(model="stub", messages=user("late"))
    assert admin.finish(rollout["rollout_id"], reward=0.0).status_code == 409  # no second verdict
    assert admin.http.get("/rollouts/nope").status_code == 404
    assert admin.finish("nope", reward=1.0).status_code == 404
    bad = httpx.post(other["base_url"] + "/chat/completions", content=b"{not json",
                     headers={"Authorization": f"Bearer {other['token']}"})
    assert bad.status_code == 400 and "bad request" in bad.json()["error"]["message"]

    record, other_record = admin.record(rollout["rollout_id"]), admin.record(other["rollout_id"])
    assert len(record["calls"]) == 1 and record["reward"] == 1.0  # refused requests never become calls...
    assert [r["reason"] for r in record["rejected"]] == ["request after the rollout was finished"]
    assert other_record["calls"] == [] and len(other_record["rejected"]) == 2  # ...but are noted


def test_unix_socket_serves_model_endpoints_only(admin, proxy):
    rollout = admin.open()
    transport = httpx.HTTPTransport(uds=proxy.uds)
    with httpx.Client(transport=transport, base_url="http://proxy") as http:
        path = f"/r/{rollout['rollout_id']}/v1/chat/completions"
        ok = http.post(path, json={"model": "stub", "messages": user("via socket")},
                       headers={"Authorization": f"Bearer {rollout['token']}"})
        assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == "echo: via socket"
        assert http.get("/health").status_code == 200
        admin_headers = {"Authorization": f"Bearer {proxy.admin_key}"}
        assert http.get(f"/rollouts/{rollout['rollout_id']}", headers=admin_headers).status_code == 404
        assert http.post("/rollouts", json={}, headers=admin_headers).status_code == 404


def test_32_concurrent_rollouts_never_mix(admin):
    rollouts = [admin.open(metadata={"n": i}) for i in range(32)]

    def run(i: int) -> None:
        c = client_for(rollouts[i])
        for k in range(3):
            text = f"rollout {i} call {k}"
            if k == 1:
                got = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
                    model="stub", messages=user(text), stream=True) if ch.choices)
            else:
                got = c.chat.completions.create(model="stub", messages=user(text)).choices[0].message.content
            assert got == f"echo: {text}"

    with ThreadPoolExecutor(32) as pool:
        list(pool.map(run, range(32)))
    for i, rollout in enumerate(rollouts):
        record = admin.record(rollout["rollout_id"])
        assert record["metadata"] == {"n": i}
        assert [c["messages"][-1]["content"] for c in record["calls"]] == [f"rollout {i} call {k}" for k in range(3)]
        assert [c["message"]["content"] for c in record["calls"]] == [f"echo: rollout {i} call {k}" for k in range(3)]
        assert [c["index"] for c in record["calls"]] == [0, 1, 2]


# ----------------------------------------------------------------------------- policy mode
def test_policy_mode_over_the_control_api(admin, proxy):
    rollout = admin.open(mode="policy")
    c = client_for(rollout)
    answers = {}

    def harness():
        answers["chat"] = c.chat.completions.create(model="my-model", messages=user("hi policy"), tools=TOOLS)
        answers["stream"] = list(c.chat.completions.create(model="my-model", messages=user("stream it"), stream=True))
        answers["responses"] = c.responses.create(model="my-model", input="responses too")

    t = threading.Thread(target=harness)
    t.start()
    replies = [{"name": "bash", "arguments": {"command": "ls"}}, "streamed answer", "plain text"]
    for reply in replies:
        nxt = admin.http.get(f"/rollouts/{rollout['rollout_id']}/next", params={"timeout": 20})
        assert nxt.status_code == 200, nxt.text
        r = admin.http.post(f"/rollouts/{rollout['rollout_id']}/calls/{nxt.json()['call_id']}/respond",
                            json={"message": reply, "logprobs": [{"token": "x", "logprob": -1.0}]})
        assert r.status_code == 200, r.text
    t.join(20)
    assert answers["chat"].choices[0].message.tool_calls[0].function.arguments == '{"command": "ls"}'
    assert answers["chat"].model == "my-model" and answers["chat"].usage.total_tokens > 0
    assert "".join(ch.choices[0].delta.content or "" for ch in answers["stream"] if ch.choices) == "streamed answer"
    assert answers["responses"].output_text == "plain text"
    assert admin.http.get(f"/rollouts/{rollout['rollout_id']}/next", params={"timeout": 0.2}).status_code == 204
    bad = admin.http.post(f"/rollouts/{rollout['rollout_id']}/calls/nope/respond", json={"message": "x"})
    assert bad.status_code == 404
    calls = admin.record(rollout["rollout_id"])["calls"]
    assert [c["source"] for c in calls] == ["policy"] * 3 and calls[0]["logprobs"] == [{"token": "x", "logprob": -1.0}]


def test_policy_mode_harness_gone_or_rollout_finished_while_parked(admin, proxy):
    rollout = admin.open(mode="policy")
    # the harness hangs up while its request waits for the policy
    with pytest.raises(openai.APITimeoutError):
        client_for(rollout, timeout=0.5).chat.completions.create(model="m", messages=user("impatient"))
    recorded = lambda: admin.record(rollout["rollout_id"])["calls"]
    assert wait_until(lambda: "disconnected" in (recorded()[0]["error"] or ""), 10)  # the proxy saw it go
    # the rollout ends (e.g. its timeout) while a request waits: the harness is told
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("error", _catch(lambda: client_for(rollout).chat.completions
                                                                               .create(model="m", messages=user("late")))))
    t.start()
    assert wait_until(lambda: len(recorded()) == 2, 10)  # recorded, so parked (the same step of the proxy's loop)
    assert admin.finish(rollout["rollout_id"], error="timeout: 900s").json()["status"] == "failed"
    t.join(10)
    assert isinstance(result["error"], openai.ConflictError) and "failed" in str(result["error"])
    calls = admin.record(rollout["rollout_id"])["calls"]
    assert "disconnected" in calls[0]["error"] and "failed" in calls[1]["error"]


def _catch(fn):
    try:
        fn()
    except Exception as e:
        return e
    return None


def test_in_process_policy_api_and_reconstruction():
    async def main():
        async with RecordingProxy() as proxy:  # no upstream: policy mode
            rollout = proxy.store.open("policy", {"task_id": "t"})
            async with openai.AsyncOpenAI(base_url=proxy.rollout_url(rollout.id), api_key=rollout.token) as c:
                harness = asyncio.ensure_future(asyncio.gather(*(c.chat.completions.create(
                    model="m", messages=user(f"q{i}")) for i in range(3))))
                for _ in range(3):
                    pending = await proxy.store.next_call(rollout.id, timeout=10)
                    q = pending.record.messages[-1]["content"]
                    proxy.store.respond(rollout.id, pending.call_id, f"a{q[1:]}", completion_token_ids=[1, 2])
                answers = await harness
            assert sorted(a.choices[0].message.content for a in answers) == ["a0", "a1", "a2"]
            proxy.store.finish(rollout.id, reward=1.0)
            failed = proxy.store.open("policy")
            proxy.store.finish(failed.id, reward=1.0, error="harness crashed")  # an error wins over a reward
            return rollout.record, failed.record

    record, failed = asyncio.run(main())
    samples = reconstruct(record, gamma=0.5)
    assert [s.reward for s in samples] == [0.25, 0.5, 1.0] and [s.t for s in samples] == [0, 1, 2]
    assert samples[0].completion_token_ids == [1, 2] and samples[0].response["role"] == "assistant"
    assert failed.status == "failed" and failed.reward is None
    assert reconstruct(failed) == [] and drop_errors([record, failed]) == [record]
    trajectory = to_trajectory(record)
    assert trajectory.ok and trajectory.task_id == "t" and len(trajectory.turns) == 3 and trajectory.reward == 1.0
    assert not to_trajectory(failed).ok and drop_errors([trajectory, to_trajectory(failed)]) == [trajectory]


def test_samples_and_export_over_http(admin, proxy, tmp_path):
    rollout = admin.open()
    c = client_for(rollout)
    c.chat.completions.create(model="stub", messages=user("a"))
    with pytest.raises(openai.APIStatusError):
        c.chat.completions.create(model="stub-500", messages=user("b"))
    c.chat.completions.create(model="stub", messages=user("c"))
    assert admin.http.get(f"/rollouts/{rollout['rollout_id']}/samples").status_code == 409  # still open
    admin.finish(rollout["rollout_id"], reward=2.0)
    samples = admin.http.get(f"/rollouts/{rollout['rollout_id']}/samples", params={"gamma": 0.5}).json()
    # the failed call is in the record but is no sample
    assert [(s["t"], s["reward"], s["messages"][-1]["content"]) for s in samples] == [(0, 1.0, "a"), (1, 2.0, "c")]
    crashed = admin.open()
    client_for(crashed).chat.completions.create(model="stub", messages=user("x"))
    admin.finish(crashed["rollout_id"], error="the harness crashed: exit code 3")
    assert admin.http.get(f"/rollouts/{crashed['rollout_id']}/samples").json() == []
    kept = admin.http.get(f"/rollouts/{crashed['rollout_id']}/samples", params={"include_failed": True}).json()
    assert [s["reward"] for s in kept] == [None]

    trajectory = admin.http.get(f"/rollouts/{crashed['rollout_id']}/trajectory").json()
    assert trajectory["error"] == "the harness crashed: exit code 3" and len(trajectory["turns"]) == 1
    lines = admin.http.get("/export", params={"status": "failed"}).text.splitlines()
    assert crashed["rollout_id"] in {json.loads(line)["rollout_id"] for line in lines}
    n = proxy.store.export_jsonl(tmp_path / "all.jsonl")
    records = load_jsonl(tmp_path / "all.jsonl")
    assert len(records) == n and {r.rollout_id for r in records} >= {rollout["rollout_id"], crashed["rollout_id"]}


# ----------------------------------------------------------------------------- the command
def test_orchard_proxy_command(stub):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "orchard_gym.cli", "proxy", "--port", str(port), "--upstream",
                             stub.url, "--admin-key", "sekrit"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        banner = json.loads(proc.stdout.readline())
        assert banner["url"] == f"http://127.0.0.1:{port}" and banner["admin_key"] == "sekrit"
        a = Admin.__new__(Admin)
        a.http = httpx.Client(base_url=banner["url"], headers={"Authorization": "Bearer sekrit"})
        for _ in range(50):
            try:
                rollout = a.open()
                break
            except httpx.ConnectError:
                time.sleep(0.1)
        out = client_for(rollout).chat.completions.create(model="stub", messages=user("cli"))
        assert out.choices[0].message.content == "echo: cli"
        assert len(a.record(rollout["rollout_id"])["calls"]) == 1
        a.http.close()
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(10)


def test_docstring_examples_run():
    import doctest

    from orchard_gym.wrappers.proxy import server as module

    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


def test_chat_text_part_lists_become_one_string_in_the_normal_form():
    """OpenClaw sends user turns as lists of text parts: the normal form (what the policy sees and
    chat templates render) joins them, as the Responses and Messages doors already do; images stay."""
    from orchard_gym.wrappers.proxy.openai_format import CHAT, prompt_of

    image = [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]
    body = {"messages": [{"role": "system", "content": "s"},
                         {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                         {"role": "user", "content": image}], "tools": []}
    messages, _ = prompt_of(CHAT, body)
    assert [m["content"] for m in messages] == ["s", "ab", image]
    assert body["messages"][1]["content"][0] == {"type": "text", "text": "a"}  # the request as sent is untouched


@pytest.mark.parametrize("endpoint", ["chat.completions", "responses"])
def test_a_streamed_answer_is_recorded_before_its_end_reaches_the_harness(endpoint):
    """The harness that has read `data: [DONE]` (or `response.completed`) may ask for the record at
    once: the call must be recorded and closed before that last event leaves the proxy (it was
    recorded after it, and an admin read raced the recording)."""
    from orchard_gym.wrappers.proxy.calls import ModelEndpoints
    from orchard_gym.wrappers.proxy.records import CallRecord, RolloutStore

    if endpoint == "chat.completions":
        events = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": "hi"}}]},
                  {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}, "[DONE]"]
    else:
        events = [{"type": "response.output_text.delta", "delta": "hi"},
                  {"type": "response.completed", "response": {
                      "id": "r1", "object": "response", "status": "completed", "model": "m",
                      "output": [{"type": "message", "role": "assistant", "id": "m1", "status": "completed",
                                  "content": [{"type": "output_text", "text": "hi", "annotations": []}]}]}}]
    body = b"".join(f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n".encode() for e in events)

    async def relay() -> list[tuple[bytes, dict | None, float | None]]:
        endpoints = ModelEndpoints(ProxyConfig(), RolloutStore())
        call = CallRecord(index=0, call_id="c0", endpoint=endpoint, stream=True, request={"model": "m"})
        upstream = httpx.Response(200, content=body)
        seen = []
        async for chunk in endpoints._relay(call, time.monotonic(), upstream):
            seen.append((chunk, call.message, call.latency))  # the record as the harness could read it now
        return seen

    seen = asyncio.run(relay())
    end = b"[DONE]" if endpoint == "chat.completions" else b"response.completed"
    at_end = [(message, latency) for chunk, message, latency in seen if end in chunk]
    assert len(at_end) == 1, seen
    message, latency = at_end[0]
    assert message is not None and "hi" in json.dumps(message) and latency is not None
    assert b"".join(chunk for chunk, _, _ in seen) == body  # the same events, in the same order
