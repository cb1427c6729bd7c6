"""Harbor task folders: finding them, reading them, and saying why one cannot run.

    my-task/
      task.toml               # Harbor's TaskConfig (config.py reviews every field)
      instruction.md          # the first observation
      environment/Dockerfile  # the sandbox (or [environment] docker_image)
      solution/solve.sh       # the oracle
      tests/test.sh           # the verifier: writes /logs/verifier/reward.txt (or reward.json)

`load_tasks(source)` takes a folder of task folders at any depth, one task folder, or a JSONL
index (one `{"path": "...", "task_id": "..."}` a line, paths relative to the index file). A
task that cannot run is a `Problem` (one line: where and why) and is skipped; the rest load.
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from .compose import COMPOSE_FILE, Compose, parse_compose
from .config import Settings, review
from .dockerfile import DockerfileError, Plan, parse

IMAGE_PREFIX = "localhost/orchard/harbor-"
REQUIRED = ("task.toml", "instruction.md", "tests/test.sh")


@dataclass(frozen=True)
class Problem:
    path: str
    severity: str  # "error": the task is skipped; "warning": it runs, with this caveat
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.severity}: {self.message}"


class HarborTask(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)

    task_id: str
    root: Path
    instruction: str
    dockerfile: str | None
    settings: Settings
    plan: Plan | None = None  # the Dockerfile as set-up steps (None: no Dockerfile, docker_image only)
    compose: Compose | None = None  # environment/docker-compose.yaml's services (docker backend only)
    warnings: list[str] = []

    # the names the Claw-era HarborTask had
    @property
    def agent_timeout(self) -> float | None:
        return self.settings.agent_timeout

    @property
    def verifier_timeout(self) -> float:
        return self.settings.verifier_timeout

    @property
    def build_timeout(self) -> float:
        return self.settings.build_timeout

    @property
    def image_tag(self) -> str:
        name = re.sub(r"[^a-z0-9._-]+", "-", self.task_id.lower()).strip("-.") or "task"
        return f"{IMAGE_PREFIX}{name}:{folder_hash(self.root / 'environment')[:12]}"


def folder_hash(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def load_task(folder: Path, task_id: str | None = None) -> HarborTask:
    """One task folder; ValueError (one line) when it cannot run."""
    for needed in REQUIRED:
        if not (folder / needed).is_file():
            raise ValueError(f"{needed} is missing")
    try:
        data = tomllib.loads((folder / "task.toml").read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"task.toml is not valid TOML: {e}") from None
    settings, warnings = review(data)
    dockerfile_path = folder / "environment" / "Dockerfile"
    dockerfile = dockerfile_path.read_text() if dockerfile_path.is_file() else None
    if dockerfile is None and settings.docker_image is None:
        raise ValueError("environment/Dockerfile is missing (and [environment] docker_image is not set)")
    plan = None
    if dockerfile is not None:
        try:
            plan = parse(dockerfile, settings.workdir)
        except DockerfileError as e:  # runs on docker still; local refuses it at reset with this reason
            warnings.append(f"local backend cannot run environment/Dockerfile: {e}")
        else:
            warnings += plan.warnings
    instruction = (folder / "instruction.md").read_text()
    if not instruction.strip():
        raise ValueError("instruction.md is empty")
    task = HarborTask(task_id=task_id or folder.name, root=folder.resolve(), instruction=instruction,
                      dockerfile=dockerfile, settings=settings, plan=plan, warnings=warnings)
    if (folder / "environment" / COMPOSE_FILE).is_file():
        main_image = task.image_tag if dockerfile is not None else str(settings.docker_image)
        task.compose = parse_compose(folder / "environment", settings, main_image)
        task.warnings += [*task.compose.warnings, f"local backend cannot run environment/{COMPOSE_FILE} (services "
                                                   f"beside the agent's): docker backend only"]
    return task


def _index(path: Path) -> tuple[list[tuple[str, Path]], list[Problem]]:
    entries, problems = [], []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            folder = Path(record["path"]).expanduser()
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            problems.append(Problem(f"{path}:{number}", "error", f"not a JSON object with a 'path': {e}"))
            continue
        folder = folder if folder.is_absolute() else path.parent / folder
        entries.append((str(record.get("task_id") or folder.name), folder))
    return entries, problems


def discover(source: str | Path) -> tuple[list[tuple[str, Path]], list[Problem]]:
    """(task id, folder) for every task under `source`, and the problems finding them."""
    path = Path(str(source).removeprefix("harbor:")).expanduser()
    if path.is_file() and path.suffix == ".jsonl":
        return _index(path)
    if not path.is_dir():
        raise ValueError(f"no Harbor tasks at {str(source)!r}: give a task folder, a folder of them (any depth) "
                         f"or a JSONL index")
    if (path / "task.toml").exists():
        return [(path.name, path)], []
    folders = sorted(p.parent for p in path.rglob("task.toml"))
    # a task folder's own sub-folders are not other tasks
    folders = [f for f in folders if not any(o in f.parents for o in folders)]
    return [(f.relative_to(path).as_posix(), f) for f in folders], []


def load_tasks(source: Any) -> tuple[dict[str, HarborTask], list[Problem]]:
    """Every task that can run, by id, and one Problem per task that cannot (or runs with a caveat)."""
    if isinstance(source, dict):
        return dict(source), []
    entries, problems = discover(source)
    tasks: dict[str, HarborTask] = {}
    for task_id, folder in entries:
        if task_id in tasks:
            problems.append(Problem(str(folder), "error", f"duplicate task id {task_id!r}"))
            continue
        try:
            task = load_task(folder, task_id)
        except (ValueError, OSError) as e:
            problems.append(Problem(str(folder), "error", str(e)))
            continue
        tasks[task_id] = task
        problems += [Problem(str(folder), "warning", w) for w in task.warnings]
    return tasks, problems


def is_harbor(source: Any) -> bool:
    """Whether a Claw `tasks=` value names Harbor tasks: "harbor:PATH", or a dict of HarborTask."""
    if isinstance(source, str):
        return source.startswith("harbor:")
    return isinstance(source, dict) and bool(source) and all(isinstance(t, HarborTask) for t in source.values())


def looks_like_harbor(source: str) -> bool:
    """Whether `orchard tasks check SOURCE` means Harbor tasks: a folder holding a task.toml at any
    depth, or a JSONL index whose first record has a "path" (SWE task files have none)."""
    path = Path(source.removeprefix("harbor:")).expanduser()
    if source.startswith("harbor:") or (path.is_dir() and next(path.rglob("task.toml"), None) is not None):
        return True
    if path.is_file() and path.suffix == ".jsonl":
        with path.open() as f:
            first = next((line for line in f if line.strip()), "")
        try:
            record = json.loads(first)
        except json.JSONDecodeError:
            return False
        return isinstance(record, dict) and "path" in record and "instance_id" not in record
    return False
