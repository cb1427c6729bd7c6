"""Ctrl-C while the `orchard` command is still importing: one line and exit 130, not the
traceback of whatever module was loading. The package's `__init__` arms this first thing
(only when this process IS the `orchard` command: a library user's Ctrl-C stays a
KeyboardInterrupt); the CLI disarms it once a command runs, whose own clean-up then
answers Ctrl-C (cli.py's `_Group`)."""

from __future__ import annotations

import os
import signal
import sys


def _is_the_cli() -> bool:
    argv = getattr(sys, "orig_argv", [])  # the console script, or `python [-X ...] -m orchard_gym.cli`
    return (len(argv) > 1 and os.path.basename(argv[1]) == "orchard") or any(
        a == "-m" and b == "orchard_gym.cli" for a, b in zip(argv, argv[1:], strict=False))


def _quit(signum, frame) -> None:
    os.write(2, b"Error: interrupted (nothing had started yet)\n")
    os._exit(130)  # nothing to clean up: no sandbox, thread or file exists yet


def arm() -> None:
    if _is_the_cli() and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _quit)


def disarm() -> None:
    if signal.getsignal(signal.SIGINT) is _quit:
        signal.signal(signal.SIGINT, signal.default_int_handler)
