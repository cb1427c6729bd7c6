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
}


def register_envs() -> None:
    for env_id, entry_point in ENVS.items():
        if env_id not in gym.registry:
            # no TimeLimit wrapper: the env enforces its own step and wall-clock budgets
            gym.register(id=env_id, entry_point=entry_point, disable_env_checker=False)
