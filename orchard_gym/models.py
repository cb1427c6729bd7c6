"""Wire and record models shared by the SDK, the backends and the orchestrator."""

from __future__ import annotations

import re
import time
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, field_validator
from datetime import UTC

SANDBOX_ID_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
HOST_IMAGES = (None, "", "host")  # what `image` says for "no image" (the local backend's host view)
SNAPSHOT_ID_RE = re.compile(r"^snap-[0-9a-f]{16}$")  # never a path: no '/', no '..'
RESERVED_ENV_PREFIX = "ORCHARD_"  # sandbox env names the backends set themselves
SandboxStatus = Literal["pending", "running", "failed", "deleting", "deleted"]
JobStatus = Literal["queued", "running", "succeeded", "failed"]


def parse_memory(value: int | str | None) -> int | None:
    """'512m', '2Gi', '1.5g' or a byte count -> bytes."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError("memory must be a byte count or a string like '512m'")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError("memory must be positive")
        return value
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)?\s*", str(value).lower())
    if not m:
        raise ValueError(f"cannot read memory size {value!r}; use e.g. '512m' or '2Gi'")
    scale = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}[m.group(2)]
    size = int(float(m.group(1)) * scale)
    if size <= 0:
        raise ValueError("memory must be positive")
    return size


def parse_cpu(value):
    """A CPU count: a number, or a Kubernetes quantity ('2', '0.5', '2000m') -> cores."""
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(m?)\s*", value)
        if not m:
            raise ValueError(f"cannot read cpu {value!r}; use a number of cores or a quantity like '500m'")
        return float(m.group(1)) / (1000 if m.group(2) else 1)
    return value


# cores: a number, or the Kubernetes quantity Orchard Env's SDK sends ("2000m", "0.5")
Cpu = Annotated[float, BeforeValidator(parse_cpu), Field(gt=0, le=1024, allow_inf_nan=False)]


def _checked_memory(value: int | str) -> int | str:
    parse_memory(value)  # a clear ValueError for garbage; the value is kept as given
    return value


def _not_bool(value):
    if isinstance(value, bool):  # lax validation would read True as 1 byte
        raise ValueError("a size is a byte count or a string like '512m', not a boolean")
    return value


Memory = Annotated[int | str, BeforeValidator(_not_bool), AfterValidator(_checked_memory)]


def parse_mtime(value):
    """A modification time: seconds since the epoch, or the ISO 8601 string of the REST API."""
    if isinstance(value, str):
        from datetime import datetime
        try:
            stamp = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"cannot read modification time {value!r}") from None
        return (stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)).timestamp()
    return value


def iso_mtime(seconds: float) -> str:
    """The REST API's `modified`: ISO 8601 in UTC, as a string (Orchard Env's SDK reads a string)."""
    from datetime import datetime
    return datetime.fromtimestamp(seconds, UTC).isoformat()


SERVICE_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?$")


def check_env_vars(v: dict[str, str]) -> dict[str, str]:
    """`v` if every name and value can be a process's environment, else ValueError saying which not."""
    for key, value in v.items():
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise ValueError(f"illegal environment variable {key!r}: names need no '=' and no NUL, values no NUL")
    return v


class ServiceHealthcheck(BaseModel):
    """A sidecar's readiness probe, run in the sidecar by the backend (not by the engine):
    healthy at the first probe that exits 0; unhealthy when none does within
    `start_period + retries * interval` (plus one `timeout`), or when the sidecar exits."""

    model_config = ConfigDict(extra="forbid")

    test: list[str] = Field(min_length=1, description="argv of the probe (`sh -c CMD` for a shell probe)")
    interval: float = Field(30.0, gt=0, le=3600, allow_inf_nan=False)
    timeout: float = Field(30.0, gt=0, le=3600, allow_inf_nan=False)
    retries: int = Field(3, ge=1, le=1000)
    start_period: float = Field(0.0, ge=0, le=3600, allow_inf_nan=False)


