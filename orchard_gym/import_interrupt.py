"""Ctrl-C while the `orchard` command is still importing: one line and exit 130, not the
traceback of whatever module was loading. The package's `__init__` arms this first thing
(only when this process IS the `orchard` command: a library user's Ctrl-C stays a
KeyboardInterrupt); the CLI disarms it once a command runs, whose own clean-up then
answers Ctrl-C (cli/commands.py's `_Group`)."""

from __future__ import annotations

import os
import signal
import sys


def is_the_cli() -> bool:
    argv = getattr(sys, "orig_argv", [])  # the console script, or `python [-X ...] -m orchard_gym.cli`
    return (len(argv) > 1 and os.path.basename(argv[1]) == "orchard") or any(
        a == "-m" and b == "orchard_gym.cli" for a, b in zip(argv, argv[1:], strict=False))


def _quit(signum, frame) -> None:
    os.write(2, b"Error: interrupted (nothing had started yet)\n")
    os._exit(130)  # nothing to clean up: no sandbox, thread or file exists yet


def arm() -> None:
    if is_the_cli() and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _quit)


def disarm() -> None:
    if signal.getsignal(signal.SIGINT) is _quit:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def exit_interrupted(message: str) -> None:
    """The `orchard` command after Ctrl-C, once its clean-up ran: the atexit handlers (the SDK
    deletes this process's sandboxes there), the message, exit 130, without the interpreter's
    teardown: C++ threads of torch or tokenizers still running then abort the process
    ("terminate called without an active exception", exit 134). Outside the command (a test's
    CliRunner, a library caller) it returns and the caller raises as usual."""
    if not is_the_cli():
        return
    import atexit

    try:
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        os.write(2, f"Error: {message}\n".encode())
        os._exit(130)
