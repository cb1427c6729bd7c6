"""Harnesses: agent programs that own their loop (mini-swe-agent, Codex, Claude Code, ...), run
in sandboxes with their model calls through the recording proxy (docs/harnesses.md).

- `spec.py`: a harness as data (`Harness`, `ShippedVenv`) and the registry (`get_harness`, `all_harnesses`);
- `plugins/`: the built-in harnesses, one module each, found by file name;
- `env.py`: `HarnessEnv`, a harness as a Gymnasium env;
- `eval.py`: harness evaluations (`orchard eval --harness`);
- `install.py`, `python.py`: installing them (cached venvs and npm prefixes, a portable CPython).
"""

from __future__ import annotations

from typing import Any

from . import spec
from .spec import HARNESS_PACKAGE, Harness, ShippedVenv, all_harnesses, get_harness

__all__ = ["HARNESS_PACKAGE", "Harness", "ShippedVenv", "all_harnesses", "get_harness"]


def __getattr__(name: str) -> Any:  # MINI_SWE_AGENT, HARNESSES, ...: found among the plugins on demand
    return getattr(spec, name)
