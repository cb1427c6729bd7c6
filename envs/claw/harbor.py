"""Deprecated: Harbor tasks moved to `orchard_gym.envs.harbor` (Orchard/Harbor-v0).
`Orchard/Claw-v0` with tasks="harbor:PATH" still makes a HarborEnv."""

import warnings

from ..harbor.env import (GradingFailed, HarborEnv, HarborOraclePolicy, ensure_image,  # noqa: F401
                          hide_task_folders, load_harbor)
from ..harbor.dockerfile import pip_packages  # noqa: F401
from ..harbor.tasks import HarborTask, folder_hash, is_harbor  # noqa: F401

warnings.warn("orchard_gym.envs.claw.harbor moved to orchard_gym.envs.harbor (gym.make('Orchard/Harbor-v0'))",
              DeprecationWarning, stacklevel=2)
