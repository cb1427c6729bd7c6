"""The built-in harnesses, one small module each. A module here defines `HARNESS` (a
`Harness`); it is found by its file name (`wrappers.harness.all_harnesses`), so adding a
harness is adding a file (see docs/harnesses.md)."""

from __future__ import annotations

from ..spec import Harness, all_harnesses


def builtin_harnesses() -> dict[str, Harness]:
    """The built-in harnesses by name (the same as `wrappers.harness.all_harnesses`)."""
    return all_harnesses()
