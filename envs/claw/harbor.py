"""Harbor / Terminal-Bench task folders, run unchanged: `ClawEnv(tasks="harbor:PATH")`.

    my-task/
      task.toml               # [agent] timeout_sec, [verifier] timeout_sec, [environment] build_timeout_sec
      instruction.md          # the first observation
      environment/Dockerfile  # the sandbox image
      solution/solve.sh       # the oracle (ClawEnv's oracle policy runs it)
      tests/test.sh           # the verifier: writes /logs/verifier/reward.txt (or reward.json)

PATH is one task folder or a folder of task folders. The policy acts with `bash` and
`submit`. At the end every process the policy left is killed (SIGSTOP, then SIGKILL,
until none is left), `/logs/verifier` is emptied, `tests/` is uploaded fresh to `/tests`
(so the policy never had the verifier to edit), `bash /tests/test.sh` runs, and the reward
file is the reward. No reward file, or one that is not a finite number, is a grading
failure, never a score: `report["error_kind"] == "grading"` with `report["error"]`, and the
trajectory is errored (`trajectory.error` = "grading: ...", `trajectory.error_kind` =
"grading"), so trainers drop it.

Where the sandbox comes from:
- container backends: the image is built from `environment/` with the docker SDK, never
  pulling (FROM must be a local image), tagged `localhost/orchard/harbor-NAME:HASH12` by a
  hash of the folder, and rebuilt only when the folder changes;
- local backend: only a Dockerfile of `FROM` plus `RUN pip install ...` lines can run
  there — a venv with those packages is built once on the host (envs/swe/venvs.py) and put
  first on PATH; the absolute Harbor paths (/tests, /solution, /logs, /app) are rewritten
  to folders in the sandbox's working directory, and in the instruction `/app/x` becomes
  the relative `x` (the working directory). The local backend needs bwrap isolation
  (its own PID namespace), so that killing the policy's processes touches nothing else.
"""

from __future__ import annotations

import base64
import hashlib
import io
import math
import re
import shlex
import tarfile
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

HARBOR_DIRS = ("tests", "solution", "logs", "app")  # the absolute paths Harbor tasks use
IMAGE_PREFIX = "localhost/orchard/harbor-"

# Kills every process of the sandbox but this script's own ancestry (the agent and the shell
# running it): stop them all first so none can fork or restart another, then kill.
KILL_ALL = r"""
keep=" $$ "; p=$$
while [ "$p" -gt 1 ]; do set -- $(cat /proc/$p/stat 2>/dev/null || echo x x x 1); p=$4; keep="$keep$p "; done
keep="$keep 1 "
for round in 1 2 3 4 5 6 7 8 9 10; do
  found=""
  for d in /proc/[0-9]*; do
    pid=${d#/proc/}
    case "$keep" in *" $pid "*) continue;; esac
    set -- $(cat "$d/stat" 2>/dev/null) || continue
    [ "$#" -ge 3 ] && [ "$3" != Z ] || continue  # gone, or a zombie waiting for init to reap it
    found="$found $pid"
  done
  [ -z "$found" ] && exit 0
  kill -STOP $found 2>/dev/null; kill -KILL $found 2>/dev/null; sleep 0.2
done
echo "processes left: $found" >&2; exit 1
"""


class GradingFailed(SandboxFailed):
    """The verifier gave no usable reward: the trajectory is errored, not scored."""


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


