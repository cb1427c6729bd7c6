"""How the orchestrator's errors look on the wire: a status code and `{detail, error}`,
where `error` names the SDK's exception class. The table is `orchard_gym.errors.WIRE_ERRORS`
(the remote client decodes with the same one); here: what only a server meets."""

from __future__ import annotations

from orchard_gym.errors import Conflict, wire_error

__all__ = ["Conflict", "job_error", "status_of"]


def status_of(exc: BaseException) -> tuple[int, str]:
    row = wire_error(exc)
    if row is not None:
        return row.status, row.name
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
    client turns back into that exception (orchard_gym.errors.error_from_job)."""
    return f"{status_of(exc)[1]}: {exc}"
