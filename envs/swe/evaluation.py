"""Run an SWE task's tests on a submitted patch, inside a sandbox, the way SWE-bench does.

`submitted_patch` takes the policy's changes out of its sandbox (`git diff --binary`
against the base commit, new files included). `run_tests` then, in a sandbox holding
the task's base tree (a fresh one, normally):

1. applies the submitted patch (`git apply --binary`);
2. puts the protected paths back to base (`protected.py`: test files, conftest.py,
   start-up hooks, runner configs, bytecode, import-shadowing modules) and lists them;
3. applies the task's test patch and runs `test_cmd`.

The output is graded by `grading.grade` (SWE-bench's own code); see `env.SWEEnv.grade`.
"""

from __future__ import annotations

import contextlib
import shlex
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass, field

from .protected import ProtectedPaths
from .verdicts import verdict_exec

GIT = "git -c user.name=orchard -c user.email=orchard@localhost -c core.quotepath=off"
MAX_PATCH_BYTES = 32 * 1024 * 1024  # a submission past this is refused (0.0), not applied
OUTPUT_TAIL = 4096  # characters of test output kept in the report


@dataclass
class TestRun:
    """What happened when the tests ran on a submission."""

    applied: bool = True  # the submitted patch applied
    apply_output: str = ""
    dropped: list[dict] = field(default_factory=list)  # {"path", "reason"} put back to base
    test_patch_applied: bool = False
    test_patch_output: str = ""
    output: str = ""
    exit_code: int | None = None
    timed_out: bool = False
    verdicts: dict | None = None  # the verdict run's result (verdicts.py), when this was one
    tampering: list[dict] = field(default_factory=list)  # static findings in the submission (tamper_scan.py)
    sandbox_from: str | None = None  # a fresh sandbox's start: the snapshot it was forked from; None: set up anew

    @property
    def tail(self) -> str:
        return self.output[-OUTPUT_TAIL:]


def scratch_path(ctx) -> str:
    """A path outside the repository, unique per use (so nothing can be planted there first)."""
    base = ctx.cwd.rsplit("/", 1)[0] or "/tmp"
    root = (getattr(ctx.sandbox, "workdir", None) or "/").rstrip("/") + "/"
    if not (base + "/").startswith(root):
        base = f"{ctx.cwd}/.git"  # the repository is the workdir (/testbed): git never diffs its .git
    return f"{base}/.orchard-grade-{uuid.uuid4().hex[:12]}"


async def submitted_patch(ctx) -> bytes:
    """The policy's changes as a binary git diff against the base commit (new files included)."""
    out = scratch_path(ctx) + ".diff"
    q = shlex.quote(out)
    r = await ctx.sandbox.exec(
        f"{GIT} add -A && {GIT} diff --cached --binary --no-ext-diff --no-textconv --no-color HEAD > {q}",
        cwd=ctx.cwd, timeout=120)
    try:
        if r.exit_code != 0:
            return b""  # an unreadable repository submits nothing
        return await ctx.sandbox.download_content(out)
    finally:
        await ctx.sandbox.exec(f"rm -f {q}", timeout=30)


@contextlib.asynccontextmanager
async def uploaded(ctx, data: bytes):
    """`data` in a scratch file for the duration (its path), removed afterwards."""
    path = scratch_path(ctx)
    await ctx.sandbox.upload_content(data, path)
    try:
        yield path
    finally:
        await ctx.sandbox.exec(f"rm -f {shlex.quote(path)}", timeout=30)


async def upload_and_run(ctx, data: bytes, script: str, timeout: float = 120):
    """Upload `data` to a scratch file, run `script` with {file} replaced by its path, remove it."""
    async with uploaded(ctx, data) as path:
        return await ctx.sandbox.exec(script.format(file=shlex.quote(path)), cwd=ctx.cwd, timeout=timeout)


