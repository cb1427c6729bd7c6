"""The orchestrator's settings, read from `ORCHARD_*` environment variables.

    ORCHARD_API_KEYS=key1,key2 ORCHARD_REDIS_URL=redis://127.0.0.1:6379/0 orchard serve
    ORCHARD_REDIS_URL=rediss://orchard@redis.internal:6380/0 ORCHARD_REDIS_PASSWORD=... orchard serve

Every field below is also an environment variable: `sandbox_ttl` is `ORCHARD_SANDBOX_TTL`.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import tempfile
import uuid
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


def _default_replica_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


REDIS_SCHEMES = ("redis", "rediss", "unix")


def default_serve_root() -> Path:
    """The local backend's root under `orchard serve`: never the in-process default
    (`/tmp/orchard-gym-UID`, or $ORCHARD_LOCAL_ROOT), so the orchestrator never sees, adopts
    or reaps sandboxes that in-process `SandboxClient()`s made."""
    return Path(tempfile.gettempdir()) / f"orchard-gym-serve-{os.getuid()}"


def redact_url(url: str | None) -> str | None:
    """The URL with its password replaced by ***, for logs and error messages."""
    if not url:
        return url
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[-1]}"))


class ServiceSettings(BaseSettings):
    """How one orchestrator replica runs."""

    model_config = SettingsConfigDict(env_prefix="ORCHARD_", extra="ignore")

    api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="accepted X-API-Key values, comma-separated; none: no auth (loopback only)")
    admin_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="X-API-Key values that see and may act on every sandbox, comma-separated")
    backend: str = Field("local", description="backend type: local, docker or kubernetes")
    backend_config: dict[str, Any] = Field(
        default_factory=dict, description="JSON object of the backend config's other fields, e.g. {\"root\": ...}")
    redis_url: str | None = Field(
        None, description="share state through Redis (several replicas): redis://[user[:pass]@]host:port/db, "
                          "rediss:// (TLS) or unix:///path.sock?db=0; none: in memory")
    redis_username: str | None = Field(None, description="Redis ACL user (instead of putting it in the URL)")
    redis_password: SecretStr | None = Field(None, description="Redis password (requirepass/ACL), e.g. from a Secret")
    redis_ca_certs: str | None = Field(None, description="CA bundle that signs the rediss:// server's certificate")
    redis_allow_no_auth: bool = Field(
        False, description="allow a Redis on a non-loopback TCP address without a password (not recommended)")
    redis_prefix: str = Field("orchard", description="prefix of every Redis key and channel")
    replica_id: str = Field(default_factory=_default_replica_id, description="this replica's name")
    owner: str | None = Field(None, pattern=r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$",
                              description="owner label of the docker/kubernetes backend's sandboxes, shared by the "
                                          "replicas (default: one derived from redis_url and redis_prefix)")

    sandbox_ttl: float = Field(600.0, gt=0, description="seconds without a heartbeat (or any use) before a sandbox is reaped")
    snapshot_ttl: float = Field(6 * 3600.0, gt=0, description="seconds after which a snapshot is deleted (its "
                                "client deletes it sooner, when it closes)")
    reconcile_interval: float = Field(10.0, gt=0, description="seconds between reconciliation passes")
    replica_ttl: float | None = Field(None, gt=0, description="a replica silent this long is dead (default 3x reconcile_interval, at least 3 s)")
    ready_timeout: float = Field(120.0, gt=0, description="default seconds for a sandbox to become ready")
    job_ttl: float = Field(3600.0, gt=0, description="seconds a finished job stays readable")
    max_wait: float = Field(60.0, gt=0, description="longest server-side wait of one request (wait=true, a job's /wait)")
    service_secret: str | None = Field(None, description="key of the service endpoint URLs' signatures, the same "
                                                         "on every replica (default: derived from the API keys)")
    service_ttl: float = Field(3600.0, gt=0, description="default lifetime of a service endpoint URL, seconds")
    max_ready_wait: float = Field(3600.0, gt=0, description="longest wait of a sandbox's /wait (Orchard Env's SDK "
                                                           "asks for up to its ready timeout and treats 408 as final)")

    exec_concurrency: int = Field(128, ge=1, description="commands running at once on this replica")
    exec_queue: int = Field(4096, ge=0, description="commands waiting beyond that; more are refused with 503")
    agent_retry_window: float = Field(5.0, ge=0, description="seconds to keep retrying an agent that refuses connections")
    lock_ttl: float = Field(15.0, gt=0, description="seconds a per-sandbox lock outlives a replica that died holding it")

    log_level: str = Field("INFO")

    @field_validator("api_keys", "admin_keys", mode="before")
    @classmethod
    def _split_keys(cls, v):
        if v is None:
            return []
        if isinstance(v, str):
            return [k.strip() for k in v.split(",") if k.strip()]
        return v

    @field_validator("api_keys", "admin_keys")
    @classmethod
    def _check_keys(cls, v: list[str]) -> list[str]:
        for key in v:
            # HTTP header values are visible ASCII; anything else could never be sent
            if not key.isascii() or not key.isprintable() or key != key.strip():
                raise ValueError("API keys must be printable ASCII without surrounding spaces")
        return v

    @field_validator("redis_url")
    @classmethod
    def _check_redis_url(cls, v: str | None) -> str | None:
        if not v:
            return None
        try:
            parts = urlsplit(v)
            parts.port  # noqa: B018 - raises on a port that is not a number
        except ValueError as e:
            raise ValueError(f"cannot parse the Redis URL: {e}") from None
        if parts.scheme not in REDIS_SCHEMES:
            raise ValueError(f"the Redis URL must start with redis://, rediss:// or unix://, not {parts.scheme or v!r}")
        if parts.scheme == "unix" and not parts.path:
            raise ValueError("a unix:// Redis URL needs a socket path, e.g. unix:///run/redis/redis.sock")
        if parts.scheme != "unix" and not parts.hostname:
            raise ValueError("the Redis URL has no host, e.g. redis://127.0.0.1:6379/0")
        return v

    @model_validator(mode="after")
    def _check_redis_auth(self):
        if not self.redis_url:
            return self
        parts = urlsplit(self.redis_url)
        if self.redis_password is not None and parts.password is not None:
            raise ValueError("the Redis password is set twice (in ORCHARD_REDIS_URL and ORCHARD_REDIS_PASSWORD): "
                             "set it in one place")
        if self.redis_username and parts.username:
            raise ValueError("the Redis user is set twice (in ORCHARD_REDIS_URL and ORCHARD_REDIS_USERNAME)")
        has_password = self.redis_password is not None or parts.password is not None
        if parts.scheme != "unix" and not has_password and not self.redis_allow_no_auth \
                and not is_loopback(parts.hostname or ""):
            raise ValueError(f"refusing a Redis on {parts.hostname} without a password: anyone who reaches it could "
                             f"rewrite sandbox records. Set ORCHARD_REDIS_PASSWORD (requirepass or an ACL user), "
                             f"or ORCHARD_REDIS_ALLOW_NO_AUTH=true")
        return self

    @property
    def auth_required(self) -> bool:
        return bool(self.api_keys or self.admin_keys)

    def redis_options(self) -> dict[str, Any]:
        """Keyword arguments for `redis.asyncio.Redis.from_url` beside the URL."""
        options: dict[str, Any] = {}
        if self.redis_username:
            options["username"] = self.redis_username
        if self.redis_password is not None:
            options["password"] = self.redis_password.get_secret_value()
        if self.redis_ca_certs:
            options["ssl_ca_certs"] = self.redis_ca_certs
        return options

    @property
    def replica_dead_after(self) -> float:
        return self.replica_ttl or max(3.0, 3 * self.reconcile_interval)

    def backend_config_dict(self) -> dict[str, Any]:
        config = {"type": self.backend, **self.backend_config}
        if self.backend == "local":
            # sandboxes must outlive a replica restart so that it (or another) adopts them
            config["die_with_client"] = False
            config.setdefault("root", str(default_serve_root()))
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
    host = host.strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
