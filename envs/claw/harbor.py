"""Harbor / Terminal-Bench task folders, run unchanged: `ClawEnv(tasks="harbor:PATH")`.

    my-task/
      task.toml               # [agent] timeout_sec, [verifier] timeout_sec, [environment] build_timeout_sec
      instruction.md          # the first observation
      environment/Dockerfile  # the sandbox image
      solution/solve.sh       # the oracle (ClawEnv's oracle policy runs it)
      tests/test.sh           # the verifier: writes /logs/verifier/reward.txt (or reward.json)

PATH is one task folder or a folder of task folders. The policy acts with `bash` and
`submit`. At the end the verifier runs out of the policy's reach (envs/claw/verifier.py):
every process the policy left is killed, the tests are uploaded to folders made only then,
`test.sh` runs from there with an isolated environment, and the reward file it writes is
the reward. No reward file, or one that is not a finite number, is a grading failure, never
a score: `report["error_kind"] == "grading"` with `report["error"]`, and the trajectory is
errored (`trajectory.error` = "grading: ...", `trajectory.error_kind` = "grading"), so
trainers drop it. On the local backend the task folders are hidden from the sandboxes
(LocalBackendConfig.hide, added by `client_kwargs`); a sandbox that can still read one is
refused at reset.

Where the sandbox comes from:
- container backends: the image is built from `environment/` with the docker SDK, never
  pulling (FROM must be a local image), tagged `localhost/orchard/harbor-NAME:HASH12` by a
  hash of the folder, and rebuilt only when the folder changes;
- local backend: only a Dockerfile of `FROM` plus `RUN pip install ...` lines can run
  there — a venv with those packages is built once on the host (envs/swe/venvs.py) and put
  first on PATH; the absolute Harbor paths are rewritten: /app to the working directory,
  /solution and /logs (the agent's) to folders in it, /tests and /logs for the verifier to
  its folder in the sandbox's private /tmp; in the instruction `/app/x` becomes
  the relative `x` (the working directory). The local backend needs bwrap isolation
  (its own PID namespace), so that killing the policy's processes touches nothing else.
"""

from __future__ import annotations

import base64
import hashlib
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import gymnasium as gym
from pydantic import BaseModel

from orchard_gym._loop import run_in_thread
from orchard_gym.client import AsyncSandboxInstance
from orchard_gym.errors import SandboxFailed

from ..base import SandboxEnv
from ..swe.venvs import ensure_venv
from ..tools import BashTool, SubmitTool, Tool, ToolContext
from .verifier import GradingFailed, VerifierDirs, run_verifier, tar_folder

HARBOR_DIRS = ("tests", "solution", "logs", "app")  # the absolute paths Harbor tasks use
IMAGE_PREFIX = "localhost/orchard/harbor-"

class HarborTask(BaseModel):
    task_id: str
    root: Path
    instruction: str
    dockerfile: str
    agent_timeout: float | None = None
    verifier_timeout: float = 600.0
    build_timeout: float = 600.0

    @property
    def pip_requirements(self) -> list[str] | None:
        """The packages when the Dockerfile is only FROM + RUN pip install lines, else None."""
        return pip_only(self.dockerfile)

    @property
    def image_tag(self) -> str:
        name = re.sub(r"[^a-z0-9._-]+", "-", self.task_id.lower()).strip("-.") or "task"
        return f"{IMAGE_PREFIX}{name}:{folder_hash(self.root / 'environment')[:12]}"


def pip_only(dockerfile: str) -> list[str] | None:
    lines = [line.strip() for line in re.sub(r"\\\n", " ", dockerfile).splitlines()]
    lines = [line for line in lines if line and not line.startswith("#")]
    if not lines or not lines[0].upper().startswith("FROM "):
        return None
    packages: list[str] = []
    for line in lines[1:]:
        m = re.fullmatch(r"RUN\s+(?:python3?\s+-m\s+)?pip3?\s+install\s+(.+)", line, re.IGNORECASE)
        if m is None:
            return None
        words = shlex.split(m.group(1))
        if any(w.startswith("-") and w not in ("--no-cache-dir", "-q", "--quiet") for w in words):
            return None  # options we would have to emulate: not a plain package list
        packages += [w for w in words if not w.startswith("-")]
    return packages


