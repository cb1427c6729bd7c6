"""Typed errors of the SDK. Catch `OrchardError` for all of them."""

from __future__ import annotations

from dataclasses import dataclass


class OrchardError(Exception):
    """Base class of every error this package raises on purpose."""


class InvalidRequest(OrchardError, ValueError):
    """The request was malformed or named something impossible (a 4xx, never retried)."""


class FileTooLarge(InvalidRequest):
    """A file is bigger than the agent serves (`--max-file-size`; a 413)."""


class AuthenticationError(OrchardError):
    """Missing or wrong API key or sandbox token."""


class SandboxNotFound(OrchardError, KeyError):
    """No sandbox with this id (never created, or already deleted)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "sandbox not found"


class SnapshotNotFound(OrchardError, KeyError):
    """No snapshot with this id (never taken, deleted, or another API key's)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "snapshot not found"


class JobNotFound(OrchardError, KeyError):
    """No job with this id."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "job not found"


class SandboxTimeout(OrchardError, TimeoutError):
    """A sandbox did not become ready, or a wait ran out, in the time allowed."""


class AgentUnavailable(OrchardError, ConnectionError):
    """The agent inside the sandbox cannot be reached (dead sandbox, crashed agent)."""


class SandboxFailed(OrchardError):
    """The sandbox failed to start or died; its record says why."""


class ImageNotFound(OrchardError):
    """The task image is not available to the backend."""


class BackendError(OrchardError):
    """The backend (process spawner, container engine, cluster) refused or failed."""


class ServiceUnavailable(OrchardError):
    """The orchestrator is overloaded (503); safe to retry."""


class EndpointError(OrchardError):
    """A model endpoint (OpenAI-compatible `URL#MODEL`, orchard_gym.endpoint) gave no usable answer.

    `url` is the route that was called (None for a bad spec), `status` the HTTP status where
    one came back."""

    def __init__(self, message: str, *, url: str | None = None, status: int | None = None,
                 reason: str | None = None):
        super().__init__(message)
        self.url, self.status = url, status
        self.reason = reason or message  # short, without the URL: fit to count failures by


class EndpointSpecError(EndpointError, InvalidRequest):
    """The endpoint spec is not `URL#MODEL` (or `openai:URL#MODEL`) with an http(s) URL."""


class EndpointUnreachable(EndpointError, ConnectionError):
    """No connection to the endpoint (refused, reset, DNS), after the retries."""


class EndpointTimeout(EndpointError, TimeoutError):
    """The endpoint did not answer within the client's timeout."""


class EndpointStatusError(EndpointError):
    """The endpoint answered an HTTP error status (429/502/503/504 only after the retries).

    `retry_after`: seconds the server asked to wait (`Retry-After`), where it said."""

    def __init__(self, message: str, *, url: str | None = None, status: int | None = None,
                 reason: str | None = None, retry_after: float | None = None):
        super().__init__(message, url=url, status=status, reason=reason)
        self.retry_after = retry_after


class EndpointBadResponse(EndpointError, ValueError):
    """The endpoint answered 2xx with something unusable: no JSON, a non-finite number, not the
    expected shape (no chat completion, no choices)."""


class JudgeError(OrchardError, RuntimeError):
    """A judge (LLM, local model, value model, Monte Carlo values) gave no usable verdict: the
    sample or trajectory is dropped or marked errored, never given a made-up score."""

    @classmethod
    def of(cls, error: EndpointError) -> JudgeError:
        """The judge's endpoint failed: its reason first (what a count of dropped samples keys on)."""
        return cls(f"the judge failed ({error.reason}): {error}")


class Conflict(InvalidRequest):
    """The request clashes with what exists (a sandbox or job id that is taken)."""


# --------------------------------------------------------------------------- the wire
# The one table of how errors cross HTTP. The orchestrator answers an exception with a
# status and `{detail, error}`, where `error` names the class the remote client raises:
# service/errors.py encodes with it, remote.py (and the terminal) decode with it.


@dataclass(frozen=True)
class WireError:
    cls: type[BaseException]  # raised on the server (matched by isinstance, first row wins)
    status: int  # the answer's status
    name: str  # the answer's `error`: the class the client raises


WIRE_ERRORS: tuple[WireError, ...] = (  # most specific first
    WireError(Conflict, 409, "InvalidRequest"),
    WireError(SandboxNotFound, 404, "SandboxNotFound"),
    WireError(JobNotFound, 404, "JobNotFound"),
    WireError(SnapshotNotFound, 404, "SnapshotNotFound"),
    WireError(FileNotFoundError, 404, "FileNotFoundError"),
    WireError(FileTooLarge, 413, "FileTooLarge"),
    WireError(ImageNotFound, 422, "ImageNotFound"),
    WireError(InvalidRequest, 422, "InvalidRequest"),
    WireError(SandboxTimeout, 408, "SandboxTimeout"),
    WireError(SandboxFailed, 409, "SandboxFailed"),
    WireError(ServiceUnavailable, 503, "ServiceUnavailable"),
    # a sandbox's agent refusing our token is our fault, not the caller's: never a 401 here
    WireError(AuthenticationError, 502, "AgentUnavailable"),
    WireError(AgentUnavailable, 502, "AgentUnavailable"),
    WireError(BackendError, 502, "BackendError"),
    WireError(OrchardError, 500, "OrchardError"),
)

# An answer that names no class we know (a proxy's, the framework's own 401/403/404): by status.
STATUS_ERRORS: dict[int, type[BaseException]] = {
    401: AuthenticationError, 403: AuthenticationError, 404: SandboxNotFound, 408: SandboxTimeout,
    409: InvalidRequest, 413: FileTooLarge, 422: InvalidRequest, 503: ServiceUnavailable,
}

# `error` name -> class, for every name the orchestrator sends
_SENT = {row.name for row in WIRE_ERRORS} | {cls.__name__ for cls in STATUS_ERRORS.values()}
ERRORS_BY_NAME: dict[str, type[BaseException]] = {
    cls.__name__: cls for cls in (*(row.cls for row in WIRE_ERRORS), *STATUS_ERRORS.values()) if cls.__name__ in _SENT}

# The in-sandbox agent's answers are `{error: message}` with a status alone (no class name).
AGENT_STATUS_ERRORS: dict[int, type[BaseException]] = {401: AuthenticationError, 413: FileTooLarge}

MAX_MESSAGE = 10_000  # characters of an error answer kept in the exception (a proxy may send whole pages)


def wire_error(exc: BaseException) -> WireError | None:
    """The table's row for an exception raised on the server; None if none fits."""
    for row in WIRE_ERRORS:
        if isinstance(exc, row.cls):
            return row
    return None


def _short(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE] + f"... ({len(text)} characters)"


def error_from_answer(status: int, body) -> BaseException:
    """The typed exception for the orchestrator's error answer `{detail, error}` (or any body,
    however garbled: an unknown or non-string `error` falls back to the status)."""
    name, detail = None, body
    if isinstance(body, dict):
        name, detail = body.get("error"), body.get("detail", body)
    if isinstance(detail, list):  # validation problems
        detail = "; ".join(
            f"{'.'.join(str(p) for p in d.get('loc', ()) if p != 'body') or 'value'}: {d.get('msg', d)}"
            if isinstance(d, dict) else str(d) for d in detail)
    cls = (ERRORS_BY_NAME.get(name) if isinstance(name, str) else None) or STATUS_ERRORS.get(status)
    if cls is None:
        cls = InvalidRequest if status < 500 else OrchardError
    message = _short(str(detail)) if detail not in (None, "") else f"HTTP {status}"
    if cls is InvalidRequest and status not in (409, 422):
        message = f"{status}: {message}"
    return cls(message)


def error_from_job(error: str) -> BaseException:
    """The exception a job's 'ClassName: message' error names (OrchardError if none we know)."""
    name, _, message = error.partition(": ")
    cls = ERRORS_BY_NAME.get(name)
    return cls(message or error) if cls is not None else OrchardError(error)


def error_from_agent(status: int, message: str) -> BaseException:
    """The typed exception for the in-sandbox agent's error answer (status and message)."""
    if status == 404 and "no such file" in message:
        return FileNotFoundError(message)
    cls = AGENT_STATUS_ERRORS.get(status)
    if cls is not None:
        return cls(message)
    if status < 500:
        return InvalidRequest(f"{status}: {message}")
    return OrchardError(f"agent error {status}: {message}")
