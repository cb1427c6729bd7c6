"""Orchard envs in SkyRL-Gym's own registry (`skyrl_gym.make`), stepping with the model's text:
whole Claw-v0 and SWE-v0 episodes get the rewards `gym.make` gives for the same actions."""

from __future__ import annotations


import gymnasium as gym
import pytest

from adapter_helpers import as_text, gym_reward, live_sandboxes
from conftest import require_module

skyrl_gym = require_module("integrations", "skyrl_gym")

import orchard_gym  # noqa: E402, F401
from orchard_gym.envs.swe.tasks import load_tasks  # noqa: E402
from orchard_gym.integrations.skyrl import register_envs  # noqa: E402

CLAW_TASK = "calendar-answer-001"
SWE_TASK = "semver-3.0.2"
SWE = load_tasks("builtin")[SWE_TASK]


def skyrl_episode(env_id, task_id, actions, config) -> tuple[float, dict]:
    env = skyrl_gym.make(env_id, env_config=config, extras={"task_id": task_id})
    try:
        prompt, meta = env.init([{"role": "system", "content": "Act."}])
        assert meta["task_id"] == task_id and prompt[-1]["role"] == "user" and meta["tools"]
        for action in actions:
            out = env.step(as_text(action))
        assert out["done"]
        return out["reward"], out["metadata"]
    finally:
        env.close()


def test_claw_episodes_in_skyrl_registry(local_root):
    backend = {"type": "local", "root": str(local_root)}
    assert "Orchard/Claw-v0" in register_envs() and "Orchard/Claw-v0" in skyrl_gym.registry
    oracle = gym.make("Orchard/Claw-v0").unwrapped.get_task(CLAW_TASK).oracle + [{"name": "submit", "arguments": {}}]
    rewards = []
    for actions in (oracle, [{"name": "submit", "arguments": {}}]):
        reward, meta = skyrl_episode("Orchard/Claw-v0", CLAW_TASK, actions, {"backend": backend})
        assert "error" not in meta and reward == gym_reward("Orchard/Claw-v0", CLAW_TASK, actions, backend=backend)
        rewards.append(reward)
    assert rewards[0] == 1.0 > rewards[1]
    assert live_sandboxes(backend) == []


@pytest.mark.slow
def test_swe_episode_in_skyrl_registry(local_root):
    backend = {"type": "local", "root": str(local_root)}
    register_envs()
    config = {"backend": backend, "grade_in_place": True}  # the built-in tasks; the row's extras pick one
    gold = [{"name": "bash", "arguments": {"command": f"git apply <<'EOF_PATCH'\n{SWE.patch}\nEOF_PATCH"}},
            {"name": "submit", "arguments": {}}]
    reward, _ = skyrl_episode("Orchard/SWE-v0", SWE_TASK, gold, config)
    assert reward == 1.0 == gym_reward("Orchard/SWE-v0", SWE_TASK, gold, backend=backend, grade_in_place=True)
    assert live_sandboxes(backend) == []


def test_malformed_text_is_an_observation_and_dead_sandbox_is_flagged(local_root):
    backend = {"type": "local", "root": str(local_root)}
    register_envs()
    env = skyrl_gym.make("Orchard/Claw-v0", env_config={"backend": backend}, extras={"task_id": CLAW_TASK})
    env.init([])
    out = env.step("I think I am done?")
    assert not out["done"] and out["metadata"]["action_error"] and "no action found" in out["observations"][0]["content"]
    env.hub.run(env.episode.env.sandbox.delete())  # the sandbox dies under the episode
    out = env.step(as_text({"name": "submit", "arguments": {}}))
    assert out["done"] and out["metadata"].get("error") and env.get_metrics()["errored"] == 1
    env.close()
    assert live_sandboxes(backend) == []


def test_gui_is_refused_saying_why():
    """SkyRL-Gym's observations are text: the GUI env is refused by name, at registration and at
    make, with the reason, never served as a numpy repr in a string."""
    from orchard_gym.integrations.core import ImagesNotCarried
    from orchard_gym.integrations.skyrl import OrchardTextEnv

    with pytest.raises(ImagesNotCarried, match=r"GUI-v0 observes screenshots.*SkyRL-Gym.*string content"):
        register_envs(["Orchard/GUI-v0"])
    assert "Orchard/GUI-v0" not in skyrl_gym.registry and "Orchard/GUI-v0" not in register_envs()
    with pytest.raises(ImagesNotCarried, match="text tokens"):
        OrchardTextEnv({"tasks": "miniwob"}, env_id="Orchard/GUI-v0")