def folder_hash(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _toml(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not valid TOML: {e}") from None


def load_task(folder: Path) -> HarborTask:
    for needed in ("task.toml", "instruction.md", "environment/Dockerfile", "tests/test.sh"):
        if not (folder / needed).is_file():
            raise ValueError(f"{folder}: not a Harbor task: {needed} is missing")
    meta = _toml(folder / "task.toml")
    timeouts = {}
    for section, key, field in (("agent", "timeout_sec", "agent_timeout"), ("verifier", "timeout_sec", "verifier_timeout"),
                                ("environment", "build_timeout_sec", "build_timeout")):
        value = (meta.get(section) or {}).get(key)
        if value is not None:
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{folder}/task.toml: [{section}] {key} must be a positive number, not {value!r}")
            timeouts[field] = float(value)
    return HarborTask(task_id=folder.name, root=folder.resolve(), instruction=(folder / "instruction.md").read_text(),
                      dockerfile=(folder / "environment" / "Dockerfile").read_text(), **timeouts)


def load_harbor(source: str) -> dict[str, HarborTask]:
    """Tasks by folder name from "harbor:PATH" (one task folder or a folder of them)."""
    path = Path(source.removeprefix("harbor:")).expanduser()
    if not path.is_dir():
        raise ValueError(f"no Harbor tasks at {source!r}: give harbor:FOLDER (a task folder or a folder of them)")
    folders = [path] if (path / "task.toml").exists() else sorted(p for p in path.iterdir() if (p / "task.toml").exists())
    if not folders:
        raise ValueError(f"no Harbor task folders (with task.toml) in {path}")
    return {task.task_id: task for task in map(load_task, folders)}


def is_harbor(source: Any) -> bool:
    """Whether a `tasks=` value names Harbor tasks: "harbor:PATH", or the dict load_harbor gives."""
    if isinstance(source, str):
        return source.startswith("harbor:")
    return isinstance(source, dict) and bool(source) and all(isinstance(t, HarborTask) for t in source.values())


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


def ensure_image(task: HarborTask, base_url: str) -> str:
    """Build the task's image once per content of environment/ (never pulling)."""
    import docker

    tag = task.image_tag
    client = docker.DockerClient(base_url=base_url, timeout=max(60, int(task.build_timeout)))
    try:
        try:
            client.images.get(tag)
            return tag
        except docker.errors.ImageNotFound:
            pass
        try:
            client.images.build(path=str(task.root / "environment"), tag=tag, pull=False, rm=True, forcerm=True)
        except (docker.errors.BuildError, docker.errors.APIError) as e:
            raise SandboxFailed(f"building {task.task_id}'s environment/Dockerfile failed (FROM must be a local "
                                f"image; nothing is pulled): {e}") from None
        return tag
    finally:
        client.close()


class HarborEnv(SandboxEnv):
    """Gymnasium env over Harbor task folders (see the module docstring); made by
    `ClawEnv(tasks="harbor:PATH")`, so `gym.make("Orchard/Claw-v0", tasks="harbor:PATH")`."""

    env_id = "Orchard/Claw-v0"

    def __init__(self, *, tasks: str | dict[str, HarborTask], max_steps: int = 40, exec_timeout: float = 180.0,
                 **kwargs: Any):
        self._tasks = dict(tasks) if is_harbor(tasks) and isinstance(tasks, dict) else load_harbor(tasks)
        self._images: dict[str, str] = {}
        super().__init__(max_steps=max_steps, exec_timeout=exec_timeout, **kwargs)
        self._max_seconds = self.max_seconds  # the caller's; else each task's [agent] timeout_sec

    def make_tools(self) -> list[Tool]:
        return [BashTool(), SubmitTool()]

    def client_kwargs(self, kwargs: dict) -> dict:
        if kwargs.get("base_url") is not None:
            return kwargs
        return {**kwargs, "backend": hide_task_folders(kwargs.get("backend"), [t.root for t in self._tasks.values()])}

    def task_ids(self) -> list[str]:
        return sorted(self._tasks)

    def get_task(self, task_id: str) -> HarborTask:
        return self._tasks[task_id]

    def _backend(self):
        return getattr(self._client, "backend", None)

    def _is_local(self) -> bool:
        backend = self._backend()
        return backend is not None and backend.name == "local"

    def image_for(self, task: HarborTask) -> str | None:
        if self._is_local():
            if task.pip_requirements is None:
                raise gym.error.Error(
                    f"Harbor task {task.task_id}: its environment/Dockerfile does more than FROM + RUN pip install, "
                    f"which the local backend cannot reproduce; run it with backend={{'type': 'docker'}}")
            if not getattr(self._backend(), "bwrap", None):  # isolation "bwrap", or "auto" with bwrap there
                raise gym.error.Error(f"Harbor task {task.task_id}: the local backend needs isolation='bwrap' "
                                      f"(a PID namespace, so the policy's processes can be killed before the "
                                      f"verifier runs), or use backend={{'type': 'docker'}}")
            return None
        return self._images[task.task_id]

    async def areset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        # choose the task here so that its image is built off the event loop, before the base reset
        gym.Env.reset(self, seed=seed)
        task_id = self._choose_task(options)
        task = self.get_task(task_id)
        self.max_seconds = self._max_seconds if self._max_seconds is not None else task.agent_timeout
        await self._get_client()
        if not self._is_local():
            backend = self._backend()
            if backend is None or backend.name != "docker":
                raise gym.error.Error(f"Harbor tasks need the local or the docker backend, not "
                                      f"{getattr(backend, 'name', 'an orchestrator')} (images are built with the docker SDK)")
            self._images[task_id] = await run_in_thread(ensure_image, task, backend.base_url)
        return await super().areset(options={**(options or {}), "task_id": task_id})

    async def astep(self, action: Any) -> tuple[str, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = await super().astep(action)
        report = info.get("report") or {}
        if report.get("error_kind") and self.trajectory.error is None:
            # a task that cannot be graded is not a failed agent: trainers drop it
            self.trajectory.error = info["error"] = f"grading: {report['error']}"
            self.trajectory.error_kind = report["error_kind"]
        return obs, reward, terminated, truncated, info

    def paths(self, workdir: str) -> dict[str, str]:
        """Where /tests, /solution, /logs and /app are in this sandbox."""
        if self._is_local():
            return {name: f"{workdir}/.harbor/{name}" if name != "app" else workdir for name in HARBOR_DIRS}
        return {name: f"/{name}" for name in HARBOR_DIRS}

    def rewrite(self, text: str, workdir: str, verifier: dict[str, str] | None = None) -> str:
        """A Harbor script with its absolute paths moved to this sandbox's (a no-op in containers);
        `verifier`: where /tests and /logs are for the verifier's run."""
        if not self._is_local():
            return text
        paths = {**self.paths(workdir), **(verifier or {})}
        return re.sub(r"(?<![\w./-])/(tests|solution|logs|app)(?![\w.-])", lambda m: paths[m.group(1)], text)

    async def setup(self, sandbox: AsyncSandboxInstance, task: HarborTask) -> ToolContext:
        workdir = sandbox.workdir or "/app"
        path = (await sandbox.exec("echo $PATH", timeout=30)).stdout.strip() or "/usr/local/bin:/usr/bin:/bin"
        if self._is_local():
            venv = await run_in_thread(ensure_venv, task.pip_requirements)
            path = f"{venv}/bin:{path}"
        if self._is_local():
            await self.check_task_folder_hidden(sandbox, task)
        logs = self.paths(workdir)["logs"]
        r = await sandbox.exec(f"mkdir -p {shlex.quote(logs)}/agent", timeout=60)
        if r.exit_code != 0:
            raise SandboxFailed(f"cannot make {logs} in the sandbox: {r.stderr[-500:]}")
        # the set-up PATH is kept for the verifier: what the policy does to its shell never reaches it
        return ToolContext(sandbox=sandbox, cwd=workdir, env={"PATH": path}, timeout=self.exec_timeout,
                           state={"workdir": workdir, "path": path})

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
        if self._is_local():  # /app is the working directory here; same text for every sandbox
            return re.sub(r"(?<![\w./-])/app(?![\w.-])/?", "", task.instruction).replace("``", "`.`")
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

        try:
            return await run_verifier(ctx.sandbox, task.root / "tests", private_tmp=self._is_local(),
                                      path=ctx.state["path"], workdir=workdir, timeout=task.verifier_timeout,
                                      transform=transform)
        except GradingFailed as e:
            return 0.0, {"reward": 0.0, "error_kind": "grading", "error": str(e)}

    def oracle_policy(self):
        return HarborOraclePolicy()


class HarborOraclePolicy:
    """Uploads solution/ (through bash, like any policy could) and runs solution/solve.sh."""

    def __init__(self, env: HarborEnv | None = None):
        self.env = env

    def bind(self, env: HarborEnv) -> HarborOraclePolicy:
        return HarborOraclePolicy(env)

    def command(self) -> str:
        env, task = self.env, self.env.task
        workdir = env._ctx.state["workdir"]
        dest = env.paths(workdir)["solution"]
        scripts = lambda p: env.rewrite(p.read_text(), workdir).encode() if p.suffix in (".sh", ".py") else None  # noqa: E731
        archive = tar_folder(task.root / "solution", scripts)
        blob = base64.b64encode(archive).decode()
        q = shlex.quote
        return f"mkdir -p {q(dest)} && echo {blob} | base64 -d | tar -xz -C {q(dest)} && bash {q(dest)}/solve.sh"

    async def __call__(self, messages: list[dict], tools: list[dict]) -> Any:
        if not any(m["role"] == "assistant" for m in messages):
            return {"name": "bash", "arguments": {"command": self.command()}}
        return {"name": "submit", "arguments": {}}


__all__ = ["GradingFailed", "HarborEnv", "HarborOraclePolicy", "HarborTask", "load_harbor"]
