"""Orchard/SWE-v0: resolve a real issue in a real repository; graded like SWE-bench.

`reset` unpacks the task's repository (at its base state, committed to a fresh git
repo) into the sandbox; the policy works with `bash`, `str_replace_editor` and
`submit`. At the end the submitted patch is `git diff` of the repository; the test
files are put back to their base state, the task's test patch is applied, the tests
run, and SWE-bench's own grading turns the log into the reward: 1.0 when every
FAIL_TO_PASS and PASS_TO_PASS test passes, else 0.0. `info["report"]` has the details.

Where the test environment comes from (`runtime`):
- "host" (the default on the local backend): a venv with the task's requirements,
  built once on the host and cached (`~/.cache/orchard-gym/swe/venvs`);
- "image" (container backends): the task's image (`task.image`), with its venv at
  `/opt/venv` (see `scripts/build_swe_images.py`).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, Literal

from orchard_gym._loop import run_in_thread
from orchard_gym.client import AsyncSandboxInstance
from orchard_gym.errors import OrchardError

from ..base import SandboxEnv
from ..editor import EditorTool
from ..tools import BashTool, SubmitTool, Tool, ToolContext
from .tasks import SWETask, load_tasks
from .venvs import ensure_venv

IMAGE_VENV = "/opt/venv"
GIT = "git -c user.name=orchard -c user.email=orchard@localhost -c core.quotepath=off"

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
    `test_timeout` (seconds for the test run)."""

    env_id = "Orchard/SWE-v0"

    def __init__(self, *, tasks: str | Path | dict[str, SWETask] = "builtin",
                 runtime: Literal["auto", "host", "image"] = "auto", test_timeout: float = 900.0, **kwargs: Any):
        self._tasks = tasks if isinstance(tasks, dict) else load_tasks(tasks)
        self.runtime = runtime
        self.test_timeout = test_timeout
        super().__init__(**kwargs)

    # ------------------------------------------------------------------ hooks
    def make_tools(self) -> list[Tool]:
        return [BashTool(), EditorTool(), SubmitTool()]

    def task_ids(self) -> list[str]:
        return sorted(self._tasks)

    def get_task(self, task_id: str) -> SWETask:
        return self._tasks[task_id]

    def _runtime(self) -> str:
        if self.runtime != "auto":
            return self.runtime
        backend = getattr(self._client, "backend", None)
        return "host" if backend is not None and backend.name == "local" else "image"

    def image_for(self, task: SWETask) -> str | None:
        return None if self._runtime() == "host" else task.image

    async def setup(self, sandbox: AsyncSandboxInstance, task: SWETask) -> ToolContext:
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
        script = (f"mkdir -p {shlex.quote(repo)} && tar -xzf {shlex.quote(archive)} -C {shlex.quote(repo)} && "
                  f"rm -f {shlex.quote(archive)} && cd {shlex.quote(repo)} && {GIT} init -q && {GIT} add -A && "
                  f"{GIT} commit -qm base")
        for command in task.setup_commands:
            script += f" && ({command})"
        r = await sandbox.exec(script, timeout=600, env=env)
        if r.exit_code != 0:
            raise OrchardError(f"setting up {task.instance_id} failed ({r.exit_code}): {(r.stdout + r.stderr)[-2000:]}")
        return ToolContext(sandbox=sandbox, cwd=repo, env=env, timeout=self.exec_timeout)

    def first_observation(self, task: SWETask) -> str:
        # no sandbox-specific path here: the same seed must give the same first observation
        return INSTRUCTIONS.format(repo=task.repo, problem=task.problem_statement.strip(),
                                   python_hint="`python`, `pytest`")

    async def fingerprint(self, ctx: ToolContext) -> str | None:
        r = await ctx.sandbox.exec(f"{{ {GIT} status --porcelain; {GIT} diff; }} | cksum", cwd=ctx.cwd, timeout=60)
        return r.stdout.split()[0] if r.exit_code == 0 and r.stdout else None

    async def submitted_patch(self, ctx: ToolContext) -> str:
        r = await ctx.sandbox.exec(f"{GIT} add -A && {GIT} diff --cached HEAD", cwd=ctx.cwd, timeout=120)
        return r.stdout

    async def grade(self, ctx: ToolContext, task: SWETask) -> tuple[float, dict]:
        from .grading import grade

        patch = await self.submitted_patch(ctx)
        # SWE-bench puts the test files back to base before applying the test patch
        restore = " ; ".join(f"({GIT} checkout HEAD -- {shlex.quote(f)} 2>/dev/null || rm -f {shlex.quote(f)})"
                             for f in task.test_files)
        if restore:
            await ctx.sandbox.exec(restore, cwd=ctx.cwd, timeout=120)
        applied = await ctx.sandbox.apply_patch(task.test_patch, cwd=ctx.cwd, timeout=120)
        if not applied.success:
            return 0.0, {"resolved": False, "reward": 0.0, "patch": patch,
                         "error": f"the test patch did not apply: {applied.stderr[-1000:]}"}
        run = await ctx.sandbox.exec(task.test_cmd, cwd=ctx.cwd, env=ctx.env, timeout=self.test_timeout)
        report = await run_in_thread(grade, run.stdout + run.stderr, task.model_dump(mode="json"), run.exit_code)
        report.update(patch=patch, test_exit_code=run.exit_code, test_timed_out=run.timed_out)
        return float(report["reward"]), report
