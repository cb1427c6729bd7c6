"""Each warning shown once per process. `filterwarnings("once")` is not enough: every
`warnings.catch_warnings()` block (TRL and transformers open them each training step)
resets the bookkeeping behind "once", so a deprecation repeated per step printed per step."""

from __future__ import annotations

import warnings


def install() -> None:
    """Wrap `warnings.showwarning` so a (message, category) already shown is dropped."""
    if getattr(warnings.showwarning, "orchard_once", False):
        return
    seen: set[tuple[str, type]] = set()
    show = warnings.showwarning

    def once(message, category, filename, lineno, file=None, line=None):
        key = (str(message), category)
        if key not in seen:
            seen.add(key)
            show(message, category, filename, lineno, file, line)

    once.orchard_once = True  # type: ignore[attr-defined]
    warnings.showwarning = once
