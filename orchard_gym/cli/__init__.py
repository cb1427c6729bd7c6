"""The `orchard` command line: the top room of docs/architecture.md (it may import every layer;
no other module imports it). `main` is the click group the `orchard` console script runs;
`python -m orchard_gym.cli` runs it too.

- `commands.py`: the group and the core commands (sandboxes, serve, eval, train, proxy, ...);
- `tasks.py`, `export.py`, `view.py`, `value.py`, `harness.py`: commands and helpers of their own;
- `exit.py`: the exit status of a run whose episodes failed.
"""

from __future__ import annotations

from typing import Any

from ..moved import old_name
from .commands import main

__all__ = ["main"]


def __getattr__(name: str) -> Any:  # the old orchard_gym/cli.py's other names: deprecated, from commands.py
    return old_name(__name__, name)
