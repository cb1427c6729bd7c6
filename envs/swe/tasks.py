"""SWE tasks in the SWE-bench instance schema: our built-in set, and public datasets' records
(SWE-bench, SWE-Gym, SWE-rebench, R2E-Gym, SWE-smith; `datasets.py`) from JSON/JSONL/Parquet
files, `datasets` folders or the Hugging Face hub."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .datasets import TaskFormatError, kind_for_source, normalize, read_records

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
    test_patch: str = Field("", description="the tests that check the fix")
    FAIL_TO_PASS: list[str]
    PASS_TO_PASS: list[str] = Field(default_factory=list)
    image: str | None = None
    test_cmd: str = Field("", description="run in the repository root; its output is graded")
    test_files: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    install: list[str] = Field(default_factory=list, description="pip requirements of the test environment")
    setup_commands: list[str] = Field(default_factory=list, description="run in the repository after unpacking")
    python: str = "3.11"
    # image-based instances (public datasets): the repository is already in the image
    workdir: str | None = Field(None, pattern=r"^/", description="where the image holds the repository")
    eval_script: str | None = Field(None, description="SWE-bench 5's per-instance eval.sh")
    log_parser: str = "parse_log_pytest"
    eval_type: str = "pass_and_fail"
    dataset: str | None = Field(None, description="the dataset schema the record came in")
    bug_patch: str = Field("", description="SWE-smith: applied at set-up to put the bug in")

    @model_validator(mode="after")
    def _has_source(self):
        if self.source_archive is None and self.workdir is None:
            raise ValueError("needs source_archive (a tar.gz of the repository) or workdir (the repository's "
                             "place in the task's image)")
        if self.workdir is not None and not self.image:
            raise ValueError("an image-based task (workdir set) needs an image")
        return self

    @property
    def in_image(self) -> bool:
        return self.workdir is not None

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _json_list(cls, v):
        return json.loads(v) if isinstance(v, str) else v  # SWE-bench ships these as JSON strings

    @property
    def repo_name(self) -> str:
        return self.repo.rstrip("/").split("/")[-1]


def load_tasks(source: str | Path = "builtin", split: str | None = None, *, image_prefix: str | None = None,
               dataset: str | None = None) -> dict[str, SWETask]:
    """Tasks by instance_id from 'builtin', a .json/.jsonl/.parquet file, a folder (tasks.jsonl,
    one sub-folder per task with a task.json, a `datasets` save_to_disk folder, or parquet
    files), or a Hugging Face dataset name. `split` picks a split of a folder or hub dataset;
    `image_prefix` replaces the registry/namespace of the images; `dataset` forces a schema
    (`datasets.KINDS`) instead of recognising it per record."""
    path = BUILTIN_DIR if str(source) == "builtin" else Path(source)
    kind = dataset or kind_for_source(source)
    if path.is_dir() and (path / "tasks.jsonl").exists():
        files = [path / "tasks.jsonl"]
    elif path.is_dir() and any(path.glob("*/task.json")):
        files = sorted(path.glob("*/task.json"))
    else:
        files = [path if path.exists() else source]
    tasks: dict[str, SWETask] = {}
    for file in files:
        for where, row in read_records(file, split):
            task = parse_task(row, where, kind=kind, image_prefix=image_prefix)
            if task.source_archive is not None and not task.source_archive.is_absolute():
                task.source_archive = (Path(file).parent / task.source_archive).resolve()
            if task.instance_id in tasks:
                raise TaskFormatError(f"{where}: duplicate instance_id {task.instance_id!r}")
            tasks[task.instance_id] = task
    if not tasks:
        raise TaskFormatError(f"no tasks found in {source}")
    return tasks


def parse_task(row: Any, where: str, kind: str | None = None, image_prefix: str | None = None) -> SWETask:
    """One record as a task; a bad one raises TaskFormatError naming `where`, the task and the field."""
    name = f"task {row.get('instance_id')!r}" if isinstance(row, dict) and row.get("instance_id") else "a task"
    try:
        return SWETask.model_validate(normalize(row, kind, image_prefix))
    except TaskFormatError as e:
        raise TaskFormatError(f"{where}: {name}: {e}") from None
    except (ValueError, TypeError) as e:  # pydantic's ValidationError is a ValueError
        raise TaskFormatError(f"{where}: {name}: {_explain(e)}") from None


def _explain(e: Exception) -> str:
    if not isinstance(e, ValidationError):
        return f"{type(e).__name__}: {e}"
    parts = []
    for err in e.errors():
        field = ".".join(str(x) for x in err["loc"]) or "record"
        msg = err["msg"].removeprefix("Value error, ")
        parts.append(f"field {field!r}: {msg}" if err["loc"] else msg)
    return "; ".join(parts)
