"""`task.toml` as Harbor's own `TaskConfig` (harbor 0.25, schema 1.x) defines it, read field by field.

Every field Harbor knows is either honoured (it changes how the task runs here) or refused
with a message naming it; a key Harbor does not know is a warning, never silently dropped.
The table in docs/harbor.md lists each field and what happens to it. (Written from the
schema, not from Harbor's code: `harbor` needs Python >= 3.12.)
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

ORG_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._-]*/[a-zA-Z0-9][a-zA-Z0-9._-]*$")
ENV_TEMPLATE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-(.*?))?\}")


class TaskRefused(ValueError):
    """A task.toml asks for something Orchard cannot do faithfully: the task is skipped."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="allow")


class Author(_Section):
    name: str
    email: str | None = None


class PackageInfo(_Section):
    name: str
    version: str | None = Field(None, min_length=1)
    description: str = ""
    authors: list[Author] = Field(default_factory=list)
    keywords: list[str] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _org_name(cls, v: str) -> str:
        if not ORG_NAME.match(v) or ".." in v:
            raise ValueError(f"[task] name must be 'org/name', got {v!r}")
        return v


class Healthcheck(_Section):
    command: str
    interval_sec: float = 5.0
    timeout_sec: float = 30.0
    start_period_sec: float = 0.0
    start_interval_sec: float = 5.0
    retries: int = 3


class _Network(_Section):
    network_mode: str | None = None
    allowed_hosts: list[str] | None = None

    @field_validator("network_mode")
    @classmethod
    def _mode(cls, v: str | None) -> str | None:
        if v is not None and v not in ("no-network", "public", "allowlist"):
            raise ValueError(f"network_mode must be no-network, public or allowlist, not {v!r}")
        return v


class Environment(_Network):
    build_timeout_sec: float = 600.0
    docker_image: str | None = None
    os: str = "linux"
    cpus: int | float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None
    gpus: int | None = None
    gpu_types: list[str] | None = None
    tpu: dict | None = None
    mcp_servers: list[dict] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    skills_dir: str | None = None
    healthcheck: Healthcheck | None = None
    workdir: str | None = None
    allow_internet: bool | None = None
    memory: str | None = None  # deprecated: "2G"
    storage: str | None = None  # deprecated


class Agent(_Network):
    timeout_sec: float | None = None
    user: str | int | None = None


class Verifier(_Network):
    timeout_sec: float = 600.0
    env: dict[str, str] = Field(default_factory=dict)
    user: str | int | None = None
    environment_mode: str | None = None
    environment: dict | None = None
    collect: list[dict] = Field(default_factory=list)


class Solution(_Section):
    env: dict[str, str] = Field(default_factory=dict)


class TaskConfig(_Section):
    schema_version: str = "1.4"
    version: str | None = None  # the old name of schema_version
    task: PackageInfo | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    verifier: Verifier = Field(default_factory=Verifier)
    agent: Agent = Field(default_factory=Agent)
    environment: Environment = Field(default_factory=Environment)
    solution: Solution = Field(default_factory=Solution)
    source: str | None = None
    multi_step_reward_strategy: str | None = None
    steps: list[dict] | None = None
    artifacts: list[Any] = Field(default_factory=list)


class Settings(BaseModel):
    """What a task.toml asks of a run, after the review: only what Orchard honours."""

    agent_timeout: float | None = None
    verifier_timeout: float = 600.0
    build_timeout: float = 600.0
    docker_image: str | None = None
    cpus: float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None
    internet: bool = True  # Harbor's default network_mode is "public"
    env: dict[str, str] = Field(default_factory=dict)
    verifier_env: dict[str, str] = Field(default_factory=dict)
    solution_env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = None
    healthcheck: Healthcheck | None = None
    name: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


def _unknown(model: BaseModel, where: str) -> list[str]:
    """Keys Harbor does not define, anywhere in the tree (warned about, never dropped silently)."""
    found = [f"{where}{k}" for k in (model.model_extra or {})]
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, _Section) and name != "metadata":
            found += _unknown(value, f"{where}{name}.")
    return found


def _positive(value: float | None, what: str) -> float | None:
    if value is not None and (not math.isfinite(value) or value <= 0):
        raise TaskRefused(f"{what} must be a positive number, not {value!r}")
    return value


def _size_mb(text: str, what: str) -> int:
    m = re.fullmatch(r"\s*([0-9.]+)\s*([GMK])\s*", text.upper())
    if not m:
        raise TaskRefused(f"[environment] {what} = {text!r}: expected a size like '1G' or '512M'")
    factor = {"G": 1024, "M": 1, "K": 1 / 1024}[m.group(2)]
    return int(float(m.group(1)) * factor)


def resolve_env(env: dict[str, str], what: str, host: dict[str, str] | None = None) -> dict[str, str]:
    """${VAR} and ${VAR:-default} from the host's environment, as Harbor resolves them."""
    host = os.environ if host is None else host

    def one(m: re.Match) -> str:
        if m.group(1) in host:
            return host[m.group(1)]
        if m.group(2) is not None:
            return m.group(2)
        raise TaskRefused(f"{what} needs ${{{m.group(1)}}} from the host environment, which is not set")
    return {k: ENV_TEMPLATE.sub(one, v) for k, v in env.items()}


