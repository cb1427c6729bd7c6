"""The recording proxy: OpenAI-compatible model endpoints per rollout, recorded.

    orchard proxy --port 8100 --upstream http://localhost:8000/v1     # upstream mode

A harness gets `base_url = http://PROXY/r/<rollout_id>/v1` and `api_key = <rollout token>`
and calls `/chat/completions` (streaming or not, tools, tool_choice), `/responses` or
`/models` there. In **upstream** mode the proxy forwards each call to an OpenAI-compatible
server and records request, response, token ids and logprobs (when the upstream returns
them), usage and timings. In **policy** mode the call is parked until the trainer/eval
loop answers it (`RolloutStore.next_call` / `respond`, or the control API's
`/rollouts/{id}/next` and `/respond`): that is how `HarnessEnv` turns a harness into an env.

The control API (`/rollouts...`, `/export`) needs the admin key; model endpoints need the
rollout's own token, so a sandbox can neither read nor write another rollout's records.
When the proxy also listens on a unix socket (`uds`), that socket serves only the model
endpoints and `/health`: it is what sandboxes reach (see `wrappers/relay.py`).
See docs/recording.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import secrets
import socket
import threading
import time
from typing import Any

import httpx
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from .openai_format import (
    CHAT,
    RESPONSES,
    ChatStreamAssembler,
    FormatError,
    assistant_message,
    chat_chunks,
    chat_completion,
    check_chat_completion,
    check_request,
    check_response,
    error_body,
    estimate_usage,
    message_of_response,
    response_events,
    responses_object,
    sse,
    tokens_of,
    usage_of_response,
)
from .records import CallRecord, Mode, Rollout, RolloutClosed, RolloutNotFound, RolloutStore

log = logging.getLogger("orchard_gym.proxy")


class ProxyConfig(BaseModel):
    """How the proxy listens and where (if anywhere) it forwards."""

    model_config = ConfigDict(extra="forbid")

    host: str = Field("127.0.0.1", description="TCP address to listen on")
    port: int = Field(0, ge=0, le=65535, description="TCP port (0: any free port)")
    uds: str | None = Field(None, description="also listen on this unix socket (model endpoints only)")
    upstream: str | None = Field(None, description="OpenAI-compatible base URL, e.g. http://localhost:8000/v1")
    upstream_api_key: str | None = Field(None, description="API key for the upstream (never the rollout token)")
    upstream_model: str | None = Field(None, description="model name sent upstream instead of the harness's")
    upstream_timeout: float = Field(600.0, gt=0, description="seconds for one upstream call")
    admin_key: str | None = Field(None, description="key of the control API (generated when absent)")
    public_url: str | None = Field(None, description="base of the URLs handed out (default http://HOST:PORT)")
    model_name: str = Field("orchard-policy", description="the model /v1/models lists in policy mode")
    policy_timeout: float | None = Field(None, gt=0, description="seconds a parked call waits for the policy")


class OpenRollout(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: Mode | None = Field(None, description="default: upstream when the proxy has one, else policy")
    metadata: dict[str, Any] = Field(default_factory=dict)
    rollout_id: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]{1,128}$")


class FinishRollout(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reward: float | None = None
    error: str | None = Field(None, min_length=1)


class Answer(BaseModel):
    model_config = ConfigDict(extra="forbid")

    message: Any = Field(description="the assistant message: text, a tool call, a list of them, or a message dict")
    usage: dict[str, Any] | None = None
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[dict[str, Any]] | None = None


def _bearer(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return request.headers.get("api-key")


def _error(status: int, message: str, code: str, type_: str = "invalid_request_error", **extra) -> JSONResponse:
    return JSONResponse(error_body(message, type_, code, **extra), status_code=status)


class _Model:
    """The model endpoints' logic, bound to one store and one upstream client."""

    def __init__(self, config: ProxyConfig, store: RolloutStore):
        self.config = config
        self.store = store
        self.http: httpx.AsyncClient | None = None
        if config.upstream:
            headers = {"Authorization": f"Bearer {config.upstream_api_key}"} if config.upstream_api_key else {}
            self.http = httpx.AsyncClient(base_url=config.upstream.rstrip("/"), headers=headers,
                                          timeout=httpx.Timeout(config.upstream_timeout, connect=10.0),
                                          limits=httpx.Limits(max_connections=1024, max_keepalive_connections=256))

    # ------------------------------------------------------------------ entry
    async def call(self, request: Request, rollout_id: str, endpoint: str) -> Response:
        arrived = time.monotonic()
        try:
            rollout = self.store.get(rollout_id)
        except RolloutNotFound as e:
            return _error(404, str(e), "rollout_not_found")
        if not rollout.check_token(_bearer(request)):
            rollout.reject("missing or wrong rollout token", request.url.path)
            return _error(401, "missing or wrong rollout token (Authorization: Bearer <token>)", "invalid_api_key",
                          "authentication_error")
        if rollout.record.status != "open":
            rollout.reject(f"request after the rollout was {rollout.record.status}", request.url.path)
            return _error(409, f"rollout {rollout_id} is {rollout.record.status}; it takes no more calls",
                          "rollout_finished")
        try:
            body = check_request(endpoint, json.loads(await request.body()))
        except (ValueError, FormatError) as e:
            rollout.reject(f"bad request: {e}", request.url.path)
            return _error(400, f"bad request: {e}", "bad_request")
        call = rollout.new_call(endpoint, body, bool(body.get("stream")))
        if rollout.record.mode == "policy":
            return await self._from_policy(request, rollout, call, arrived)
        if self.http is None:
            return self._fail(call, arrived, 503, "this proxy has no upstream; open the rollout in policy mode",
                              "no_upstream")
        return await self._from_upstream(call, arrived)

    def _fail(self, call: CallRecord, arrived: float, status: int, message: str, code: str,
              type_: str = "proxy_error") -> JSONResponse:
        call.error, call.status_code = message, status
        self._close(call, arrived)
        return _error(status, message, code, type_)

    @staticmethod
    def _close(call: CallRecord, arrived: float) -> None:
        call.ended_at = time.time()
        call.latency = time.monotonic() - arrived

    def _record(self, call: CallRecord, data: dict) -> None:
        """Keep a whole (or assembled) upstream/policy answer on the call."""
        call.response, call.status_code = data, 200
        if call.endpoint == CHAT:
            choice = data["choices"][0]
            call.message, call.finish_reason = choice.get("message"), choice.get("finish_reason")
            call.usage = data.get("usage")
            tokens = tokens_of(data)
            call.prompt_token_ids = call.prompt_token_ids or tokens["prompt_token_ids"]
            call.completion_token_ids = call.completion_token_ids or tokens["completion_token_ids"]
            call.logprobs = call.logprobs or tokens["logprobs"]
        else:
            call.message, call.usage = message_of_response(data), usage_of_response(data)
            call.finish_reason = data.get("status")

    # ------------------------------------------------------------------ upstream mode
    async def _from_upstream(self, call: CallRecord, arrived: float) -> Response:
        path = "/chat/completions" if call.endpoint == CHAT else "/responses"
        body = dict(call.request)
        if self.config.upstream_model:
            body["model"] = self.config.upstream_model
        sent = time.monotonic()
        try:
            resp = await self.http.send(self.http.build_request("POST", path, json=body), stream=call.stream)
        except httpx.TimeoutException as e:
            return self._fail(call, arrived, 504, f"the upstream timed out ({type(e).__name__})", "upstream_timeout")
        except httpx.HTTPError as e:
            return self._fail(call, arrived, 502, f"cannot reach the upstream: {type(e).__name__}: {e}",
                              "upstream_unreachable")
        if resp.status_code >= 400 or "text/event-stream" not in resp.headers.get("content-type", ""):
            try:
                raw = await resp.aread()
            except httpx.HTTPError as e:
                await resp.aclose()
                return self._fail(call, arrived, 502, f"the upstream's answer broke off: {type(e).__name__}: {e}",
                                  "upstream_unreachable")
            await resp.aclose()
            call.upstream_latency = time.monotonic() - sent
            return self._whole_answer(call, arrived, resp.status_code, raw)
        call.upstream_latency = time.monotonic() - sent  # to the headers; the stream follows
        return StreamingResponse(self._relay(call, arrived, resp), media_type="text/event-stream",
                                 headers={"cache-control": "no-cache", "x-accel-buffering": "no"})

    def _whole_answer(self, call: CallRecord, arrived: float, status: int, raw: bytes) -> Response:
        text = raw.decode("utf-8", "replace")
        if status >= 400:
            try:
                upstream_error = json.loads(text)
            except ValueError:
                upstream_error = None
            message = f"the upstream answered {status}: {text[:500]}"
            if 400 <= status < 500 and isinstance(upstream_error, dict) and "error" in upstream_error:
                call.error, call.status_code = message, status  # the harness's own mistake: pass it through
                self._close(call, arrived)
                return JSONResponse(upstream_error, status_code=status)
            return self._fail(call, arrived, 502 if status >= 500 else status, message, "upstream_error")
        try:
            data = json.loads(text)
            data = check_chat_completion(data) if call.endpoint == CHAT else check_response(data)
        except (ValueError, FormatError) as e:
            return self._fail(call, arrived, 502, f"the upstream's answer is not valid: {e}; it began {text[:200]!r}",
                              "upstream_bad_response")
        self._record(call, data)
        call.time_to_first_byte = time.monotonic() - arrived
        if call.stream:  # the upstream ignored stream=true: stream its whole answer ourselves
            self._close(call, arrived)
            return StreamingResponse(self._replay(call, data), media_type="text/event-stream")
        self._close(call, arrived)
        return Response(raw, media_type="application/json")  # the upstream's own bytes

    async def _relay(self, call: CallRecord, arrived: float, resp: httpx.Response):
        """Pass the upstream's SSE events through as they come (whole events only, all those
        of one read in one write), assembling the whole answer."""
        assembler = ChatStreamAssembler() if call.endpoint == CHAT else None
        final: dict | None = None
        buffer = b""
        try:
            async for raw in resp.aiter_bytes():
                if call.time_to_first_byte is None:
                    call.time_to_first_byte = time.monotonic() - arrived
                buffer = (buffer + raw).replace(b"\r\n", b"\n")
                out = []
                while (end := buffer.find(b"\n\n")) >= 0:
                    block, buffer = buffer[:end], buffer[end + 2:]
                    if not block.strip():
                        continue
                    final = self._parse_event(call, block.decode("utf-8", "replace").split("\n"), assembler) or final
                    out.append(block + b"\n\n")
                    if call.error:
                        break
                if out:
                    yield b"".join(out)
                if call.error:
                    return
            if buffer.strip():
                final = self._parse_event(call, buffer.decode("utf-8", "replace").split("\n"), assembler) or final
                yield buffer + b"\n\n"
            if call.error is None:
                if assembler is not None:
                    if assembler.chunks == 0:
                        raise FormatError("the upstream's stream ended before any chunk")
                    self._record(call, assembler.result())
                elif final is None:
                    raise FormatError("the upstream's stream ended without response.completed")
                else:
                    self._record(call, final)
        except (httpx.HTTPError, FormatError) as e:
            why = f"the upstream's stream broke: {type(e).__name__}: {e}"
            call.error, call.status_code = why, 502
            yield sse(error_body(why, "proxy_error", "upstream_stream_error"), "error" if assembler is None else None)
        except (asyncio.CancelledError, GeneratorExit):
            call.error = call.error or "the harness disconnected mid-stream"
            raise
        finally:
            await resp.aclose()
            self._close(call, arrived)

    @staticmethod
    def _parse_event(call: CallRecord, event: list[str], assembler: ChatStreamAssembler | None) -> dict | None:
        data = "\n".join(line[5:].lstrip() for line in event if line.startswith("data:"))
        if not data or data == "[DONE]":
            return None
        try:
            obj = json.loads(data)
        except ValueError:
            raise FormatError(f"a stream event is not JSON: {data[:200]!r}") from None
        if isinstance(obj, dict) and obj.get("error") and obj.get("type") != "response.completed":
            call.error, call.status_code = f"the upstream sent an error mid-stream: {json.dumps(obj)[:500]}", 502
            return None
        if assembler is not None:
            assembler.feed(obj)
            return None
        if isinstance(obj, dict) and obj.get("type") == "response.completed":
            return check_response(obj.get("response"))
        if isinstance(obj, dict) and obj.get("type") == "response.failed":
            call.error, call.status_code = f"the upstream's response failed: {json.dumps(obj)[:500]}", 502
        return None

    async def _replay(self, call: CallRecord, data: dict):
        if call.endpoint == CHAT:
            for chunk in chat_chunks(data):
                yield sse(chunk)
            yield sse("[DONE]")
        else:
            for event in response_events(data):
                yield sse(event, event["type"])

    # ------------------------------------------------------------------ policy mode
    async def _from_policy(self, request: Request, rollout: Rollout, call: CallRecord, arrived: float) -> Response:
        pending = self.store.park(rollout, call)
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({pending.future, gone}, timeout=self.config.policy_timeout,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        call.upstream_latency = time.monotonic() - arrived
        if not pending.future.done():
            rollout.parked.pop(call.call_id, None)
            pending.future.cancel()
            if gone.done() and not gone.cancelled():
                call.error, call.status_code = "the harness disconnected while waiting for the policy", 499
                self._close(call, arrived)
                return Response(status_code=499)
            return self._fail(call, arrived, 504, f"no answer from the policy within {self.config.policy_timeout}s",
                              "policy_timeout")
        try:
            answer, extra = pending.future.result()
            message = assistant_message(answer)
        except RolloutClosed as e:
            return self._fail(call, arrived, 409, f"{e}; it takes no more calls", "rollout_finished")
        except FormatError as e:
            return self._fail(call, arrived, 500, f"the policy's answer is not an assistant message: {e}",
                              "policy_bad_answer")
        usage = extra.get("usage") or estimate_usage(call.messages, message)
        model = call.request.get("model") or self.config.model_name
        call.prompt_token_ids = extra.get("prompt_token_ids")
        call.completion_token_ids = extra.get("completion_token_ids")
        call.logprobs = extra.get("logprobs")
        if call.endpoint == CHAT:
            logprobs = {"content": call.logprobs} if call.logprobs else None
            data = chat_completion(message, model, usage, logprobs=logprobs)
        else:
            data = responses_object(message, model, usage, call.request)
        self._record(call, data)
        call.time_to_first_byte = time.monotonic() - arrived
        self._close(call, arrived)
        if call.stream:
            return StreamingResponse(self._replay(call, data), media_type="text/event-stream")
        return JSONResponse(data)

    async def aclose(self) -> None:
        if self.http is not None:
            await self.http.aclose()


async def _disconnected(request: Request) -> None:
    """Returns when the client hangs up (the body has been read, so only that can come)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


class _UnixSocketGuard:
    """Over the unix socket (what sandboxes reach) only model endpoints and /health exist."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            server = scope.get("server")
            over_uds = server is None or server[1] is None
            path = scope.get("path", "")
            if over_uds and not (path.startswith("/r/") or path == "/health"):
                await JSONResponse(error_body("not found", "invalid_request_error", "not_found"),
                                   status_code=404)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(config: ProxyConfig | None = None, store: RolloutStore | None = None) -> FastAPI:
    """The proxy's ASGI app. `app.state.store` holds the rollouts, `app.state.config` the config
    (its `admin_key` filled in when it was absent)."""
    config = (config or ProxyConfig()).model_copy()
    config.admin_key = config.admin_key or secrets.token_urlsafe(24)
    store = store or RolloutStore()
    model = _Model(config, store)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        await model.aclose()

    app = FastAPI(title="orchard-gym recording proxy", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.config, app.state.store, app.state.model = config, store, model

    def admin(request: Request) -> None:
        token = _bearer(request)
        if token is None or not hmac.compare_digest(token.encode(), config.admin_key.encode()):
            raise HTTPException(401, "missing or wrong admin key (Authorization: Bearer <admin key>)")

    def rollout_or_404(rollout_id: str) -> Rollout:
        try:
            return store.get(rollout_id)
        except RolloutNotFound as e:
            raise HTTPException(404, str(e)) from None

    def base_url(request: Request, rollout_id: str) -> str:
        root = config.public_url or str(request.base_url).rstrip("/")
        return f"{root.rstrip('/')}/r/{rollout_id}/v1"

    # ------------------------------------------------------------------ model endpoints
    @app.post("/r/{rollout_id}/v1/chat/completions", include_in_schema=False)
    async def chat_completions(rollout_id: str, request: Request):
        return await model.call(request, rollout_id, CHAT)

    @app.post("/r/{rollout_id}/v1/responses", include_in_schema=False)
    async def responses(rollout_id: str, request: Request):
        return await model.call(request, rollout_id, RESPONSES)

    @app.get("/r/{rollout_id}/v1/models", include_in_schema=False)
    async def models(rollout_id: str, request: Request):
        try:
            rollout = store.get(rollout_id)
        except RolloutNotFound as e:
            return _error(404, str(e), "rollout_not_found")
        if not rollout.check_token(_bearer(request)):
            rollout.reject("missing or wrong rollout token", request.url.path)
            return _error(401, "missing or wrong rollout token", "invalid_api_key", "authentication_error")
        name = (config.upstream_model or config.model_name) if rollout.record.mode == "upstream" else config.model_name
        return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "orchard-gym"}]}

    # ------------------------------------------------------------------ control API
    @app.get("/health")
    async def health():
        return {"status": "ok", "rollouts": len(store.rollouts), "upstream": config.upstream}

    @app.post("/rollouts", dependencies=[Depends(admin)], status_code=201)
    async def open_rollout(body: OpenRollout, request: Request):
        mode = body.mode or ("upstream" if config.upstream else "policy")
        if mode == "upstream" and not config.upstream:
            raise HTTPException(422, "this proxy has no upstream (start it with --upstream URL) or use mode=policy")
        try:
            rollout = store.open(mode, body.metadata, body.rollout_id)
        except ValueError as e:
            raise HTTPException(409, str(e)) from None
        return {"rollout_id": rollout.id, "token": rollout.token, "mode": mode,
                "base_url": base_url(request, rollout.id)}

    @app.get("/rollouts", dependencies=[Depends(admin)])
    async def list_rollouts(status: str | None = None):
        return [r.summary() for r in store.records([status] if status else None)]

    @app.get("/rollouts/{rollout_id}", dependencies=[Depends(admin)])
    async def get_rollout(rollout_id: str):
        return rollout_or_404(rollout_id).record.model_dump(mode="json")

    @app.post("/rollouts/{rollout_id}/finish", dependencies=[Depends(admin)])
    async def finish_rollout(rollout_id: str, body: FinishRollout):
        rollout_or_404(rollout_id)
        try:
            return store.finish(rollout_id, reward=body.reward, error=body.error).summary()
        except RolloutClosed as e:
            raise HTTPException(409, str(e)) from None
        except ValueError as e:
            raise HTTPException(422, str(e)) from None

    @app.delete("/rollouts/{rollout_id}", dependencies=[Depends(admin)])
    async def delete_rollout(rollout_id: str):
        rollout_or_404(rollout_id)
        return store.delete(rollout_id).summary()

    @app.get("/rollouts/{rollout_id}/samples", dependencies=[Depends(admin)])
    async def samples(rollout_id: str, gamma: float = Query(1.0, ge=0.0, le=1.0), include_failed: bool = False):
        from .reconstruct import reconstruct

        record = rollout_or_404(rollout_id).record
        if record.status == "open":
            raise HTTPException(409, f"rollout {rollout_id} is still open; finish it first")
        return [s.model_dump(mode="json") for s in reconstruct(record, gamma=gamma, drop_failed=not include_failed)]

    @app.get("/rollouts/{rollout_id}/trajectory", dependencies=[Depends(admin)])
    async def trajectory(rollout_id: str):
        from .reconstruct import to_trajectory

        return to_trajectory(rollout_or_404(rollout_id).record).model_dump(mode="json")

    @app.get("/rollouts/{rollout_id}/next", dependencies=[Depends(admin)])
    async def next_call(rollout_id: str, timeout: float = Query(30.0, ge=0.0, le=600.0)):
        rollout = rollout_or_404(rollout_id)
        if rollout.record.mode != "policy":
            raise HTTPException(409, f"rollout {rollout_id} is in {rollout.record.mode} mode")
        pending = await store.next_call(rollout_id, timeout)
        if pending is None:
            return Response(status_code=204)
        c = pending.record
        return {"call_id": c.call_id, "index": c.index, "endpoint": c.endpoint, "messages": c.messages,
                "tools": c.tools, "request": c.request}

    @app.post("/rollouts/{rollout_id}/calls/{call_id}/respond", dependencies=[Depends(admin)])
    async def respond(rollout_id: str, call_id: str, body: Answer):
        rollout_or_404(rollout_id)
        try:
            message = assistant_message(body.message)
            extra = body.model_dump(exclude={"message"}, exclude_none=True)
            return {"call_id": store.respond(rollout_id, call_id, message, **extra).call_id}
        except FormatError as e:
            raise HTTPException(422, str(e)) from None
        except RolloutClosed as e:
            raise HTTPException(409, str(e)) from None
        except KeyError as e:
            raise HTTPException(404, str(e.args[0])) from None

    @app.get("/export", dependencies=[Depends(admin)])
    async def export(status: str | None = None):
        records = store.records([status] if status else None)
        return Response("".join(r.model_dump_json() + "\n" for r in records), media_type="application/x-ndjson")

    app.add_middleware(_UnixSocketGuard)
    return app


