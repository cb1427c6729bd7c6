"""orchard_gym.endpoint, the one model-endpoint client, against a real scripted HTTP server on loopback.

The server answers each request with the next entry of the script of the model named in the
body (or of the route, for GET /models): a status, headers and a body; `HOLD` keeps the
request open until the test ends (a model that never answers).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from orchard_gym import ledger
from orchard_gym.endpoint import Endpoint, EndpointSpec, is_endpoint, parse_spec, retry_after
from orchard_gym.errors import (
    EndpointBadResponse,
    EndpointError,
    EndpointSpecError,
    EndpointStatusError,
    EndpointTimeout,
    EndpointUnreachable,
    InvalidRequest,
    JudgeError,
)
from orchard_gym.retry import RetryPolicy

HOLD = "hold"
FAST = RetryPolicy(attempts=3, initial=0.01, maximum=0.05, deadline=30)


def completion(text: str = "hello", usage: dict | None = None) -> str:
    return json.dumps({"id": "c", "object": "chat.completion", "model": "m",
                       "choices": [{"index": 0, "finish_reason": "stop",
                                    "message": {"role": "assistant", "content": text}}],
                       "usage": usage or {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}})


class Scripted(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.scripts: dict[str, list] = {}
        self.seen: list[tuple[str, str, dict | None, dict]] = []  # (method, path, body, headers)
        self.release = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_port}/v1"


class Handler(BaseHTTPRequestHandler):
    server: Scripted

    def _answer(self, body: dict | None) -> None:
        key = (body or {}).get("model") or self.path
        self.server.seen.append((self.command, self.path, body, dict(self.headers)))
        script = self.server.scripts.get(key) or [(200, {}, completion())]
        entry = script.pop(0) if len(script) > 1 else script[0]
        if entry == HOLD:
            self.server.release.wait(30)
            return
        status, headers, text = entry
        data = text.encode()
        self.send_response(status)
        for k, v in {"Content-Type": "application/json", **headers}.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        self._answer(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))

    def do_GET(self):
        self._answer(None)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = Scripted()
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield httpd
    httpd.release.set()
    httpd.shutdown()
    httpd.server_close()


def run(coro):
    return asyncio.run(coro)


async def chat_once(endpoint: Endpoint, **params):
    try:
        return await endpoint.chat([{"role": "user", "content": "hi"}], **params)
    finally:
        await endpoint.aclose()


# ------------------------------------------------------------------ specs
@pytest.mark.parametrize("spec, url, model", [
    ("http://h:8000/v1#Qwen/Qwen3-8B", "http://h:8000/v1", "Qwen/Qwen3-8B"),
    ("openai:http://h:8000/v1/#m", "http://h:8000/v1", "m"),
    ("https://api.example.com/v1#gpt#x", "https://api.example.com/v1", "gpt#x"),
    ("  http://127.0.0.1:9/v1#m  ", "http://127.0.0.1:9/v1", "m"),
])
def test_every_spec_form_of_today_parses(spec, url, model):
    parsed = parse_spec(spec)
    assert (parsed.url, parsed.model) == (url, model) and is_endpoint(spec)
    assert parsed.route("chat/completions") == f"{url}/chat/completions"


@pytest.mark.parametrize("spec", ["", "no-model-here", "http://h/v1", "http://h/v1#", "ftp://h/v1#m", "http://#m",
                                  "h:8000/v1#m", "http://h/v1?x=1#m", None, 3, "openai:"])
def test_a_bad_spec_is_a_typed_value_error_that_says_the_form(spec):
    with pytest.raises(EndpointSpecError, match="URL#MODEL") as e:
        parse_spec(spec, what="judge=")
    assert isinstance(e.value, ValueError) and isinstance(e.value, InvalidRequest) and "judge=" in str(e.value)


def test_the_model_may_be_left_to_the_server_where_the_caller_allows():
    assert parse_spec("http://h/v1", model_required=False) == EndpointSpec("http://h/v1", None)
    assert str(EndpointSpec("http://h/v1", "m")) == "http://h/v1#m" and not is_endpoint("/models/tiny")
    with pytest.raises(EndpointSpecError):
        Endpoint("http://h/v1#m", timeout=0)


@pytest.mark.parametrize("header, want", [("3", 3.0), ("0.5", 0.5), ("-4", 0.0), (None, None), ("soon", None),
                                          ("nan", None), ("inf", None), (formatdate(0, usegmt=True), 0.0)])
def test_retry_after_values(header, want):
    assert retry_after(header) == want
    later = retry_after(formatdate(time.time() + 120, usegmt=True))
    assert later is not None and 100 < later <= 120


# ------------------------------------------------------------------ answers
def test_chat_sync_and_async_send_the_request_and_charge_the_usage(server):
    ep = Endpoint(f"{server.url}#m", api_key="sk-test", timeout=10, usage_source="judge")
    mine = ledger.Ledger()
    token = ledger.bind(mine)
    try:
        reply = run(chat_once(ep, temperature=0.0, max_tokens=5, tools=None))
        with Endpoint(f"openai:{server.url}#m", timeout=10) as sync:
            again = sync.chat_sync([{"role": "user", "content": "hi"}])
    finally:
        ledger.unbind(token)
    assert reply.content == "hello" and again.content == "hello" and reply.refusal is None
    method, path, body, headers = server.seen[0]
    assert (method, path) == ("POST", "/v1/chat/completions") and headers["Authorization"] == "Bearer sk-test"
    assert body == {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.0, "max_tokens": 5}
    assert (mine.prompt_tokens, mine.completion_tokens, mine.model_calls) == (14, 6, 2)
    assert mine.token_source == "judge"


def test_usage_is_not_charged_where_the_caller_accounts_for_it(server):
    mine = ledger.Ledger()
    token = ledger.bind(mine)
    try:
        run(chat_once(Endpoint(f"{server.url}#m", usage_source=None)))
    finally:
        ledger.unbind(token)
    assert mine.model_calls == 0 and mine.tokens == 0


def test_the_model_is_looked_up_and_completions_are_posted(server):
    server.scripts["/v1/models"] = [(200, {}, json.dumps({"data": [{"id": "served", "object": "model"}]}))]
    server.scripts["served"] = [(200, {}, json.dumps({"choices": [{"index": 0, "text": "x"}]}))]
    ep = Endpoint(server.url, model_required=False)

    async def go():
        try:
            return await ep.completions([[1, 2, 3]], max_tokens=1, prompt_logprobs=0)
        finally:
            await ep.aclose()

    assert run(go())["choices"][0]["text"] == "x" and ep.model == "served"
    assert [s[:2] for s in server.seen] == [("GET", "/v1/models"), ("POST", "/v1/completions")]
    assert server.seen[1][2] == {"model": "served", "prompt": [[1, 2, 3]], "max_tokens": 1, "prompt_logprobs": 0}
    server.scripts["/v1/models"] = [(200, {}, json.dumps({"data": []}))]
    with pytest.raises(EndpointBadResponse, match="lists no model"):
        run(Endpoint(server.url, model_required=False).model_name())


# ------------------------------------------------------------------ garbage in: a typed error
@pytest.mark.parametrize("body, why", [
    ("<html>busy</html>", "no valid JSON"),
    ('{"choices": [{"message": {"content": NaN}}]}', "non-finite number NaN"),
    ('{"choices": [{"message": {"content": "x"}}], "usage": {"prompt_tokens": -Infinity}}', "non-finite"),
    ('{"choices": [{"message": {"content": "x"}}], "score": 1e999}', "non-finite number 1e999"),
    ("[1, 2]", "no object"),
    ('{"choices": []}', "no chat completion"),
    ('{"choices": [{"message": "text"}]}', "no chat completion"),
    ('{"error": "no"}', "no chat completion"),
])
def test_a_2xx_that_is_no_usable_completion_is_a_bad_response(server, body, why):
    server.scripts["m"] = [(200, {}, body)]
    with pytest.raises(EndpointBadResponse, match=why) as e:
        run(chat_once(Endpoint(f"{server.url}#m", retry=FAST)))
    assert isinstance(e.value, ValueError) and e.value.url.endswith("/chat/completions") and len(server.seen) == 1


def test_an_error_status_is_not_retried_except_overload(server):
    server.scripts["m"] = [(500, {}, '{"error": {"message": "boom"}}')]
    with pytest.raises(EndpointStatusError, match="HTTP 500") as e:
        run(chat_once(Endpoint(f"{server.url}#m", retry=FAST)))
    assert e.value.status == 500 and e.value.reason == "answered HTTP 500" and len(server.seen) == 1
    server.scripts["m"] = [(400, {}, "{}")]
    with pytest.raises(EndpointStatusError):
        Endpoint(f"{server.url}#m", retry=FAST).chat_sync([])
    assert len(server.seen) == 2


def test_429_and_503_are_retried_waiting_what_retry_after_asks(server):
    server.scripts["m"] = [(429, {"Retry-After": "1"}, "{}"), (503, {"Retry-After": formatdate(usegmt=True)}, "{}"),
                           (200, {}, completion("finally"))]
    started = time.monotonic()
    reply = run(chat_once(Endpoint(f"{server.url}#m", retry=FAST)))
    assert reply.content == "finally" and len(server.seen) == 3
    assert time.monotonic() - started >= 0.9  # the asked second was waited (FAST alone waits < 0.1 s)
    server.scripts["m"] = [(503, {}, "{}"), (200, {}, completion("sync too"))]
    assert Endpoint(f"{server.url}#m", retry=FAST).chat_sync([]).content == "sync too"


def test_overload_gives_up_after_the_attempts_or_the_deadline(server):
    server.scripts["m"] = [(503, {}, "{}")]
    with pytest.raises(EndpointStatusError) as e:
        run(chat_once(Endpoint(f"{server.url}#m", retry=FAST)))
    assert e.value.status == 503 and len(server.seen) == FAST.attempts
    server.seen.clear()
    server.scripts["m"] = [(429, {"Retry-After": "3600"}, "{}")]
    started = time.monotonic()
    with pytest.raises(EndpointStatusError) as e:
        run(chat_once(Endpoint(f"{server.url}#m", retry=RetryPolicy(attempts=5, deadline=0.3))))
    assert e.value.retry_after == 3600 and time.monotonic() - started < 60  # not the hour asked: the deadline


def test_a_model_that_does_not_answer_times_out_once(server):
    server.scripts["m"] = [HOLD]
    with pytest.raises(EndpointTimeout, match="did not answer within 0.3s") as e:
        run(chat_once(Endpoint(f"{server.url}#m", timeout=0.3, retry=FAST)))
    assert isinstance(e.value, TimeoutError) and len(server.seen) == 1  # a slow model is not asked again


def test_nobody_listening_is_unreachable_after_the_retries():
    probe = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port = probe.server_port
    probe.server_close()  # the port is free now: connections are refused
    with pytest.raises(EndpointUnreachable, match="cannot reach") as e:
        run(chat_once(Endpoint(f"http://127.0.0.1:{port}/v1#m", retry=FAST)))
    assert isinstance(e.value, ConnectionError) and isinstance(e.value, EndpointError)
    with pytest.raises(EndpointUnreachable):
        Endpoint(f"http://127.0.0.1:{port}/v1#m", retry=FAST).chat_sync([])


def test_a_judge_error_names_the_reason_first():
    err = JudgeError.of(EndpointTimeout("http://h:1/v1/chat/completions did not answer within 2s",
                                        reason="did not answer within 2s"))
    assert str(err).split(":")[0] == "the judge failed (did not answer within 2s)"
    assert isinstance(err, RuntimeError)


# ------------------------------------------------------------------ every caller goes through it
def tool_call(name: str, arguments: str) -> str:
    return json.dumps({"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": None,
        "tool_calls": [{"id": "t1", "type": "function", "function": {"name": name, "arguments": arguments}}]}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2}})


def test_the_policies_call_through_the_client(server):
    from orchard_gym.policies import OpenAIPolicy
    from orchard_gym.wrappers.harness.eval import ChatPolicy, policy_from_spec

    server.scripts["m"] = [(429, {"Retry-After": "0"}, "{}"), (200, {}, tool_call("bash", '{"command": "ls"}'))]
    policy = OpenAIPolicy(f"openai:{server.url}#m", api_key="k")
    mine = ledger.Ledger()

    async def act():
        token = ledger.bind(mine)
        try:
            return await policy([{"role": "user", "content": "go"}], [{"type": "function", "function": {"name": "bash"}}])
        finally:
            ledger.unbind(token)
            await policy.aclose()

    assert run(act()) == {"id": "t1", "name": "bash", "arguments": '{"command": "ls"}'}
    assert len(server.seen) == 2 and mine.model_calls == 1 and mine.token_source == "policy"  # the 429 retried
    with pytest.raises(EndpointSpecError, match="URL#MODEL"):
        OpenAIPolicy("http://h/v1")

    harness_policy = policy_from_spec(f"openai:{server.url}#h", api_key="k")
    assert isinstance(harness_policy, ChatPolicy)
    server.scripts["h"] = [(200, {}, completion("done"))]

    async def answer():
        token = ledger.bind(mine)
        try:
            return await harness_policy(None, None, {"messages": [{"role": "user", "content": "x"}],
                                                     "tools": [{"type": "web_search"}]})
        finally:
            ledger.unbind(token)
            await harness_policy.aclose()

    action, tokens = run(answer())
    assert action["content"] == "done" and tokens == {"usage": {"prompt_tokens": 7, "completion_tokens": 3,
                                                                "total_tokens": 10}}
    assert mine.model_calls == 1  # the proxy charges what the policy hands back: not charged twice
    assert "tools" not in server.seen[-1][2]  # hosted tools are no chat tools
    for bad in ("openai:nourl", "openai:http://h/v1", "openai:ftp://h#m"):
        with pytest.raises(ValueError, match="unknown policy"):
            policy_from_spec(bad)


def test_the_judges_turn_endpoint_failures_into_the_one_judge_error(server):
    from orchard_gym.algos import credit, rpr
    from orchard_gym.envs.claw import judge as claw_judge

    assert credit.JudgeError is rpr.JudgeError is claw_judge.JudgeFailed is JudgeError
    server.scripts["nan"] = [(200, {}, '{"choices": [{"message": {"content": "x"}}], "usage": {"x": NaN}}')]
    check = {"type": "judge", "rubric": "r"}
    with pytest.raises(JudgeError, match=r"^the judge at .* failed: EndpointBadResponse: .*non-finite"):
        run(claw_judge.judge(f"{server.url}#nan", None, check, "task", "answer", timeout=5))
    server.scripts["ok"] = [(503, {"Retry-After": "0"}, "{}"),
                            (200, {}, completion('{"verdict": "pass", "reason": "fine"}'))]
    assert run(claw_judge.judge(f"{server.url}#ok", None, check, "task", "answer", timeout=5)) == (True, "fine")
    with pytest.raises(ValueError, match="URL#MODEL"):
        claw_judge.parse_spec("nope")
    assert claw_judge.parse_spec(f"{server.url}#ok") == (f"{server.url}/chat/completions", "ok")

    server.scripts["refuse"] = [(200, {}, json.dumps({"choices": [{"finish_reason": "content_filter",
                                                                     "message": {"content": None}}]}))]
    judge = rpr.ServerJudge(f"{server.url}#refuse", timeout=5)
    with pytest.raises(JudgeError, match="refused: content filter"):
        run(judge.complete([{"role": "user", "content": "x"}]))
    server.scripts["500"] = [(500, {}, "{}")]
    with pytest.raises(JudgeError, match=r"^the judge failed \(answered HTTP 500\)"):
        run(rpr.ServerJudge(f"{server.url}#500", timeout=5).complete([]))
    with pytest.raises(ValueError, match="URL#MODEL"):
        rpr.RPRConfig(judge="openai:http://x/v1")
    assert isinstance(rpr.make_judge(f"openai:{server.url}#m", 5), rpr.ServerJudge)


def test_the_teacher_calls_through_the_client(server):
    from orchard_gym.algos.opd import OPDConfig, ServerTeacher, TeacherError

    server.scripts["/v1/models"] = [(200, {}, json.dumps({"data": [{"id": "t"}]}))]
    lp = [None, {"2": {"logprob": -0.5}}, {"3": {"logprob": -0.25}}]
    server.scripts["t"] = [(502, {}, "{}"), (200, {}, json.dumps({"choices": [{"index": 0, "prompt_logprobs": lp}]}))]
    teacher = ServerTeacher(server.url, batch_size=4)

    async def score():
        try:
            return await teacher.logprobs([[1, 2, 3]], [1])
        finally:
            await teacher.aclose()

    assert run(score()) == [[-0.5, -0.25]] and teacher.model == "t" and teacher.name == f"{server.url}#t"
    server.scripts["t"] = [(200, {}, json.dumps({"choices": [{"index": 0, "prompt_logprobs": [
        None, {"2": {"logprob": -1e999}}, {"3": {"logprob": -0.25}}]}]}))]
    with pytest.raises(TeacherError, match="non-finite"):  # -inf would have passed as a log-prob
        run(ServerTeacher(f"{server.url}#t").logprobs([[1, 2, 3]], [1]))
    with pytest.raises(ValueError, match="http"):
        OPDConfig(teacher="https://#m")
