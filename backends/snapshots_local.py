"""Snapshots of local sandboxes: a frozen copy of the working directory.

A snapshot is `ROOT/.snapshots/<snapshot-id>/` with `meta.json` and `tree/` (the workdir
as it was). Inside ROOT, so bubblewrap's tmpfs over ROOT hides it from every sandbox.
Taking one copies the workdir; a sandbox started from one copies `tree/` into its new
workdir. Copies go through `cp -a --reflink=auto`: on a filesystem with reflinks (btrfs,
XFS) each file is shared copy-on-write and the cost is the number of files, elsewhere
(ext4) it is a byte copy. Why not a hardlink tree: writes in place go through every link,
so a fork would change its snapshot. Why not overlayfs: bubblewrap before 0.9 has no
overlay options, and an overlay mounted inside the sandbox's namespace leaves the host's
view of the workdir empty (docs/snapshots.md has the measurements).

Running processes are not part of a snapshot. While the copy runs the sandbox's cgroup
(where there is one) is frozen, so the tree is one moment's state.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from pathlib import Path

from orchard_gym.errors import BackendError, SnapshotNotFound
from orchard_gym.models import SNAPSHOT_ID_RE, SnapshotRecord

from . import procs
from .fstree import remove_tree, tree_size
from .base import new_snapshot_id

log = logging.getLogger(__name__)
SNAPSHOTS_DIR = ".snapshots"  # under the backend's root; sweep and list skip dot-names


def copy_tree(src: Path, dst: Path) -> None:
    """Copy the contents of `src` into the existing folder `dst`, keeping modes, times and
    links; copy-on-write where the filesystem can."""
    r = subprocess.run(["cp", "-a", "--reflink=auto", "--", f"{src}/.", str(dst)], capture_output=True, text=True)
    if r.returncode != 0:
        raise BackendError(f"cannot copy {src} to {dst}: {r.stderr.strip()[-500:]}")


class LocalSnapshotStore:
    """Snapshots on disk next to the sandboxes, so any process with the same root finds them."""

    def __init__(self, root: Path, backend_name: str = "local", die_with_client: bool = True):
        self.root = root / SNAPSHOTS_DIR  # made by the first take: a root without snapshots stays as it was
        self.backend_name, self.die_with_client = backend_name, die_with_client

    def _home(self, snapshot_id: str) -> Path:
        if not isinstance(snapshot_id, str) or not SNAPSHOT_ID_RE.match(snapshot_id):
            raise SnapshotNotFound(f"no snapshot {str(snapshot_id)[:80]!r} (snapshot ids are 'snap-' + 16 hex digits)")
        return self.root / snapshot_id

    def _meta(self, snapshot_id: str) -> dict | None:
        try:
            return json.loads((self._home(snapshot_id) / "meta.json").read_text())
        except (OSError, ValueError, SnapshotNotFound):
            return None

    def _record(self, meta: dict) -> SnapshotRecord:
        return SnapshotRecord(**{k: meta[k] for k in SnapshotRecord.model_fields if k in meta})

    def take(self, sandbox_meta: dict, freeze=None) -> SnapshotRecord:
        """Copy the sandbox's workdir into a new snapshot. `freeze`: a context manager that
        holds the sandbox's processes still during the copy (or None)."""
        snapshot_id = new_snapshot_id()
        home = self.root / snapshot_id
        tmp = self.root / f".{snapshot_id}.tmp"  # renamed into place when complete: never half a snapshot
        tree = tmp / "tree"
        self.root.mkdir(mode=0o700, exist_ok=True)
        tree.mkdir(parents=True, mode=0o700)
        try:
            if freeze is not None:
                with freeze():
                    copy_tree(Path(sandbox_meta["workdir"]), tree)
            else:
                copy_tree(Path(sandbox_meta["workdir"]), tree)
            meta = {"snapshot_id": snapshot_id, "sandbox_id": sandbox_meta["sandbox_id"], "backend": self.backend_name,
                    # where the sandbox saw its workdir: forks (bubblewrap) see theirs at the same path
                    "workdir": sandbox_meta.get("sandbox_workdir", sandbox_meta["workdir"]),
                    "image": sandbox_meta.get("image"), "created_at": time.time(), "size_bytes": tree_size(tree),
                    "labels": dict(sandbox_meta.get("labels") or {}), "owner": procs.identity(os.getpid()),
                    "die_with_client": self.die_with_client}
            (tmp / "meta.json").write_text(json.dumps(meta))
            os.rename(tmp, home)
        except BaseException:
            _remove_quietly(tmp)
            raise
        return self._record(meta)

    def restore(self, snapshot_id: str, workdir: Path) -> dict:
        """Fill the (empty) `workdir` with the snapshot's tree; returns the snapshot's meta."""
        meta = self._meta(snapshot_id)
        if meta is None:
            self._home(snapshot_id)  # a malformed id says so
            raise SnapshotNotFound(f"no snapshot {snapshot_id!r} (never taken, or deleted)")
        copy_tree(self.root / snapshot_id / "tree", workdir)
        return meta

    def get(self, snapshot_id: str) -> SnapshotRecord | None:
        meta = self._meta(snapshot_id)
        return self._record(meta) if meta else None

    def _homes(self) -> list[Path]:
        try:
            return list(self.root.iterdir())
        except FileNotFoundError:  # no snapshot taken yet
            return []

    def list(self) -> list[SnapshotRecord]:
        out = []
        for home in sorted(self._homes()):
            meta = self._meta(home.name) if SNAPSHOT_ID_RE.match(home.name) else None
            if meta:
                out.append(self._record(meta))
        return out

    def delete(self, snapshot_id: str) -> bool:
        try:
            home = self._home(snapshot_id)
        except SnapshotNotFound:
            return False
        if not (home / "meta.json").exists():
            return False
        # rename first: a concurrent restore sees it gone, never half-deleted
        doomed = self.root / f".{snapshot_id}.deleting"
        try:
            os.rename(home, doomed)
        except OSError:
            return False
        _remove_quietly(doomed)  # a crashed or failed removal: the sweep finishes it
        return True

    def sweep(self) -> list[str]:
        """Remove snapshots whose taking process died (when die_with_client) and leftovers
        of takes and deletes that crashed or failed midway. One that fails is logged and
        left for the next sweep."""
        removed = []
        for home in self._homes():
            try:
                if home.name.startswith("."):
                    if time.time() - home.lstat().st_mtime > 60:  # a crashed take, or a delete
                        remove_tree(home)
                    continue
                meta = self._meta(home.name)
                if meta and meta.get("die_with_client") and not procs.alive(meta.get("owner")):
                    if self.delete(home.name):
                        removed.append(home.name)
            except Exception as e:
                log.warning("cannot sweep snapshot %s (%s); the next sweep tries again", home.name, e)
        return removed


def _remove_quietly(path: Path) -> None:
    try:
        remove_tree(path)
    except OSError as e:
        log.warning("%s; the next sweep tries again", e)
