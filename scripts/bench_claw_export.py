#!/usr/bin/env python3
"""The exported Claw command line's cost per call (docs/harbor.md, "Orchard/Claw-v0"), on the host.

    python scripts/bench_claw_export.py [--task todo-cleanup-001] [--calls 10] [--depths 0,20,40]

Each call of an exported task's `claw` starts python3, replays the call log so far and appends
its entry: a read-only call (`todo_list`) is timed N times at each log depth, against a bare
`python3 -c "import json"` in the same run (the floor any python command line pays).
Medians in milliseconds, and each as a ratio to the baseline's.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchard_gym.envs.claw.tasks import load_tasks
from orchard_gym.envs.harbor.export import export_tasks


def timed(argv: list[str], n: int) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        subprocess.run(argv, capture_output=True, check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--task", default="todo-cleanup-001")
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--depths", default="0,20,40", help="log depths (calls already made) to time at")
    opts = p.parse_args()
    depths = sorted(int(d) for d in opts.depths.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        folders, refused = export_tasks({opts.task: load_tasks()[opts.task]}, Path(tmp), "Orchard/Claw-v0")
        if refused:
            raise SystemExit(refused[0])
        claw = Path(tmp) / "world"
        shutil.copytree(folders[0] / "environment" / "claw", claw)
        call = ["python3", str(claw / "claw"), "todo_list"]
        base = timed(["python3", "-c", "import json"], opts.calls)
        print(f"{'python3 -c import json (baseline)':<36}{base:8.1f} ms  1.0x")
        made = 0
        for depth in depths:
            while made < depth:
                subprocess.run(call, capture_output=True, check=True)
                made += 1
            ms = timed(call, opts.calls)
            made += opts.calls
            print(f"{f'claw todo_list, log at {depth} calls':<36}{ms:8.1f} ms  {ms / base:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