async def changed_paths(ctx) -> list[tuple[str, str]]:
    """(status, path) of every path that differs from the base commit, ignored files included."""
    r = await ctx.sandbox.exec(f"{GIT} add -A -f && {GIT} diff --cached --name-status --no-renames -z HEAD",
                               cwd=ctx.cwd, timeout=300)
    if r.exit_code != 0:
        raise RuntimeError(f"listing the changes failed ({r.exit_code}): {(r.stdout + r.stderr)[-1000:]}")
    fields = r.stdout.split("\0")
    return [(fields[i][:1], fields[i + 1]) for i in range(0, len(fields) - 1, 2) if fields[i]]


async def restore_protected(ctx, rules: ProtectedPaths) -> list[dict]:
    """Put every protected path back to its base state; return what was dropped."""
    changes = [(status, path, rules.reason(path)) for status, path in await changed_paths(ctx)]
    dropped = [(status, path, why) for status, path, why in changes if why]
    if not dropped:
        return []
    new = [path for status, path, _ in dropped if status == "A"]
    old = [path for status, path, _ in dropped if status != "A"]
    # .gitattributes first: it would steer how the other files are checked out
    old.sort(key=lambda p: not p.endswith(".gitattributes"))
    if new:
        r = await upload_and_run(ctx, "\0".join(new).encode(), "xargs -0 rm -rf -- < {file}")
        if r.exit_code != 0:
            raise RuntimeError(f"removing dropped files failed: {(r.stdout + r.stderr)[-1000:]}")
    if old:
        r = await upload_and_run(
            ctx, "\0".join(old).encode(),
            f"{GIT} --literal-pathspecs checkout HEAD --pathspec-from-file={{file}} --pathspec-file-nul")
        if r.exit_code != 0:
            raise RuntimeError(f"restoring protected files failed: {(r.stdout + r.stderr)[-1000:]}")
    await ctx.sandbox.exec(f"{GIT} reset -q", cwd=ctx.cwd, timeout=120)  # leave the index at base
    return [{"path": path, "reason": why} for _, path, why in dropped]


async def apply_submission(ctx, rules: ProtectedPaths, patch: bytes | None) -> TestRun:
    """Apply `patch` (None: the tree already holds the submission) and put protected paths back.
    A patch that does not apply comes back with `applied` False and its output."""
    run = TestRun()
    if patch:
        r = await upload_and_run(ctx, patch, f"{GIT} apply --binary --whitespace=nowarn {{file}}")
        if r.exit_code != 0:
            run.applied, run.apply_output = False, (r.stdout + r.stderr)[-OUTPUT_TAIL:]
            return run
    run.dropped = await restore_protected(ctx, rules)
    return run


async def run_tests(ctx, task, rules: ProtectedPaths, patch: bytes | None, timeout: float,
                    verdicts: bool = False, go: Awaitable[bool] | None = None) -> TestRun:
    """Apply `patch` (None: the tree already holds the submission), protect, test-patch, test
    (verdicts: under the verdict driver, whose result lands in `run.verdicts`). `go`: awaited once
    the tree is ready, right before the tests; False: stop there, the tests not run."""
    run = await apply_submission(ctx, rules, patch)
    if not run.applied:
        return run
    applied = await ctx.sandbox.apply_patch(task.test_patch, cwd=ctx.cwd, timeout=120)
    run.test_patch_applied = applied.success
    if not applied.success:
        run.test_patch_output = (applied.stdout + applied.stderr)[-OUTPUT_TAIL:]
        return run
    if go is not None and not await go:
        return run
    if verdicts:
        run.verdicts = await verdict_exec(ctx, task.test_cmd, scratch_path(ctx), timeout)
        return run
    r = await ctx.sandbox.exec(task.test_cmd, cwd=ctx.cwd, env=ctx.env, timeout=timeout)
    run.output, run.exit_code, run.timed_out = r.stdout + r.stderr, r.exit_code, r.timed_out
    return run
