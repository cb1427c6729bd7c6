"""orchard-gym: train and evaluate LLM agents in real sandboxes through the Gymnasium API.

Importing the package is cheap: it never imports torch, docker or kubernetes.
"""

from __future__ import annotations

from .import_interrupt import arm as _arm_import_interrupt

_arm_import_interrupt()  # the `orchard` command: Ctrl-C during these imports is one line, not a traceback

from .moved import install as _install_moved  # noqa: E402

_install_moved()  # old import paths of moved modules: deprecated aliases of the new ones

from .client import AsyncSandboxClient, AsyncSandboxInstance, SandboxClient, SandboxInstance  # noqa: E402
from .errors import (  # noqa: E402
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
from .models import ExecEvent, FileInfo, JobResult, PatchResult, SandboxRecord, SandboxSpec, SnapshotRecord  # noqa: E402
from .terminal import AsyncPtyProcess, PtyError, PtyProcess  # noqa: E402

__version__ = "0.1.0"

from .registration import register_envs as _register_envs  # noqa: E402

_register_envs()

__all__ = [
    "AgentUnavailable", "AsyncPtyProcess", "AsyncSandboxClient", "AsyncSandboxInstance", "AuthenticationError", "BackendError",
    "ExecEvent", "FileInfo", "ImageNotFound", "InvalidRequest", "JobNotFound", "JobResult", "OrchardError",
    "PatchResult", "PtyError", "PtyProcess", "SandboxClient", "SandboxFailed", "SandboxInstance", "SandboxNotFound", "SandboxRecord",
    "SandboxSpec", "SandboxTimeout", "ServiceUnavailable", "SnapshotNotFound", "SnapshotRecord", "__version__",
]
