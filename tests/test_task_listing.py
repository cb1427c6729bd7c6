"""Listing an env's tasks needs no env, sandbox or backend: `EnvClass.tasks_from(**env_kwargs)` /
`orchard_gym.registration.list_task_ids(env_id, **env_kwargs)` read the task source the kwargs name
(what `orchard eval`, harness evals, GRPO and harness GRPO use), and agree with the env's own
`task_ids()`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest

import orchard_gym  # noqa: F401 - registers the env ids
from orchard_gym.registration import env_tasks, list_task_ids

HARBOR = str(Path(__file__).parent / "data" / "harbor")
CASES = [("Orchard/Toy-v0", {}), ("Orchard/Toy-v0", {"kinds": ["write"], "num_tasks": 3, "seed": 5}),
         ("Orchard/ToyColour-v0", {"colours": {"teal": (0, 128, 128)}}), ("Orchard/Claw-v0", {}),
         ("Orchard/SWE-v0", {}), ("Orchard/GUI-v0", {"tasks": "desktop"}), ("Orchard/Harbor-v0", {"tasks": HARBOR}),
         ("Orchard/Claw-v0", {"tasks": f"harbor:{HARBOR}"})]  # the old door to Harbor folders: a Harbor env


@pytest.mark.parametrize("env_id, kwargs", CASES, ids=[f"{e}-{i}" for i, (e, _) in enumerate(CASES)])
def test_listing_agrees_with_the_env(env_id, kwargs):
    env = gym.make(env_id, **kwargs).unwrapped
    try:
        assert list_task_ids(env_id, **kwargs) == env.task_ids() and env.task_ids()
        assert set(env_tasks(env_id, **kwargs)) == set(env.task_ids())
    finally:
        env.close()


@pytest.mark.parametrize("env_id, kwargs", [("Orchard/Claw-v0", {}), ("Orchard/Harbor-v0", {"tasks": HARBOR}),
                                            ("Orchard/SWE-v0", {})])
def test_listing_makes_no_env_and_loads_no_backend(env_id, kwargs):
    """In a fresh process where making a SandboxEnv raises: the listing works and no backend
    module was imported (Harbor's env, made, reads the backend config to hide its task folders)."""
    code = f"""
import sys
import orchard_gym
from orchard_gym.envs.base import SandboxEnv
from orchard_gym.registration import list_task_ids

def tripwire(self, *a, **k):
    raise AssertionError("an env was made to list tasks")

SandboxEnv.__init__ = tripwire
ids = list_task_ids({env_id!r}, **{kwargs!r})
assert ids, ids
loaded = sorted(m for m in sys.modules if m.startswith("orchard_gym.backends"))
assert not loaded, loaded
print(len(ids))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


def test_a_bad_task_source_is_said_without_a_sandbox():
    with pytest.raises(ValueError, match="no Claw tasks"):
        list_task_ids("Orchard/Claw-v0", tasks="/nonexistent/tasks")
