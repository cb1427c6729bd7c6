"""Orchard/SWE-v0: resolve a real issue in a real repository; graded like SWE-bench.

`reset` unpacks the task's repository (at its base state, committed to a fresh git
repo) into the sandbox; the policy works with `bash`, `str_replace_editor` and
`submit`. Grading (as SWE-bench does; `evaluation.py`): the submission is the
repository's `git diff --binary` against the base commit; it is applied to a *fresh*
sandbox of the same task, the protected paths (`protected.py`: test files,
`conftest.py`, start-up hooks, runner configs, bytecode, import-shadowing modules) are
put back to base there, the task's test patch is applied, the tests run, and SWE-bench's
own grading turns the log into the reward: 1.0 when every FAIL_TO_PASS and PASS_TO_PASS
test passes, else 0.0. Nothing the policy left in its own sandbox (processes, an edited
venv, files outside the repository) takes part. `grade_in_place=True` skips the fresh
sandbox (faster; protected paths are still put back, but processes and the
environment of the policy's sandbox are trusted). The grading sandbox is always deleted.

The submission's own source runs inside the test process, so the log alone proves nothing:
`tamper_check=True` (the default) scans it for test-runner machinery (`tamper_scan.py`) and,
when the log resolves the task, runs the tests again in another fresh sandbox with per-test
verdicts sent through a pipe to a parent process (`verdicts.py`); a finding, or verdicts that
disagree with the log, is `report["tampering"]` and 0.0 (`orchard eval` counts it apart).

A run whose output names none of the task's tests (e.g. a `test_cmd` without `-rA`)
is checked against the gold patch in another fresh sandbox: if the gold patch's run
names them, the submission broke the test run (0.0); if not, the task is broken and the
trajectory is marked errored (`report["error_kind"] == "grading"`,
`trajectory.error_kind == "grading"`), so trainers drop it and `orchard eval` counts it
apart. `info["report"]` has the details, including the last 4 KB of test output.

Public datasets (SWE-bench, SWE-Gym, SWE-rebench, R2E-Gym, SWE-smith; `tasks.py`,
`datasets.py`): the instance's own image holds the repository at `/testbed` and its test
environment; `setup` snapshots that tree as the base commit (ignored build files
included, so they are never part of a submission), and grading runs the instance's
SWE-bench eval script (`image_eval.py`) in a fresh sandbox of the image, after the same
patch application and protected-path restore.

Where the test environment comes from (`runtime`, built-in tasks):
- "host" (the default on the local backend): a venv with the task's requirements,
  built once on the host and cached (`~/.cache/orchard-gym/swe/venvs`);
- "image" (container backends): the task's image (`task.image`), with its venv at
  `/opt/venv` (see `scripts/build_swe_images.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import shlex
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Literal

import gymnasium as gym

from orchard_gym._loop import run_in_thread
from orchard_gym.client import AsyncSandboxInstance
from orchard_gym.errors import OrchardError
from orchard_gym.ledger import charge_sandbox

from .. import forking
from ..base import INFRA_ERRORS, SandboxEnv
from ..editor import EditorTool
from ..tools import BashTool, SubmitTool, Tool, ToolContext
from .evaluation import GIT, MAX_PATCH_BYTES, TestRun, run_tests, scratch_path, submitted_patch
from .image_eval import eval_script, run_eval_script
from .oracle import SWEOraclePolicy
from .protected import ProtectedPaths, base_names
from .tamper_scan import exempt, scan
from .tasks import SWETask, load_tasks
from .venvs import ensure_venv
from .verdicts import VerdictRunError, compare, verdict_exec

log = logging.getLogger(__name__)

IMAGE_VENV = "/opt/venv"
MAX_REPORTED_PATCH = 1_000_000  # characters of the submitted patch kept in the report

INSTRUCTIONS = """\
You are a software engineer. The repository {repo} is checked out in your working directory.
A user filed this issue:

<issue>
{problem}
</issue>

Change the non-test source files so that the issue is resolved. Tools:
- bash: run a command in the repository (each call starts afresh in its root);
- str_replace_editor: view, create and edit files (paths relative to the repository root, or absolute);
- submit: call it when you are done; your changes are then tested.
Python with the project's test dependencies is on PATH ({python_hint})."""


