"""The recording proxy: OpenAI- and Anthropic-compatible model endpoints per rollout, recorded
(docs/recording.md). Importing this package does not import FastAPI.

- `server.py`: `RecordingProxy` (the server in a thread of its own), `serve` (`orchard proxy`);
- `app.py`, `calls.py`, `models.py`: its FastAPI app, the model-call endpoints, the control API's bodies;
- `openai_format.py`, `anthropic_format.py`: the wire formats;
- `records.py`: what is recorded (`RolloutStore`); `reconstruct.py`: samples and trajectories from it;
- `relay.py`: run inside sandboxes (stdlib only), a loopback port leading to the proxy's unix socket;
- `stub.py`: `StubUpstream`, a deterministic OpenAI-compatible server for tests and benchmarks.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_LAZY = {
    "RecordingProxy": "server", "serve": "server", "default_socket_dir": "server",
    "ProxyConfig": "models", "OpenRollout": "models", "FinishRollout": "models", "Answer": "models",
    "create_app": "app", "RolloutStore": "records", "StubUpstream": "stub",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
