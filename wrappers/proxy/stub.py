"""A tiny OpenAI-compatible server for tests and benchmarks, on loopback.

    stub = StubUpstream().start()           # a thread of its own; stub.url ends in /v1
    ... http://127.0.0.1:PORT/v1/chat/completions ...
    stub.stop()

It answers deterministically, so tests can check what was recorded. The model name
picks the behaviour:

| model | answer |
|---|---|
| anything else | `echo: <last user text>` |
| `stub-tool` | a call of the request's first tool with `{"echo": <last user text>}` |
| `stub-image` | `images: N` and, per `image_url` part received, its media type, byte count and sha256 prefix |
| `stub-500` / `stub-400` | an OpenAI-shaped error with that status |
| `stub-garbage` | `200` with an HTML body |
| `stub-shape` | `200` with JSON that is no completion |
| `stub-slow-S` | the echo after S seconds |
| `stub-held` | the echo once `stub.release()` was called (at most 600 s later): a model "thinking" for as long as a test needs |
| `stub-broken-stream` | (stream) two chunks, then a line that is no JSON |
| `stub-cut-stream` | (stream) two chunks, then the connection closes |
| `stub-error-stream` | (stream) two chunks, then an OpenAI-shaped error event |
| a name in `scripts` | reply N of that script, N = the assistant messages already in the request |

`StubUpstream(scripts={"oracle": ["first reply", "second reply"]})` makes a scripted policy:
stateless (the conversation says which turn it is), so any client that resends the
conversation replays the script; past its end it answers `script over`.

`stub.received` holds the last 256 chat/Responses request bodies as the stub got them (newest
last), so a test can check what a client really sent (e.g. its image parts).

`"logprobs": true` adds logprobs; `"return_token_ids": true` (vLLM's flag) adds
`prompt_token_ids` and `choices[0].token_ids`. `/v1/responses` echoes too.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import hashlib
import json
import threading
import time
import zlib

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .openai_format import (
    chat_chunks,
    chat_completion,
    error_body,
    prompt_of,
    response_events,
    responses_object,
    sse,
)


def _token_ids(text: str) -> list[int]:
    return [zlib.crc32(w.encode()) % 50_000 for w in text.split()]


def _last_user_text(messages: list[dict]) -> str:
    for m in reversed(messages):
        if m.get("role") in ("user", "tool"):
            content = m.get("content")
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            return str(content or "")
    return ""


def _images_seen(messages: list[dict]) -> str:
    """What the stub received as images: proves a proxy forwarded them byte for byte."""
    seen = []
    for m in messages:
        for part in m.get("content") if isinstance(m.get("content"), list) else []:
            if isinstance(part, dict) and part.get("type") in ("image_url", "input_image"):  # chat / Responses API
                url = part.get("image_url")
                head, _, payload = str(url.get("url", "") if isinstance(url, dict) else url or "").partition(",")
                data = base64.b64decode(payload) if ";base64" in head else payload.encode()
                seen.append(f"{head[5:].split(';')[0]} {len(data)}B {hashlib.sha256(data).hexdigest()[:16]}")
    return f"images: {len(seen)}" + "".join(f"; {s}" for s in seen)


def _answer(body: dict, messages: list[dict], tools: list[dict], scripts: dict[str, list[str]]) -> dict:
    text = _last_user_text(messages)
    if (script := scripts.get(str(body.get("model")))) is not None:
        turn = sum(m.get("role") == "assistant" for m in messages)
        return {"role": "assistant", "content": script[turn] if turn < len(script) else "script over"}
    if body.get("model") == "stub-image":
        return {"role": "assistant", "content": _images_seen(messages)}
    if body.get("model") == "stub-tool" and tools:
        name = tools[0].get("function", tools[0]).get("name", "tool")
        return {"role": "assistant", "content": None, "tool_calls": [{
            "id": f"call_{zlib.crc32(text.encode()):08x}", "type": "function",
            "function": {"name": name, "arguments": json.dumps({"echo": text})}}]}
    return {"role": "assistant", "content": f"echo: {text}"}


def _failure(model: str) -> Response | None:
    if model == "stub-500":
        return JSONResponse(error_body("the stub's engine fell over", "server_error", "internal"), 500)
    if model == "stub-400":
        return JSONResponse(error_body("this model's maximum context length is 8 tokens", "invalid_request_error",
                                       "context_length_exceeded"), 400)
    if model == "stub-garbage":
        return Response("<html><body>502 Bad Gateway</body></html>", 200, media_type="text/html")
    if model == "stub-shape":
        return JSONResponse({"hello": "world"})
    return None


async def chat(request: Request) -> Response:
    body, scripts = await request.json(), request.app.state.scripts
    request.app.state.received.append(body)
    model = str(body.get("model", "stub"))
    if (failed := _failure(model)) is not None:
        return failed
    if model.startswith("stub-slow-"):
        await asyncio.sleep(float(model.rsplit("-", 1)[1]))
    if model == "stub-held":
        await _held(request.app.state.released)
    messages, tools = prompt_of("chat.completions", body)
    message = _answer(body, messages, tools, scripts)
    prompt_text = " ".join(str(m.get("content") or "") for m in messages)
    out_text = message.get("content") or json.dumps(message.get("tool_calls"))
    usage = {"prompt_tokens": len(prompt_text.split()), "completion_tokens": len(out_text.split()),
             "total_tokens": len(prompt_text.split()) + len(out_text.split())}
    extra = {}
    if body.get("logprobs"):
        extra["logprobs"] = {"content": [{"token": w, "logprob": -0.5, "bytes": list(w.encode()), "top_logprobs": []}
                                         for w in out_text.split()]}
    completion = chat_completion(message, model, usage, **extra)
    if body.get("return_token_ids"):
        completion["prompt_token_ids"] = _token_ids(prompt_text)
        completion["choices"][0]["token_ids"] = _token_ids(out_text)
    if not body.get("stream"):
        return JSONResponse(completion)
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

    async def events():
        chunks = list(chat_chunks(completion))
        if not include_usage and chunks and not chunks[-1]["choices"]:
            chunks.pop()
        if body.get("return_token_ids"):
            chunks[0]["prompt_token_ids"] = completion["prompt_token_ids"]
            chunks[1]["choices"][0]["token_ids"] = completion["choices"][0]["token_ids"]
        if body.get("logprobs"):
            chunks[1]["choices"][0]["logprobs"] = completion["choices"][0]["logprobs"]
        for i, chunk in enumerate(chunks):
            if i == 2 and model == "stub-broken-stream":
                yield b"data: {this is not json\n\n"
                return
            if i == 2 and model == "stub-error-stream":
                yield sse(error_body("the stub's engine fell over mid-stream", "server_error", "internal"))
                return
            if i == 2 and model == "stub-cut-stream":
                raise RuntimeError("the stub cuts the stream")  # uvicorn drops the connection
            yield sse(chunk)
        yield sse("[DONE]")

    return StreamingResponse(events(), media_type="text/event-stream")


HELD_AT_MOST = 600.0  # seconds a `stub-held` answer waits for release()


async def _held(released: threading.Event) -> None:
    deadline = time.monotonic() + HELD_AT_MOST
    while not released.is_set() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


async def responses(request: Request) -> Response:
    body, scripts = await request.json(), request.app.state.scripts
    request.app.state.received.append(body)
    model = str(body.get("model", "stub"))
    if (failed := _failure(model)) is not None:
        return failed
    messages, tools = prompt_of("responses", body)
    message = _answer(body, messages, tools, scripts)
    words = len(" ".join(str(m.get("content") or "") for m in messages).split())
    usage = {"prompt_tokens": words, "completion_tokens": 3, "total_tokens": words + 3}
    response = responses_object(message, model, usage, body)
    if not body.get("stream"):
        return JSONResponse(response)

    async def events():
        for event in response_events(response):
            yield sse(event, event["type"])

    return StreamingResponse(events(), media_type="text/event-stream")


async def models(request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [{"id": "stub", "object": "model", "owned_by": "stub"}]})


RECEIVED = 256  # request bodies kept in app.state.received (a bound: benchmarks send thousands)


def create_stub_app(scripts: dict[str, list[str]] | None = None) -> Starlette:
    """The stub's app; `scripts` maps model names to scripted replies (module doc)."""
    if not isinstance(scripts or {}, dict) or not all(
            isinstance(r, list) and all(isinstance(x, str) for x in r) for r in (scripts or {}).values()):
        raise TypeError("scripts must map model names to lists of reply strings")
    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]),
                            Route("/v1/responses", responses, methods=["POST"]),
                            Route("/v1/models", models, methods=["GET"])])
    app.state.scripts = dict(scripts or {})
    app.state.received = collections.deque(maxlen=RECEIVED)
    app.state.released = threading.Event()  # set by StubUpstream.release(): `stub-held` answers
    return app


