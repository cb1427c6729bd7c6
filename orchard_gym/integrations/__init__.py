"""Thin adapters that put Orchard envs into other ecosystems' slots (TRL, OpenEnv, verifiers,
SkyRL-Gym), all over one env core (`core.py`). See docs/integrations.md."""
