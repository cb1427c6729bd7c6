"""Snapshots of local sandboxes: copy-on-write layers, or a frozen copy of the working directory.

A snapshot is `ROOT/.snapshots/<snapshot-id>/meta.json`, inside ROOT, so no sandbox's view
shows it. Where overlay layers work (root, Linux: layers.py) the snapshot is a chain of
layers (`meta["layers"]`, top first):

- of a fresh sandbox: one layer, a copy of its workdir (O(size), once);
- of a fork (a sandbox made from a snapshot, whose workdir is an overlay): one new layer, a
  copy of the fork's upper folder (only what changed since it was forked), over the chain
  it was forked from. A chain deeper than layers.MAX_DEPTH is taken flat (the merged workdir);
- a fork from it: an overlay mount of the chain with an empty upper of its own: O(1).

Elsewhere (not root) a snapshot is `tree/`, a copy of the workdir, and a fork copies it
into its new workdir. Copies go through `cp -a --reflink=auto`: on a filesystem with
reflinks (btrfs, XFS) each file is shared copy-on-write and the cost is the number of
files, elsewhere (ext4) it is a byte copy. Why not a hardlink tree: writes in place go
through every link, so a fork would change its snapshot (docs/snapshots.md has the
measurements).

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

from . import layers as layers_mod, procs
from .fstree import remove_tree, tree_size
from .base import new_snapshot_id
from .layers import LayerStore

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

    def __init__(self, root: Path, backend_name: str = "local", die_with_client: bool = True, layered: bool = True):
        self.root = root / SNAPSHOTS_DIR  # made by the first take: a root without snapshots stays as it was
        self.backend_root = root
        self.backend_name, self.die_with_client = backend_name, die_with_client
        self.no_layers_reason = layers_mod.unavailable_reason(root) if layered else "layered=False"
        self.layers = None if self.no_layers_reason else LayerStore(root)

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
        """Snapshot the sandbox's workdir: a new layer over its chain (layers.py) or a copy of
        the whole tree. `freeze`: a context manager that holds the sandbox's processes still
        during the copy (or None)."""
        snapshot_id = new_snapshot_id()
        home = self.root / snapshot_id
        tmp = self.root / f".{snapshot_id}.tmp"  # renamed into place when complete: never half a snapshot
        self.root.mkdir(mode=0o700, exist_ok=True)
        tmp.mkdir(mode=0o700)
        chain: list[str] | None = None
        staged: Path | None = None
        try:
            meta = {"snapshot_id": snapshot_id, "sandbox_id": sandbox_meta["sandbox_id"], "backend": self.backend_name,
                    # where the sandbox saw its workdir: forks (bubblewrap) see theirs at the same path
                    "workdir": sandbox_meta.get("sandbox_workdir", sandbox_meta["workdir"]),
                    "image": sandbox_meta.get("image"), "created_at": time.time(),
                    "labels": dict(sandbox_meta.get("labels") or {}), "owner": procs.identity(os.getpid()),
                    "die_with_client": self.die_with_client}
            if self.layers is not None:
                below = list(sandbox_meta.get("layers") or [])
                source = Path(sandbox_meta["upper"]) if below else Path(sandbox_meta["workdir"])
                if len(below) >= layers_mod.MAX_DEPTH:  # flat: the merged workdir as one layer
                    source, below = Path(sandbox_meta["workdir"]), []
                layer_id, staged = self.layers.staging()
                _copy_frozen(source, staged, freeze)
                meta["size_bytes"] = tree_size(staged)  # what this snapshot added
                chain = meta["layers"] = self.layers.publish(layer_id, staged, "sn-" + snapshot_id, below)
            else:
                tree = tmp / "tree"
                tree.mkdir(mode=0o700)
                _copy_frozen(Path(sandbox_meta["workdir"]), tree, freeze)
                meta["size_bytes"] = tree_size(tree)
            (tmp / "meta.json").write_text(json.dumps(meta))
            os.rename(tmp, home)
        except BaseException:
            _remove_quietly(tmp)
            if chain is not None:
                self.layers.release(chain, "sn-" + snapshot_id)
            elif staged is not None:
                _remove_quietly(staged.parent)
            raise
        return self._record(meta)

    def restore(self, snapshot_id: str, workdir: Path, rw: Path | None = None, holder: str | None = None) -> dict:
        """Give the (empty) `workdir` the snapshot's files; returns the snapshot's meta. A layered
        snapshot is mounted there (the upper in `rw`; the layers held by sandbox `holder`) and
        the meta returned has "upper"; a copied one is copied into it."""
        meta = self._meta(snapshot_id)
        if meta is None:
            self._home(snapshot_id)  # a malformed id says so
            raise SnapshotNotFound(f"no snapshot {snapshot_id!r} (never taken, or deleted)")
        chain = meta.get("layers")
        if chain is None:
            copy_tree(self.root / snapshot_id / "tree", workdir)
            return meta
        if self.layers is None or rw is None or holder is None:
            raise BackendError(f"snapshot {snapshot_id} is made of overlay layers, which cannot be mounted here: "
                               f"{self.no_layers_reason or 'no upper folder given'}")
        try:
            self.layers.hold(chain, "sb-" + holder, (self.root / snapshot_id / "meta.json").exists)
        except FileNotFoundError:
            raise SnapshotNotFound(f"no snapshot {snapshot_id!r} (deleted)") from None
        try:
            upper = self.layers.mount(chain, rw, workdir)
        except BaseException:
            self.layers.release(chain, "sb-" + holder)
            raise
        return {**meta, "upper": str(upper)}

    def release_sandbox(self, sandbox_meta: dict) -> None:
        """A deleted sandbox lets go of the layers it was forked from."""
        if self.layers is not None and sandbox_meta.get("layers"):
            self.layers.release(sandbox_meta["layers"], "sb-" + sandbox_meta["sandbox_id"])

    def _holder_exists(self, holder: str) -> bool:
        kind, _, name = holder.partition("-")
        if kind == "sn":
            return (self.root / name / "meta.json").exists()
        return kind == "sb" and "/" not in name and (self.backend_root / name).is_dir()

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
        try:
            chain = json.loads((doomed / "meta.json").read_text()).get("layers")
        except (OSError, ValueError):
            chain = None
        if chain and self.layers is not None:
            self.layers.release(chain, "sn-" + snapshot_id)
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
        if self.layers is not None:
            self.layers.sweep(self._holder_exists)
        return removed


def _copy_frozen(src: Path, dst: Path, freeze) -> None:
    if freeze is None:
        copy_tree(src, dst)
        return
    with freeze():
        copy_tree(src, dst)


def _remove_quietly(path: Path) -> None:
    try:
        remove_tree(path)
    except OSError as e:
        log.warning("%s; the next sweep tries again", e)
