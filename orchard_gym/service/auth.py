"""Who is calling, and which sandboxes they may see.

Every sandbox belongs to the API key that created it: its record (and the backend's
labels, so that an adopted sandbox keeps its owner) carries `orchard-gym.owner:
sha256:<hex of the key>` — a hash, never the key. Another key gets 404 on every route
of that sandbox and its jobs, and never sees it in a listing; an admin key
(`ORCHARD_ADMIN_KEYS`) sees and acts on all. Without any keys (loopback only) every caller
is the same one, "anonymous".
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Annotated

from fastapi import HTTPException, Request, Security
from fastapi.security import APIKeyHeader

from orchard_gym.errors import InvalidRequest, JobNotFound, SandboxNotFound, SnapshotNotFound
from orchard_gym.models import SandboxRecord

OWNER_LABEL = "orchard-gym.owner"
RESERVED_LABEL_PREFIX = "orchard-gym."
ANONYMOUS = "anonymous"
HIDDEN = "<hidden>"
MAX_KEY_LENGTH = 4096  # longer is garbage: refused before it is hashed

api_key_header = APIKeyHeader(name="X-API-Key", auto_error=False,
                              description="one of ORCHARD_API_KEYS (or ORCHARD_ADMIN_KEYS)")


def key_owner(key: str | bytes) -> str:
    data = key if isinstance(key, bytes) else key.encode("utf-8", "surrogateescape")
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Caller:
    owner: str  # what the sandboxes this caller creates are labelled with
    admin: bool = False

    def may_see(self, record: SandboxRecord) -> bool:
        return self.admin or hmac.compare_digest(record.labels.get(OWNER_LABEL, ""), self.owner)

    def may_see_owner(self, owner: str | None) -> bool:
        return self.admin or hmac.compare_digest(owner or "", self.owner)


class KeyRing:
    """The hashes of the accepted keys (the keys themselves are not kept here)."""

    def __init__(self, api_keys: list[str], admin_keys: list[str]):
        self.required = bool(api_keys or admin_keys)
        self._hashes = [(key_owner(k), False) for k in api_keys] + [(key_owner(k), True) for k in admin_keys]

    def caller(self, key: str | None) -> Caller:
        if not self.required:
            return Caller(ANONYMOUS, admin=True)
        if not key:
            raise HTTPException(401, "missing X-API-Key header")
        if len(key) > MAX_KEY_LENGTH:
            raise HTTPException(403, "invalid API key")
        given = key_owner(key)
        found, admin = False, False
        for owner, is_admin in self._hashes:  # compare with every key: the time says nothing
            if hmac.compare_digest(given, owner):
                found, admin = True, admin or is_admin
        if not found:
            raise HTTPException(403, "invalid API key")
        return Caller(given, admin=admin)


def require_api_key(request: Request, key: str | None) -> Caller:
    caller = request.app.state.keyring.caller(key)
    request.state.caller = caller
    return caller


def caller_of(request: Request) -> Caller:
    return request.state.caller


async def check_scope(request: Request, key: Annotated[str | None, Security(api_key_header)] = None) -> None:
    """The router's dependency: authenticates, then 404s any sandbox or job in the path that
    this caller may not see — so every route with `{sandbox_id}` or `{job_id}` is scoped,
    including routes added later. One dependency, not two: FastAPI solves each per request.
    (async: FastAPI runs a plain `def` dependency on its thread pool, a thread hop per request)"""
    caller = require_api_key(request, key)
    if caller.admin:
        return
    svc = request.app.state.service
    params = request.path_params
    if "sandbox_id" in params:
        record = await svc.store.get_sandbox(params["sandbox_id"])
        if record is None or not caller.may_see(record):
            raise SandboxNotFound(f"no sandbox {params['sandbox_id']!r}")
    if "job_id" in params:
        job = await svc.store.get_job(params["job_id"])
        if job is None or not caller.may_see_owner(getattr(job, "key_owner", None)):
            raise JobNotFound(f"no job {params['job_id']!r}")
    if "snapshot_id" in params:
        found = await svc.backend.get_snapshot(params["snapshot_id"])
        if found is None or not caller.may_see_owner(found.labels.get(OWNER_LABEL)):
            raise SnapshotNotFound(f"no snapshot {params['snapshot_id'][:80]!r}")


def check_labels(labels: dict[str, str]) -> None:
    reserved = [k for k in labels if k.startswith(RESERVED_LABEL_PREFIX)]
    if reserved:
        raise InvalidRequest(f"labels starting with {RESERVED_LABEL_PREFIX!r} are reserved: {reserved}")


def public_record(record: SandboxRecord) -> dict:
    """A record as a caller sees it: environment names without their values, no owner label."""
    data = record.public()
    data["env"] = {name: HIDDEN for name in record.env}
    data["labels"] = {k: v for k, v in record.labels.items() if not k.startswith(RESERVED_LABEL_PREFIX)}
    return data
