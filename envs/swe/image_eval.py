"""Grading image-based instances (public datasets) the way their own harness does.

SWE-bench 5 ships a per-instance `eval_script`; swebench's `make_test_spec(instance)`
turns it into the script its harness runs as `/bin/bash /eval.sh` in the instance's
container after `git apply`ing the prediction in `/testbed` (it also makes the script
record the test command's exit status after the end marker). A record with a test
command of its own instead (SWE-rebench's `install_config.test_cmd`, R2E-Gym's
`run_tests.sh`, a hand-written task's `test_cmd`) gets a script of the same shape
(`eval_script_for`): activate the image's `testbed` conda env, reset the test files to
the base commit, apply the test patch, print the start marker, run the tests, print
the end marker, reset the test files again.

The grading sandbox is fresh and the protected paths are put back before the script
runs (`evaluation.py`), exactly as for the built-in tasks; only the test step differs.
"""

from __future__ import annotations

import shlex
from collections.abc import Awaitable

from .evaluation import TestRun, apply_submission, scratch_path, uploaded
from .protected import ProtectedPaths
from .verdicts import START_MARKER, verdict_exec

HEREDOC = "EOF_114329324912"  # the delimiter SWE-bench's scripts use
ACTIVATE = ["source /opt/miniconda3/bin/activate", "conda activate testbed"]
START = START_MARKER
END = ": '>>>>> End Test Output'"


def _make_test_spec():
    from . import grading  # noqa: F401  (registers swebench.harness without its docker/modal __init__)

    try:
        from swebench.harness.utils import make_test_spec
    except ImportError as e:
        raise ImportError(f"grading SWE-bench instances needs swebench's harness utilities, which import "
                          f"the datasets package: pip install 'orchard-gym[swe]' ({e})") from e
    return make_test_spec


def eval_script_for(task) -> str:
    """A SWE-bench-shaped eval.sh for a task that ships a test command but no eval_script."""
    if not task.test_cmd:
        raise ValueError(f"task {task.instance_id} ships neither an eval_script nor a test_cmd: nothing "
                         "says how to run its tests")
    repo = task.workdir or "/testbed"
    base = task.base_commit or "HEAD"
    existing = [f for f in task.test_files if f]
    lines = [*ACTIVATE, f"cd {shlex.quote(repo)}", f"git config --global --add safe.directory {shlex.quote(repo)}"]
    lines += [f"{k}={shlex.quote(v)}; export {k}" for k, v in sorted(task.env.items())]
    if existing:
        lines.append(f"git checkout {shlex.quote(base)} -- {' '.join(map(shlex.quote, existing))}")
    if task.test_patch:
        lines += [f"git apply --verbose --reject - <<'{HEREDOC}'", task.test_patch.rstrip("\n"), HEREDOC]
    lines += [START, task.test_cmd, END]
    if existing:
        lines.append(f"git checkout {shlex.quote(base)} -- {' '.join(map(shlex.quote, existing))}")
    return "\n".join(["#!/bin/bash", "set -uxo pipefail", *lines]) + "\n"


def eval_script(task) -> str:
    """The script the grader runs: swebench's `make_test_spec(instance).eval_script`."""
    script = task.eval_script or eval_script_for(task)
    instance = {**task.model_dump(mode="json"), "eval_script": script, "image": task.image or ""}
    return _make_test_spec()(instance).eval_script


async def run_eval_script(ctx, task, rules: ProtectedPaths, patch: bytes | None, timeout: float,
                          verdicts: bool = False, go: Awaitable[bool] | None = None) -> TestRun:
    """Apply `patch` (None: the tree already holds it), put protected paths back, run the eval script
    (verdicts: under the verdict driver, whose result lands in `run.verdicts`). `go`: as in
    `evaluation.run_tests`."""
    run = await apply_submission(ctx, rules, patch)
    if not run.applied:
        return run
    # the script applies the test patch itself; whether it did shows in the log (no marker, no tests)
    run.test_patch_applied = True
    if go is not None and not await go:
        return run
    if verdicts:
        run.verdicts = await verdict_exec(ctx, None, scratch_path(ctx), timeout, script=eval_script(task))
        return run
    async with uploaded(ctx, eval_script(task).encode()) as script:
        r = await ctx.sandbox.exec(f"/bin/bash {shlex.quote(script)} 2>&1", cwd=ctx.cwd, timeout=timeout)
    run.output, run.exit_code, run.timed_out = r.stdout + r.stderr, None, r.timed_out
    return run
