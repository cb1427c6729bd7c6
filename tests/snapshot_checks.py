"""The fork-correctness check every backend's snapshot test runs (tests/test_snapshots*.py)."""

from __future__ import annotations

import pytest

from orchard_gym import SnapshotNotFound


def out(box, command: str) -> str:
    r = box.exec(command, timeout=60)
    assert r.exit_code == 0, (command, r.stdout, r.stderr)
    return r.stdout


def check_fork_correctness(client, image=None) -> None:
    """Files written before the snapshot are in every fork; a fork's writes are seen by no
    other fork nor the parent; deleting the parent (and then the snapshot) leaves forks intact."""
    parent = client.create_sandbox(image=image)
    out(parent, "mkdir -p sub && echo before > sub/a.txt && echo keep > b.txt && ln -s sub/a.txt link")
    snap = client_snapshot = parent.snapshot()
    assert snap.sandbox_id == parent.sandbox_id and snap.snapshot_id.startswith("snap-")
    assert snap.snapshot_id in [s.snapshot_id for s in client.list_snapshots()]
    out(parent, "echo parent-after > sub/a.txt")  # after the snapshot: in no fork
    forks = [client.create_sandbox(image=image, from_snapshot=snap.snapshot_id) for _ in range(2)]
    for fork in forks:
        assert out(fork, "cat sub/a.txt b.txt link") == "before\nkeep\nbefore\n"
    out(forks[0], "echo fork0 > sub/a.txt && echo new > c.txt && rm b.txt")
    assert out(forks[1], "cat sub/a.txt b.txt; test ! -e c.txt && echo no-c") == "before\nkeep\nno-c\n"
    assert out(parent, "cat sub/a.txt b.txt; test ! -e c.txt && echo no-c") == "parent-after\nkeep\nno-c\n"
    parent.delete()
    assert out(forks[0], "cat sub/a.txt c.txt; test ! -e b.txt && echo no-b") == "fork0\nnew\nno-b\n"
    late = client.create_sandbox(image=image, from_snapshot=snap.snapshot_id)  # the parent is gone
    assert out(late, "cat sub/a.txt") == "before\n"
    client.delete_snapshot(client_snapshot.snapshot_id)
    assert snap.snapshot_id not in [s.snapshot_id for s in client.list_snapshots()]
    assert out(forks[1], "cat sub/a.txt") == "before\n"  # a deleted snapshot leaves its forks
    with pytest.raises(SnapshotNotFound):
        client.create_sandbox(image=image, from_snapshot=snap.snapshot_id)
    with pytest.raises(SnapshotNotFound):
        client.delete_snapshot(snap.snapshot_id)
    for box in (*forks, late):
        box.delete()
