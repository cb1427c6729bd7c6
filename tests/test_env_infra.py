"""SandboxEnv when the infrastructure, not the policy, fails: a sandbox deleted behind the env's
back (an operator, a reaper, a lost node) ends the episode as an infrastructure error (truncated,
trajectory.error set, trainers drop it), never as an action error the policy is told to fix, nor
as an exception out of step or grading; the next reset starts afresh."""

from __future__ import annotations

import gymnasium as gym
import pytest

import orchard_gym  # noqa: F401
from orchard_gym._loop import LoopThread
from orchard_gym.errors import InvalidRequest

BASH = {"name": "bash", "arguments": {"command": "echo hi"}}


@pytest.fixture
def env(local_root):
    e = gym.make("Orchard/Toy-v0", backend={"type": "local", "root": str(local_root)}).unwrapped
    yield e
    e.close()


def delete_behind_its_back(env) -> None:
    LoopThread.shared().run(env.sandbox.delete())


@pytest.mark.parametrize("last", [BASH, {"name": "submit", "arguments": {}}], ids=["step", "grading"])
def test_a_sandbox_deleted_behind_the_envs_back_is_an_infrastructure_error(env, last):
    env.reset(seed=0)
    env.step(BASH)
    delete_behind_its_back(env)
    obs, reward, terminated, truncated, info = env.step(last)
    assert (reward, terminated, truncated) == (0.0, False, True), info
    assert info["error"].startswith("SandboxNotFound"), info
    assert env.trajectory.error == info["error"] and env.trajectory.truncated
    obs, info = env.reset(seed=1)  # a fresh sandbox; the gone one is not in the way
    obs, reward, terminated, truncated, info = env.step(BASH)
    assert info.get("error") is None and info["action_error"] is None and "hi" in obs


def test_a_backend_named_by_its_type_alone():
    e = gym.make("Orchard/Toy-v0", backend="local").unwrapped
    try:
        e.reset(seed=0)
        assert e.sandbox.record.backend == "local"
    finally:
        e.close()
    bad = gym.make("Orchard/Toy-v0", backend="lokal").unwrapped
    try:
        with pytest.raises(InvalidRequest, match="bad backend config"):
            bad.reset(seed=0)
    finally:
        bad.close()
