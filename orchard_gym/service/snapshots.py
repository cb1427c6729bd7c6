"""Snapshot routes (docs/snapshots.md):

    POST   /sandboxes/{sandbox_id}/snapshots   -> the snapshot's record
    GET    /snapshots                          -> the caller's snapshots
    DELETE /snapshots/{snapshot_id}            -> {status: deleted, snapshot_id}
    POST   /sandboxes {"from_snapshot": id}    (api.py) starts a sandbox from one

A snapshot carries its sandbox's labels and the owner label of its record (a pooled
sandbox's backend labels predate its claim), so it belongs to the key that owned the sandbox: another key gets the same 404 as for a missing one (`check_scope`
looks up `{snapshot_id}` like `{sandbox_id}`). The backend keeps the snapshots; the
reconciler deletes an orchestrator's snapshots `snapshot_ttl` seconds after they were
taken (their client deletes them sooner, when it closes).
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel

from orchard_gym.errors import SnapshotNotFound
from orchard_gym.models import SnapshotRecord

from .auth import OWNER_LABEL, RESERVED_LABEL_PREFIX, Caller, caller_of, check_scope
from .pools import POOL_LABEL

router = APIRouter(dependencies=[Depends(check_scope)])


class SnapshotDeleted(BaseModel):
    status: str = "deleted"
    snapshot_id: str


def public_snapshot(record: SnapshotRecord) -> dict:
    data = record.model_dump()
    data["labels"] = {k: v for k, v in record.labels.items() if not k.startswith(RESERVED_LABEL_PREFIX)}
    return data


async def visible_snapshot(request: Request, caller: Caller, snapshot_id: str) -> SnapshotRecord:
    """The snapshot if this caller may see it; else the 404 a missing one gets."""
    found = await request.app.state.service.backend.get_snapshot(snapshot_id)
    if found is None or not (caller.admin or caller.may_see_owner(found.labels.get(OWNER_LABEL))):
        raise SnapshotNotFound(f"no snapshot {snapshot_id[:80]!r}")
    return found


@router.post("/sandboxes/{sandbox_id}/snapshots", summary="snapshot a sandbox's files (not its processes)",
             response_model=SnapshotRecord)
async def take_snapshot(request: Request, sandbox_id: str) -> dict:
    # 404 when gone, 409 when failed; counts as a heartbeat; carries the record's owner
    return public_snapshot(await request.app.state.service.control.snapshot(sandbox_id))


@router.get("/snapshots", summary="list your snapshots", response_model=list[SnapshotRecord])
async def list_snapshots(request: Request) -> list[dict]:
    caller = caller_of(request)
    return [public_snapshot(s) for s in await request.app.state.service.control.list_snapshots()
            if OWNER_LABEL in s.labels and caller.may_see_owner(s.labels[OWNER_LABEL])]


@router.delete("/snapshots/{snapshot_id}", summary="delete a snapshot (sandboxes started from it go on)",
               response_model=SnapshotDeleted)
async def delete_snapshot(request: Request, snapshot_id: str) -> dict:
    await visible_snapshot(request, caller_of(request), snapshot_id)
    await request.app.state.service.control.delete_snapshot(snapshot_id)
    return {"status": "deleted", "snapshot_id": snapshot_id}


async def expire_snapshots(backend, ttl: float) -> int:
    """The reconciler's pass: delete this orchestrator's snapshots older than `ttl` (also those
    of pooled sandboxes taken before their owner was stamped on, which no key could see)."""
    try:
        snapshots = await backend.list_snapshots()
    except Exception:  # a backend without snapshots
        return 0
    done = 0
    for s in snapshots:
        if (OWNER_LABEL in s.labels or POOL_LABEL in s.labels) and s.created_at + ttl < time.time():
            done += int(await backend.delete_snapshot(s.snapshot_id))
    return done