# ---------------------------------------------------------------------------- running it
def _quiet_server(config):
    """uvicorn's Server without its signal handlers (the proxy runs inside other programs)."""
    import uvicorn

    class Quiet(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):
            yield

    return Quiet(config)


def default_socket_dir() -> str:
    """Where proxies put their unix sockets: a folder local sandboxes see (not under /tmp,
    which each sandbox gets privately)."""
    from orchard_gym.envs.swe.venvs import cache_root

    return str(cache_root() / "run")


class RecordingProxy:
    """The proxy as an object: start it in a running event loop (`await proxy.start()`),
    or on a thread of its own (`proxy.start_in_thread()`), then use `proxy.store` (same
    loop only) or the HTTP API at `proxy.url`.

    >>> import httpx
    >>> proxy = RecordingProxy(ProxyConfig(upstream="http://127.0.0.1:9/v1")).start_in_thread()
    >>> admin = {"Authorization": f"Bearer {proxy.admin_key}"}
    >>> rollout = httpx.post(f"{proxy.url}/rollouts", json={}, headers=admin).json()
    >>> rollout["base_url"] == f"{proxy.url}/r/{rollout['rollout_id']}/v1"
    True
    >>> proxy.stop_in_thread()
    """

    def __init__(self, config: ProxyConfig | None = None, store: RolloutStore | None = None):
        self.app = create_app(config, store)
        self.config: ProxyConfig = self.app.state.config
        self.store: RolloutStore = self.app.state.store
        self._server = None
        self._task: asyncio.Task | None = None
        self._thread: threading.Thread | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.port: int | None = None

    @property
    def admin_key(self) -> str:
        return self.config.admin_key

    @property
    def uds(self) -> str | None:
        return self.config.uds

    @property
    def url(self) -> str:
        return self.config.public_url or f"http://{self.config.host}:{self.port}"

    def rollout_url(self, rollout_id: str) -> str:
        return f"{self.url}/r/{rollout_id}/v1"

    def _sockets(self) -> list[socket.socket]:
        family = socket.AF_INET6 if ":" in self.config.host else socket.AF_INET
        # proto=IPPROTO_TCP, so asyncio sets TCP_NODELAY on accepted connections (it checks
        # sock.proto): without it, Nagle + delayed ACKs add ~40 ms to keep-alive calls
        tcp = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        tcp.bind((self.config.host, self.config.port))
        self.port = tcp.getsockname()[1]
        sockets = [tcp]
        if self.config.uds:
            os.makedirs(os.path.dirname(self.config.uds) or ".", mode=0o700, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.config.uds)
            unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            unix.bind(self.config.uds)
            os.chmod(self.config.uds, 0o600)
            sockets.append(unix)
        for s in sockets:
            s.listen(2048)
            s.setblocking(False)
        return sockets

    async def start(self) -> RecordingProxy:
        import uvicorn

        if self._task is not None:
            return self
        sockets = self._sockets()
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="on",
                                timeout_graceful_shutdown=2, timeout_keep_alive=30, backlog=2048)
        self._server = _quiet_server(config)
        self.loop = asyncio.get_running_loop()
        self._task = asyncio.ensure_future(self._server.serve(sockets=sockets))
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises what went wrong
                raise RuntimeError("the proxy stopped while starting")
            await asyncio.sleep(0.01)
        return self

    async def stop(self) -> None:
        if self._task is None:
            return
        self._server.should_exit = True
        with contextlib.suppress(Exception):
            await self._task
        self._task = None
        if self.config.uds:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.config.uds)

    def start_in_thread(self) -> RecordingProxy:
        ready = threading.Event()
        failure: list[BaseException] = []

        def serve():
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self.start())
            except BaseException as e:
                failure.append(e)
                ready.set()
                return
            ready.set()
            loop.run_until_complete(self._task)
            loop.close()

        self._thread = threading.Thread(target=serve, name="orchard-proxy", daemon=True)
        self._thread.start()
        ready.wait(30)
        if failure:
            raise failure[0]
        return self

    def stop_in_thread(self) -> None:
        if self._thread is None:
            return
        self._server.should_exit = True
        self._thread.join(10)
        self._thread = None
        self._task = None
        if self.config.uds:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.config.uds)

    async def __aenter__(self) -> RecordingProxy:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.stop()


def serve(config: ProxyConfig) -> None:
    """Run the proxy in the foreground until Ctrl-C (what `orchard proxy` does)."""
    import uvicorn

    proxy = RecordingProxy(config)
    sockets = proxy._sockets()
    log_config = uvicorn.Config(proxy.app, log_level="info", lifespan="on", timeout_graceful_shutdown=5)
    print(json.dumps({"url": proxy.url, "uds": proxy.uds, "upstream": config.upstream,
                      "admin_key": proxy.admin_key}), flush=True)
    try:
        asyncio.run(uvicorn.Server(log_config).serve(sockets=sockets))
    finally:
        if config.uds:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(config.uds)

