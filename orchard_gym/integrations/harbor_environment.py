"""Harbor's own runner on Orchard sandboxes: a Harbor `BaseEnvironment` (harbor 0.25) that Harbor
loads by import path, so each trial of a `harbor run` job runs in an Orchard sandbox.

    harbor run --path TASKS --agent oracle \\
        --env orchard_gym.integrations.harbor_environment:OrchardEnvironment --ek backend=docker

Runs where harbor is installed (Python >= 3.12: scripts/install_harbor.sh builds that venv, with
this package in it). The sandbox is the one `Orchard/Harbor-v0` makes for the task (its reset,
nothing else: no policy, no grading): on docker the task's image, built from `environment/`
(never pulled); on local the Dockerfile's steps as set-up in a bwrap sandbox, where Harbor's
absolute paths (/logs, /tests, /solution, the image's WORKDIR) live in the working directory
and are rewritten in every command, path and uploaded text file as Orchard/Harbor-v0 rewrites
the task's own scripts. Harbor does the rest as with any environment: the agent, its time
limit (a command's `timeout_sec` is its Orchard timeout; one whose call Harbor cancels is killed by
the sandbox's agent when the caller hangs up), the
verifier, the reward. Environment kwargs (`--ek`, or `environment.kwargs` in a job config):
`backend`: "local" (default; bwrap isolation), "docker", or a backend config as JSON.
Commands run as the sandbox's user (a Harbor `user=` is not honoured: Orchard sandboxes have
one user, as `[agent] user` is for Orchard/Harbor-v0).
"""

from __future__ import annotations

import base64
import io
import json
import shlex
import tarfile
from pathlib import Path
from typing import Any

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities

from orchard_gym.envs.harbor.env import HarborEnv
from orchard_gym.envs.harbor.tasks import load_tasks

BACKENDS = {"local": {"type": "local", "isolation": "bwrap"}, "docker": {"type": "docker"}}
MAX_EXEC = 7 * 86400.0  # Orchard's longest command; Harbor's own limits cancel sooner


def backend_config(backend: Any) -> dict:
    """The Orchard backend config an environment kwarg names: "local", "docker" or a JSON object."""
    if backend is None:
        return dict(BACKENDS["local"])
    if isinstance(backend, dict):
        return backend
    if isinstance(backend, str) and backend in BACKENDS:
        return dict(BACKENDS[backend])
    if isinstance(backend, str) and backend.lstrip().startswith("{"):
        try:
            parsed = json.loads(backend)
        except json.JSONDecodeError as e:
            raise ValueError(f"backend: not valid JSON ({e})") from None
        if isinstance(parsed, dict):
            return parsed
    raise ValueError(f"backend must be 'local', 'docker' or a backend config as a JSON object, not {backend!r}")


