"""Validate with Harbor's own models (needs Python >= 3.12 and harbor installed; not orchard-gym):

    python3.12 -m venv /tmp/hv && /tmp/hv/bin/pip install --no-deps harbor==0.25.0 && /tmp/hv/bin/pip install pydantic toml
    /tmp/hv/bin/python scripts/harbor_check.py tasks tests/data/harbor/corpus   # every task.toml: TaskConfig
    /tmp/hv/bin/python scripts/harbor_check.py atif runs/eval.atif.jsonl         # every line: ATIF Trajectory

Prints one line per item; exit 1 if any is invalid.
"""

import json
import sys
import warnings
from pathlib import Path


def check_tasks(root: Path) -> int:
    from harbor.models.task.config import TaskConfig

    bad = 0
    for toml in sorted(root.rglob("task.toml")):
        name = toml.parent.relative_to(root) if toml.parent != root else toml.parent.name
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                TaskConfig.model_validate_toml(toml.read_text())
            print(f"valid   {name}" + "".join(f"  ({w.message})" for w in caught))
        except Exception as e:
            bad += 1
            print(f"INVALID {name}: {str(e).splitlines()[0][:200]}")
    return bad


def check_atif(path: Path) -> int:
    from harbor.models.trajectories import Trajectory

    bad = 0
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            t = Trajectory.model_validate(json.loads(line))
            calls = sum(len(s.tool_calls or []) for s in t.steps)
            print(f"valid   line {number}: {t.schema_version}, {len(t.steps)} steps, {calls} tool calls")
        except Exception as e:
            bad += 1
            print(f"INVALID line {number}: {str(e)[:300]}")
    return bad


if __name__ == "__main__":
    kind, target = sys.argv[1], Path(sys.argv[2])
    sys.exit(1 if (check_tasks(target) if kind == "tasks" else check_atif(target)) else 0)
