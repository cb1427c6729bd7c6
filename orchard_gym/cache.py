"""The orchard cache: what is built once on the host and reused (test venvs, harness
installs, MiniWoB's pages, the recording proxies' sockets). Local sandboxes see some of
its folders read-only (backends/local_view.py says which)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """$ORCHARD_CACHE, else ~/.cache/orchard-gym."""
    return Path(os.environ.get("ORCHARD_CACHE", Path.home() / ".cache" / "orchard-gym"))
