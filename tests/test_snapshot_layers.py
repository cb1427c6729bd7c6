"""Local snapshots as copy-on-write layers (backends/layers.py): what a snapshot and a fork
cost on disk follows what changed, and the layers keep every fork's state its own.

Real sandboxes (bubblewrap, the zygote, loop-mounted workdirs) on a real root; root is
needed for overlay mounts, which is what CI runs as."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from conftest import needs_bwrap
from orchard_gym import SandboxClient, SnapshotNotFound
from orchard_gym.backends.config import LocalBackendConfig
from orchard_gym.backends.fstree import tree_size
from orchard_gym.backends.layers import STALE_SECONDS, LayerStore, unavailable_reason
from snapshot_checks import out

MiB = 1024 * 1024


def _layers(root: Path) -> list[str]:
    try:
        return sorted(n for n in os.listdir(root / ".layers" / "trees") if not n.startswith("."))
    except FileNotFoundError:
        return []


@pytest.fixture
def client(local_root):
    reason = unavailable_reason(local_root)
    assert reason is None, f"overlay layers must work here (CI runs as root): {reason}"
    with SandboxClient({"type": "local", "root": str(local_root), "isolation": "bwrap",
                        "snapshots": "layers"}) as c:
        yield c


@needs_bwrap
def test_snapshot_of_a_fork_copies_what_changed_not_the_gib(client, local_root):
    """1 GiB in the set-up, 1 MiB changed in a fork: the fork's snapshot adds ~1 MiB to the
    disk and a fork from it adds nothing; the data is all there."""
    base = client.create_sandbox()
    out(base, "yes orchard | head -c 1073741824 > big && mkdir -p src && echo v1 > src/a.py && echo x > gone.txt"
              " && mkdir -p cache && echo old > cache/o")
    setup = base.snapshot()  # a fresh sandbox: its whole workdir becomes the first layer (once)
    assert setup.size_bytes >= 1024 * MiB
    fork = client.create_sandbox(from_snapshot=setup.snapshot_id)
    assert out(fork, "ls -la >/dev/null; head -c 7 big; cat src/a.py") == "orchard" + "v1\n"
    out(fork, "head -c 1048576 /dev/urandom > change.bin && echo v2 > src/a.py && rm gone.txt"
              " && rm -r cache && mkdir cache && echo new > cache/n")  # a whiteout and an opaque folder
    before = tree_size(local_root / ".layers")
    snap = fork.snapshot()
    added = tree_size(local_root / ".layers") - before
    assert added < 8 * MiB and snap.size_bytes < 8 * MiB, (added, snap.size_bytes)
    child = client.create_sandbox(from_snapshot=snap.snapshot_id)
    assert tree_size(local_root / ".layers") - before == added  # a fork copies nothing
    assert tree_size(Path(child.record.details["host_workdir"]).parent / "rw" / "upper") < MiB
    assert out(child, "cat src/a.py cache/*; test ! -e gone.txt && echo no-gone; stat -c %s big change.bin") == \
        f"v2\nnew\nno-gone\n{1024 * MiB}\n{MiB}\n"
    assert out(child, "md5sum change.bin") == out(fork, "md5sum change.bin")
    for b in (base, fork, child):
        b.delete()
    client.delete_snapshot(setup.snapshot_id)
    client.delete_snapshot(snap.snapshot_id)
    assert _layers(local_root) == []  # the last holder went: so did the 1 GiB


@needs_bwrap
def test_forks_see_the_snapshot_and_nothing_of_each_other(client, local_root):
    parent = client.create_sandbox()
    out(parent, "echo p0 > s.txt && mkdir d && echo in > d/f")
    snap0 = parent.snapshot()
    mid = client.create_sandbox(from_snapshot=snap0.snapshot_id)
    out(mid, "echo m1 > s.txt && echo extra > e.txt")
    snap1 = mid.snapshot()  # a layer over snap0's
    out(mid, "echo m-after > s.txt && rm d/f")  # after the snapshot: in no fork of it
    a = client.create_sandbox(from_snapshot=snap1.snapshot_id)
    b = client.create_sandbox(from_snapshot=snap1.snapshot_id)
    assert a.workdir == b.workdir == parent.workdir  # every fork sees its files at the first path
    assert out(a, "cat s.txt e.txt d/f") == "m1\nextra\nin\n"
    out(a, "echo a > s.txt && echo a > d/f && touch only-a")
    assert out(b, "cat s.txt d/f; test ! -e only-a && echo no-a") == "m1\nin\nno-a\n"
    assert out(mid, "cat s.txt; test ! -e d/f && test ! -e only-a && echo clean") == "m-after\nclean\n"
    assert out(parent, "cat s.txt d/f; test ! -e e.txt && echo no-e") == "p0\nin\nno-e\n"
    # a sandbox sees neither the layers nor another's upper folder
    assert a.exec(f"ls {local_root}/.layers {local_root}/{b.sandbox_id}/rw").exit_code != 0
    # deleting the parents and the snapshots leaves the forks whole
    parent.delete()
    mid.delete()
    client.delete_snapshot(snap0.snapshot_id)
    client.delete_snapshot(snap1.snapshot_id)
    assert out(b, "cat s.txt e.txt d/f") == "m1\nextra\nin\n"
    assert out(a, "cat s.txt d/f") == "a\na\n"
    with pytest.raises(SnapshotNotFound):
        client.create_sandbox(from_snapshot=snap1.snapshot_id)
    assert len(_layers(local_root)) == 2  # held by a and b until they go
    snap_a = a.snapshot()  # a third layer, over two whose snapshots are gone
    a.delete()
    c = client.create_sandbox(from_snapshot=snap_a.snapshot_id)
    assert out(c, "cat s.txt d/f e.txt") == "a\na\nextra\n"
    for box in (b, c):
        box.delete()
    client.delete_snapshot(snap_a.snapshot_id)
    assert _layers(local_root) == []


@needs_bwrap
def test_a_fork_cannot_write_into_a_layer(client, local_root):
    """Red team: a layer is shared by every fork of its snapshot, so a write that reached it
    would reach the siblings (and a reset from a set-up snapshot). Overlay keeps the layers
    read-only: a write lands in the writer's upper only."""
    parent = client.create_sandbox()
    out(parent, "echo clean > grader_input.txt")
    snap = parent.snapshot()
    evil = client.create_sandbox(from_snapshot=snap.snapshot_id)
    out(evil, "echo tampered > grader_input.txt; chmod 777 .; touch -d 2000-01-01 grader_input.txt")
    layer = LayerStore(local_root).tree(_layers(local_root)[0])
    assert (layer / "grader_input.txt").read_text() == "clean\n"
    victim = client.create_sandbox(from_snapshot=snap.snapshot_id)
    assert out(victim, "cat grader_input.txt") == "clean\n"


