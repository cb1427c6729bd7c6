"""The builder's and the refiner's sandbox: an Orchard env whose episode ends with a task folder.

The agent works with `bash` in a sandbox holding the assets pool (`pool/`, a copy) and the task
folder (`task/`: empty for a build, the current version for a refine). When it submits, `task/`
is packed out of the sandbox and checked as `orchard tasks check` checks a folder: the reward is
1.0 when it loads, 0.0 with the problems in the report when it does not.
"""

from __future__ import annotations

import base64
import shlex
from dataclasses import dataclass
from typing import Any

from orchard_gym.client import AsyncSandboxInstance
from orchard_gym.errors import SandboxFailed

from ...base import SandboxEnv
from ...tools import BashTool, SubmitTool, Tool, ToolContext
from . import folders

TASK_DIR, POOL_DIR = "task", "pool"
VERDICT = "verdict.txt"  # the refiner's finding (beside task/, never in it)


@dataclass
class Job:
    """What one builder or refiner run starts from."""

    prompt: str                 # the first observation
    pool: bytes | None = None   # the assets pool, a gzip tar
    folder: bytes | None = None  # the task folder so far (refine), a gzip tar


class WorkshopEnv(SandboxEnv):
    env_id = "Orchard/SynthWorkshop-v0"

    def __init__(self, *, job: Job, **kwargs: Any):
        self.job = job
        self.result: bytes | None = None  # the packed task folder once the agent submitted
        super().__init__(**kwargs)

    def make_tools(self) -> list[Tool]:
        return [BashTool(), SubmitTool()]

    def task_ids(self) -> list[str]:
        return ["job"]

    def get_task(self, task_id: str) -> Job:
        return self.job

    async def setup(self, sandbox: AsyncSandboxInstance, task: Job) -> ToolContext:
        workdir = sandbox.workdir or "/tmp"
        for name, blob in ((POOL_DIR, task.pool), (TASK_DIR, task.folder)):
            target = f"{workdir}/{name}"
            r = await sandbox.exec(["bash", "-c", 'mkdir -p "$1" && { [ -z "$2" ] || base64 -d | tar -xz -C "$1"; }',
                                    "sh", target, "1" if blob else ""],
                                   stdin=base64.b64encode(blob).decode() if blob else None, timeout=120)
            if r.exit_code != 0:
                raise SandboxFailed(f"cannot put {name}/ in the workshop sandbox: {r.stderr[-500:]}")
        return ToolContext(sandbox=sandbox, cwd=workdir, timeout=self.exec_timeout, state={"workdir": workdir})

    def first_observation(self, task: Job) -> str:
        return task.prompt

    async def grade(self, ctx: ToolContext, task: Job) -> tuple[float, dict]:
        target = shlex.quote(f"{ctx.state['workdir']}/{TASK_DIR}")
        r = await ctx.sandbox.exec(f"tar -cz -C {target} . | base64 -w0", timeout=120)
        if r.exit_code != 0 or r.truncated:
            return 0.0, {"problems": [f"the task folder could not be packed: {(r.stderr or '')[-300:]}"]}
        try:
            blob = base64.b64decode(r.stdout)
        except ValueError as e:
            return 0.0, {"problems": [f"the task folder could not be packed: {e}"]}
        self.result = blob
        problems = folders.check(blob)
        verdict = await ctx.sandbox.exec(f"cat {shlex.quote(ctx.state['workdir'] + '/' + VERDICT)} 2>/dev/null",
                                         timeout=30)
        return (0.0 if problems else 1.0), {"problems": problems, "verdict": verdict.stdout.strip()[:2000] or None}
