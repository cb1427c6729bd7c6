"""Harness mode: the real mini-swe-agent (bash only) in the sandbox, reaching the Claw tools
through the `claw` command line; our scripted policy plays its model through the proxy."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

import orchard_gym  # noqa: F401
from orchard_gym.wrappers.harness.env import HarnessEnv


def _claw(tool: str, **args) -> dict:
    return {"name": "bash", "arguments": {"command": f"claw {tool} --json '{json.dumps(args)}'"}}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_mini_swe_agent_solves_a_claw_task_through_the_cli(local_root):
    env = gym.make("Orchard/Claw-v0", harness="mini-swe-agent", bash=True, max_seconds=600,
                   backend={"type": "local", "root": str(local_root)})
    try:
        assert isinstance(env.unwrapped, HarnessEnv)
        obs, info = env.reset(options={"task_id": "todo-cleanup-001"})
        request = json.loads(obs)
        assert "claw TOOL --json" in request["messages"][1]["content"]
        task = env.unwrapped.task_env.task
        steps = [_claw(c["name"], **c["arguments"]) for c in task.oracle]
        for step in steps:
            obs, reward, terminated, truncated, info = env.step(step)
            assert not (terminated or truncated), info
        last = json.loads(obs)["messages"][-1]
        assert '"returncode": 0' in last["content"] and "deleted" in last["content"]
        obs, reward, terminated, truncated, info = env.step(
            {"name": "bash", "arguments": {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}})
        assert (reward, terminated) == (1.0, True), info
        report = info["report"]
        assert report["passed"] and report["completion"] == 1.0
        assert report["doors"] == {"cli": len(steps)}  # the service saw every call come by the command line
    finally:
        env.close()
