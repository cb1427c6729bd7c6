"""scripts/uv_pip_args.py: pip's configuration as uv's options (scripts/install.sh installs with uv
where it can, and uv reads neither pip.conf nor $PIP_*)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "uv_pip_args.py"


def fake_python(tmp_path: Path, config_list: str, code: int = 0) -> Path:
    """An interpreter stand-in whose `-m pip config list` prints `config_list`."""
    exe = tmp_path / "python"
    exe.write_text(f"#!/bin/sh\ncat <<'EOF'\n{config_list}\nEOF\nexit {code}\n")
    exe.chmod(0o755)
    return exe


def run(python: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(python)], capture_output=True, text=True)


def test_indexes_find_links_and_constraints_become_uv_options(tmp_path):
    listed = ("global.cert='/etc/ssl/certs/ca.crt'\n"
              "global.constraint='/etc/xdg/pip/constraints.txt'\n"
              "global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'\n"
              "global.find-links='/opt/wheels'\n"
              ":env:.find-links='/opt/wheels'\n"          # the same again from $PIP_FIND_LINKS: once
              ":env:.default-timeout='180'")
    r = run(fake_python(tmp_path, listed))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["--index-strategy", "unsafe-best-match"]  # pip's: best over all
    pairs = list(zip(*[iter(r.stdout.split()[2:])] * 2))
    assert pairs == [("--constraint", "/etc/xdg/pip/constraints.txt"),
                     ("--extra-index-url", "file:///opt/pypi/simple"),
                     ("--extra-index-url", "file:///opt/pypi-more/simple"), ("--find-links", "/opt/wheels")]


def test_no_configuration_gives_only_the_strategy_and_a_broken_pip_fails(tmp_path):
    assert run(fake_python(tmp_path, "")).stdout.split() == ["--index-strategy", "unsafe-best-match"]
    garbage = run(fake_python(tmp_path, "no equals sign here\nglobal.find-links=\n=orphan"))
    assert garbage.returncode == 0 and garbage.stdout.split() == ["--index-strategy", "unsafe-best-match"]
    broken = run(fake_python(tmp_path, "", code=3))  # install.sh then falls back to pip
    assert broken.returncode != 0 and broken.stdout == ""
