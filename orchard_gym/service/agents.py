"""Deprecated name of orchard_gym/agent_pool.py (one agent client per sandbox): the SDK's
in-process control plane and the orchestrator share it. This module is that one under its
old name."""

from __future__ import annotations

import sys
import warnings

from orchard_gym import agent_pool

warnings.warn("orchard_gym.service.agents is now orchard_gym.agent_pool", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = agent_pool
