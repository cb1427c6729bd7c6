"""How the orchestrator's errors look on the wire: a status code and `{detail, error}`,
where `error` names the SDK's exception class (`orchard_gym.errors`), so the remote
client raises exactly what the in-process one would."""

from __future__ import annotations

from orchard_gym.errors import (
    AgentUnavailable,
    AuthenticationError,
    BackendError,
    FileTooLarge,
    ImageNotFound,
    InvalidRequest,
    JobNotFound,
    OrchardError,
    SandboxFailed,
    SandboxNotFound,
    SandboxTimeout,
    ServiceUnavailable,
    SnapshotNotFound,
)


class Conflict(InvalidRequest):
    """The request clashes with what exists (a sandbox id that is taken)."""


# most specific first
_STATUS: list[tuple[type[BaseException], int, str]] = [
    (Conflict, 409, "InvalidRequest"),
    (SandboxNotFound, 404, "SandboxNotFound"),
    (JobNotFound, 404, "JobNotFound"),
    (SnapshotNotFound, 404, "SnapshotNotFound"),
    (FileNotFoundError, 404, "FileNotFoundError"),
    (FileTooLarge, 413, "FileTooLarge"),
    (ImageNotFound, 422, "ImageNotFound"),
    (InvalidRequest, 422, "InvalidRequest"),
    (SandboxTimeout, 408, "SandboxTimeout"),
    (SandboxFailed, 409, "SandboxFailed"),
    (ServiceUnavailable, 503, "ServiceUnavailable"),
    # a sandbox's agent refusing our token is our fault, not the caller's: never a 401 here
    (AuthenticationError, 502, "AgentUnavailable"),
    (AgentUnavailable, 502, "AgentUnavailable"),
    (BackendError, 502, "BackendError"),
    (OrchardError, 500, "OrchardError"),
]


def status_of(exc: BaseException) -> tuple[int, str]:
    for cls, status, name in _STATUS:
        if isinstance(exc, cls):
            return status, name
    if _is_store_outage(exc):
        return 503, "ServiceUnavailable"
    return 500, "InternalError"


def _is_store_outage(exc: BaseException) -> bool:
    try:
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import TimeoutError as RedisTimeout
    except ImportError:  # pragma: no cover - redis is in the server extra
        return False
    return isinstance(exc, (RedisConnectionError, RedisTimeout))


def job_error(exc: BaseException) -> str:
    """The `error` of a job that could not run: 'ClassName: message', which the remote
    client turns back into that exception."""
    return f"{status_of(exc)[1]}: {exc}"
