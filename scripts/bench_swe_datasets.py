#!/usr/bin/env python3
"""How long loading a SWE-bench-format task file takes (JSONL, JSON, Parquet).

    python scripts/bench_swe_datasets.py [--n 200] [--repeats 5]

Writes N SWE-bench-shaped records (JSON-string FAIL_TO_PASS / PASS_TO_PASS with 300
test ids, a ~2 KB problem statement, a ~3 KB gold patch, a test patch) to a temporary
folder and times `load_tasks` on each format, in a fresh process each time (imports
included) and in-process (parsing only). Prints the median and the worst of the repeats.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def records(n: int) -> list[dict]:
    hunk = "".join(f"-    old_line_{i} = compute({i})\n+    new_line_{i} = compute({i}, fixed=True)\n" for i in range(40))
    return [{
        "repo": "owner/repo", "instance_id": f"owner__repo-{i}", "base_commit": f"{i:040x}",
        "patch": f"diff --git a/pkg/mod_{i}.py b/pkg/mod_{i}.py\n--- a/pkg/mod_{i}.py\n+++ b/pkg/mod_{i}.py\n@@ -1,40 +1,40 @@\n"
                 + hunk,
        "test_patch": f"diff --git a/tests/test_{i}.py b/tests/test_{i}.py\n--- a/tests/test_{i}.py\n+++ b/tests/test_{i}.py\n"
                      "@@ -1,1 +1,2 @@\n+def test_new(): pass\n",
        "problem_statement": "word " * 400, "hints_text": "", "created_at": "2024-01-01T00:00:00Z", "version": "1.0",
        "FAIL_TO_PASS": json.dumps([f"tests/test_{i}.py::test_new"]),
        "PASS_TO_PASS": json.dumps([f"tests/test_{i}.py::test_{j}" for j in range(300)]),
        "environment_setup_commit": f"{i:040x}",
    } for i in range(n)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    from orchard_gym.envs.swe.tasks import load_tasks

    rows = records(args.n)
    with tempfile.TemporaryDirectory() as tmp:
        files = {"jsonl": Path(tmp) / "t.jsonl", "json": Path(tmp) / "t.json"}
        files["jsonl"].write_text("".join(json.dumps(r) + "\n" for r in rows))
        files["json"].write_text(json.dumps(rows))
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq

            files["parquet"] = Path(tmp) / "t.parquet"
            pq.write_table(pa.Table.from_pylist(rows), files["parquet"])
        except ImportError:
            print("pyarrow missing: no parquet figures")
        size = {k: f.stat().st_size / 1e6 for k, f in files.items()}
        print(f"{args.n} SWE-bench-format instances; median / worst of {args.repeats}")
        base = []
        for _ in range(args.repeats):  # same-run baseline: a fresh process that only imports the loader
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", "import orchard_gym.envs.swe.tasks"], check=True, cwd="/")
            base.append(time.perf_counter() - t0)
        print(f"  baseline: fresh process importing the loader only {statistics.median(base):.3f} s / {max(base):.3f} s")
        for kind, file in files.items():
            inproc = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                assert len(load_tasks(file)) == args.n
                inproc.append(time.perf_counter() - t0)
            fresh = []
            code = f"from orchard_gym.envs.swe.tasks import load_tasks; assert len(load_tasks({str(file)!r})) == {args.n}"
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                subprocess.run([sys.executable, "-c", code], check=True, cwd="/")
                fresh.append(time.perf_counter() - t0)
            print(f"  {kind:8} {size[kind]:5.1f} MB  in-process {statistics.median(inproc):.3f} s / {max(inproc):.3f} s"
                  f"   fresh process (imports included) {statistics.median(fresh):.3f} s / {max(fresh):.3f} s")


if __name__ == "__main__":
    main()
