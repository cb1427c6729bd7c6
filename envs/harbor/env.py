"""Orchard/Harbor-v0: Harbor task folders, run faithfully (tasks.py, config.py, dockerfile.py).

    env = gym.make("Orchard/Harbor-v0", tasks="path/to/tasks")   # any depth, one task, or a JSONL index

The policy acts with `bash` and `submit`. At the end the verifier runs out of the policy's
reach (verifier.py) and the reward is the verifier's file. task.toml is honoured field by
field (config.py): `[agent] timeout_sec` caps every command at what is left of it (the command
is killed at the limit, the episode truncated and graded, as Harbor does), `cpus`/`memory_mb`
are the sandbox's limits, the network is on or off as `network_mode`/`allow_internet` say,
`[environment] env` reaches the agent and the verifier, `[verifier] env` the verifier,
`[solution] env` the oracle, `workdir` the working directory, `healthcheck` runs after set-up,
`storage_mb` is the sandbox's `disk` where the backend can hold one (else a warning, once).

Where the sandbox comes from (images.py):
- docker backend: the image is built from `environment/` with the docker SDK, never pulling
  (FROM must be a local image), tagged `localhost/orchard/harbor-NAME:HASH12` by a hash of the
  folder, built again only when the folder changes; or `[environment] docker_image` as is;
- kubernetes backend: the image pushed as `REGISTRY/orchard/harbor-NAME:HASH12` (the env's
  `image_registry`; `orchard tasks push`), or `[environment] docker_image` as is; the pod works
  in the image's WORKDIR;
- local backend: the Dockerfile's steps run as set-up in the sandbox (dockerfile.py; FROM is
  not honoured: one warning), once per task: the set-up is snapshotted and later resets
  restore it. Harbor's absolute paths are rewritten: the image's WORKDIR (/app) to the
  working directory, /solution and /logs to folders in it, /tests and /logs for the verifier
  to its folder in the sandbox's private /tmp; in the instruction `/app/x` becomes `x`.
  The local backend needs bwrap isolation (its own PID namespace) so that killing the
  policy's processes touches nothing else; the task folders are hidden from the sandboxes.
"""

from __future__ import annotations

import asyncio
import base64
import glob
import io
import logging
import re
import shlex
import tarfile
import time
from pathlib import Path, PurePosixPath
from typing import Any

import gymnasium as gym
from pydantic import BaseModel

from orchard_gym._loop import run_in_thread
from orchard_gym.client import AsyncSandboxInstance
from orchard_gym.errors import SandboxFailed

from ..base import SandboxEnv
from ..swe.venvs import ensure_venv
from ..tools import BashArgs, BashTool, SubmitTool, Tool, ToolContext, ToolResult
from .dockerfile import DockerfileError, Plan, local_path
from .images import check_registry, cluster_image, ensure_image, ensure_services
from .tasks import HarborTask, Problem, load_tasks
from .verifier import GradingFailed, VerifierDirs, run_verifier, tar_folder

log = logging.getLogger("orchard_gym.harbor")
HARBOR_DIRS = ("tests", "solution", "logs")  # the absolute paths Harbor tasks use besides the WORKDIR
WARNED_FROM: set[str] = set()
WARNED_STORAGE: set[tuple[str, str | None]] = set()  # (task, backend) whose storage_mb was said to be unheld


def hide_task_folders(backend: Any, roots: list[Path]) -> Any:
    """The backend config with the task folders hidden from local sandboxes (they hold the
    solutions and the verifiers); any other backend unchanged (containers never see the host)."""
    from orchard_gym.backends.config import LocalBackendConfig, parse_backend_config

    if backend is not None and not isinstance(backend, (dict, BaseModel)):
        return backend  # a backend object: its sandboxes are checked at reset (check_task_folder_hidden)
    try:
        config = parse_backend_config(backend) if backend is not None else LocalBackendConfig()
    except ValueError:
        return backend  # the client says what is wrong with it, as for any env
    if not isinstance(config, LocalBackendConfig):
        return backend
    return config.model_copy(update={"hide": [*config.hide, *(r for r in roots if r not in config.hide)]})


