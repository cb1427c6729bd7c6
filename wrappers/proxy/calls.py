"""The proxy's model endpoints: one call of a harness, forwarded upstream or parked for the
policy, validated and recorded (see wrappers/proxy/server.py)."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import httpx
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

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
from .anthropic_format import (
    MESSAGES,
    ChatToMessagesStream,
    anthropic_error,
    chat_request,
    check_messages_request,
    message_events,
    messages_object_of_chat,
    sse_event,
)
from .records import CallRecord, Rollout, RolloutClosed, RolloutNotFound, RolloutStore
from .models import ProxyConfig

log = logging.getLogger("orchard_gym.proxy")


def bearer_token(request: Request) -> str | None:
    """The caller's key: `Authorization: Bearer`, else Anthropic's `x-api-key` or Azure's `api-key`."""
    auth = request.headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return request.headers.get("x-api-key") or request.headers.get("api-key")  # Anthropic's, Azure's


def _error(status: int, message: str, code: str, type_: str = "invalid_request_error", **extra) -> JSONResponse:
    return JSONResponse(error_body(message, type_, code, **extra), status_code=status)


def error_response(endpoint: str, status: int, message: str, code: str, type_: str = "invalid_request_error") -> JSONResponse:
    """An error in the shape the door's clients parse: Anthropic's for the Messages door."""
    if endpoint == MESSAGES:
        return JSONResponse(anthropic_error(status, message), status_code=status)
    return _error(status, message, code, type_)


