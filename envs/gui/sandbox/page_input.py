"""Waiting until a browser page has received the X input an action sent.

X input reaches the page asynchronously (X server -> browser -> renderer): a page-state read
right after xdotool/XTEST returns can overtake the click it should see. The page counts the
input events it receives (capture phase, on window); after an action the daemon waits until
that count moves. Standard library only: it runs in the sandbox beside gui_daemon.py."""

from __future__ import annotations

import time

SEEN = ("(() => { const s = window.__orchardSeen || (window.__orchardSeen = {id: Math.random(), n: 0},"
        " ['mouseup', 'keyup', 'wheel'].forEach(t => addEventListener(t, () => window.__orchardSeen.n++, true)),"
        " window.__orchardSeen); return [s.id, s.n]; })()")


def seen(evaluate, errors: tuple) -> list | None:
    """[page id, events counted] of the active page (None: no answer). `evaluate(js)` runs JS there."""
    try:
        return evaluate(SEEN)
    except errors:
        return None


def wait_seen(evaluate, errors: tuple, before: list | None, timeout: float = 1.0) -> None:
    """Until the page counted input after `before` (or a new page replaced it); bounded, since
    input outside the page (its scrollbar, the desktop) is never counted."""
    if before is None:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = seen(evaluate, errors)
        if now is None or now[0] != before[0] or now[1] > before[1]:
            return
        time.sleep(0.01)
