"""Helpers of the tests that export Orchard tasks as Harbor folders and run them back."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
from click.testing import CliRunner

import orchard_gym  # noqa: F401  (registers the envs)
from orchard_gym.cli import main
from orchard_gym.envs.harbor.env import HarborEnv


def export_with_cli(out: Path, env_id: str, count: int) -> Path:
    """`orchard tasks export --format harbor --env ENV_ID --out OUT`, which must write `count` folders."""
    result = CliRunner().invoke(main, ["tasks", "export", "--format", "harbor", "--env", env_id, "--out", str(out)])
    assert result.exit_code == 0 and f"{count} Harbor task folders" in result.output \
        and "0 refused" in result.output, result.output
    return out


def local_harbor_env(tasks: Path, root: Path) -> HarborEnv:
    """Orchard/Harbor-v0 over the folders in `tasks`, on the local backend under `root`."""
    env = gym.make("Orchard/Harbor-v0", tasks=str(tasks),
                   backend={"type": "local", "isolation": "bwrap", "root": str(root)}).unwrapped
    assert isinstance(env, HarborEnv)
    return env
