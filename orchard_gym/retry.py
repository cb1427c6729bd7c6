"""Retries with exponential backoff and jitter, for transient failures only."""

from __future__ import annotations

import httpx
from pydantic import BaseModel, Field
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, stop_after_delay, wait_random_exponential

from .agent_http import AgentConnectError, AgentProtocolError
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
                        AgentConnectError)):
        return True
    if sent_is_safe and isinstance(exc, (httpx.ReadError, httpx.RemoteProtocolError, httpx.WriteError,
                                         AgentProtocolError)):
        return True
    return False


def retrying(policy: RetryPolicy, *, idempotent: bool = True) -> AsyncRetrying:
    return AsyncRetrying(
        retry=retry_if_exception(lambda e: is_transient(e, sent_is_safe=idempotent)),
        wait=wait_random_exponential(multiplier=policy.initial, max=policy.maximum),
        stop=stop_after_attempt(policy.attempts) | stop_after_delay(policy.deadline),
        reraise=True,
    )