class LimitedBashTool(BashTool):
    """bash whose every command is killed when the task's agent time is up ([agent] timeout_sec)."""

    async def run(self, ctx: ToolContext, args: BashArgs) -> ToolResult:
        deadline = ctx.state.get("deadline")
        if deadline is not None:
            left = max(1.0, deadline - time.monotonic())
            args = args.model_copy(update={"timeout": min(args.timeout or ctx.timeout, left)})
        return await super().run(ctx, args)


def _copy_archive(context: Path, sources: list[str], dest: str) -> tuple[str, bytes]:
    """(folder to unpack in, gzip tar) for a COPY: Docker's rules for files, folders and globs."""
    matches = []
    for pattern in sources:
        found = sorted(glob.glob(str(context / pattern)))
        if not found:
            raise DockerfileError(f"COPY source {pattern!r} is not in environment/")
        matches += [Path(p) for p in found]
    to_dir = dest.endswith("/") or len(matches) > 1 or matches[0].is_dir()
    base = dest.rstrip("/") if to_dir else str(PurePosixPath(dest).parent)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for match in matches:
            if match.is_dir():
                for path in sorted(match.rglob("*")):
                    tar.add(path, arcname=str(path.relative_to(match)), recursive=False)
            else:
                tar.add(match, arcname=match.name if to_dir else PurePosixPath(dest).name, recursive=False)
    return base, buf.getvalue()


