"""Copy-on-write layers for local snapshots: overlayfs lower layers, refcounted on disk.

A layer is a read-only folder `ROOT/.layers/trees/<layer-id>/`: the files one snapshot added
over the layers below it (overlayfs whiteouts and opaque-folder marks included). A
snapshot is a chain of layers (top first); a sandbox forked from it gets its workdir as an
overlay mount made here, in the backend's (root's) mount namespace:

    lowerdir = the chain's trees, upperdir = the sandbox's own `rw/upper` (on its size-capped
    image where there is one), mounted on ROOT/<id>/work

so a fork costs one mount whatever the workdir's size, and taking a snapshot of a fork copies
only its upper folder: what changed since it was forked. Nothing is ever written to a layer
after it is made, so no fork sees another's writes nor its parent's later ones; a fork's
upper is on its own image (or folder) and is bound into its sandbox alone.

Who uses a layer is a file per holder in `ROOT/.layers/refs/<layer-id>/` (`sn-<snapshot>`,
`sb-<sandbox>`), added and dropped under one lock file (`flock`, every process with the
same root), so a layer goes with the last snapshot or sandbox that uses it and never while
a fork is being mounted over it. `sweep()` drops refs whose holder is gone (a crashed
process) and removes layers no one holds. Inside ROOT, so no sandbox's view shows them.

Root only (overlay mounts in the host's namespace; whiteouts are device nodes), and only
where ROOT's path can be written in overlay's options: `unavailable_reason()` says why not,
and the snapshot store then copies whole trees instead (snapshots_local.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from orchard_gym.errors import BackendError

from .fstree import remove_tree
from .zygote_ns import mount

log = logging.getLogger(__name__)
LAYERS_DIR = ".layers"
MAX_DEPTH = 32  # layers in one chain; a deeper snapshot is taken flat (a copy of the merged workdir)
MS_NOSUID, MS_NODEV = 2, 4
STALE_SECONDS = 60.0  # a ref or layer younger than this may belong to a take or a fork in progress


def unavailable_reason(root: Path) -> str | None:
    """Why snapshots of sandboxes under `root` cannot be overlay layers here (None: they can)."""
    if os.geteuid() != 0:
        return "not root (overlay mounts and whiteouts need it)"
    try:
        with open("/proc/filesystems") as f:
            if not any(line.split()[-1:] == ["overlay"] for line in f):
                return "the kernel has no overlay filesystem"
    except OSError:
        return "no /proc/filesystems (not Linux?)"
    if any(c in str(root) for c in ",:\\=\n"):
        return f"the root {str(root)!r} has a character overlay's mount options cannot hold"
    return None


def new_layer_id() -> str:
    return "lay-" + uuid.uuid4().hex[:16]


class LayerStore:
    """The layers of one backend root (see the module docstring)."""

    def __init__(self, root: Path):
        self.home = root / LAYERS_DIR
        self.trees, self.refs = self.home / "trees", self.home / "refs"

    def tree(self, layer_id: str) -> Path:
        return self.trees / layer_id

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.refs.mkdir(parents=True, mode=0o700, exist_ok=True)
        fd = os.open(self.home / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    # ------------------------------------------------------------------ making
    def staging(self) -> tuple[str, Path]:
        """A new layer's id and the empty folder to fill (not a layer until `publish`)."""
        layer_id = new_layer_id()
        self.trees.mkdir(parents=True, mode=0o700, exist_ok=True)
        tmp = self.trees / f".{layer_id}.tmp"  # its own mtime: the copy keeps the source's on `tree`
        tmp.mkdir(mode=0o700)
        (tmp / "tree").mkdir(mode=0o755)
        return layer_id, tmp / "tree"

    def publish(self, layer_id: str, tmp: Path, holder: str, below: list[str]) -> list[str]:
        """Make the filled `tmp` the layer `layer_id`, held by `holder` with the layers `below`
        it (which `holder`'s source holds already); returns the chain, top first."""
        chain = [layer_id, *below]
        with self._locked():
            missing = [lid for lid in below if not self.tree(lid).is_dir()]
            if missing:
                raise BackendError(f"layers {missing} of the sandbox are gone; cannot snapshot it")
            os.rename(tmp, self.tree(layer_id))
            self._add(chain, holder)
        os.rmdir(tmp.parent)
        return chain

    def _add(self, chain: list[str], holder: str) -> None:
        for lid in chain:
            refs = self.refs / lid
            refs.mkdir(mode=0o700, exist_ok=True)
            os.close(os.open(refs / holder, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))

    def hold(self, chain: list[str], holder: str, still_there) -> None:
        """Add `holder` to every layer of `chain`, if `still_there()` (asked under the lock: a
        snapshot deleted meanwhile) and every layer exists; else BackendError/False from it."""
        with self._locked():
            if not still_there():
                raise FileNotFoundError("the snapshot was deleted")
            missing = [lid for lid in chain if not self.tree(lid).is_dir()]
            if missing:
                raise BackendError(f"the snapshot's layers {missing} are gone (removed by hand?)")
            self._add(chain, holder)

    def release(self, chain: list[str], holder: str) -> list[str]:
        """Drop `holder` from the layers of `chain`; remove those no one holds any more."""
        doomed = []
        with self._locked():
            for lid in chain:
                refs = self.refs / lid
                with contextlib.suppress(FileNotFoundError):
                    (refs / holder).unlink()
                if not _entries(refs):
                    doomed.append(self._retire(lid))
        for path in doomed:
            _remove_quietly(path)
        return [p.name for p in doomed]

    def _retire(self, layer_id: str) -> Path:
        """Under the lock: rename the layer out of reach (removed after the lock is let go)."""
        doomed = self.trees / f".{layer_id}.deleting.{uuid.uuid4().hex[:6]}"
        with contextlib.suppress(FileNotFoundError):
            os.rename(self.tree(layer_id), doomed)
        with contextlib.suppress(OSError):
            os.rmdir(self.refs / layer_id)
        return doomed

    # ------------------------------------------------------------------ mounting
    def mount(self, chain: list[str], rw: Path, target: Path) -> Path:
        """Mount the overlay of `chain` on `target` with its upper and work folders in `rw`
        (made here); the upper's root takes the top layer's owner and mode. Returns the upper."""
        upper, work = rw / "upper", rw / ".overlay-work"
        top = os.stat(self.tree(chain[0]))
        upper.mkdir(mode=0o700)
        work.mkdir(mode=0o700)
        os.chown(upper, top.st_uid, top.st_gid)
        os.chmod(upper, top.st_mode & 0o7777)
        lower = ":".join(str(self.tree(lid)) for lid in chain)
        try:
            mount("overlay", str(target), "overlay", MS_NOSUID | MS_NODEV,
                  f"lowerdir={lower},upperdir={upper},workdir={work}")
        except OSError as e:
            raise BackendError(f"cannot mount the fork's overlay on {target}: {e}") from None
        return upper

    # ------------------------------------------------------------------ sweeping
    def sweep(self, holder_exists) -> list[str]:
        """Drop refs older than a minute whose holder is gone (`holder_exists(name)` False),
        remove layers no one holds and leftovers of crashed takes and deletes."""
        now, removed, doomed = time.time(), [], []
        try:
            names = os.listdir(self.trees)
        except FileNotFoundError:
            return []
        with self._locked():
            for name in names:
                path = self.trees / name
                try:
                    old = now - path.lstat().st_mtime > STALE_SECONDS
                except FileNotFoundError:
                    continue
                if name.startswith("."):
                    if old:
                        doomed.append(path)
                    continue
                refs = self.refs / name
                for ref in _entries(refs):
                    with contextlib.suppress(FileNotFoundError):
                        if now - (refs / ref).lstat().st_mtime > STALE_SECONDS and not holder_exists(ref):
                            (refs / ref).unlink()
                if old and not _entries(refs):
                    doomed.append(self._retire(name))
                    removed.append(name)
        for path in doomed:
            _remove_quietly(path)
        return removed


def _entries(folder: Path) -> list[str]:
    try:
        return os.listdir(folder)
    except FileNotFoundError:
        return []


def _remove_quietly(path: Path) -> None:
    try:
        remove_tree(path)
    except OSError as e:
        log.warning("%s; the next sweep tries again", e)
