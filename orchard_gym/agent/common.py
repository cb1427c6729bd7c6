"""What every part of the agent shares: limits, the client-error exception, request checks."""

from __future__ import annotations

import math

VERSION = "0.1.0"
DEFAULT_MAX_OUTPUT = 4 * 1024 * 1024  # bytes per stream
MAX_BODY = 512 * 1024 * 1024  # largest request body we accept
DEFAULT_MAX_FILE = 100 * 1024 * 1024  # largest file GET /files serves
MAX_TIMEOUT = 7 * 86400  # seconds; as the SDK's ExecRequest
MIN_RATE = 64 * 1024  # bytes/s a client must at least move while sending or receiving a body
CHUNK = 1 << 20  # bytes per read/write when streaming files
JOB_MARKER = "ORCHARD_JOB"
KILL_GRACE = 0.2  # seconds to let pipes drain after the main process exits


class BadRequest(Exception):
    """A client error: answered with a 4xx and a message."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status



def _reject_constant(name: str):
    raise BadRequest(f"non-finite numbers ({name}) are not allowed", 422)


def _number(req: dict, key: str, default, *, positive: bool = False, integer: bool = False,
            maximum: float | None = None):
    """A finite, non-negative number (positive: > 0; integer: an int) from a request."""
    value = req.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        raise BadRequest(f"{key} must be {'an integer' if integer else 'a number'}", 422)
    if not math.isfinite(value):
        raise BadRequest(f"{key} must be a finite number", 422)
    if value < 0 or (positive and value == 0):
        raise BadRequest(f"{key} must be {'positive' if positive else 'non-negative'}", 422)
    if maximum is not None and value > maximum:
        raise BadRequest(f"{key} must be at most {maximum:g}", 422)
    return value


def _typed(req: dict, key: str, types, default):
    value = req.get(key, default)
    if value is None or value is default:
        return value
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise BadRequest(f"{key} has the wrong type", 422)
    if not isinstance(value, types):
        raise BadRequest(f"{key} has the wrong type", 422)
    return value


def _only_keys(req: dict, allowed: set[str]) -> None:
    unknown = set(req) - allowed
    if unknown:
        raise BadRequest(f"unknown fields: {sorted(unknown)}", 422)