class HarborEnv(SandboxEnv):
    """Gymnasium env over Harbor task folders (see the module docstring). Extra kwargs: `tasks`
    (a folder of task folders, one task folder, a JSONL index, or {task_id: HarborTask});
    tasks that cannot run are skipped, each logged in one line and listed in `env.problems`.
    `network`: "task" (each task.toml's network_mode / allow_internet; Harbor's default is
    public) or "off" (every sandbox blocked, whatever the task asks). `image_registry`: on
    kubernetes, where the tasks' images were pushed (`REGISTRY/orchard/harbor-NAME:HASH12`, see
    images.py; `orchard tasks push`)."""

    env_id = "Orchard/Harbor-v0"

    def __init__(self, *, tasks: Any, max_steps: int = 40, exec_timeout: float = 180.0,
                 snapshot_setup: bool | None = None, network: str = "task", image_registry: str | None = None,
                 **kwargs: Any):
        if network not in ("task", "off"):
            raise gym.error.Error(f"network must be 'task' (as each task.toml says; Harbor's default is public) "
                                  f"or 'off' (every sandbox blocked), not {network!r}")
        self.network = network
        try:
            self.image_registry = check_registry(image_registry)
        except ValueError as e:
            raise gym.error.Error(str(e)) from None
        self._tasks, self.problems = load_tasks(tasks)
        for problem in self.problems:  # one line each: skipped tasks, and caveats (unknown keys, ...)
            log.warning("Harbor task %s: %s", "skipped" if problem.severity == "error" else "caveat", problem)
        _some_can_run(tasks, self._tasks, self.problems)
        self._images: dict[str, str] = {}
        self._services: dict[str, list[dict]] = {}  # compose tasks' sidecars (docker)
        super().__init__(max_steps=max_steps, exec_timeout=exec_timeout, snapshot_setup=bool(snapshot_setup), **kwargs)
        # None: snapshot the set-up on local (the Dockerfile's steps ran there); on docker the image is the cache
        self._snapshot_choice = snapshot_setup
        self._max_seconds = self.max_seconds  # the caller's; else each task's [agent] timeout_sec

    def make_tools(self) -> list[Tool]:
        return [LimitedBashTool(), SubmitTool()]

    def client_kwargs(self, kwargs: dict) -> dict:
        if kwargs.get("base_url") is not None:
            return kwargs
        return {**kwargs, "backend": hide_task_folders(kwargs.get("backend"), [t.root for t in self._tasks.values()])}

    @classmethod
    def tasks_from(cls, *, tasks: Any, **_: Any) -> dict[str, HarborTask]:
        found, problems = load_tasks(tasks)
        _some_can_run(tasks, found, problems)
        return found

    def task_ids(self) -> list[str]:
        return sorted(self._tasks)

    def get_task(self, task_id: str) -> HarborTask:
        return self._tasks[task_id]

    def _is_local(self) -> bool:
        return self.backend_name() == "local"

    def image_for(self, task: HarborTask) -> str | None:
        if self._is_local():
            if task.compose is not None:
                raise gym.error.Error(f"Harbor task {task.task_id}: environment/docker-compose.yaml (services "
                                      f"beside the agent's) runs on the docker backend only; run it with "
                                      f"backend={{'type': 'docker'}}")
            if task.plan is None:
                reason = next((w for w in task.warnings if w.startswith("local backend cannot")),
                              "it has no environment/Dockerfile (only [environment] docker_image)")
                raise gym.error.Error(f"Harbor task {task.task_id}: {reason}; run it with backend={{'type': 'docker'}}")
            if not getattr(self.client.backend, "bwrap", None):  # isolation "bwrap", or "auto" with bwrap there
                raise gym.error.Error(f"Harbor task {task.task_id}: the local backend needs isolation='bwrap' "
                                      f"(a PID namespace, so the policy's processes can be killed before the "
                                      f"verifier runs), or use backend={{'type': 'docker'}}")
            if task.plan.base and task.task_id not in WARNED_FROM:
                WARNED_FROM.add(task.task_id)
                log.warning("Harbor task %s: FROM %s is not honoured on the local backend (the host's userland "
                            "runs the Dockerfile's other steps)", task.task_id, task.plan.base)
            return None
        return self._images[task.task_id]

    def task_size(self, task: HarborTask) -> dict:
        s = task.settings
        size: dict[str, Any] = {"block_network": self.network == "off" or not s.internet}
        if s.cpus is not None:
            size["cpu"] = s.cpus
        if s.memory_mb is not None:
            size["memory"] = s.memory_mb * 1024 * 1024
        if s.storage_mb is not None:
            backend = getattr(self.client, "backend", None)  # None on an orchestrator: its backend decides
            why = backend.disk_limit_unavailable() if backend is not None else None
            if why is None:
                size["disk"] = s.storage_mb * 1024 * 1024
            elif (task.task_id, self.backend_name()) not in WARNED_STORAGE:
                WARNED_STORAGE.add((task.task_id, self.backend_name()))
                log.warning("Harbor task %s: [environment] storage_mb = %d is not enforced on the %s backend: %s",
                            task.task_id, s.storage_mb, self.backend_name(), why)
        return size

    async def before_sandbox(self, task: HarborTask) -> None:
        """The task's budget and, on docker, its image (built off the event loop); on kubernetes
        its pushed image's name."""
        self.max_seconds = self._max_seconds if self._max_seconds is not None else task.agent_timeout
        self.snapshot_setup = self._is_local() if self._snapshot_choice is None else self._snapshot_choice
        name = self.backend_name()
        if name == "docker":
            self._images[task.task_id] = await run_in_thread(ensure_image, task, self.client.backend.base_url)
            if task.compose is not None:
                self._services[task.task_id] = await run_in_thread(ensure_services, task,
                                                                   self.client.backend.base_url)
            if task.settings.storage_mb is not None:  # asks the engine once (cached): not on the event loop
                await run_in_thread(self.client.backend.disk_limit_unavailable)
        elif name == "kubernetes":  # nothing is built on a cluster: the pushed image (images.py)
            if task.compose is not None:
                raise gym.error.Error(f"Harbor task {task.task_id}: environment/docker-compose.yaml (services "
                                      f"beside the agent's) runs on the docker backend only")
            try:
                self._images[task.task_id] = cluster_image(task, self.image_registry)
            except ValueError as e:
                raise gym.error.Error(str(e)) from None
        elif name != "local":
            raise gym.error.Error("Harbor tasks need the local, docker or kubernetes backend in-process, not an "
                                  "orchestrator (which backend runs its sandboxes is not known here)")

    def sandbox_spec(self, task: HarborTask) -> dict:
        """The base spec; a compose task's with its services and `main`'s environment."""
        spec = super().sandbox_spec(task)
        if task.compose is not None and self.backend_name() == "docker":
            spec.update(services=self._services[task.task_id], env=dict(task.compose.main_env))
        return spec

    def on_ready(self, ctx: ToolContext, task: HarborTask) -> None:
        # the agent's time starts now, after set-up (as in Harbor): every command is killed when it is up
        self.restart_clock()
        ctx.state["deadline"] = time.monotonic() + self.max_seconds if self.max_seconds is not None else None

    def context(self) -> ToolContext:
        """The episode's sandbox, working directory and set-up environment (after reset): what a
        runner other than this env's tools (Harbor's own, orchard_gym.integrations.harbor_environment)
        runs commands with."""
        if self.ctx is None:
            raise gym.error.ResetNeeded("call reset() first")
        return self.ctx

    # ------------------------------------------------------------------ paths
    def image_workdir(self, task: HarborTask) -> str:
        return task.plan.workdir if task.plan is not None else (task.settings.workdir or "/app")

    def paths(self, workdir: str) -> dict[str, str]:
        """Where /tests, /solution, /logs and the image's WORKDIR ("app") are in this sandbox."""
        if self._is_local():
            return {**{name: f"{workdir}/.harbor/{name}" for name in HARBOR_DIRS}, "app": workdir}
        return {**{name: f"/{name}" for name in HARBOR_DIRS}, "app": workdir}

    def rewrite(self, text: str, workdir: str, verifier: dict[str, str] | None = None) -> str:
        """A Harbor script with its absolute paths moved to this sandbox's (a no-op in containers);
        `verifier`: where /tests and /logs are for the verifier's run."""
        if not self._is_local():
            return text
        named = {**self.paths(workdir), **(verifier or {})}
        paths = {(self.image_workdir(self.task) if k == "app" else f"/{k}"): v for k, v in named.items()}
        pattern = "|".join(re.escape(p) for p in sorted(paths, key=len, reverse=True))
        return re.sub(rf"(?<![\w./-])({pattern})(?![\w.-])", lambda m: paths[m.group(1)], text)

    # ------------------------------------------------------------------ set-up
    async def setup(self, sandbox: AsyncSandboxInstance, task: HarborTask) -> ToolContext:
        workdir = sandbox.workdir or "/app"
        path = (await sandbox.exec("echo $PATH", timeout=30)).stdout.strip() or "/usr/local/bin:/usr/bin:/bin"
        env: dict[str, str] = {}
        if self._is_local():
            await self.check_task_folder_hidden(sandbox, task)
            if task.plan.packages:
                venv = await run_in_thread(ensure_venv, task.plan.packages)
                path = f"{venv}/bin:{path}"
            await self.run_plan(sandbox, task, task.plan, workdir, path)
            env = {k: self.rewrite(v, workdir) for k, v in task.plan.env.items()}
            path = env.pop("PATH", path)
        elif self.backend_name() == "kubernetes":  # the pod works in the backend's workdir: the image's WORKDIR
            workdir = task.settings.workdir or self.image_workdir(task)
            r = await sandbox.exec(["mkdir", "-p", workdir], timeout=60)
            if r.exit_code != 0:
                raise SandboxFailed(f"cannot make the working directory {workdir} in the pod: {r.stderr[-300:]}")
        else:
            workdir = task.settings.workdir or workdir
        env.update(task.settings.env)
        logs = self.paths(workdir)["logs"]
        r = await sandbox.exec(f"mkdir -p {shlex.quote(logs)}/agent", timeout=60)
        if r.exit_code != 0:
            raise SandboxFailed(f"cannot make {logs} in the sandbox: {r.stderr[-500:]}")
        ctx = ToolContext(sandbox=sandbox, cwd=workdir, env={**env, "PATH": path}, timeout=self.exec_timeout,
                          state={"workdir": workdir, "path": path, "env": env})
        if task.settings.healthcheck is not None:
            await self.healthcheck(ctx, task)
        # the set-up PATH and env are kept for the verifier: what the policy does to its shell never reaches it
        return ctx

    async def run_plan(self, sandbox: AsyncSandboxInstance, task: HarborTask, plan: Plan, workdir: str,
                       path: str) -> None:
        """The Dockerfile's steps in the sandbox (local backend; see dockerfile.py)."""
        image_workdir = plan.workdir
        for step in plan.steps:
            where = f"Harbor task {task.task_id}: Dockerfile line {step.line}"
            try:
                cwd = local_path(step.cwd, workdir, image_workdir) if step.cwd != "/" else workdir
                if step.kind == "copy":
                    dest = local_path(step.dest.rstrip("/") or "/", workdir, image_workdir) + (
                        "/" if step.dest.endswith("/") else "")
                    base, blob = await run_in_thread(_copy_archive, task.root / "environment", step.sources, dest)
            except DockerfileError as e:
                raise gym.error.Error(f"{where}: {e}; run it with backend={{'type': 'docker'}}") from None
            if step.kind == "pip":
                continue  # in the host venv (setup)
            if step.kind == "copy":
                script = 'mkdir -p "$1" && base64 -d | tar -xz -C "$1"'
                if step.unpack:  # ADD a.tar.gz: unpacked where it lands, as Docker does
                    script += ' && for f in "$1"/*.tar "$1"/*.tar.* "$1"/*.tgz; do [ -f "$f" ] && tar -xf "$f" -C "$1" && rm "$f"; done; true'
                r = await sandbox.exec(["bash", "-c", script, "sh", base], stdin=base64.b64encode(blob).decode(),
                                       timeout=120)
            else:
                env = {k: self.rewrite(v, workdir) for k, v in step.env.items()}
                env["PATH"] = env.get("PATH", path)
                command = f"mkdir -p {shlex.quote(cwd)} && cd {shlex.quote(cwd)} && {self.rewrite(step.command, workdir)}"
                r = await sandbox.exec(["bash", "-c", command], env=env, timeout=task.build_timeout)
            if r.exit_code != 0 or r.timed_out:
                raise SandboxFailed(f"{where} failed in set-up (exit {r.exit_code}): {(r.stderr or r.stdout)[-500:]}")

    async def healthcheck(self, ctx: ToolContext, task: HarborTask) -> None:
        hc = task.settings.healthcheck
        await asyncio.sleep(0)
        for _attempt in range(max(1, hc.retries)):
            r = await ctx.sandbox.exec(self.rewrite(hc.command, ctx.cwd), cwd=ctx.cwd, env=ctx.env,
                                       timeout=hc.timeout_sec)
            if r.exit_code == 0 and not r.timed_out:
                return
            await asyncio.sleep(min(hc.interval_sec, 5.0))
        raise SandboxFailed(f"Harbor task {task.task_id}: the [environment] healthcheck failed {hc.retries} times: "
                            f"{(r.stderr or r.stdout)[-300:]}")

    async def check_task_folder_hidden(self, sandbox: AsyncSandboxInstance, task: HarborTask) -> None:
        """Refuse to run where the sandbox can read the task folder (its solution/ and tests/)."""
        probe = shlex.quote(str(task.root / "task.toml"))
        r = await sandbox.exec(f"test -e {probe} && echo visible || echo hidden", timeout=30)
        if r.stdout.strip() != "hidden":
            raise SandboxFailed(
                f"Harbor task {task.task_id}: the sandbox can read the task folder {task.root} (its solution and "
                f"tests); give the env its backend as a config (HarborEnv hides the task folders there) or list "
                f"them in LocalBackendConfig.hide")

    def first_observation(self, task: HarborTask) -> str:
        if self._is_local():  # the image's WORKDIR is the working directory here; same text for every sandbox
            root = re.escape(self.image_workdir(task))
            return re.sub(rf"(?<![\w./-]){root}(?![\w.-])/?", "", task.instruction).replace("``", "`.`")
        return task.instruction

    async def grade(self, ctx: ToolContext, task: HarborTask) -> tuple[float, dict]:
        workdir = ctx.state["workdir"]

        def transform(dirs: VerifierDirs):
            mapping = {"tests": dirs.tests, "logs": dirs.logs}

            def rewritten(path: Path) -> bytes | None:
                if not self._is_local() or path.suffix not in (".sh", ".py"):
                    return None
                return self.rewrite(path.read_text(), workdir, mapping).encode()
            return rewritten

        env = {**ctx.state.get("env", {}), **task.settings.verifier_env}
        try:
            return await run_verifier(ctx.sandbox, task.root / "tests", private_tmp=self._is_local(),
                                      path=ctx.state["path"], workdir=workdir, timeout=task.verifier_timeout,
                                      transform=transform, env=env)
        except GradingFailed as e:
            return 0.0, {"reward": 0.0, "error_kind": "grading", "error": str(e)}

    def oracle_policy(self):
        return HarborOraclePolicy()


