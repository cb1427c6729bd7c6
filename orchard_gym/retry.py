"""Retries with exponential backoff and jitter, for transient failures only."""

from __future__ import annotations

import random
from collections.abc import Callable

import httpx
from pydantic import BaseModel, Field
from tenacity import (AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt, stop_after_delay,
                      wait_random_exponential)
from tenacity.wait import wait_base

from .http1 import HTTPConnectError, HTTPProtocolError
from .errors import ServiceUnavailable


class RetryPolicy(BaseModel):
    """Retry connection errors, timeouts and 503s; never a 4xx."""

    attempts: int = Field(5, ge=1, description="tries in all, the first included")
    initial: float = Field(0.05, ge=0, description="first backoff, seconds")
    maximum: float = Field(2.0, ge=0, description="largest single backoff, seconds")
    deadline: float = Field(30.0, gt=0, description="give up after this many seconds in all")


def is_transient(exc: BaseException, *, sent_is_safe: bool = True) -> bool:
    """Connection failures before anything was sent are always safe to retry; others only
    when the request is idempotent (`sent_is_safe`)."""
    if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, ServiceUnavailable,
                        HTTPConnectError)):
        return True
    if sent_is_safe and isinstance(exc, (httpx.ReadError, httpx.RemoteProtocolError, httpx.WriteError,
                                         HTTPProtocolError)):
        return True
    return False


def retrying(policy: RetryPolicy, *, idempotent: bool = True) -> AsyncRetrying:
    return AsyncRetrying(
        retry=retry_if_exception(lambda e: is_transient(e, sent_is_safe=idempotent)),
        wait=wait_random_exponential(multiplier=policy.initial, max=policy.maximum),
        stop=stop_after_attempt(policy.attempts) | stop_after_delay(policy.deadline),
        reraise=True,
    )


class wait_backoff(wait_base):
    """Doubling backoff from `initial` up to `maximum`, each wait jittered by ±50%, and never
    shorter than what the failure itself asks for (`hint(exc)`, e.g. a Retry-After header)."""

    def __init__(self, initial: float, maximum: float,
                 hint: Callable[[BaseException], float | None] | None = None):
        self.initial, self.maximum, self.hint = initial, maximum, hint

    def __call__(self, retry_state: RetryCallState) -> float:
        delay = min(self.initial * 2 ** (retry_state.attempt_number - 1), self.maximum)
        delay *= 0.5 + random.random()
        exc = retry_state.outcome.exception() if retry_state.outcome is not None else None
        asked = self.hint(exc) if self.hint is not None and exc is not None else None
        return max(delay, asked or 0.0)