def test_sweep_drops_refs_of_crashed_holders(local_root):
    """A layer held only by a sandbox or snapshot that no longer exists (its process crashed
    before it let go) is removed by the sweep; one held by a live holder stays."""
    store = LayerStore(local_root)
    old = time.time() - 2 * STALE_SECONDS
    ids = []
    for holder in ("sb-sb-gone0000", "sn-snap-0123456789abcdef", "sb-alive"):
        lid, tree = store.staging()
        (tree / "f").write_text(holder)
        store.publish(lid, tree, holder, [])
        os.utime(store.tree(lid), (old, old))
        os.utime(store.refs / lid / holder, (old, old))
        ids.append(lid)
    (local_root / "alive").mkdir()  # a sandbox folder: the holder sb-alive exists
    removed = store.sweep(lambda ref: ref == "sb-alive")
    assert sorted(removed) == sorted(ids[:2]) and _layers(local_root) == [ids[2]]


def test_snapshots_setting_garbage_is_refused(local_root):
    for bad in ("overlay", "", None, 1):
        with pytest.raises(ValidationError, match="snapshots"):
            LocalBackendConfig(root=local_root, snapshots=bad)


@needs_bwrap
def test_a_warm_pool_serves_forks(local_root):
    """With a pool, create_sandbox(from_snapshot=...) takes a warm sandbox and mounts the
    snapshot's layers into it (backends/snapshot_attach.py): its files at its own workdir and
    at the snapshot's path, its writes its own, the layers let go when it goes."""
    from orchard_gym import InvalidRequest

    with SandboxClient({"type": "local", "root": str(local_root), "isolation": "bwrap", "snapshots": "layers"},
                       pool={None: 2}) as client:
        assert client.wait_pools(120)
        parent = client.create_sandbox()
        out(parent, "mkdir -p repo && echo v1 > repo/a && pwd > where")
        snap = parent.snapshot()
        assert client.wait_pools(120)
        pooled = set(client._async._pools.idle_ids())
        a = client.create_sandbox(from_snapshot=snap.snapshot_id)
        b = client.create_sandbox(from_snapshot=snap.snapshot_id)
        assert {a.sandbox_id, b.sandbox_id} == pooled  # both were warm ones
        assert out(a, "cat repo/a where") == f"v1\n{parent.workdir}\n"
        assert out(a, f"cat {parent.workdir}/repo/a") == "v1\n"  # absolute paths of the snapshot hold
        out(a, "echo a > repo/a && touch only-a")
        assert out(b, f"cat repo/a {parent.workdir}/repo/a; test ! -e only-a && echo no-a") == "v1\nv1\nno-a\n"
        assert out(parent, "cat repo/a; test ! -e only-a && echo no-a") == "v1\nno-a\n"
        snap_a = a.snapshot()  # a pool-served fork snapshots what it changed
        assert snap_a.size_bytes < 1024 * 1024
        c = client.create_sandbox(from_snapshot=snap_a.snapshot_id)
        assert out(c, "cat repo/a; ls only-a") == "a\nonly-a\n"
        # garbage: a used sandbox, a bad id, a missing snapshot (the claimed warm sandbox is not leaked)
        control = client._async._control
        with pytest.raises(InvalidRequest, match="untouched"):
            client._loop.run(control.load_snapshot(parent.sandbox_id, snap.snapshot_id))
        with pytest.raises(InvalidRequest, match="snapshot id"):
            client._loop.run(control.load_snapshot(parent.sandbox_id, "../x"))
        assert client.wait_pools(120)
        before = {r.sandbox_id for r in client.list_sandboxes()}
        with pytest.raises(SnapshotNotFound):
            client.create_sandbox(from_snapshot="snap-0123456789abcdef")
        assert client.wait_pools(120)
        assert len({r.sandbox_id for r in client.list_sandboxes()}) == len(before)
        for box in (a, b, c, parent):
            box.delete()
        client.delete_snapshot(snap.snapshot_id)
        client.delete_snapshot(snap_a.snapshot_id)
        assert _layers(local_root) == []
