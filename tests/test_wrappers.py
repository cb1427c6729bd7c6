"""The Gymnasium wrappers (timeouts, rewards, error filter) and the docstring examples."""

from __future__ import annotations

import asyncio
import doctest
import importlib
import time

import gymnasium as gym
import pytest
from orchard_gym.wrappers import DiscountedTerminalReward, ErrorFilter, ShapeReward, EchoEnv, WallClockTimeout
from orchard_gym.wrappers.proxy.reconstruct import discounted

import orchard_gym  # noqa: F401

DOC_MODULES = ["echo", "timeout", "reward", "error_filter", "proxy.reconstruct"]


@pytest.mark.parametrize("name", DOC_MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(f"orchard_gym.wrappers.{name}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_discounting_matches_the_paper():
    assert discounted(1.0, 4) == [1.0, 1.0, 1.0, 1.0]  # γ = 1.0, the default
    assert discounted(2.0, 3, gamma=0.9) == pytest.approx([2.0 * 0.81, 2.0 * 0.9, 2.0])
    assert discounted(1.0, 0) == []
    with pytest.raises(ValueError):
        discounted(1.0, 2, gamma=1.5)


def test_timeout_cancels_a_step_in_flight_and_aborts_the_env():
    inner = EchoEnv(length=10, delay=5.0)
    env = WallClockTimeout(inner, max_seconds=0.5)
    env.reset(seed=0)
    started = time.monotonic()
    obs, reward, terminated, truncated, info = env.step("slow")
    assert time.monotonic() - started < 2.0  # not the 5 s the step wanted
    assert truncated and not terminated and reward == 0.0 and info["error"].startswith("timeout")
    assert inner.aborted == info["error"]
    assert env.step("again")[3]  # still expired until reset
    env.reset(seed=0)
    assert inner.aborted is None
    with pytest.raises(ValueError):
        WallClockTimeout(inner, max_seconds=0)


def test_wrappers_compose_and_keep_errors_out_of_rewards():
    env = ErrorFilter(DiscountedTerminalReward(ShapeReward(EchoEnv(length=3, fail_at=3), lambda r, o, i: r + 5.0)))
    env.reset(seed=0)
    assert env.step("a")[1] == 5.0
    assert env.step("b")[1] == 5.0
    obs, reward, terminated, truncated, info = env.step("c")  # the toy sandbox dies here
    assert reward == 0.0 and info["discard"] and info["step_rewards"] is None and env.discarded == 1

    ok = ErrorFilter(DiscountedTerminalReward(EchoEnv(length=2, reward=1.0), gamma=0.5))
    ok.reset(seed=0)
    ok.step("a")
    obs, reward, terminated, truncated, info = ok.step("b")
    assert terminated and reward == 1.0 and not info["discard"] and info["step_rewards"] == [0.5, 1.0]
    assert (ok.episodes, ok.discarded) == (1, 0)


def test_async_twins_work_in_an_event_loop():
    async def main():
        env = WallClockTimeout(EchoEnv(length=2, delay=0.01), max_seconds=30)
        await env.areset(seed=1)
        await env.astep("a")
        result = await env.astep("b")
        await env.aclose()
        return result

    assert asyncio.run(main())[2] is True


def test_timeout_on_a_sandbox_env_deletes_the_sandbox_and_marks_the_trajectory(local_root):
    env = WallClockTimeout(gym.make("Orchard/SWE-v0", backend={"type": "local", "root": str(local_root)}),
                           max_seconds=6)
    try:
        env.reset(options={"task_id": "semver-3.0.2"})
        started = time.monotonic()
        obs, reward, terminated, truncated, info = env.step({"name": "bash", "arguments": {"command": "sleep 60"}})
        assert time.monotonic() - started < 15
        assert truncated and reward == 0.0 and info["error"].startswith("timeout")
        inner = env.unwrapped
        assert inner.trajectory.error.startswith("timeout") and not inner.trajectory.ok and inner.sandbox is None
        # the sandbox, and the sleep in it, are gone (dot-names are the backend's own: the zygote's log)
        assert not [p for p in local_root.iterdir() if not p.name.startswith(".")]
    finally:
        env.close()


def test_the_old_name_of_the_echo_env_still_works():
    import orchard_gym.wrappers as w

    with pytest.warns(DeprecationWarning, match="EchoEnv"):
        assert w.ToyEnv is EchoEnv