class StubUpstream:
    """The stub on 127.0.0.1 (any free port), served by uvicorn on a thread of its own."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, scripts: dict[str, list[str]] | None = None):
        from .server import ProxyConfig, RecordingProxy

        # reuse the proxy's server plumbing: same uvicorn, same socket handling
        self._runner = RecordingProxy(ProxyConfig(host=host, port=port))
        self._runner.app = create_stub_app(scripts)

    @property
    def url(self) -> str:
        return f"http://{self._runner.config.host}:{self._runner.port}/v1"

    @property
    def received(self) -> list[dict]:
        """The last RECEIVED request bodies the stub got, oldest first."""
        return list(self._runner.app.state.received)

    def release(self) -> None:
        """Let every `stub-held` request answer, those waiting and those to come."""
        self._runner.app.state.released.set()

    def start(self) -> StubUpstream:
        self._runner.start_in_thread()
        return self

    async def astart(self) -> StubUpstream:
        await self._runner.start()
        return self

    async def astop(self) -> None:
        await self._runner.stop()

    def stop(self) -> None:
        self._runner.stop_in_thread()

    def __enter__(self) -> StubUpstream:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    """`python -m orchard_gym.wrappers.proxy.stub --port 8200`: serve the stub in the foreground."""
    import argparse

    import uvicorn

    parser = argparse.ArgumentParser(description="a tiny OpenAI-compatible stub server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8200)
    args = parser.parse_args(argv)
    uvicorn.run(create_stub_app(), host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