async def _disconnected(request: Request) -> None:
    """Returns when the client hangs up (the body has been read, so only that can come)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


class ModelEndpoints:
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
            return error_response(endpoint, 404, str(e), "rollout_not_found")
        if not rollout.check_token(bearer_token(request)):
            rollout.reject("missing or wrong rollout token", request.url.path)
            return error_response(endpoint, 401, "missing or wrong rollout token (Authorization: Bearer <token>, "
                              "or x-api-key: <token>)", "invalid_api_key", "authentication_error")
        if rollout.record.status != "open":
            rollout.reject(f"request after the rollout was {rollout.record.status}", request.url.path)
            return error_response(endpoint, 409, f"rollout {rollout_id} is {rollout.record.status}; it takes no more calls",
                              "rollout_finished")
        try:
            raw = json.loads(await request.body())
            body = check_messages_request(raw) if endpoint == MESSAGES else check_request(endpoint, raw)
        except (ValueError, FormatError) as e:
            rollout.reject(f"bad request: {e}", request.url.path)
            return error_response(endpoint, 400, f"bad request: {e}", "bad_request")
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
        return error_response(call.endpoint, status, message, code, type_)

    @staticmethod
    def _close(call: CallRecord, arrived: float) -> None:
        call.ended_at = time.time()
        call.latency = time.monotonic() - arrived

    def _record(self, call: CallRecord, data: dict) -> None:
        """Keep a whole (or assembled) upstream/policy answer on the call."""
        call.response, call.status_code = data, 200
        if call.endpoint in (CHAT, MESSAGES):
            choice = data["choices"][0]
            call.message, call.finish_reason = choice.get("message"), choice.get("finish_reason")
            call.usage = data.get("usage")
            tokens = tokens_of(data)
            call.prompt_token_ids = call.prompt_token_ids or tokens["prompt_token_ids"]
            call.completion_token_ids = call.completion_token_ids or tokens["completion_token_ids"]
            call.logprobs = call.logprobs or tokens["logprobs"]
            if call.endpoint == MESSAGES:  # keep what the harness got: the Messages object
                call.response = messages_object_of_chat(data, call.request.get("model") or "")
                call.finish_reason = call.response["stop_reason"]
        else:
            call.message, call.usage = message_of_response(data), usage_of_response(data)
            call.finish_reason = data.get("status")

    # ------------------------------------------------------------------ upstream mode
    async def _from_upstream(self, call: CallRecord, arrived: float) -> Response:
        path = "/responses" if call.endpoint == RESPONSES else "/chat/completions"
        body = chat_request(call.request) if call.endpoint == MESSAGES else dict(call.request)
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
                if call.endpoint == MESSAGES:
                    detail = upstream_error["error"]
                    detail = detail.get("message", text) if isinstance(detail, dict) else str(detail)
                    return JSONResponse(anthropic_error(status, detail), status_code=status)
                return JSONResponse(upstream_error, status_code=status)
            return self._fail(call, arrived, 502 if status >= 500 else status, message, "upstream_error")
        try:
            data = json.loads(text)
            data = check_response(data) if call.endpoint == RESPONSES else check_chat_completion(data)
        except (ValueError, FormatError) as e:
            return self._fail(call, arrived, 502, f"the upstream's answer is not valid: {e}; it began {text[:200]!r}",
                              "upstream_bad_response")
        self._record(call, data)
        call.time_to_first_byte = time.monotonic() - arrived
        if call.stream:  # the upstream ignored stream=true: stream its whole answer ourselves
            self._close(call, arrived)
            return StreamingResponse(self._replay(call, data), media_type="text/event-stream")
        self._close(call, arrived)
        if call.endpoint == MESSAGES:
            return JSONResponse(call.response)
        return Response(raw, media_type="application/json")  # the upstream's own bytes

    async def _relay(self, call: CallRecord, arrived: float, resp: httpx.Response):
        """Pass the upstream's SSE events through as they come (whole events only, all those
        of one read in one write), assembling the whole answer."""
        assembler = None if call.endpoint == RESPONSES else ChatStreamAssembler()
        # the Messages door translates each chunk into Messages events instead of passing it through
        translator = ChatToMessagesStream(call.request.get("model") or "") if call.endpoint == MESSAGES else None
        final: dict | None = None
        buffer = last = b""
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
                    lines = block.decode("utf-8", "replace").split("\n")
                    parsed = self._parse_event(call, lines, assembler, translator)
                    final = parsed or final
                    if translator is None and (last or parsed is not None or _is_done(lines)):
                        last += block + b"\n\n"  # the answer's end: said once the call is recorded (below)
                    elif translator is None:
                        out.append(block + b"\n\n")
                    else:
                        out += [sse_event(*e) for e in translator.pending]
                        translator.pending.clear()
                    if call.error:
                        break
                if out:
                    yield b"".join(out)
                if call.error:
                    if translator is not None:  # the upstream's own error event was chat-shaped: say it in Anthropic's
                        yield sse_event("error", anthropic_error(502, call.error))
                    elif last:
                        yield last
                    return
            if buffer.strip():
                final = self._parse_event(call, buffer.decode("utf-8", "replace").split("\n"), assembler,
                                          translator) or final
                if translator is None:
                    last += buffer + b"\n\n"
                else:
                    yield b"".join(sse_event(*e) for e in translator.pending)
            if call.error is None:
                if assembler is not None:
                    if assembler.chunks == 0:
                        raise FormatError("the upstream's stream ended before any chunk")
                    self._record(call, assembler.result())
                    if translator is not None:
                        yield b"".join(sse_event(*e) for e in translator.finish())
                elif final is None:
                    raise FormatError("the upstream's stream ended without response.completed")
                else:
                    self._record(call, final)
            if last:  # a harness that has read its answer's end finds the call recorded and closed
                self._close(call, arrived)
                yield last
        except (httpx.HTTPError, FormatError) as e:
            why = f"the upstream's stream broke: {type(e).__name__}: {e}"
            call.error, call.status_code = why, 502
            if translator is not None:
                yield sse_event("error", anthropic_error(502, why))
            else:
                yield sse(error_body(why, "proxy_error", "upstream_stream_error"), "error" if assembler is None else None)
        except (asyncio.CancelledError, GeneratorExit):
            call.error = call.error or "the harness disconnected mid-stream"
            raise
        finally:
            await resp.aclose()
            if call.latency is None:
                self._close(call, arrived)

    @staticmethod
    def _parse_event(call: CallRecord, event: list[str], assembler: ChatStreamAssembler | None,
                     translator: ChatToMessagesStream | None = None) -> dict | None:
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
            if translator is not None:
                translator.pending += translator.feed(obj)
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
        elif call.endpoint == MESSAGES:
            for event, body in message_events(call.response):
                yield sse_event(event, body)
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
        if call.endpoint in (CHAT, MESSAGES):
            logprobs = {"content": call.logprobs} if call.logprobs else None
            data = chat_completion(message, model, usage, logprobs=logprobs)
        else:
            data = responses_object(message, model, usage, call.request)
        self._record(call, data)
        call.time_to_first_byte = time.monotonic() - arrived
        self._close(call, arrived)
        if call.stream:
            return StreamingResponse(self._replay(call, data), media_type="text/event-stream")
        return JSONResponse(call.response if call.endpoint == MESSAGES else data)

    async def aclose(self) -> None:
        if self.http is not None:
            await self.http.aclose()


def _is_done(event: list[str]) -> bool:
    """Whether an SSE event is the chat stream's `data: [DONE]`."""
    return "\n".join(line[5:].lstrip() for line in event if line.startswith("data:")) == "[DONE]"
