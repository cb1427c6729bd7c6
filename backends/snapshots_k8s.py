"""Snapshots of kubernetes sandboxes: a tarball of the workdir, kept in a snapshot store.

Taking one: the sandbox's agent runs `tar -czf` of the workdir into a file outside it,
moves it in (the agent serves files of its workdir only) and the backend streams it out
(`GET /files`, chunk by chunk) into the store, then has the file removed. So the pod needs `tar` (busybox, Debian and SWE-bench images have it),
and the tarball must fit the agent's largest download (`--max-file-size`, 100 MiB).

Starting from one (`from_snapshot`): the pod's workdir is an `emptyDir`, and an init
container `restore-snapshot` (the injector image, a busybox) mounts the store's volume
read-only and unpacks the tarball into it before the task container starts.

The store (`SnapshotStore`) is a small interface: put/get/list/delete of a tarball and
its metadata, and the pod volume that holds its files. `DirectorySnapshotStore` is a
directory this process writes, which pods mount as the config's `snapshot_volume`: a
hostPath of the same directory (single-node clusters, the fake cluster of the tests) or a
ReadWriteMany PersistentVolumeClaim that the orchestrator's pod mounts at `snapshot_dir`.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from abc import ABC, abstractmethod
from pathlib import Path

from orchard_gym.agent_client import AgentClient
from orchard_gym.errors import BackendError, InvalidRequest, SandboxFailed, SandboxNotFound, SnapshotNotFound
from orchard_gym.models import SNAPSHOT_ID_RE, ExecRequest, SnapshotRecord

from .base import new_snapshot_id

RESTORE_CONTAINER = "restore-snapshot"
SNAPSHOT_VOLUME, WORK_VOLUME = "orchard-snapshot", "workspace"
SNAPSHOT_MOUNT = "/orchard-snapshots"


def default_snapshot_dir() -> Path:
    cache = Path(os.environ.get("ORCHARD_CACHE", Path.home() / ".cache" / "orchard-gym"))
    return cache / "k8s-snapshots"


def check_id(snapshot_id) -> str:
    if not isinstance(snapshot_id, str) or not SNAPSHOT_ID_RE.match(snapshot_id):
        raise SnapshotNotFound(f"no snapshot {str(snapshot_id)[:80]!r} (snapshot ids are 'snap-' + 16 hex digits)")
    return snapshot_id


class SnapshotStore(ABC):
    """Where tarballs of workdirs live, and how a pod reaches them."""

    @abstractmethod
    def writer(self, snapshot_id: str):
        """A binary file to write the tarball to; `commit(snapshot_id, meta)` makes it visible."""

    @abstractmethod
    def commit(self, snapshot_id: str, meta: dict) -> None: ...

    @abstractmethod
    def abort(self, snapshot_id: str) -> None: ...

    @abstractmethod
    def meta(self, snapshot_id: str) -> dict | None: ...

    @abstractmethod
    def list(self) -> list[dict]: ...

    @abstractmethod
    def delete(self, snapshot_id: str) -> bool: ...

    @abstractmethod
    def volume(self) -> dict:
        """The pod volume source (without its name) holding the tarballs."""

    @abstractmethod
    def member(self, snapshot_id: str) -> str:
        """The tarball's path inside that volume."""


class DirectorySnapshotStore(SnapshotStore):
    def __init__(self, path: Path, volume: dict | None = None):
        self.path = Path(path).resolve()
        self.path.mkdir(parents=True, exist_ok=True)
        self._volume = volume or {"hostPath": {"path": str(self.path), "type": "Directory"}}

    def writer(self, snapshot_id: str):
        return open(self.path / f".{check_id(snapshot_id)}.tgz.part", "wb")

    def commit(self, snapshot_id: str, meta: dict) -> None:
        part = self.path / f".{snapshot_id}.tgz.part"
        meta = {**meta, "size_bytes": part.stat().st_size}
        os.chmod(part, 0o644)  # the restore container may run as another uid
        os.replace(part, self.path / f"{snapshot_id}.tgz")
        tmp = self.path / f".{snapshot_id}.json.part"
        tmp.write_text(json.dumps(meta))
        os.replace(tmp, self.path / f"{snapshot_id}.json")  # the record last: a listed snapshot is complete

    def abort(self, snapshot_id: str) -> None:
        (self.path / f".{snapshot_id}.tgz.part").unlink(missing_ok=True)

    def meta(self, snapshot_id: str) -> dict | None:
        try:
            return json.loads((self.path / f"{check_id(snapshot_id)}.json").read_text())
        except (OSError, ValueError):
            return None

    def list(self) -> list[dict]:
        out = []
        for f in sorted(self.path.glob("snap-*.json")):
            found = self.meta(f.stem) if SNAPSHOT_ID_RE.match(f.stem) else None
            if found:
                out.append(found)
        return out

    def delete(self, snapshot_id: str) -> bool:
        try:
            (self.path / f"{check_id(snapshot_id)}.json").unlink()
        except (OSError, SnapshotNotFound):
            return False
        (self.path / f"{snapshot_id}.tgz").unlink(missing_ok=True)
        return True

    def volume(self) -> dict:
        return self._volume

    def member(self, snapshot_id: str) -> str:
        return f"{check_id(snapshot_id)}.tgz"