def _network(mode: str | None, allow_internet: bool | None, hosts: list[str] | None, where: str) -> bool | None:
    if mode == "allowlist" or hosts:
        raise TaskRefused(f"{where} network_mode = 'allowlist' (allowed_hosts) is not supported: Orchard "
                          f"sandboxes have the network on or off")
    if mode is not None:
        return mode == "public"
    return allow_internet


def review(data: dict) -> tuple[Settings, list[str]]:
    """(what to honour, warnings) for a parsed task.toml; TaskRefused/ValueError when it cannot run."""
    try:
        config = TaskConfig.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"{where}: {first['msg']}" + (f" ({len(e.errors()) - 1} more)" if len(e.errors()) > 1 else "")) from None
    warnings = [f"unknown key {k} (not in Harbor's TaskConfig): ignored" for k in _unknown(config, "")]
    version = config.version if config.schema_version == "1.4" and config.version else config.schema_version
    if not version.startswith("1."):
        raise TaskRefused(f"schema_version {version!r}: only Harbor's 1.x task schema is known")
    env, agent, verifier = config.environment, config.agent, config.verifier
    if config.steps:
        raise TaskRefused("[[steps]] (multi-step tasks) are not supported")
    if config.multi_step_reward_strategy is not None:
        raise TaskRefused("multi_step_reward_strategy is for multi-step tasks, which are not supported")
    if env.os.lower() != "linux":
        raise TaskRefused(f"[environment] os = {env.os!r}: only linux sandboxes")
    if env.gpus or env.gpu_types or env.tpu:
        raise TaskRefused("[environment] gpus/gpu_types/tpu: Orchard sandboxes have no accelerators")
    if env.mcp_servers:
        raise TaskRefused("[environment] mcp_servers: MCP servers for the agent are not supported")
    if verifier.environment is not None or verifier.environment_mode == "separate":
        raise TaskRefused("[verifier] environment / environment_mode = 'separate': the verifier runs in the "
                          "agent's sandbox (after the agent's processes are killed), not in a container of its own")
    if verifier.environment_mode not in (None, "shared"):
        raise TaskRefused(f"[verifier] environment_mode must be shared or separate, not {verifier.environment_mode!r}")
    if verifier.collect:
        raise TaskRefused("[[verifier.collect]] hooks are not supported: they snapshot services' state into files "
                          "for artifact collection and a separate verifier, and neither is done here (the verifier "
                          "runs in the agent's sandbox and reaches the services by name)")
    internet = _network(env.network_mode, env.allow_internet, env.allowed_hosts, "[environment]")
    internet = True if internet is None else internet
    for section, phase in (("agent", agent), ("verifier", verifier)):
        override = _network(phase.network_mode, None, phase.allowed_hosts, f"[{section}]")
        if override is not None and override != internet:
            raise TaskRefused(f"[{section}] network_mode = {phase.network_mode!r} differs from [environment]'s: "
                              f"a sandbox's network is set once, for the agent and the verifier alike")
    memory_mb, storage_mb = env.memory_mb, env.storage_mb
    if env.memory is not None:
        memory_mb = memory_mb or _size_mb(env.memory, "memory")
    if env.storage is not None:
        storage_mb = storage_mb or _size_mb(env.storage, "storage")
    if storage_mb is not None and not 16 <= storage_mb <= 2**20:  # SandboxSpec.disk's range
        raise TaskRefused(f"[environment] storage_mb = {storage_mb}: a sandbox's disk is 16 MB to 1 TB here")
    for section, user in (("agent", agent.user), ("verifier", verifier.user)):
        if user is not None:
            warnings.append(f"[{section}] user = {user!r}: commands run as the sandbox's user (the image's USER "
                            f"on docker), not switched per phase")
    if env.skills_dir is not None:
        warnings.append("[environment] skills_dir: Orchard's policies have no skills folder; ignored")
    if config.artifacts:
        warnings.append("artifacts: not collected (the trajectory and the verifier's report are kept)")
    settings = Settings(
        agent_timeout=_positive(agent.timeout_sec, "[agent] timeout_sec"),
        verifier_timeout=_positive(verifier.timeout_sec, "[verifier] timeout_sec"),
        build_timeout=_positive(env.build_timeout_sec, "[environment] build_timeout_sec"),
        docker_image=env.docker_image,
        cpus=_positive(env.cpus, "[environment] cpus"), memory_mb=_positive(memory_mb, "[environment] memory_mb"),
        storage_mb=_positive(storage_mb, "[environment] storage_mb"), internet=internet,
        env=resolve_env(env.env, "[environment] env"),
        verifier_env=resolve_env(verifier.env, "[verifier] env"),
        solution_env=resolve_env(config.solution.env, "[solution] env"),
        workdir=env.workdir, healthcheck=env.healthcheck,
        name=config.task.name if config.task else None, metadata=config.metadata)
    return settings, warnings