class HarborOraclePolicy:
    """Uploads solution/ (through bash, like any policy could) and runs solution/solve.sh
    with the task's `[solution] env`."""

    def __init__(self, env: HarborEnv | None = None):
        self.env = env

    def bind(self, env: HarborEnv) -> HarborOraclePolicy:
        return HarborOraclePolicy(env)

    def command(self) -> str:
        env, task = self.env, self.env.task
        workdir = env.ctx.state["workdir"]
        dest = env.paths(workdir)["solution"]
        scripts = lambda p: env.rewrite(p.read_text(), workdir).encode() if p.suffix in (".sh", ".py") else None
        archive = tar_folder(task.root / "solution", scripts)
        blob = base64.b64encode(archive).decode()
        q = shlex.quote
        exports = "".join(f"export {k}={q(env.rewrite(v, workdir))}; " for k, v in task.settings.solution_env.items())
        return f"mkdir -p {q(dest)} && echo {blob} | base64 -d | tar -xz -C {q(dest)} && {exports}bash {q(dest)}/solve.sh"

    async def __call__(self, messages: list[dict], tools: list[dict]) -> Any:
        if not any(m["role"] == "assistant" for m in messages):
            return {"name": "bash", "arguments": {"command": self.command()}}
        return {"name": "submit", "arguments": {}}


def _some_can_run(source: Any, tasks: dict, problems: list) -> None:
    if not tasks:
        reasons = "; ".join(str(p) for p in problems if p.severity == "error")[:2000]
        raise ValueError(f"no Harbor task in {source!r} can run" + (f": {reasons}" if reasons else
                                                                   " (no folder with a task.toml)"))


def load_harbor(source: str) -> dict[str, HarborTask]:
    """Tasks by id (the Claw-era loader: any problem is an error here)."""
    tasks, problems = load_tasks(source)
    errors = [p for p in problems if p.severity == "error"]
    if errors:
        raise ValueError("; ".join(str(p) for p in errors))
    if not tasks:
        raise ValueError(f"no Harbor task folders (with task.toml) in {source}")
    return tasks


__all__ = ["GradingFailed", "HarborEnv", "HarborOraclePolicy", "HarborTask", "Problem", "ensure_image",
           "hide_task_folders", "load_harbor", "load_tasks"]