class ServiceSpec(BaseModel):
    """A sidecar container of a sandbox (docker backend only): it runs beside the sandbox on a
    network of the sandbox's own, where the sandbox reaches it by `name`, and is removed with
    the sandbox. Made from an image already on the engine (nothing is pulled)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="host name the sandbox and the other services reach it by")
    image: str = Field(min_length=1)
    command: list[str] | None = None
    entrypoint: list[str] | None = None
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = None
    user: str | None = None
    healthcheck: ServiceHealthcheck | None = None
    depends_on: dict[str, Literal["service_started", "service_healthy"]] = Field(
        default_factory=dict, description="services started (or healthy) before this one starts")

    @field_validator("name")
    @classmethod
    def _check_name(cls, v: str) -> str:
        if not SERVICE_NAME_RE.match(v) or v == "main":
            raise ValueError(f"service name {v!r}: lowercase letters, digits, '-', '_', at most 63, not 'main' "
                             f"(the sandbox's own name)")
        return v

    @field_validator("env")
    @classmethod
    def _check_env(cls, v: dict[str, str]) -> dict[str, str]:
        return check_env_vars(v)


def check_services(services: list[ServiceSpec]) -> list[ServiceSpec]:
    """Unique names, known dependencies, no cycles; the services in an order that starts every
    service after those it depends on (ValueError otherwise)."""
    by_name: dict[str, ServiceSpec] = {}
    for s in services:
        if s.name in by_name:
            raise ValueError(f"service {s.name!r} is listed twice")
        by_name[s.name] = s
    ordered: list[ServiceSpec] = []
    state: dict[str, str] = {}

    def visit(s: ServiceSpec, path: tuple[str, ...]) -> None:
        if state.get(s.name) == "done":
            return
        if state.get(s.name) == "busy":
            raise ValueError(f"services depend on each other in a cycle: {' -> '.join((*path, s.name))}")
        state[s.name] = "busy"
        for dep in s.depends_on:
            if dep not in by_name:
                raise ValueError(f"service {s.name!r} depends on {dep!r}, which is not a service of the sandbox")
            visit(by_name[dep], (*path, s.name))
        state[s.name] = "done"
        ordered.append(s)
    for s in services:
        visit(s, ())
    return ordered


# a sandbox's disk: below 16 MiB mkfs cannot lay out an ext4 workdir (local); above 1 TiB each
# size's formatted template alone takes tens of MB on the backend's root
DISK_MIN, DISK_MAX = 16 * 2**20, 2**40


class SandboxSpec(BaseModel):
    """What to create: the body of `POST /sandboxes` and `create_sandbox()`."""

    model_config = ConfigDict(extra="forbid")

    image: str | None = Field(None, description="task image; on the local backend None or 'host'")
    block_network: bool = True
    sandbox_id: str | None = Field(None, description="DNS-label id; generated when absent")
    cpu: Cpu | None = Field(None, description="cores: 1.5, or a quantity like '1500m'")
    memory: Memory | None = Field(None, description="bytes, or '512m', '2Gi'")
    disk: Memory | None = Field(None, description="writable disk space, bytes or '10g' (local: the workdir's "
                                "size; kubernetes: the ephemeral-storage limit; docker: the container's storage "
                                "size, where the engine's storage driver has quotas); a backend that cannot hold "
                                "it refuses the sandbox")
    timeout: float | None = Field(None, gt=0, le=86400, allow_inf_nan=False, description="seconds to wait for ready")
    env: dict[str, str] = Field(default_factory=dict, description="environment of every exec")
    labels: dict[str, str] = Field(default_factory=dict)
    from_snapshot: str | None = Field(None, description="start from this snapshot's filesystem (snapshot())")
    services: list[ServiceSpec] = Field(default_factory=list, max_length=16,
                                        description="sidecar containers (docker backend only)")

    @field_validator("services")
    @classmethod
    def _check_services(cls, v: list[ServiceSpec]) -> list[ServiceSpec]:
        return check_services(v)

    @field_validator("disk")
    @classmethod
    def _check_disk(cls, v: int | str | None) -> int | str | None:
        size = parse_memory(v)
        if size is not None and not DISK_MIN <= size <= DISK_MAX:
            raise ValueError(f"disk must be between 16 MiB and 1 TiB, not {size} bytes")
        return v

    @field_validator("from_snapshot")
    @classmethod
    def _check_snapshot(cls, v: str | None) -> str | None:
        return check_snapshot_id(v) if v is not None else None

    @field_validator("sandbox_id")
    @classmethod
    def _check_id(cls, v: str | None) -> str | None:
        if v is not None and not SANDBOX_ID_RE.match(v):
            raise ValueError("sandbox_id must be a DNS label: lowercase letters, digits, '-', at most 63")
        return v

    @field_validator("env")
    @classmethod
    def _check_env(cls, v: dict[str, str]) -> dict[str, str]:
        for key in check_env_vars(v):
            if key.startswith(RESERVED_ENV_PREFIX):  # the backends' own (sandbox id, agent token)
                raise ValueError(f"environment variable {key!r} is reserved: names starting with "
                                 f"{RESERVED_ENV_PREFIX!r} belong to orchard-gym")
        return v

    @property
    def memory_bytes(self) -> int | None:
        return parse_memory(self.memory)

    @property
    def disk_bytes(self) -> int | None:
        return parse_memory(self.disk)


def check_snapshot_id(snapshot_id) -> str:
    """A snapshot id as snapshot() makes them ('snap-' + 16 hex), or ValueError."""
    if not isinstance(snapshot_id, str) or not SNAPSHOT_ID_RE.match(snapshot_id):
        raise ValueError(f"not a snapshot id: {str(snapshot_id)[:80]!r} (snapshot ids are 'snap-' + 16 hex digits)")
    return snapshot_id


class SnapshotRecord(BaseModel):
    """The filesystem state of a sandbox at one moment (`sandbox.snapshot()`); running
    processes are not part of it. Owned like its sandbox (its labels, owner label included)."""

    snapshot_id: str
    sandbox_id: str = Field(description="the sandbox it was taken from (may be deleted since)")
    backend: str
    image: str | None = None
    created_at: float = Field(default_factory=time.time)
    size_bytes: int | None = None
    labels: dict[str, str] = Field(default_factory=dict)


class AgentEndpoint(BaseModel):
    """How to reach a sandbox's agent: a unix socket or an HTTP base URL, and its token."""

    base_url: str | None = None
    uds: str | None = None
    token: str


