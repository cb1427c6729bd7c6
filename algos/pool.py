"""Deprecated name of the trajectory pool: algos/trajectory_pool.py (`pool` alone is also the
warm sandbox pools of orchard_gym/pool.py). This module is that one under its old name."""

from __future__ import annotations

import sys
import warnings

from . import trajectory_pool

warnings.warn("orchard_gym.algos.pool is now orchard_gym.algos.trajectory_pool", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = trajectory_pool
