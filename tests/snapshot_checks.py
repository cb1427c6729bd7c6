"""The fork-correctness check every backend's snapshot test runs (tests/test_snapshots.py)."""

from __future__ import annotations

import pytest

from orchard_gym import SnapshotNotFound


def out(box, command: str) -> str:
    r = box.exec(command, timeout=120)
    assert r.exit_code == 0, (command, r.stdout, r.stderr)
    return r.stdout


def check_fork_correctness(client, image=None, outside: str | None = None, hook=None, deleted_hook=None) -> None:
    """Files written before the snapshot are in every fork; a fork's writes are seen by no
    other fork nor the parent; deleting the parent (and then the snapshot) leaves forks
    intact. Three sandboxes: the parent, fork A, and fork B made after the parent is gone.
    `outside`: a file outside the workdir that the snapshot also holds (docker: the whole
    filesystem); `hook(snapshot, fork)`: backend-specific checks while both exist;
    `deleted_hook(snapshot)`: checks once the snapshot is deleted while its forks still run."""
    parent = client.create_sandbox(image=image)
    out(parent, "mkdir -p sub && echo before > sub/a.txt && echo keep > b.txt && ln -s sub/a.txt link"
                + (f" && echo outside > {outside}" if outside else ""))
    snap = parent.snapshot()
    assert snap.sandbox_id == parent.sandbox_id and snap.snapshot_id.startswith("snap-")
    assert snap.snapshot_id in [s.snapshot_id for s in client.list_snapshots()]
    out(parent, "echo parent-after > sub/a.txt")  # after the snapshot: in no fork
    fork_a = client.create_sandbox(image=image, from_snapshot=snap.snapshot_id)
    assert out(fork_a, "cat sub/a.txt b.txt link") == "before\nkeep\nbefore\n"
    if outside:
        assert out(fork_a, f"cat {outside}") == "outside\n"
    out(fork_a, "echo fork-a > sub/a.txt && echo new > c.txt && rm b.txt")
    assert out(parent, "cat sub/a.txt b.txt; test ! -e c.txt && echo no-c") == "parent-after\nkeep\nno-c\n"
    parent.delete()
    assert out(fork_a, "cat sub/a.txt c.txt; test ! -e b.txt && echo no-b") == "fork-a\nnew\nno-b\n"
    fork_b = client.create_sandbox(image=image, from_snapshot=snap.snapshot_id)  # the parent is gone
    assert out(fork_b, "cat sub/a.txt b.txt; test ! -e c.txt && echo no-c") == "before\nkeep\nno-c\n"
    if hook is not None:
        hook(snap, fork_b)
    client.delete_snapshot(snap.snapshot_id)
    assert snap.snapshot_id not in [s.snapshot_id for s in client.list_snapshots()]
    assert out(fork_b, "cat sub/a.txt") == "before\n"  # a deleted snapshot leaves its forks
    assert out(fork_a, "cat sub/a.txt") == "fork-a\n"
    if deleted_hook is not None:
        deleted_hook(snap)
    with pytest.raises(SnapshotNotFound):
        client.create_sandbox(image=image, from_snapshot=snap.snapshot_id)
    with pytest.raises(SnapshotNotFound):
        client.delete_snapshot(snap.snapshot_id)
    fork_a.delete()
    fork_b.delete()
