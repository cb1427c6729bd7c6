"""Deprecated: moved to `orchard_gym.envs.harbor.verifier`."""

import warnings

from ..harbor.verifier import *  # noqa: F403
from ..harbor.verifier import __all__  # noqa: F401

warnings.warn("orchard_gym.envs.claw.verifier moved to orchard_gym.envs.harbor.verifier", DeprecationWarning,
              stacklevel=2)