class SWEEnv(SandboxEnv):
    """Gymnasium env over SWE tasks (see module docstring). Extra kwargs: `tasks`
    ('builtin', a file or a folder), `runtime` ('auto', 'host', 'image'),
    `test_timeout` (seconds for the test run), `grade_in_place` (grade in the policy's
    sandbox instead of a fresh one; off by default), `reference_check` (run the gold
    patch when a grading names no test results, to tell a broken task from a failed
    agent; on by default), `split` (of a dataset folder or hub dataset), `image_prefix`
    (registry/namespace replacing that of every task image), `dataset` (force a record
    schema: see `datasets.KINDS`), `tamper_check` (flag a submission that reaches for the test
    runner's machinery, statically and through a verdict run: see `tamper_scan.py` and
    `verdicts.py`; on by default, never switch it off for RL)."""

    env_id = "Orchard/SWE-v0"

    def __init__(self, *, tasks: str | Path | dict[str, SWETask] = "builtin",
                 runtime: Literal["auto", "host", "image"] = "auto", test_timeout: float = 900.0,
                 grade_in_place: bool = False, reference_check: bool = True, split: str | None = None,
                 image_prefix: str | None = None, dataset: str | None = None, tamper_check: bool = True,
                 **kwargs: Any):
        for name, value in (("grade_in_place", grade_in_place), ("reference_check", reference_check),
                            ("tamper_check", tamper_check)):
            if not isinstance(value, bool):
                raise gym.error.Error(f"{name} must be True or False, not {value!r}")
        for name, value in (("split", split), ("image_prefix", image_prefix), ("dataset", dataset)):
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise gym.error.Error(f"{name} must be a non-empty string or None, not {value!r}")
        self._tasks = self.tasks_from(tasks=tasks, split=split, image_prefix=image_prefix, dataset=dataset)
        self.runtime = runtime
        self.test_timeout = test_timeout
        self.grade_in_place, self.reference_check = grade_in_place, reference_check
        self.tamper_check = tamper_check
        super().__init__(**kwargs)

    # ------------------------------------------------------------------ hooks
    def make_tools(self) -> list[Tool]:
        return [BashTool(), EditorTool(), SubmitTool()]

    @classmethod
    def tasks_from(cls, *, tasks: str | Path | dict[str, SWETask] = "builtin", split: str | None = None,
                   image_prefix: str | None = None, dataset: str | None = None, **_: Any) -> dict[str, SWETask]:
        return tasks if isinstance(tasks, dict) else load_tasks(tasks, split, image_prefix=image_prefix, dataset=dataset)

    def task_ids(self) -> list[str]:
        return sorted(self._tasks)

    def get_task(self, task_id: str) -> SWETask:
        return self._tasks[task_id]

    def _runtime(self) -> str:
        if self.runtime != "auto":
            return self.runtime
        return "host" if self.backend_name() == "local" else "image"

    def image_for(self, task: SWETask) -> str | None:
        return task.image if task.in_image or self._runtime() != "host" else None

    async def setup(self, sandbox: AsyncSandboxInstance, task: SWETask) -> ToolContext:
        if task.in_image:
            return await self._setup_in_image(sandbox, task)
        if self._runtime() == "host":
            venv_bin = str(await run_in_thread(ensure_venv, task.install) / "bin")
        else:
            venv_bin = f"{IMAGE_VENV}/bin"
        base = sandbox.workdir or "/workspace"
        repo = f"{base}/{task.repo_name}"
        path = (await sandbox.exec("echo $PATH", timeout=30)).stdout.strip() or "/usr/bin:/bin"
        env = {**task.env, "PATH": f"{venv_bin}:{path}", "PYTHONDONTWRITEBYTECODE": "1", "GIT_PAGER": "cat",
               "PAGER": "cat"}
        if task.source_archive is None:
            raise OrchardError(f"task {task.instance_id} has no source_archive; cannot build its repository")
        archive = f"{base}/.orchard-src.tar.gz"
        await sandbox.upload_content(await run_in_thread(task.source_archive.read_bytes), archive)
        # every file of the archive is in the base commit (-f: even those its .gitignore names), and
        # so is what the set-up commands make: the grader compares a tree against exactly that
        script = (f"mkdir -p {shlex.quote(repo)} && tar -xzf {shlex.quote(archive)} -C {shlex.quote(repo)} && "
                  f"rm -f {shlex.quote(archive)} && cd {shlex.quote(repo)} && {GIT} init -q && {GIT} add -A -f && "
                  f"{GIT} commit -qm base")
        for command in task.setup_commands:
            script += f" && ({command})"
        if task.setup_commands:
            script += f" && {GIT} add -A -f && {GIT} commit -q --allow-empty -m setup"
        r = await sandbox.exec(script, timeout=600, env=env)
        if r.exit_code != 0:
            raise OrchardError(f"setting up {task.instance_id} failed ({r.exit_code}): {(r.stdout + r.stderr)[-2000:]}")
        return ToolContext(sandbox=sandbox, cwd=repo, env=env, timeout=self.exec_timeout)

    async def _setup_in_image(self, sandbox: AsyncSandboxInstance, task: SWETask) -> ToolContext:
        """The image holds the repository (SWE-bench layout): commit its tree as the base."""
        repo, root = task.workdir, (sandbox.workdir or "/").rstrip("/") + "/"
        if not (repo + "/").startswith(root):
            raise OrchardError(f"task {task.instance_id}: the repository is at {repo}, outside the sandbox's "
                               f"workdir {sandbox.workdir}; set the backend's workdir to {repo!r}")
        q = shlex.quote(repo)
        # the image's own test environment (SWE-bench: conda env `testbed`), as its eval script activates it
        probe = ("if [ -f /opt/miniconda3/bin/activate ]; then source /opt/miniconda3/bin/activate && "
                 "conda activate testbed; fi >/dev/null 2>&1; echo \"$PATH\"")
        r = await sandbox.exec(f"bash -c {shlex.quote(probe)}", timeout=60)
        path = r.stdout.strip().splitlines()[-1] if r.exit_code == 0 and r.stdout.strip() else "/usr/bin:/bin"
        env = {**task.env, "PATH": path, "GIT_PAGER": "cat", "PAGER": "cat"}
        lines = ["set -e", f"git config --global --add safe.directory {q} >/dev/null 2>&1 || true", f"cd {q}"]
        if task.bug_patch:  # SWE-smith: the image holds the clean repository
            lines += [f"{GIT} apply --binary - <<'ORCHARD_BUG_EOF'", task.bug_patch.rstrip("\n"), "ORCHARD_BUG_EOF"]
        lines += [f"({command})" for command in task.setup_commands]
        # every file now present (also what .gitignore names: build outputs) is in the base commit
        lines.append(f"{GIT} add -A -f && {GIT} commit -q --allow-empty --no-verify -m orchard-base")
        script = "\n".join(lines)
        r = await sandbox.exec(script, timeout=600, env=env)
        if r.exit_code != 0:
            raise OrchardError(f"setting up {task.instance_id} in {task.image} failed ({r.exit_code}): "
                               f"{(r.stdout + r.stderr)[-2000:]}")
        return ToolContext(sandbox=sandbox, cwd=repo, env=env, timeout=self.exec_timeout)

    def oracle_policy(self) -> SWEOraclePolicy:
        """The gold patch, then submit (`orchard eval --policy oracle`)."""
        return SWEOraclePolicy()

    def first_observation(self, task: SWETask) -> str:
        # no sandbox-specific path here: the same seed must give the same first observation
        return INSTRUCTIONS.format(repo=task.repo, problem=task.problem_statement.strip(),
                                   python_hint="`python`, `pytest`")

    async def fingerprint(self, ctx: ToolContext) -> str | None:
        r = await ctx.sandbox.exec(f"{{ {GIT} status --porcelain; {GIT} diff; }} | cksum", cwd=ctx.cwd, timeout=60)
        return r.stdout.split()[0] if r.exit_code == 0 and r.stdout else None

    async def submitted_patch(self, ctx: ToolContext) -> str:
        return (await submitted_patch(ctx)).decode("utf-8", "replace")

    async def grade(self, ctx: ToolContext, task: SWETask) -> tuple[float, dict]:
        patch = await submitted_patch(ctx)
        report: dict[str, Any] = {"patch": patch.decode("utf-8", "replace")[:MAX_REPORTED_PATCH],
                                  "graded_in": "in_place" if self.grade_in_place else "fresh_sandbox"}
        if len(patch) > MAX_PATCH_BYTES:
            report.update(resolved=False, reward=0.0, dropped=[],
                          patch_error=f"the submitted patch is {len(patch)} bytes (limit {MAX_PATCH_BYTES})")
            return 0.0, report
        verdict_run = self._prepare_verdict_run(task, patch)
        deletes: list[asyncio.Future] = []  # the graded run's sandbox, deleted while the verdict run goes on
        try:
            reward, report = await self._grade(ctx, task, patch, report, verdict_run, deletes)
        finally:  # every grading sandbox is gone before the step ends, whatever happened
            if verdict_run is not None:
                await verdict_run.settle()
            await asyncio.gather(*deletes, return_exceptions=True)
        if verdict_run is not None:
            report["verdict_run"] = ("prepared beside the graded run" if verdict_run.used else
                                     "prepared beside the graded run, not needed: its tests did not run")
        return reward, report

    async def _grade(self, ctx: ToolContext, task: SWETask, patch: bytes, report: dict[str, Any],
                     verdict_run: _VerdictRun | None, deletes: list[asyncio.Future]) -> tuple[float, dict]:
        from .grading import grade

        try:
            if self.grade_in_place:
                run = await self._test(ctx, task, None, scan_patch=patch)
            else:
                run = await self._run_fresh(task, patch, scan_patch=patch, deletes=deletes)
        except INFRA_ERRORS:
            raise  # the env marks the trajectory failed (infrastructure)
        except (OrchardError, RuntimeError, ValueError, ImportError) as e:  # ValueError: no test command
            return 0.0, self._broken(report, f"the grading sandbox failed: {type(e).__name__}: {e}", TestRun())
        report["dropped"] = run.dropped
        if not self.grade_in_place:
            report["grading_sandbox"] = f"forked from the set-up snapshot {run.sandbox_from}" if run.sandbox_from \
                else "set up afresh"
        if self.tamper_check:
            report["tampering"] = run.tampering
        if not run.applied:
            report.update(resolved=False, reward=0.0, patch_error="the submitted patch did not apply",
                          apply_output=run.apply_output)
            return 0.0, report
        if run.test_patch_applied:
            report.update(await run_in_thread(grade, run.output, task.model_dump(mode="json"), run.exit_code))
        report.update(test_exit_code=run.exit_code, test_timed_out=run.timed_out, test_output_tail=run.tail)
        if run.test_patch_applied and report["named"]:
            if report["resolved"] and self._runs_verdicts(task):
                try:
                    await self._check_verdicts(ctx, task, patch, report, verdict_run)
                except INFRA_ERRORS:
                    raise
                except (OrchardError, RuntimeError, ValueError) as e:  # VerdictRunError included
                    return 0.0, self._broken(report, f"the verdict run failed: {type(e).__name__}: {e}", run)
            if report.get("tampering"):
                report.update(resolved=False, reward=0.0)  # counted apart by `orchard eval`
            return float(report["reward"]), report
        # the run tells nothing about this task's tests: the submission's fault, or the task's?
        why = ("the test patch did not apply: " + run.test_patch_output if not run.test_patch_applied else
               "the test output names none of the task's FAIL_TO_PASS/PASS_TO_PASS tests (does test_cmd "
               "print per-test results, e.g. pytest -rA?)")
        if self.reference_check and task.patch:
            reference = await self._reference(task)
            report["reference"] = reference
            if reference.get("named"):
                report.update(resolved=False, reward=0.0,
                              note=f"{why}; with the gold patch it does, so the submission broke the test run")
                return 0.0, report
            why += "; with the gold patch neither"
        return 0.0, self._broken(report, why, run)

    # ------------------------------------------------------------------ grading helpers
    async def _rules(self, task: SWETask, ctx: ToolContext) -> ProtectedPaths:
        if not task.in_image:
            return ProtectedPaths(task.test_files, ctx.env, base_names(task.source_archive))
        r = await ctx.sandbox.exec(f"{GIT} ls-tree -r -z --name-only HEAD", cwd=ctx.cwd, timeout=120)
        if r.exit_code != 0:
            raise RuntimeError(f"listing the base tree failed: {(r.stdout + r.stderr)[-1000:]}")
        names = {n for n in r.stdout.split("\0") if n}
        folders = {str(p) for n in names for p in PurePosixPath(n).parents if str(p) != "."}
        return ProtectedPaths(task.test_files, ctx.env, frozenset(names | folders))

    async def _test(self, ctx: ToolContext, task: SWETask, patch: bytes | None, *, verdicts: bool = False,
                    scan_patch: bytes | None = None, go: Awaitable[bool] | None = None) -> TestRun:
        """Apply `patch` (None: already in the tree), test; `verdicts`: as the verdict run;
        `scan_patch`: the submission to scan for runner machinery (base versions read here); `go`:
        awaited right before the tests run, False: they do not (`evaluation.run_tests`)."""
        rules = await self._rules(task, ctx)
        if task.in_image:
            run = await run_eval_script(ctx, task, rules, patch, self.test_timeout, verdicts=verdicts, go=go)
        else:
            run = await run_tests(ctx, task, rules, patch, self.test_timeout, verdicts=verdicts, go=go)
        if scan_patch is not None and self.tamper_check:
            found = scan(scan_patch.decode("utf-8", "replace"), rules)
            run.tampering = [{"source": "scan", **f} for f in await exempt(found, lambda p: _base_text(ctx, p))]
        return run

    def _runs_verdicts(self, task: SWETask) -> bool:
        """Whether a resolved grading of `task` gets a verdict run (its log parser is pytest's)."""
        from .grading import pytest_parser

        return self.tamper_check and pytest_parser(task.log_parser)

    def _prepare_verdict_run(self, task: SWETask, patch: bytes) -> _VerdictRun | None:
        """Grading in a fresh sandbox with the verdict run to come if the submission resolves: its own
        fresh sandbox is made ready (forked or set up, submission and test patch in) beside the graded
        run, and its tests wait for the graded run's word (`_VerdictRun.go`). A resolved grading then
        costs one test run's time more, not a sandbox's and a test run's; an unresolved one, a sandbox
        whose tests never ran."""
        if self.grade_in_place or not self._runs_verdicts(task):
            return None
        go: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        return _VerdictRun(go, asyncio.ensure_future(self._run_fresh(task, patch, verdicts=True, go=go)))

    async def _check_verdicts(self, ctx: ToolContext, task: SWETask, patch: bytes, report: dict,
                              verdict_run: _VerdictRun | None = None) -> None:
        """Run the tests again as the verdict run (in another fresh sandbox, prepared beside the graded
        run; in place, right after the graded run, when grading in place) and add what disagrees with
        the log, or what the plugin saw, to report["tampering"]."""
        if self.grade_in_place:  # the tree as the graded run left it (test patch in): the same test step again
            script = eval_script(task) if task.in_image else None
            result = await verdict_exec(ctx, None if script else task.test_cmd, scratch_path(ctx), self.test_timeout,
                                        script=script)
        else:
            assert verdict_run is not None  # grading in a fresh sandbox prepares one (`_prepare_verdict_run`)
            run = await verdict_run.run()
            if not run.applied or not run.test_patch_applied or run.verdicts is None:
                raise VerdictRunError("the submission or the test patch did not apply in the verdict run")
            result = run.verdicts
        findings, summary = compare(report, result, task.model_dump(mode="json"))
        report["verdicts"] = summary
        report["tampering"] = [*report.get("tampering", []), *findings]

    @contextlib.asynccontextmanager
    async def _fresh_sandbox(self, task: SWETask):
        """(tool context, the snapshot it was forked from or None) of a new sandbox of `task` at its
        base state, deleted on the way out whatever happens. With `snapshot_setup`, a fork of the
        task's set-up snapshot (taken before the policy's first action, kept by the backend where no
        sandbox can write), which skips the set-up; should the fork fail, a sandbox set up afresh."""
        client = await self.get_client()
        setup = forking.kept_setup(self, self.trajectory.task_id) if self.trajectory is not None else None
        if setup is not None:
            setup.hold()
        try:
            box = None
            if setup is not None:
                try:
                    box = await client.create_sandbox(**self.sandbox_spec(task), from_snapshot=setup.snapshot_id)
                except OrchardError as e:
                    log.warning("grading from the set-up snapshot %s failed (%s); setting a sandbox up afresh",
                                setup.snapshot_id, e)
            forked = box is not None
            if box is None:
                box = await client.create_sandbox(**self.sandbox_spec(task))
            try:
                ctx = await (self.resume(box, task, setup.ctx) if forked else self.setup(box, task))
                yield ctx, (setup.snapshot_id if forked else None)
            finally:
                with contextlib.suppress(OrchardError):
                    await asyncio.shield(box.delete())
                charge_sandbox(self.trajectory, box)  # the grader's sandbox is the episode's cost too
        finally:  # after the delete (the fork may stand on the snapshot's layer), or when none was made
            if setup is not None:
                await setup.release()

    async def _run_fresh(self, task: SWETask, patch: bytes, *, deletes: list[asyncio.Future] | None = None,
                         **kwargs: Any) -> TestRun:
        """`_test` in a fresh sandbox, deleted before this returns; with `deletes`, the delete is
        started and put there instead (for the caller to await), so that what comes next need not
        wait for it."""
        stack = contextlib.AsyncExitStack()
        gctx, snapshot_id = await stack.enter_async_context(self._fresh_sandbox(task))
        try:
            run = await self._test(gctx, task, patch, **kwargs)
        except BaseException:
            await stack.aclose()
            raise
        run.sandbox_from = snapshot_id
        if deletes is None:
            await stack.aclose()
        else:
            deletes.append(asyncio.ensure_future(stack.aclose()))
        return run

    async def _reference(self, task: SWETask) -> dict:
        """Run the gold patch in a fresh sandbox: do its test results name the task's tests?"""
        from .grading import grade

        key = hashlib.sha256(task.model_dump_json().encode() + self._runtime().encode()).hexdigest()
        if key in _REFERENCE_NAMED:
            return {"named": _REFERENCE_NAMED[key], "cached": True}
        try:
            run = await self._run_fresh(task, task.patch.encode())
        except (OrchardError, RuntimeError) as e:
            return {"named": 0, "error": f"{type(e).__name__}: {e}"}
        out: dict[str, Any] = {"named": 0, "applied": run.applied, "test_patch_applied": run.test_patch_applied,
                               "test_exit_code": run.exit_code, "test_output_tail": run.tail}
        if run.applied and run.test_patch_applied:
            graded = await run_in_thread(grade, run.output, task.model_dump(mode="json"), run.exit_code)
            out.update(named=graded["named"], resolved=graded["resolved"])
        if out["named"]:
            _REFERENCE_NAMED[key] = out["named"]  # only a positive answer is kept: a broken task is re-checked
        return out

    @staticmethod
    def _broken(report: dict, why: str, run: TestRun) -> dict:
        report.update(resolved=False, reward=0.0, error_kind="grading", error=why)
        report.setdefault("dropped", run.dropped)
        report.setdefault("test_output_tail", run.tail)
        return report


async def _base_text(ctx: ToolContext, path: str) -> str | None:
    """`path` as the base commit holds it (None: not there), read in the grading sandbox."""
    r = await ctx.sandbox.exec(f"{GIT} show {shlex.quote('HEAD:' + path)}", cwd=ctx.cwd, timeout=60)
    return r.stdout if r.exit_code == 0 else None


@dataclass
class _VerdictRun:
    """A verdict run started beside the graded run: `go` says whether its tests run, `task` is the run."""

    go: asyncio.Future[bool]
    task: asyncio.Future[TestRun]

    @property
    def used(self) -> bool:
        return self.go.done() and self.go.result()

    async def run(self) -> TestRun:
        """Its tests, now: the graded run resolved."""
        self.go.set_result(True)
        return await self.task

    async def settle(self) -> None:
        """Not needed (or grading failed): stop before its tests and wait for its sandbox's delete."""
        if not self.go.done():
            self.go.set_result(False)
        with contextlib.suppress(Exception):  # its errors matter only to `run`, which raised them
            await asyncio.shield(self.task)


_REFERENCE_NAMED: dict[str, int] = {}  # task (+ runtime) -> how many of its tests the gold patch's run names
