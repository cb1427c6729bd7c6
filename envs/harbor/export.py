"""Orchard tasks written as Harbor task folders (`orchard tasks export --format harbor`).

Tasks graded by a shell check over files (Orchard/Toy-v0 and any task with `files`, `check`,
`solution`): the files go into `environment/` and a `COPY`, the check becomes `tests/test.sh`
writing `/logs/verifier/reward.txt`, the solution `solution/solve.sh`. Orchard/SWE-v0 tasks:
`export_swe.py`. A task that cannot be exported is refused with its reason (`export_tasks`
returns them; the rest are written). Orchard/Claw-v0 tasks: `export_claw.py`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

BASE_IMAGE = "localhost/orchard/bookworm:latest"


def _toml_string(text: str) -> str:
    return json.dumps(text)  # a JSON string is a valid TOML basic string


def export_task(task: Any, out: Path, env_id: str, base_image: str | None = None) -> Path:
    """Write one task's folder under `out`; ValueError (with the reason) when it cannot be exported.
    `base_image`: the Dockerfiles' FROM (None: each kind's own, e.g. an image with python3 for Claw)."""
    if hasattr(task, "instance_id") and hasattr(task, "FAIL_TO_PASS"):  # an SWETask
        from .export_swe import export_swe_task

        return export_swe_task(task, out / task.instance_id, env_id, base_image or BASE_IMAGE, _toml_string)
    if hasattr(task, "checks") and hasattr(task, "services"):  # a ClawTask
        from .export_claw import export_claw_task

        return export_claw_task(task, out / task.task_id, env_id, base_image, _toml_string)
    for needed in ("files", "check", "solution", "instruction", "task_id"):
        if not hasattr(task, needed):
            name = getattr(task, "task_id", None) or getattr(task, "instance_id", None) or type(task).__name__
            raise ValueError(f"{env_id} task {name!r} has no {needed!r}: only tasks graded "
                             f"by a shell check over files (Orchard/Toy-v0) are exported to Harbor")
    folder = out / task.task_id
    for sub in ("environment/files", "solution", "tests"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    for rel, content in task.files.items():
        path = folder / "environment" / "files" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    name = re.sub(r"[^a-zA-Z0-9._-]+", "-", task.task_id)
    (folder / "task.toml").write_text(
        'schema_version = "1.4"\n\n[task]\nname = ' + _toml_string(f"orchard/{name}") + "\n\n[metadata]\nsource = "
        + _toml_string(env_id) + "\n\n[agent]\ntimeout_sec = 300.0\n\n[verifier]\ntimeout_sec = 60.0\n\n"
        '[environment]\nnetwork_mode = "no-network"\n')
    (folder / "instruction.md").write_text(f"Work in /app. {task.instruction.strip()}\n")
    copy = "COPY files/ /app/\n" if task.files else ""
    (folder / "environment" / "Dockerfile").write_text(f"FROM {base_image or BASE_IMAGE}\nWORKDIR /app\n{copy}")
    (folder / "solution" / "solve.sh").write_text(f"#!/bin/bash\ncd /app\n{task.solution}\n")
    (folder / "tests" / "test.sh").write_text(
        "#!/bin/bash\n# the env's own check, run in /app: exit 0 means solved\nmkdir -p /logs/verifier\n"
        f"if (cd /app && {task.check}) >/dev/null 2>&1; then echo 1 > /logs/verifier/reward.txt; "
        "else echo 0 > /logs/verifier/reward.txt; fi\n")
    return folder


def export_tasks(tasks: dict[str, Any], out: Path, env_id: str,
                 base_image: str | None = None) -> tuple[list[Path], list[str]]:
    """(the folders written, a reason for each task refused)."""
    folders, refused = [], []
    for _, task in sorted(tasks.items()):
        try:
            folders.append(export_task(task, out, env_id, base_image))
        except ValueError as e:
            refused.append(str(e))
    return folders, refused