class KubernetesSnapshots:
    """The snapshot half of a KubernetesBackend."""

    def __init__(self, backend, store: SnapshotStore):
        self.b, self.store = backend, store

    def _record(self, meta: dict) -> SnapshotRecord:
        return SnapshotRecord(**{k: meta[k] for k in SnapshotRecord.model_fields if k in meta})

    def _mine(self, meta: dict) -> bool:
        return meta.get("owner") == self.b.owner

    async def take(self, sandbox_id: str, extra_labels: dict[str, str] | None = None) -> SnapshotRecord:
        record = await self.b.get(sandbox_id)
        if record is None:
            raise SandboxNotFound(f"no sandbox {sandbox_id!r}")
        if record.status != "running" or record.endpoint is None:
            raise SandboxFailed(f"sandbox {sandbox_id} is not running ({record.status}); cannot snapshot it")
        snapshot_id = new_snapshot_id()
        workdir = record.workdir or self.b.config.workdir
        # packed outside the workdir (never in its own tarball), then moved in: the agent serves
        # files from its workdir only
        packed, tarball = f"/tmp/.orchard-{snapshot_id}.tgz", f"{workdir.rstrip('/')}/.orchard-{snapshot_id}.tgz"
        agent = AgentClient(record.endpoint)
        try:
            pack = f"tar -C {shlex.quote(workdir)} -czf {packed} . && mv {packed} {shlex.quote(tarball)}"
            made = await agent.exec(ExecRequest(command=pack, timeout=600))
            if made.exit_code != 0:
                raise BackendError(f"cannot pack the workdir of {sandbox_id} (tar exit {made.exit_code}): "
                                   f"{(made.stdout + made.stderr)[-500:]}")
            try:
                _, chunks = await agent.download_stream(tarball, timeout=600)
                with self.store.writer(snapshot_id) as f:
                    async for chunk in chunks:
                        f.write(chunk)
            except BaseException:
                self.store.abort(snapshot_id)
                raise
            finally:
                await agent.exec(ExecRequest(command=["rm", "-f", tarball, packed], timeout=60))
        finally:
            await agent.aclose()
        meta = {"snapshot_id": snapshot_id, "sandbox_id": sandbox_id, "backend": self.b.name, "image": record.image,
                "created_at": time.time(), "labels": {**record.labels, **(extra_labels or {})}, "owner": self.b.owner,
                "identity": self.b.identity, "workdir": workdir}
        self.store.commit(snapshot_id, meta)
        return self._record(self.store.meta(snapshot_id))

    def source(self, snapshot_id: str, image: str | None) -> dict:
        """The snapshot's meta for a create (SnapshotNotFound if there is none of ours)."""
        meta = self.store.meta(check_id(snapshot_id))
        if meta is None or not self._mine(meta):
            raise SnapshotNotFound(f"no snapshot {snapshot_id!r} (never taken, or deleted)")
        if image not in (None, meta.get("image")):
            raise InvalidRequest(f"snapshot {snapshot_id} is of image {meta.get('image')!r}, not {image!r}")
        return meta

    def restore_into(self, manifest: dict, snapshot_id: str) -> dict:
        """Make the pod's workdir an emptyDir filled from the snapshot by an init container."""
        spec = manifest["spec"]
        workdir = self.b.config.workdir
        task = next(c for c in spec["containers"] if c["name"] == "sandbox")
        if not any(v["name"] == WORK_VOLUME for v in spec["volumes"]):
            spec["volumes"].append({"name": WORK_VOLUME, "emptyDir": {}})
            task["volumeMounts"].append({"name": WORK_VOLUME, "mountPath": workdir})
        spec["volumes"].append({"name": SNAPSHOT_VOLUME, **self.store.volume()})
        injector = spec["initContainers"][0]
        member = shlex.quote(f"{SNAPSHOT_MOUNT}/{self.store.member(snapshot_id)}")
        spec["initContainers"].append({
            "name": RESTORE_CONTAINER, "image": injector["image"], "imagePullPolicy": injector["imagePullPolicy"],
            "command": ["/bin/sh", "-c", f"tar -xzf {member} -C /workspace"],
            "volumeMounts": [{"name": SNAPSHOT_VOLUME, "mountPath": SNAPSHOT_MOUNT, "readOnly": True},
                             {"name": WORK_VOLUME, "mountPath": "/workspace"}],
            "resources": injector["resources"], "securityContext": {**injector["securityContext"],
                                                                    "readOnlyRootFilesystem": True},
        })
        return manifest

    def list(self) -> list[SnapshotRecord]:
        return sorted((self._record(m) for m in self.store.list() if self._mine(m)), key=lambda r: r.created_at)

    def get(self, snapshot_id: str) -> SnapshotRecord | None:
        try:
            meta = self.store.meta(check_id(snapshot_id))
        except SnapshotNotFound:
            return None
        return self._record(meta) if meta and self._mine(meta) else None

    def delete(self, snapshot_id: str) -> bool:
        if self.get(snapshot_id) is None:
            return False
        return self.store.delete(snapshot_id)

    def sweep(self, gone) -> list[str]:
        """Delete snapshots whose per-process owner is gone (`gone(meta)`)."""
        removed = []
        for meta in self.store.list():
            if gone(meta) and self.store.delete(meta["snapshot_id"]):
                removed.append(meta["snapshot_id"])
        return removed

