"""Env ids, registered with Gymnasium on `import orchard_gym`.

    from typing import Any

from typing import Any

import gymnasium as gym
    import orchard_gym  # noqa: F401  (registers the ids)
    env = gym.make("Orchard/SWE-v0", backend={"type": "local"}, max_steps=30)

Without the import, `gym.make("orchard_gym:Orchard/SWE-v0")` imports it for you
(Gymnasium 1.x no longer reads plugin entry points).
"""

from __future__ import annotations

from typing import Any

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
        from orchard_gym.wrappers.harness.env import make_harness_env

        return make_harness_env(self.entry_point, harness, **kwargs)

    def __repr__(self) -> str:
        return f"EnvCreator({self.entry_point!r})"


def env_class(env_id: str) -> Any:
    """The class (or factory) an env id makes, imported by its dotted name: nothing is built."""
    from gymnasium.envs.registration import load_env_creator

    creator = gym.spec(env_id).entry_point
    target = creator.entry_point if isinstance(creator, EnvCreator) else creator
    return load_env_creator(target) if isinstance(target, str) else target


def env_tasks(env_id: str, **env_kwargs: Any) -> dict[str, Any]:
    """The tasks by id of `gym.make(env_id, **env_kwargs)`, read from the task source the kwargs
    name (`tasks=`, `split=`, ...) without making the env: no sandbox, no backend
    (`SandboxEnv.tasks_from`). An env that cannot say is made (never reset) and asked."""
    try:
        return env_class(env_id).tasks_from(**env_kwargs)
    except (AttributeError, NotImplementedError):
        env: Any = gym.spec(env_id).make(**env_kwargs).unwrapped
        try:
            return {task_id: env.get_task(task_id) for task_id in env.task_ids()}
        finally:
            env.close()


def list_task_ids(env_id: str, **env_kwargs: Any) -> list[str]:
    """The task ids of `env_tasks(env_id, **env_kwargs)`, sorted as the env's `task_ids()`."""
    return sorted(env_tasks(env_id, **env_kwargs))
