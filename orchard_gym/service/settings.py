"""The orchestrator's settings, read from `ORCHARD_*` environment variables.

    ORCHARD_API_KEYS=key1,key2 ORCHARD_REDIS_URL=redis://127.0.0.1:6379/0 orchard serve

Every field below is also an environment variable: `sandbox_ttl` is `ORCHARD_SANDBOX_TTL`.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import uuid
from typing import Annotated, Any

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


def _default_replica_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class ServiceSettings(BaseSettings):
    """How one orchestrator replica runs."""

    model_config = SettingsConfigDict(env_prefix="ORCHARD_", extra="ignore")

    api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="accepted X-API-Key values, comma-separated; none: no auth (loopback only)")
    backend: str = Field("local", description="backend type: local, docker or kubernetes")
    backend_config: dict[str, Any] = Field(
        default_factory=dict, description="JSON object of the backend config's other fields, e.g. {\"root\": ...}")
    redis_url: str | None = Field(None, description="share state through Redis (several replicas); none: in memory")
    redis_prefix: str = Field("orchard", description="prefix of every Redis key and channel")
    replica_id: str = Field(default_factory=_default_replica_id, description="this replica's name")
    owner: str | None = Field(None, pattern=r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$",
                              description="owner label of the docker/kubernetes backend's sandboxes, shared by the "
                                          "replicas (default: one derived from redis_url and redis_prefix)")

    sandbox_ttl: float = Field(600.0, gt=0, description="seconds without a heartbeat (or any use) before a sandbox is reaped")
    reconcile_interval: float = Field(10.0, gt=0, description="seconds between reconciliation passes")
    replica_ttl: float | None = Field(None, gt=0, description="a replica silent this long is dead (default 3x reconcile_interval, at least 3 s)")
    ready_timeout: float = Field(120.0, gt=0, description="default seconds for a sandbox to become ready")
    job_ttl: float = Field(3600.0, gt=0, description="seconds a finished job stays readable")
    max_wait: float = Field(60.0, gt=0, description="longest server-side wait of one request (wait=true, /wait)")

    exec_concurrency: int = Field(128, ge=1, description="commands running at once on this replica")
    exec_queue: int = Field(4096, ge=0, description="commands waiting beyond that; more are refused with 503")
    agent_retry_window: float = Field(5.0, ge=0, description="seconds to keep retrying an agent that refuses connections")
    lock_ttl: float = Field(15.0, gt=0, description="seconds a per-sandbox lock outlives a replica that died holding it")

    log_level: str = Field("INFO")

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_keys(cls, v):
        if v is None:
            return []
        if isinstance(v, str):
            return [k.strip() for k in v.split(",") if k.strip()]
        return v

    @property
    def replica_dead_after(self) -> float:
        return self.replica_ttl or max(3.0, 3 * self.reconcile_interval)

    def backend_config_dict(self) -> dict[str, Any]:
        config = {"type": self.backend, **self.backend_config}
        if self.backend == "local":
            # sandboxes must outlive a replica restart so that it (or another) adopts them
            config["die_with_client"] = False
        if self.backend in ("docker", "kubernetes") and "owner" not in config and self.default_owner():
            # one owner for every replica of this deployment and its restarts: they all list the
            # sandboxes, and none is swept because the process that made it is gone
            config["owner"] = self.default_owner()
        return config

    def default_owner(self) -> str | None:
        """$ORCHARD_OWNER, else one name per store (the deployment: same Redis and prefix);
        None in memory, where sandboxes stay per-process (a restart loses their records)."""
        if self.owner or not self.redis_url:
            return self.owner
        import hashlib
        from urllib.parse import urlsplit

        url = urlsplit(self.redis_url)  # without the password: the owner label is public
        where = f"{url.scheme}://{url.hostname}:{url.port}{url.path}|{self.redis_prefix}"
        return "serve-" + hashlib.sha256(where.encode()).hexdigest()[:16]


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
