"""SWE tasks in the SWE-bench instance schema, loaded from JSON/JSONL files or folders."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

BUILTIN_DIR = Path(__file__).parent / "tasks" / "builtin"


class SWETask(BaseModel):
    """One instance. Besides SWE-bench's fields: where the source comes from, how to run
    its tests, and what the test environment needs."""

    model_config = ConfigDict(extra="allow")

    instance_id: str
    repo: str
    version: str | None = None
    base_commit: str | None = None
    source_archive: Path | None = Field(None, description="tar.gz of the repository at its base state")
    problem_statement: str
    hints_text: str = ""
    patch: str = Field("", description="the gold patch (source only)")
    test_patch: str = Field(description="the tests that check the fix")
    FAIL_TO_PASS: list[str]
    PASS_TO_PASS: list[str] = Field(default_factory=list)
    image: str | None = None
    test_cmd: str = Field(description="run in the repository root; its output is graded")
    test_files: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    install: list[str] = Field(default_factory=list, description="pip requirements of the test environment")
    setup_commands: list[str] = Field(default_factory=list, description="run in the repository after unpacking")
    python: str = "3.11"

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _json_list(cls, v):
        return json.loads(v) if isinstance(v, str) else v  # SWE-bench ships these as JSON strings

    @property
    def repo_name(self) -> str:
        return self.repo.rstrip("/").split("/")[-1]


def load_tasks(source: str | Path = "builtin") -> dict[str, SWETask]:
    """Tasks by instance_id from 'builtin', a .jsonl/.json file, or a folder holding
    tasks.jsonl or one sub-folder per task with a task.json."""
    path = BUILTIN_DIR if str(source) == "builtin" else Path(source)
    if path.is_dir():
        files = [path / "tasks.jsonl"] if (path / "tasks.jsonl").exists() else sorted(path.glob("*/task.json"))
    elif path.exists():
        files = [path]
    else:
        raise FileNotFoundError(f"no SWE tasks at {path}")
    tasks: dict[str, SWETask] = {}
    for file in files:
        text = file.read_text()
        rows = [json.loads(line) for line in text.splitlines() if line.strip()] if file.suffix == ".jsonl" \
            else _as_list(json.loads(text))
        for row in rows:
            task = SWETask.model_validate(row)
            if task.source_archive is not None and not task.source_archive.is_absolute():
                task.source_archive = (file.parent / task.source_archive).resolve()
            if task.instance_id in tasks:
                raise ValueError(f"duplicate instance_id {task.instance_id} in {file}")
            tasks[task.instance_id] = task
    if not tasks:
        raise ValueError(f"no tasks found in {path}")
    return tasks


def _as_list(obj) -> list:
    return obj if isinstance(obj, list) else [obj]
