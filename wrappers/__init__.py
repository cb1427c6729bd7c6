"""Harness recording and Gymnasium wrappers.

- `proxy/`, the recording proxy (`RecordingProxy`, `ProxyConfig`, `create_app`): OpenAI-compatible
  endpoints per rollout that record every model call (needs the `server` extra), and trajectory
  reconstruction (`reconstruct`, `Sample`, `to_trajectory`, `drop_errors`);
- `harness/`: harnesses as data, one plugin module each, and `HarnessEnv`: any harness
  (mini-swe-agent, ...) as a Gymnasium env, through the proxy;
- the Gym wrappers here, one idea each: `WallClockTimeout`, `DiscountedTerminalReward`, `ShapeReward`,
  `ErrorFilter` (and `EchoEnv`, the tiny env their examples use; `ToyEnv` is its old name).

See docs/recording.md. Importing this package does not import FastAPI.
"""

from __future__ import annotations

import warnings
from importlib import import_module
from typing import Any

_LAZY = {
    "RecordingProxy": "proxy.server", "ProxyConfig": "proxy.server", "create_app": "proxy.server",
    "StubUpstream": "proxy.stub",
    "HarnessEnv": "harness.env", "HarnessError": "harness.env",
    "Harness": "harness.spec", "MINI_SWE_AGENT": "harness.spec", "get_harness": "harness.spec",
    "RolloutStore": "proxy.records", "RolloutRecord": "proxy.records", "CallRecord": "proxy.records",
    "reconstruct": "proxy.reconstruct", "Sample": "proxy.reconstruct", "to_trajectory": "proxy.reconstruct",
    "drop_errors": "proxy.reconstruct", "discounted": "proxy.reconstruct",
    "AsyncWrapper": "base", "EchoEnv": "echo",
    "WallClockTimeout": "timeout",
    "DiscountedTerminalReward": "reward", "ShapeReward": "reward",
    "ErrorFilter": "error_filter",
}

__all__ = list(_LAZY)  # a list expression, which linters can read


def __getattr__(name: str) -> Any:
    if name == "ToyEnv":  # its old name, beside the sandboxed Orchard/Toy-v0 env of the same name
        warnings.warn("orchard_gym.wrappers.ToyEnv is now EchoEnv", DeprecationWarning, stacklevel=2)
        name = "EchoEnv"
    if name in _LAZY:
        return getattr(import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
