"""Env ids, registered with Gymnasium on `import orchard_gym`.

    import gymnasium as gym
    import orchard_gym  # noqa: F401  (registers the ids)
    env = gym.make("Orchard/SWE-v0", backend={"type": "local"}, max_steps=30)

Without the import, `gym.make("orchard_gym:Orchard/SWE-v0")` imports it for you
(Gymnasium 1.x no longer reads plugin entry points).
"""

from __future__ import annotations

import gymnasium as gym

ENVS = {
    "Orchard/SWE-v0": "orchard_gym.envs.swe.env:SWEEnv",
    "Orchard/Toy-v0": "orchard_gym.envs.toy.env:ToyEnv",
    "Orchard/ToyColour-v0": "orchard_gym.envs.toy.colour:ColourEnv",
    "Orchard/Claw-v0": "orchard_gym.envs.claw.env:ClawEnv",
    "Orchard/GUI-v0": "orchard_gym.envs.gui.env:GUIEnv",
    "Orchard/Harbor-v0": "orchard_gym.envs.harbor.env:HarborEnv",
    "Orchard/OpenEnv-v0": "orchard_gym.integrations.openenv:OpenEnvEnv",  # any OpenEnv server, by url=
}


def register_envs() -> None:
    for env_id, entry_point in ENVS.items():
        if env_id not in gym.registry:
            # no TimeLimit wrapper: the env enforces its own step and wall-clock budgets
            gym.register(id=env_id, entry_point=EnvCreator(entry_point), disable_env_checker=False)


class EnvCreator:
    """An env id's entry point: the env at `entry_point`, or, given `harness=...` (e.g.
    "mini-swe-agent"), a `HarnessEnv` running that harness on the env's tasks."""

    def __init__(self, entry_point: str):
        self.entry_point = entry_point

    @property
    def metadata(self) -> dict:
        from gymnasium.envs.registration import load_env_creator

        return getattr(load_env_creator(self.entry_point), "metadata", {})

    def __call__(self, harness=None, **kwargs) -> gym.Env:
        from orchard_gym.wrappers.harness_env import make_harness_env

        return make_harness_env(self.entry_point, harness, **kwargs)

    def __repr__(self) -> str:
        return f"EnvCreator({self.entry_point!r})"