class OrchardEnvironment(BaseEnvironment):
    """A Harbor environment whose sandbox is an Orchard sandbox (the module docstring)."""

    def __init__(self, environment_dir: Path, environment_name: str, session_id: str, trial_paths: Any,
                 task_env_config: Any, logger: Any = None, backend: Any = None, **kwargs: Any):
        self.backend = backend_config(backend)
        self._env: HarborEnv | None = None
        super().__init__(environment_dir, environment_name, session_id, trial_paths, task_env_config,
                         logger=logger, **kwargs)

    @staticmethod
    def type() -> str:
        return "orchard"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(disable_internet=True)  # a sandbox's network is on or off

    def _validate_definition(self) -> None:
        tasks, problems = load_tasks(Path(self.environment_dir).parent)
        if not tasks:
            reasons = "; ".join(str(p) for p in problems if p.severity == "error") or "not a Harbor task folder"
            raise ValueError(f"Orchard cannot run this task: {reasons}")

    # ------------------------------------------------------------------ lifecycle
    async def start(self, force_build: bool) -> None:
        """Orchard/Harbor-v0's reset of this task: the image (docker) or the set-up (local)."""
        task_root = Path(self.environment_dir).parent
        self._env = HarborEnv(tasks=str(task_root), backend=self.backend, snapshot_setup=False)
        await self._env.areset(options={"task_id": self._env.task_ids()[0]})
        dirs = [self._env.paths(self._workdir)["logs"] + f"/{d}" for d in ("agent", "verifier", "artifacts")]
        await self._run(f"mkdir -p {' '.join(map(shlex.quote, dirs))} && chmod 777 {' '.join(map(shlex.quote, dirs))}",
                        timeout=60)

    async def stop(self, delete: bool) -> None:
        env, self._env = self._env, None
        if env is not None:
            await env.aclose()

    # ------------------------------------------------------------------ paths
    @property
    def _ready(self) -> HarborEnv:
        if self._env is None or self._env.sandbox is None:
            raise RuntimeError("the Orchard sandbox is not started (call start() first)")
        return self._env

    @property
    def _workdir(self) -> str:
        return self._ready.context().cwd

    def _path(self, path: str) -> str:
        """Harbor's path in this sandbox (rewritten on local, as is in containers)."""
        return self._ready.rewrite(str(path), self._workdir)

    # ------------------------------------------------------------------ commands
    async def _run(self, command: str, cwd: str | None = None, env: dict[str, str] | None = None,
                   timeout: float | None = None):
        # Harbor's agent limit cancels this call: the agent in the sandbox kills a command whose
        # caller hung up (orchard_gym/agent/jobs.py), so it does not outlive the limit
        ctx = self._ready.context()
        return await ctx.sandbox.exec(["bash", "-c", command], cwd=cwd or ctx.cwd, env={**ctx.env, **(env or {})},
                                      timeout=min(float(timeout or MAX_EXEC), MAX_EXEC))

    async def exec(self, command: str, cwd: str | None = None, env: dict[str, str] | None = None,
                   timeout_sec: int | None = None, user: str | int | None = None) -> ExecResult:
        cwd = cwd or self.task_env_config.workdir
        r = await self._run(self._path(command), self._path(cwd) if cwd else None, self._merge_env(env), timeout_sec)
        stderr = r.stderr
        if r.timed_out:
            stderr += f"\n[orchard] the command ran past its {timeout_sec}s limit and was killed"
        return ExecResult(stdout=r.stdout, stderr=stderr,
                          return_code=r.exit_code if r.exit_code is not None and not r.timed_out else 124)

    # ------------------------------------------------------------------ files
    # Through commands, not the agent's file API: that one keeps to the sandbox's file roots (the
    # working directory), and Harbor's /solution, /tests and /logs are outside it in containers.
    def _content(self, data: bytes) -> bytes:
        """An uploaded file as this sandbox needs it: text has Harbor's absolute paths rewritten."""
        try:
            text = data.decode()
        except UnicodeDecodeError:
            return data
        return self._path(text).encode() if text else data

    async def _checked(self, command: str, what: str, stdin: bytes | None = None):
        ctx = self._ready.context()
        r = await ctx.sandbox.exec(["bash", "-c", command], cwd=ctx.cwd, env=ctx.env, timeout=600,
                                   stdin=base64.b64encode(stdin).decode() if stdin is not None else None)
        if r.exit_code != 0 or r.timed_out:
            raise RuntimeError(f"Orchard sandbox: {what} failed (exit {r.exit_code}): {(r.stderr or r.stdout)[-500:]}")
        return r

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        source, target = Path(source_path), shlex.quote(self._path(target_path))
        await self._checked(f'mkdir -p "$(dirname {target})" && base64 -d > {target} && '
                            f"chmod {source.stat().st_mode & 0o7777:o} {target}",
                            f"upload of {target_path}", self._content(source.read_bytes()))

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        source, buf = Path(source_dir), io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for path in sorted(source.rglob("*")):
                info = tar.gettarinfo(str(path), arcname=path.relative_to(source).as_posix())
                if path.is_file():
                    data = self._content(path.read_bytes())
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                elif path.is_dir():
                    tar.addfile(info)
        target = shlex.quote(self._path(target_dir))
        await self._checked(f"mkdir -p {target} && base64 -d | tar -xzf - -C {target}", f"upload of {target_dir}",
                            buf.getvalue())

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        r = await self._checked(f"base64 -w0 {shlex.quote(self._path(source_path))}", f"download of {source_path}")
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(base64.b64decode(r.stdout))

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        r = await self._checked(f"tar -C {shlex.quote(self._path(source_dir))} -czf - . | base64 -w0",
                                f"download of {source_dir}")
        target = Path(target_dir)
        target.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(base64.b64decode(r.stdout)), mode="r:gz") as tar:
            tar.extractall(target, filter="data")
