"""One client for OpenAI-compatible model endpoints: policies, judges and teachers all call through it.

A spec names the endpoint: `URL#MODEL` (`http://localhost:8000/v1#Qwen/Qwen3-8B`: the API
root, then the served model), or `openai:URL#MODEL` (the CLI's policy form). Where the caller
allows it (the OPD teacher), `URL` alone means the first model `GET /models` lists.

    from orchard_gym.endpoint import Endpoint
    with Endpoint("http://localhost:8000/v1#Qwen/Qwen3-8B", timeout=60) as ep:
        reply = ep.chat_sync([{"role": "user", "content": "hi"}], max_tokens=16)
        print(reply.content, reply.usage)

What every caller gets the same way:

- retries (tenacity; `retry=RetryPolicy(...)` of orchard_gym.retry, `DEFAULT_RETRY` unless given)
  of connection failures and of 429/502/503/504, waiting what the server asks in `Retry-After`
  (seconds or an HTTP date, never past the policy's deadline), otherwise backing off with jitter;
  never of other statuses or of a read timeout (a slow model is not made slower);
- one timeout per request;
- typed errors, all `EndpointError` (orchard_gym.errors): `EndpointSpecError` (bad spec, also a
  ValueError), `EndpointUnreachable`, `EndpointTimeout`, `EndpointStatusError` (`.status`,
  `.retry_after`), `EndpointBadResponse` (no JSON, a NaN/Infinity anywhere, not a completion);
- token usage of each chat or completions answer into the running episode's cost ledger
  (`ledger.record_usage`, under `usage_source`; None: the caller accounts for it itself).
"""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlsplit

import httpx
from tenacity import AsyncRetrying, RetryCallState, Retrying, retry_if_exception, stop_after_attempt
from tenacity import stop_after_delay, wait_random_exponential

from .errors import (
    EndpointBadResponse,
    EndpointError,
    EndpointSpecError,
    EndpointStatusError,
    EndpointTimeout,
    EndpointUnreachable,
)
from .ledger import record_usage
from .retry import RetryPolicy

RETRY_STATUSES = frozenset({429, 502, 503, 504})  # overloaded or restarting: worth another try
EXAMPLE = "http://localhost:8000/v1#Qwen/Qwen3-8B"


# ------------------------------------------------------------------------------ specs
@dataclass(frozen=True)
class EndpointSpec:
    """`url`: the API root without a trailing slash (`http://host:8000/v1`); `model`: the served
    model, None where it is to be looked up (`GET /models`)."""

    url: str
    model: str | None = None

    def route(self, path: str) -> str:
        return f"{self.url}/{path.lstrip('/')}"

    def __str__(self) -> str:
        return f"{self.url}#{self.model}" if self.model else self.url


def is_endpoint(spec: Any) -> bool:
    """Whether `spec` names an endpoint rather than, say, a local model folder."""
    return isinstance(spec, str) and spec.strip().startswith(("http://", "https://", "openai:"))


def parse_spec(spec: Any, *, model_required: bool = True, what: str = "the endpoint") -> EndpointSpec:
    """`URL#MODEL` or `openai:URL#MODEL` (with `model_required=False` also `URL`), else an
    `EndpointSpecError` (a ValueError) that says the form."""
    form = "URL#MODEL" if model_required else "URL[#MODEL]"
    hint = f"{what} must be {form} with an http(s) URL, e.g. {EXAMPLE}, not {spec!r}"
    if not isinstance(spec, str):
        raise EndpointSpecError(hint)
    text = spec.strip()
    text = text[len("openai:"):] if text.startswith("openai:") else text
    url, _, model = text.partition("#")
    url, model = url.rstrip("/"), model.strip()
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise EndpointSpecError(hint)
    if model_required and not model:
        raise EndpointSpecError(hint)
    return EndpointSpec(url, model or None)


# ------------------------------------------------------------------------------ answers
@dataclass
class Chat:
    """One chat completion: the first choice's message, its finish reason, the whole response."""

    message: dict
    finish_reason: str | None
    usage: dict | None
    raw: dict

    @property
    def content(self) -> str:
        """The text ("" for none; parts of a list-valued content as their JSON)."""
        content = self.message.get("content")
        return content if isinstance(content, str) else "" if content is None else json.dumps(content)

    @property
    def tool_calls(self) -> list[dict]:
        return self.message.get("tool_calls") or []

    @property
    def refusal(self) -> str | None:
        """Why the model refused (OpenAI `refusal`, or a content filter), None when it did not."""
        if self.message.get("refusal"):
            return str(self.message["refusal"])
        return "content filter" if self.finish_reason == "content_filter" else None


def _non_finite(token: str) -> float:
    raise ValueError(f"non-finite number {token}")


def _finite_float(token: str) -> float:
    value = float(token)
    if not math.isfinite(value):
        raise ValueError(f"non-finite number {token}")
    return value


