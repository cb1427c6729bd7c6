"""orchard-gym: train and evaluate LLM agents in real sandboxes through the Gymnasium API.

Importing the package is cheap: it never imports torch, docker or kubernetes.
"""

from __future__ import annotations

from .client import AsyncSandboxClient, AsyncSandboxInstance, SandboxClient, SandboxInstance
from .errors import (
    AgentUnavailable,
    AuthenticationError,
    BackendError,
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
from .models import ExecEvent, FileInfo, JobResult, PatchResult, SandboxRecord, SandboxSpec, SnapshotRecord
from .terminal import AsyncPtyProcess, PtyError, PtyProcess

__version__ = "0.1.0"

from .registration import register_envs as _register_envs

_register_envs()

__all__ = [
    "AgentUnavailable", "AsyncPtyProcess", "AsyncSandboxClient", "AsyncSandboxInstance", "AuthenticationError", "BackendError",
    "ExecEvent", "FileInfo", "ImageNotFound", "InvalidRequest", "JobNotFound", "JobResult", "OrchardError",
    "PatchResult", "PtyError", "PtyProcess", "SandboxClient", "SandboxFailed", "SandboxInstance", "SandboxNotFound", "SandboxRecord",
    "SandboxSpec", "SandboxTimeout", "ServiceUnavailable", "SnapshotNotFound", "SnapshotRecord", "__version__",
]
