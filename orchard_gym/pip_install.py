"""Installing packages into a venv: uv, given pip's configuration, where it can; else pip.

uv does not read pip.conf or $PIP_*, so it is given what pip would see: the index URLs,
find-links (a local CPU build of torch, say) and constraints from `pip config list`, and pip's
index strategy (the best version over every index). It installs what pip would in a fraction
of the time (mini-swe-agent's venv: 52 s with pip on a brand-new machine). Used by the cached
venvs of SWE tasks and harnesses, and by `scripts/uv_pip_args.py` for the shell installers.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time

# pip's option -> uv's; each value may list several, separated by spaces
OPTIONS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
           "constraint": "--constraint"}


def pip_config(python: str) -> dict[str, list[str]]:
    """pip's own answer for `python` (its files and the environment), by option name."""
    out = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True).stdout
    found: dict[str, list[str]] = {}
    for line in out.splitlines():
        key, sep, value = line.partition("=")
        name = key.rsplit(".", 1)[-1]
        if sep and name in OPTIONS:
            for item in shlex.split(value)[0].split() if value.strip() else []:
                if item not in found.setdefault(name, []):
                    found[name].append(item)
    return found


def uv_options(python: str) -> list[str]:
    """pip's configuration as `uv pip install` options."""
    args = ["--index-strategy", "unsafe-best-match"]  # as pip: the best version over every index
    for name, values in pip_config(python).items():
        for value in values:
            args += [OPTIONS[name], value]
    return args


def _uv() -> str | None:
    beside = os.path.join(os.path.dirname(sys.executable), "uv")  # the project's venv installs it
    return beside if os.access(beside, os.X_OK) else shutil.which("uv")


def pip_install(target_python: str, requirements: list[str], timeout: float | None = None,
                ) -> subprocess.CompletedProcess:
    """Install `requirements` into the environment of `target_python` (a venv's bin/python), with
    each module compiled up front as pip does (sandboxes see such venvs read-only and could not
    write their .pyc files). The result of the install that ran: uv's, or pip's when there is no uv
    or uv failed (pip's message is the one a user can act on). Raises subprocess.TimeoutExpired."""
    deadline = None if timeout is None else time.monotonic() + timeout

    def run(cmd: list[str]) -> subprocess.CompletedProcess:
        left = None if deadline is None else max(1.0, deadline - time.monotonic())
        return subprocess.run(cmd, capture_output=True, text=True, timeout=left)

    uv = _uv()
    if uv is not None:
        try:
            options = uv_options(sys.executable)
        except (OSError, subprocess.CalledProcessError):
            options = None
        if options is not None:
            r = run([uv, "pip", "install", "-q", "--compile-bytecode", "--link-mode", "copy",
                     "--python", target_python, *options, *requirements])
            if r.returncode == 0:
                return r
    return run([sys.executable, "-m", "pip", "--python", target_python, "install", "-q",
                "--disable-pip-version-check", *requirements])
