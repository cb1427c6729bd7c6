"""Typed errors of the SDK. Catch `OrchardError` for all of them."""

from __future__ import annotations


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
