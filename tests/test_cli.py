"""The `orchard` command line, run as a user would."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest


def orchard(*args, root=None, check=False, timeout=120):
    exe = shutil.which("orchard") or None
    argv = [exe] if exe else [sys.executable, "-m", "orchard_gym.cli"]
    env = {**os.environ}
    if root:
        env["ORCHARD_LOCAL_ROOT"] = str(root)
    return subprocess.run([*argv, *args], capture_output=True, text=True, env=env, check=check, timeout=timeout)


def test_sandbox_run_prints_output_and_passes_exit_code(local_root):
    r = orchard("sandbox", "run", "--", "sh", "-c", "echo out; echo err >&2; exit 5", root=local_root)
    assert (r.returncode, r.stdout, r.stderr) == (5, "out\n", "err\n")
    r = orchard("sandbox", "run", "--", "echo hello world", root=local_root)
    assert r.returncode == 0 and r.stdout == "hello world\n"
    assert [p for p in local_root.iterdir() if not p.name.startswith(".")] == []  # the sandbox was deleted


def test_sandbox_run_timeout(local_root):
    r = orchard("sandbox", "run", "--timeout", "1", "--", "sleep 30", root=local_root)
    assert r.returncode == 124 and "timed out" in r.stderr


def test_demo_runs_end_to_end(local_root):
    r = orchard("demo", root=local_root)
    assert r.returncode == 0, r.stderr
    assert "ready in" in r.stdout and "42" in r.stdout and "only loopback" in r.stdout and "timed out" in r.stdout and "deleted" in r.stdout


@pytest.mark.parametrize("args", [["sandbox", "run"], ["sandbox", "run", "--timeout", "soon", "--", "true"],
                                  ["sandbox", "run", "--backend", "nope", "--", "true"], ["nonsense"]])
def test_garbage_arguments_fail_cleanly(local_root, args):
    r = orchard(*args, root=local_root)
    assert r.returncode != 0 and "Traceback" not in r.stderr and r.stderr.strip()


def test_agent_command_help():
    r = orchard("agent", "--help")
    assert r.returncode == 0 and "--socket" in r.stdout