class SandboxRecord(BaseModel):
    """A sandbox as the backend and the orchestrator know it."""

    sandbox_id: str
    image: str | None = None
    status: SandboxStatus = "pending"
    backend: str = "local"
    block_network: bool = True
    cpu: float | None = None
    memory: int | str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = None
    created_at: float = Field(default_factory=time.time)
    last_heartbeat: float = Field(default_factory=time.time)
    error: str | None = None
    endpoint: AgentEndpoint | None = Field(None, exclude=True)  # holds the token: never serialised
    details: dict[str, Any] = Field(default_factory=dict, description="backend-specific")

    def public(self) -> dict[str, Any]:
        return self.model_dump(exclude={"endpoint", "details"})


def _non_empty_command(v: str | list[str]) -> str | list[str]:
    if (isinstance(v, str) and not v.strip()) or (isinstance(v, list) and not v):
        raise ValueError("command is empty")
    return v


# a shell string or an argv list, never empty (the SDK's and the orchestrator's bodies)
Command = Annotated[str | list[str], AfterValidator(_non_empty_command)]
# a finite, positive number of seconds (Infinity/NaN/negative: a clear validation error)
Seconds = Annotated[float, Field(gt=0, le=7 * 86400, allow_inf_nan=False)]
# a job id the caller picks, so that it can cancel the job while it runs
JobId = Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]{1,64}$")]


class ExecRequest(BaseModel):
    """One command: the body of the agent's `POST /exec`."""

    model_config = ConfigDict(extra="forbid")

    command: Command
    cwd: str | None = None
    env: dict[str, str] | None = None
    timeout: Seconds = 600
    stdin: str | None = None
    login_shell: bool = False
    job_id: JobId | None = None


class ExecResult(BaseModel):
    """What the agent answers for one command."""

    exit_code: int
    stdout: str = ""
    stderr: str = ""
    duration: float = 0.0
    timed_out: bool = False
    truncated: bool = False
    cancelled: bool = False
    job_id: str | None = None
    limit: str | None = Field(None, description="a resource limit the command hit, in words (out of memory, "
                                                "no space left)")


class JobResult(BaseModel):
    """A command's outcome, in Orchard Env's shape (plus duration/timed_out/truncated)."""

    job_id: str
    sandbox_id: str | None = None
    command: str | list[str] | None = None
    status: JobStatus = "queued"
    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    created_at: float | None = None
    started_at: float | None = None
    completed_at: float | None = None
    error: str | None = None
    duration: float | None = None
    timed_out: bool = False
    truncated: bool = False

    @property
    def succeeded(self) -> bool:
        return self.status == "succeeded"

    @property
    def failed(self) -> bool:
        return self.status == "failed"

    @property
    def is_complete(self) -> bool:
        return self.status in ("succeeded", "failed")

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


class PatchResult(BaseModel):
    success: bool
    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None


class FileInfo(BaseModel):
    name: str
    type: Literal["file", "directory", "symlink"]
    size: int
    modified: Annotated[float, BeforeValidator(parse_mtime)]


class ExecEvent(BaseModel):
    """One event of a streamed exec: a chunk of output, or the final result."""

    type: Literal["stdout", "stderr", "exit"]
    data: str | None = None
    exit_code: int | None = None
    duration: float | None = None
    timed_out: bool = False
    truncated: bool = False
    cancelled: bool = False
    job_id: str | None = None
    limit: str | None = None  # as ExecResult.limit
