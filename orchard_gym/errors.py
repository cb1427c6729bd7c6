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
