"""The recording proxy's Anthropic Messages door, driven with the official `anthropic`
client (and raw HTTP where the client hides the wire), against the stub upstream (which
speaks chat completions only: the door translates) and in policy mode. Also the Responses
door's tool calls through the official `openai` client's Responses API."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from conftest import require_module

anthropic = require_module("anthropic", "anthropic")
openai = require_module("openai", "openai")
require_module("server", "fastapi")

from orchard_gym.wrappers.proxy import ProxyConfig, RecordingProxy  # noqa: E402
from orchard_gym.wrappers.proxy.reconstruct import reconstruct  # noqa: E402
from orchard_gym.wrappers.proxy.records import RolloutRecord  # noqa: E402
from orchard_gym.wrappers.proxy.stub import StubUpstream  # noqa: E402

BASH = {"name": "bash", "description": "run a command",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="


@pytest.fixture(scope="module")
def proxy():
    stub = StubUpstream().start()
    p = RecordingProxy(ProxyConfig(upstream=stub.url, upstream_timeout=5.0)).start_in_thread()
    yield p
    p.stop_in_thread()
    stub.stop()


@pytest.fixture(scope="module")
def admin(proxy):
    with httpx.Client(base_url=proxy.url, headers={"Authorization": f"Bearer {proxy.admin_key}"}, timeout=30) as h:
        yield h


def open_rollout(admin, **body) -> dict:
    r = admin.post("/rollouts", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def record(admin, rollout: dict) -> dict:
    return admin.get(f"/rollouts/{rollout['rollout_id']}").json()


def claude(proxy, rollout: dict, **kw) -> anthropic.Anthropic:
    # Claude Code's way: ANTHROPIC_BASE_URL is the rollout's root (the client adds /v1/messages)
    return anthropic.Anthropic(base_url=f"{proxy.url}/r/{rollout['rollout_id']}", api_key=rollout["token"],
                               max_retries=0, **kw)


def test_messages_whole_and_streamed_are_recorded_as_chat_samples(proxy, admin):
    rollout = open_rollout(admin)
    c = claude(proxy, rollout)
    msg = c.messages.create(model="stub", max_tokens=64, stop_sequences=["###"], system="be brief",
                            messages=[{"role": "user", "content": "hello there"}])
    assert msg.type == "message" and msg.role == "assistant" and msg.stop_reason == "end_turn"
    assert [b.type for b in msg.content] == ["text"] and msg.content[0].text == "echo: hello there"
    assert msg.usage.input_tokens > 0 and msg.usage.output_tokens == 3
    with c.messages.stream(model="stub", max_tokens=64, system=[{"type": "text", "text": "be brief"}],
                           messages=[{"role": "user", "content": [{"type": "text", "text": "streamed words"}]}]) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == final.content[0].text == "echo: streamed words" and final.stop_reason == "end_turn"
    assert final.usage.output_tokens == 3

    # a 'system' turn inside messages (Claude Code 2.1 sends its environment notes that way)
    turns = [{"role": "user", "content": "task"}, {"role": "system", "content": [{"type": "text", "text": "env: linux"}]},
             {"role": "user", "content": "go"}]
    assert c.messages.create(model="stub", max_tokens=8, messages=turns).content[0].text == "echo: go"

    first, second, third = record(admin, rollout)["calls"]
    assert third["messages"] == [{"role": "user", "content": "task"}, {"role": "system", "content": "env: linux"},
                                 {"role": "user", "content": "go"}]
    assert first["endpoint"] == second["endpoint"] == "messages" and second["stream"] and not first["stream"]
    assert first["request"]["stop_sequences"] == ["###"] and first["request"]["system"] == "be brief"  # as the harness sent it
    assert first["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    assert second["messages"] == first["messages"][:1] + [{"role": "user", "content": "streamed words"}]
    assert first["message"] == {"role": "assistant", "content": "echo: hello there"}
    assert first["response"]["type"] == "message" and first["response"]["content"][0]["text"] == "echo: hello there"
    assert second["message"]["content"] == "echo: streamed words" and second["finish_reason"] == "end_turn"
    assert first["usage"]["completion_tokens"] == 3 and second["usage"]["completion_tokens"] == 3


def test_wire_events_of_a_streamed_tool_call(proxy, admin):
    rollout = open_rollout(admin)
    r = httpx.post(f"{proxy.url}/r/{rollout['rollout_id']}/v1/messages",
                   headers={"x-api-key": rollout["token"], "anthropic-version": "2023-06-01"},
                   json={"model": "stub-tool", "max_tokens": 64, "stream": True, "tools": [BASH],
                         "messages": [{"role": "user", "content": "list files"}]})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [(b.split("\n")[0].removeprefix("event: "), json.loads(b.split("\n")[1].removeprefix("data: ")))
              for b in r.text.strip().split("\n\n")]
    assert [name for name, _ in events] == ["message_start", "ping", "content_block_start", "content_block_delta",
                                            "content_block_stop", "message_delta", "message_stop"]
    assert all(name == data["type"] for name, data in events)
    start, delta = events[2][1], events[3][1]
    assert start["content_block"]["type"] == "tool_use" and start["content_block"]["name"] == "bash"
    assert delta["delta"] == {"type": "input_json_delta", "partial_json": '{"echo": "list files"}'}
    assert events[5][1]["delta"]["stop_reason"] == "tool_use" and events[5][1]["usage"]["output_tokens"] > 0


@pytest.mark.parametrize("stream", [False, True])
def test_tool_use_round_trip(proxy, admin, stream):
    rollout = open_rollout(admin)
    c = claude(proxy, rollout)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}
    ask = [{"role": "user", "content": [{"type": "text", "text": "list files"}, image]}]
    if stream:
        with c.messages.stream(model="stub-tool", max_tokens=64, tools=[BASH], messages=ask) as s:
            first = s.get_final_message()
    else:
        first = c.messages.create(model="stub-tool", max_tokens=64, tools=[BASH], tool_choice={"type": "any"},
                                  messages=ask)
    (use,) = first.content
    assert first.stop_reason == "tool_use" and use.type == "tool_use" and use.name == "bash"
    assert use.input == {"echo": "list files"}
    history = ask + [{"role": "assistant", "content": [b.model_dump() for b in first.content]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                   "content": [{"type": "text", "text": "a.txt b.txt"}]}]}]
    second = c.messages.create(model="stub", max_tokens=64, tools=[BASH], messages=history)
    assert second.content[0].text == "echo: a.txt b.txt"

    calls = record(admin, rollout)["calls"]
    assert calls[0]["tools"] == [{"type": "function", "function": {"name": "bash", "description": "run a command",
                                                                   "parameters": BASH["input_schema"]}}]
    assert calls[0]["message"]["tool_calls"][0]["function"] == {"name": "bash", "arguments": '{"echo": "list files"}'}
    assert calls[0]["finish_reason"] == "tool_use"
    if not stream:
        assert calls[0]["request"]["tool_choice"] == {"type": "any"}
    # the harness's context for call 2, chat-style: the image it sent, its tool call, the tool's answer
    assert calls[1]["messages"][0] == {"role": "user", "content": [
        {"type": "text", "text": "list files"}, {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}]}
    assert calls[1]["messages"][1]["tool_calls"][0]["id"] == use.id
    assert calls[1]["messages"][2] == {"role": "tool", "tool_call_id": use.id, "content": "a.txt b.txt"}


def test_policy_mode_answers_reach_the_client_as_messages(proxy, admin):
    rollout = open_rollout(admin, mode="policy")
    c = claude(proxy, rollout)
    got: dict = {}

    def harness():
        with c.messages.stream(model="claude-x", max_tokens=100, tools=[BASH],
                               messages=[{"role": "user", "content": "fix it"}]) as s:
            got["first"] = s.get_final_message()
        got["second"] = c.messages.create(model="claude-x", max_tokens=100, messages=[{"role": "user", "content": "ok?"}])

    t = threading.Thread(target=harness)
    t.start()
    pending = admin.get(f"/rollouts/{rollout['rollout_id']}/next", params={"timeout": 20}).json()
    assert pending["endpoint"] == "messages" and pending["messages"] == [{"role": "user", "content": "fix it"}]
    assert pending["tools"][0]["function"]["name"] == "bash"
    answer = {"role": "assistant", "content": "Running it.",
              "tool_calls": [{"name": "bash", "arguments": {"command": "ls -la"}}]}
    assert admin.post(f"/rollouts/{rollout['rollout_id']}/calls/{pending['call_id']}/respond",
                      json={"message": answer}).status_code == 200
    pending = admin.get(f"/rollouts/{rollout['rollout_id']}/next", params={"timeout": 20}).json()
    admin.post(f"/rollouts/{rollout['rollout_id']}/calls/{pending['call_id']}/respond", json={"message": "all good"})
    t.join(20)
    first, second = got["first"], got["second"]
    assert [b.type for b in first.content] == ["text", "tool_use"] and first.stop_reason == "tool_use"
    assert first.content[0].text == "Running it." and first.content[1].input == {"command": "ls -la"}
    assert first.model == "claude-x" and second.content[0].text == "all good" and second.stop_reason == "end_turn"
    assert admin.post(f"/rollouts/{rollout['rollout_id']}/finish", json={"reward": 1.0}).status_code == 200
    rec = RolloutRecord.model_validate(record(admin, rollout))
    samples = reconstruct(rec)
    assert [s.endpoint for s in samples] == ["messages", "messages"] and [s.reward for s in samples] == [1.0, 1.0]
    assert samples[0].response["tool_calls"][0]["function"]["arguments"] == '{"command": "ls -la"}'
    assert rec.calls[0].response["content"][1]["type"] == "tool_use"


@pytest.mark.parametrize("model, status, error, words", [
    ("stub-500", 502, anthropic.InternalServerError, "the upstream answered 500"),
    ("stub-400", 400, anthropic.BadRequestError, "maximum context length"),
    ("stub-garbage", 502, anthropic.InternalServerError, "not valid"),
])
def test_upstream_failures_come_back_in_anthropics_error_shape(proxy, admin, model, status, error, words):
    rollout = open_rollout(admin)
    with pytest.raises(error) as e:
        claude(proxy, rollout).messages.create(model=model, max_tokens=8, messages=[{"role": "user", "content": "x"}])
    assert e.value.status_code == status and e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == ("invalid_request_error" if status == 400 else "api_error")
    assert words in e.value.body["error"]["message"]
    (call,) = record(admin, rollout)["calls"]
    assert call["status_code"] == status and words in call["error"] and call["message"] is None


@pytest.mark.parametrize("model, words", [("stub-broken-stream", "not JSON"),
                                          ("stub-error-stream", "engine fell over mid-stream")])
def test_broken_upstream_stream_ends_with_an_error_event(proxy, admin, model, words):
    rollout = open_rollout(admin)
    with pytest.raises(anthropic.APIStatusError, match=words):
        with claude(proxy, rollout).messages.stream(model=model, max_tokens=8,
                                                    messages=[{"role": "user", "content": "x"}]) as s:
            s.get_final_message()
    (call,) = record(admin, rollout)["calls"]
    assert words in call["error"] and call["message"] is None


def test_auth_garbage_and_the_other_endpoints(proxy, admin):
    rollout, other = open_rollout(admin), open_rollout(admin)
    ask = {"model": "stub", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]}
    with pytest.raises(anthropic.AuthenticationError) as e:  # another rollout's token
        anthropic.Anthropic(base_url=f"{proxy.url}/r/{other['rollout_id']}", api_key=rollout["token"],
                            max_retries=0).messages.create(**ask)
    assert e.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.NotFoundError, match="no rollout 'nope'"):
        anthropic.Anthropic(base_url=f"{proxy.url}/r/nope", api_key="x", max_retries=0).messages.create(**ask)
    # the rollout token as a bearer token (ANTHROPIC_AUTH_TOKEN) works too
    bearer = anthropic.Anthropic(base_url=f"{proxy.url}/r/{rollout['rollout_id']}", auth_token=rollout["token"],
                                 max_retries=0)
    assert bearer.messages.create(**ask).content[0].text == "echo: x"
    c = claude(proxy, rollout)
    assert c.messages.count_tokens(model="stub", messages=[{"role": "user", "content": "count me"}]).input_tokens > 0
    assert [m.id for m in c.models.list()] == ["orchard-policy"]
    assert c.models.retrieve("claude-sonnet-4-5").id == "claude-sonnet-4-5"

    url = f"{proxy.url}/r/{rollout['rollout_id']}/v1"
    headers = {"x-api-key": rollout["token"], "anthropic-version": "2023-06-01"}
    for body, words in [(b"{not json", "bad request"), (b"[1, 2]", "JSON object"),
                        (json.dumps({**ask, "max_tokens": 0}).encode(), "max_tokens"),
                        (json.dumps({**ask, "messages": [{"role": "tool", "content": "x"}]}).encode(), "role"),
                        (json.dumps({**ask, "messages": [{"role": "user", "content": [7]}]}).encode(), "block"),
                        (json.dumps({k: v for k, v in ask.items() if k != "model"}).encode(), "model")]:
        r = httpx.post(f"{url}/messages", content=body, headers=headers)
        assert r.status_code == 400 and r.json()["type"] == "error", r.text
        assert r.json()["error"]["type"] == "invalid_request_error" and words in r.json()["error"]["message"]
    r = httpx.post(f"{url}/messages/count_tokens", content=b'{"messages": 3}', headers=headers)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(f"{url}/no/such/thing", json={}, headers=headers)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    rec = record(admin, rollout)
    assert len(rec["calls"]) == 1  # refused requests are no calls, but each is noted
    assert len(rec["rejected"]) == 8 and "no such endpoint: POST /v1/no/such/thing" in rec["rejected"][-1]["reason"]
    admin.post(f"/rollouts/{rollout['rollout_id']}/finish", json={"reward": 0.0})
    with pytest.raises(anthropic.ConflictError, match="is finished"):
        c.messages.create(**ask)


# ----------------------------------------------------------------------------- the Responses door's tools
@pytest.mark.parametrize("stream", [False, True])
def test_responses_api_tool_call_round_trip(proxy, admin, stream):
    rollout = open_rollout(admin)
    c = openai.OpenAI(base_url=rollout["base_url"], api_key=rollout["token"], max_retries=0)
    tools = [{"type": "function", "name": "bash", "parameters": BASH["input_schema"]}]
    if stream:
        with c.responses.stream(model="stub-tool", input="list files", tools=tools) as s:
            kinds = {e.type for e in s}
            first = s.get_final_response()
        assert "response.function_call_arguments.delta" in kinds
    else:
        first = c.responses.create(model="stub-tool", input="list files", tools=tools)
    (fc,) = [item for item in first.output if item.type == "function_call"]
    assert fc.name == "bash" and json.loads(fc.arguments) == {"echo": "list files"}
    second = c.responses.create(model="stub", tools=tools, input=[
        {"role": "user", "content": "list files"}, fc.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": fc.call_id, "output": "a.txt"}])
    assert second.output_text == "echo: a.txt"
    calls = record(admin, rollout)["calls"]
    assert calls[0]["message"]["tool_calls"][0]["function"]["name"] == "bash" and calls[0]["stream"] is stream
    assert calls[1]["messages"][-1] == {"role": "tool", "tool_call_id": fc.call_id, "content": "a.txt"}