def decode(text: str, url: str) -> dict:
    """The JSON object of a 2xx answer; `EndpointBadResponse` for anything else (NaN and
    Infinity included: Python's json would let them through)."""
    try:
        data = json.loads(text, parse_constant=_non_finite, parse_float=_finite_float)
    except ValueError as e:
        raise EndpointBadResponse(f"{url} answered no valid JSON ({e}): {text[:200]!r}", url=url,
                                  reason="answered no valid JSON") from None
    if not isinstance(data, dict):
        raise EndpointBadResponse(f"{url} answered JSON that is no object: {text[:200]!r}", url=url,
                                  reason="answered JSON that is no object")
    return data


def chat_of(data: dict, url: str) -> Chat:
    try:
        choice = data["choices"][0]
        message = choice["message"]
        if not isinstance(message, dict):
            raise TypeError("message is no object")
    except (KeyError, IndexError, TypeError):
        raise EndpointBadResponse(f"{url} answered no chat completion: {json.dumps(data)[:200]}", url=url,
                                  reason="answered no chat completion") from None
    usage = data.get("usage")
    return Chat(message, choice.get("finish_reason"), usage if isinstance(usage, dict) else None, data)


def retry_after(value: str | None) -> float | None:
    """Seconds of a `Retry-After` header: a number, or an HTTP date; None when absent or garbage."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError, IndexError):
            return None
    return max(0.0, seconds) if math.isfinite(seconds) else None


# ------------------------------------------------------------------------------ the client
# what a model endpoint is given by default: a model server restarting or overloaded takes seconds
DEFAULT_RETRY = RetryPolicy(attempts=4, initial=0.5, maximum=8.0, deadline=120.0)


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, EndpointStatusError):
        return exc.status in RETRY_STATUSES
    return isinstance(exc, EndpointUnreachable)


class Endpoint:
    """An OpenAI-compatible endpoint, sync (`post`, `chat_sync`) and async (`apost`, `chat`,
    `completions`). Each http client is made on first use; `close`/`aclose` (or the context
    managers) release them."""

    def __init__(self, spec: str | EndpointSpec, *, api_key: str | None = None, timeout: float = 120.0,
                 retry: RetryPolicy | None = None, usage_source: str | None = "policy",
                 model_required: bool = True, what: str = "the endpoint"):
        self.spec = spec if isinstance(spec, EndpointSpec) else parse_spec(spec, model_required=model_required,
                                                                             what=what)
        if not (isinstance(timeout, (int, float)) and timeout > 0):
            raise EndpointSpecError(f"{what}'s timeout must be a positive number of seconds, not {timeout!r}")
        self.timeout = float(timeout)
        self.retry = retry or DEFAULT_RETRY
        self.usage_source = usage_source
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._async: httpx.AsyncClient | None = None
        self._sync: httpx.Client | None = None
        self._sync_lock = threading.Lock()

    @property
    def url(self) -> str:
        return self.spec.url

    @property
    def model(self) -> str | None:
        return self.spec.model

    @property
    def http(self) -> httpx.AsyncClient:
        """The async http client (event hooks may be added to it)."""
        if self._async is None:
            self._async = httpx.AsyncClient(timeout=self.timeout, headers=self.headers)
        return self._async

    @property
    def http_sync(self) -> httpx.Client:
        with self._sync_lock:  # sync callers are threads (the credit judge's pool): make one client
            if self._sync is None:
                self._sync = httpx.Client(timeout=self.timeout, headers=self.headers)
            return self._sync

    # -------------------------------------------------------------- retries
    def _wait(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        asked = getattr(exc, "retry_after", None)
        if asked is not None:
            left = self.retry.deadline - (state.seconds_since_start or 0.0)
            return max(0.0, min(asked, left))
        return wait_random_exponential(multiplier=self.retry.initial, max=self.retry.maximum)(state)

    def _retry_args(self) -> dict:
        return dict(retry=retry_if_exception(_transient), wait=self._wait, reraise=True,
                    stop=stop_after_attempt(self.retry.attempts) | stop_after_delay(self.retry.deadline))

    # -------------------------------------------------------------- one request
    def _check(self, resp: httpx.Response, url: str) -> dict:
        if resp.status_code >= 400:
            raise EndpointStatusError(f"{url} answered HTTP {resp.status_code}: {resp.text[:200]}", url=url,
                                      status=resp.status_code, reason=f"answered HTTP {resp.status_code}",
                                      retry_after=retry_after(resp.headers.get("retry-after")))
        return decode(resp.text, url)

    def _failed(self, e: httpx.HTTPError, url: str) -> EndpointError:
        if isinstance(e, httpx.TimeoutException) and not isinstance(e, (httpx.ConnectTimeout, httpx.PoolTimeout)):
            return EndpointTimeout(f"{url} did not answer within {self.timeout:g}s", url=url,
                                   reason=f"did not answer within {self.timeout:g}s")
        if isinstance(e, httpx.TransportError):
            return EndpointUnreachable(f"cannot reach {url}: {type(e).__name__}: {e}", url=url,
                                       reason=f"is unreachable ({type(e).__name__})")
        return EndpointError(f"{url}: {type(e).__name__}: {e}", url=url)

    async def _arequest(self, method: str, path: str, body: dict | None) -> dict:
        url = self.spec.route(path)
        try:
            resp = await self.http.request(method, url, json=body)
        except httpx.HTTPError as e:
            raise self._failed(e, url) from None
        return self._check(resp, url)

    def _request(self, method: str, path: str, body: dict | None) -> dict:
        url = self.spec.route(path)
        try:
            resp = self.http_sync.request(method, url, json=body)
        except httpx.HTTPError as e:
            raise self._failed(e, url) from None
        return self._check(resp, url)

    async def apost(self, path: str, body: dict) -> dict:
        """POST `body` to `URL/path`: the answer's JSON object, with retries; `EndpointError`s."""
        async for attempt in AsyncRetrying(**self._retry_args()):
            with attempt:
                return await self._arequest("POST", path, body)
        raise AssertionError("unreachable")  # tenacity re-raises the last error

    async def aget(self, path: str) -> dict:
        async for attempt in AsyncRetrying(**self._retry_args()):
            with attempt:
                return await self._arequest("GET", path, None)
        raise AssertionError("unreachable")

    def post(self, path: str, body: dict) -> dict:
        """`apost`, blocking (for callers on threads, e.g. the credit judge)."""
        for attempt in Retrying(**self._retry_args()):
            with attempt:
                return self._request("POST", path, body)
        raise AssertionError("unreachable")

    # -------------------------------------------------------------- the OpenAI routes
    async def model_name(self) -> str:
        """The spec's model, or the first one `GET /models` lists (then kept)."""
        if self.spec.model is None:
            data = await self.aget("models")
            try:
                name = data["data"][0]["id"]
                if not isinstance(name, str) or not name:
                    raise TypeError("no model id")
            except (KeyError, IndexError, TypeError):
                url = self.spec.route("models")
                raise EndpointBadResponse(f"{url} lists no model: {json.dumps(data)[:200]}", url=url,
                                          reason="lists no model") from None
            self.spec = EndpointSpec(self.spec.url, name)
        return self.spec.model  # type: ignore[return-value]  # set just above

    def _chat_body(self, messages: list[dict], params: dict) -> dict:
        return {"model": self.spec.model, "messages": messages,
                **{k: v for k, v in params.items() if v is not None}}

    def _charge(self, usage: Any) -> None:
        if self.usage_source is not None:
            record_usage(usage, source=self.usage_source)

    async def chat(self, messages: list[dict], **params: Any) -> Chat:
        """POST /chat/completions (`params`: temperature, max_tokens, tools, ...; None values left
        out); its usage goes to the ledger."""
        await self.model_name()
        reply = chat_of(await self.apost("chat/completions", self._chat_body(messages, params)),
                        self.spec.route("chat/completions"))
        self._charge(reply.usage)
        return reply

    def chat_sync(self, messages: list[dict], **params: Any) -> Chat:
        if self.spec.model is None:
            raise EndpointSpecError(f"{self.spec.url}: chat_sync needs URL#MODEL")
        reply = chat_of(self.post("chat/completions", self._chat_body(messages, params)),
                        self.spec.route("chat/completions"))
        self._charge(reply.usage)
        return reply

    async def completions(self, prompt: Any, **params: Any) -> dict:
        """POST /completions (token-id or text prompts): the whole answer; its usage to the ledger."""
        body = {"model": await self.model_name(), "prompt": prompt, **{k: v for k, v in params.items() if v is not None}}
        data = await self.apost("completions", body)
        if not isinstance(data.get("choices"), list):
            url = self.spec.route("completions")
            raise EndpointBadResponse(f"{url} answered no completions response: {json.dumps(data)[:200]}", url=url,
                                      reason="answered no completions response")
        self._charge(data.get("usage"))
        return data

    # -------------------------------------------------------------- closing
    async def aclose(self) -> None:
        client, self._async = self._async, None
        if client is not None:
            await client.aclose()
        self.close()

    def close(self) -> None:
        """Closes the sync client (the async one needs `aclose`, from its event loop)."""
        client, self._sync = self._sync, None
        if client is not None:
            client.close()

    async def __aenter__(self) -> Endpoint:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def __enter__(self) -> Endpoint:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


__all__ = ["DEFAULT_RETRY", "Chat", "Endpoint", "EndpointSpec", "decode", "is_endpoint", "parse_spec", "retry_after",
           "RETRY_STATUSES"]