def tar_folder(folder: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path in sorted(folder.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(folder)), recursive=False)
    return buf.getvalue()


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

    def rewrite(self, text: str, workdir: str) -> str:
        """A Harbor script with its absolute paths moved to this sandbox's (a no-op in containers)."""
        if not self._is_local():
            return text
        paths = self.paths(workdir)
        return re.sub(r"(?<![\w./-])/(tests|solution|logs|app)(?![\w.-])", lambda m: paths[m.group(1)], text)

    async def setup(self, sandbox: AsyncSandboxInstance, task: HarborTask) -> ToolContext:
        workdir = sandbox.workdir or "/app"
        path = (await sandbox.exec("echo $PATH", timeout=30)).stdout.strip() or "/usr/local/bin:/usr/bin:/bin"
        if self._is_local():
            venv = await run_in_thread(ensure_venv, task.pip_requirements)
            path = f"{venv}/bin:{path}"
        logs = self.paths(workdir)["logs"]
        r = await sandbox.exec(f"mkdir -p {shlex.quote(logs)}/agent {shlex.quote(logs)}/verifier", timeout=60)
        if r.exit_code != 0:
            raise SandboxFailed(f"cannot make {logs} in the sandbox: {r.stderr[-500:]}")
        return ToolContext(sandbox=sandbox, cwd=workdir, env={"PATH": path}, timeout=self.exec_timeout,
                           state={"workdir": workdir})

    def first_observation(self, task: HarborTask) -> str:
        if self._is_local():  # /app is the working directory here; same text for every sandbox
            return re.sub(r"(?<![\w./-])/app(?![\w.-])/?", "", task.instruction).replace("``", "`.`")
        return task.instruction

    async def upload_folder(self, sandbox: AsyncSandboxInstance, folder: Path, dest: str, workdir: str) -> None:
        archive = f"{workdir}/.harbor-upload.tar.gz"
        await sandbox.upload_content(await run_in_thread(tar_folder, folder), archive)
        q = shlex.quote
        r = await sandbox.exec(f"rm -rf {q(dest)} && mkdir -p {q(dest)} && tar -xzf {q(archive)} -C {q(dest)} && "
                               f"rm -f {q(archive)}", timeout=120)
        if r.exit_code != 0:
            raise SandboxFailed(f"cannot upload {folder.name}/ to {dest}: {r.stderr[-500:]}")
        if self._is_local():  # the scripts use the absolute Harbor paths: point them here
            for script in (p for p in folder.rglob("*") if p.suffix in (".sh", ".py") and p.is_file()):
                text = self.rewrite(script.read_text(), workdir)
                await sandbox.upload_content(text.encode(), f"{dest}/{script.relative_to(folder)}")

    async def grade(self, ctx: ToolContext, task: HarborTask) -> tuple[float, dict]:
        sandbox, workdir = ctx.sandbox, ctx.state["workdir"]
        paths = self.paths(workdir)
        report: dict[str, Any] = {}
        try:
            killed = await sandbox.exec(KILL_ALL, timeout=60)
            if killed.exit_code != 0:
                raise GradingFailed(f"the policy's processes could not all be killed: {killed.stderr[-500:]}")
            verifier = f"{paths['logs']}/verifier"
            r = await sandbox.exec(f"rm -rf {shlex.quote(verifier)} && mkdir -p {shlex.quote(verifier)}", timeout=60)
            if r.exit_code != 0:
                raise GradingFailed(f"cannot empty {verifier}: {r.stderr[-500:]}")
            await self.upload_folder(sandbox, task.root / "tests", paths["tests"], workdir)
            run = await sandbox.exec(f"bash {shlex.quote(paths['tests'])}/test.sh", cwd=workdir, env=ctx.env,
                                     timeout=task.verifier_timeout)
            report.update(test_exit_code=run.exit_code, test_timed_out=run.timed_out,
                          test_output=(run.stdout + run.stderr)[-4000:])
            reward = await self.read_reward(sandbox, verifier, report)
        except GradingFailed as e:
            report.update(reward=0.0, error_kind="grading", error=str(e))
            return 0.0, report
        report["reward"] = reward
        return reward, report

    async def read_reward(self, sandbox: AsyncSandboxInstance, verifier: str, report: dict) -> float:
        r = await sandbox.exec(f"cat {shlex.quote(verifier)}/reward.txt 2>/dev/null || "
                               f"{{ printf 'JSON '; cat {shlex.quote(verifier)}/reward.json; }}", timeout=60)
        text = r.stdout.strip()
        if r.exit_code != 0 or not text:
            raise GradingFailed(f"the verifier wrote no reward file ({verifier}/reward.txt or reward.json); "
                                f"test.sh exited {report['test_exit_code']}: {report['test_output'][-500:]}")
        try:
            if text.startswith("JSON "):
                import json

                data = json.loads(text[5:])
                value = float(data["reward"] if isinstance(data, dict) else data)
            else:
                value = float(text)
        except (ValueError, TypeError, KeyError) as e:
            raise GradingFailed(f"the reward file is not a number: {text[:200]!r} ({type(e).__name__})") from None
        if not math.isfinite(value):
            raise GradingFailed(f"the reward file is not a finite number: {text[:200]!r}")
        return value

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
        folder = task.root / "solution"
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for path in sorted(folder.rglob("*")):
                if path.is_file() and path.suffix in (".sh", ".py"):
                    data = env.rewrite(path.read_text(), workdir).encode()
                    info = tarfile.TarInfo(str(path.relative_to(folder)))
                    info.size, info.mode = len(data), 0o755
                    tar.addfile(info, io.BytesIO(data))
                elif path.is_file():
                    tar.add(path, arcname=str(path.relative_to(folder)))
        blob = base64.b64encode(buf.getvalue()).decode()
        q = shlex.quote
        return f"mkdir -p {q(dest)} && echo {blob} | base64 -d | tar -xz -C {q(dest)} && bash {q(dest)}/solve.sh"

    async def __call__(self, messages: list[dict], tools: list[dict]) -> Any:
        if not any(m["role"] == "assistant" for m in messages):
            return {"name": "bash", "arguments": {"command": self.command()}}
        return {"name": "submit", "arguments": {}}


__all__ = ["GradingFailed", "HarborEnv", "HarborOraclePolicy", "HarborTask", "load_harbor"]
