"""Claw tasks as data: one JSON (or YAML) file per task.

    {
      "task_id": "mail-reply-003",
      "instruction": "Reply to Dana's email about the budget ...",
      "difficulty": 1,                       # 1: 1-3 calls, 2: 4-9, 3: 10+
      "services": ["mail"],
      "seed": {"mail": {"messages": [...]}},  # laid over the empty world (claw_tools.empty_state)
      "tools": ["mail_list_messages", ...],   # allowed tools (empty: all)
      "checks": [{"kind": "completion"|"safety", "type": ..., ...}],   # see checks.py
      "faults": [{"tool": "mail_send", "call": 1, "kind": "rate_limit"|"server_error"|"timeout"}],
      "injection": {"where": "mail m3", "text": "...", "obey": [tool calls the injection asks for]},
      "oracle": [{"name": "mail_get_message", "arguments": {...}}, ...]   # a solution, retries included
    }

`tasks=` of the env: "builtin" (the files in tasks/builtin/), a folder, one file,
"agentdojo:SUITE" (agentdojo_source.py), or a dict {task_id: ClawTask}.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .agentdojo_source import load_agentdojo
from .task_model import ClawTask, Fault, Injection

__all__ = ["BUILTIN", "ClawTask", "Fault", "Injection", "load_tasks"]

BUILTIN = Path(__file__).parent / "tasks" / "builtin"


def _read(path: Path) -> dict:
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ValueError(f"{path}: YAML tasks need PyYAML (pip install pyyaml), or write JSON") from None
        return yaml.safe_load(text)
    return json.loads(text)


def load_tasks(source: Any = "builtin") -> dict[str, ClawTask]:
    """Tasks by id from "builtin", a folder of task files, one file, or a dict."""
    if isinstance(source, str) and source.startswith("agentdojo:"):
        return load_agentdojo(source)
    if isinstance(source, dict):
        return {k: v if isinstance(v, ClawTask) else ClawTask.model_validate(v) for k, v in source.items()}
    path = BUILTIN if source in (None, "builtin") else Path(source)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in (".json", ".yaml", ".yml"))
    elif path.is_file():
        files = [path]
    else:
        raise ValueError(f"no Claw tasks at {source!r}: use 'builtin', a folder or a task file")
    tasks: dict[str, ClawTask] = {}
    for file in files:
        try:
            task = ClawTask.model_validate(_read(file))
        except (ValueError, TypeError) as e:
            raise ValueError(f"{file}: not a valid Claw task: {e}") from None
        if task.task_id in tasks:
            raise ValueError(f"{file}: duplicate task id {task.task_id!r}")
        tasks[task.task_id] = task
    if not tasks:
        raise ValueError(f"no task files (*.json, *.yaml) in {path}")
    return tasks
