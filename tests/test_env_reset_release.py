"""A reset deletes the last episode's sandbox in the background (envs/base.py): the usage is
charged to that episode's ledger before reset returns, the sandbox is gone by the next
release, and close leaves nothing behind. Real local sandboxes."""

from __future__ import annotations

import gymnasium as gym

import orchard_gym  # noqa: F401  (registers the env ids)
from orchard_gym import SandboxClient
from conftest import wait_until


def test_reset_charges_then_deletes_the_last_sandbox(local_root):
    env = gym.make("Orchard/Toy-v0", backend={"type": "local", "root": str(local_root)}, num_tasks=2, max_steps=4)
    inner = env.unwrapped
    try:
        env.reset(seed=0)
        first, first_box = inner.trajectory, inner.sandbox.sandbox_id
        env.reset(seed=1)
        # charged before reset returned: the ledger of the episode that ended holds its sandbox
        assert [u.sandbox_id for u in first.ledger.sandboxes] == [first_box]
        assert inner.sandbox.sandbox_id != first_box
        with SandboxClient({"type": "local", "root": str(local_root)}) as other:
            assert wait_until(lambda: first_box not in {r.sandbox_id for r in other.list_sandboxes()}, 30)
        second_box = inner.sandbox.sandbox_id
        env.reset(seed=2)  # awaits the last delete before starting one more: at most one in flight
        assert inner.__dict__.get("_deleting") is not None
    finally:
        env.close()
    assert not (local_root / second_box).exists()
    assert inner.__dict__.get("_deleting") is None  # close awaited it
