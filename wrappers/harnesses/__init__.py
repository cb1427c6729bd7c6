"""The built-in harnesses, one small module each. A module here defines `HARNESS` (a
`Harness`); it is found by its file name, so adding a harness is adding a file (see
docs/harnesses.md)."""

from __future__ import annotations

import importlib
import pkgutil

from ..harness import Harness


def builtin_harnesses() -> dict[str, Harness]:
    found: dict[str, Harness] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        harness = getattr(importlib.import_module(f"{__name__}.{info.name}"), "HARNESS", None)
        if isinstance(harness, Harness):
            found[harness.name] = harness
    return found
