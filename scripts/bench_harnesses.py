"""The harnesses side by side on one built-in SWE task, local backend, in one run (the table in
docs/harnesses.md): install size on disk, start-up to the first model call (`reset`: sandbox,
task set-up, harness launch, until its first request reaches the proxy), and per-step overhead:
the mean time of a step that has the harness run `true` in its shell, minus the same step on
the bare Orchard/SWE-v0 env (its `bash` tool).

    .venv/bin/python scripts/bench_harnesses.py                       # every built-in harness
    .venv/bin/python scripts/bench_harnesses.py --harness openhands --steps 5
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time

import gymnasium as gym

import orchard_gym  # noqa: F401 - registers the env ids
from orchard_gym.wrappers.harness import all_harnesses

TASK = "semver-3.0.2"


def du(*paths) -> int:
    """Bytes on disk (links not followed)."""
    paths = [str(p) for p in paths if p]
    if not paths:
        return 0
    out = subprocess.run(["du", "-scb", *paths], capture_output=True, text=True, check=True).stdout
    return int(out.strip().splitlines()[-1].split()[0])


def bare_step_seconds(root: str, steps: int) -> float:
    env = gym.make("Orchard/SWE-v0", backend={"type": "local", "root": root})
    try:
        env.reset(options={"task_id": TASK})
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            env.step({"name": "bash", "arguments": {"command": "true"}})
            times.append(time.perf_counter() - t0)
    finally:
        env.close()
    return statistics.mean(times)


def bench(name: str, root: str, steps: int) -> dict:
    h = all_harnesses()[name]
    venv, npm = h.install(), h.install_npm()
    env = gym.make("Orchard/SWE-v0", harness=name, backend={"type": "local", "root": root}, max_steps=steps + 2,
                   max_seconds=900)
    try:
        t0 = time.perf_counter()
        env.reset(options={"task_id": TASK})
        start = time.perf_counter() - t0
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            _, _, terminated, truncated, info = env.step(h.shell("true"))
            times.append(time.perf_counter() - t0)
            if terminated or truncated:
                raise RuntimeError(f"{name} ended early: {info.get('error')}")
        env.step(h.finish)
    finally:
        env.close()
    return {"name": name, "size": du(venv, npm), "start": start, "step": statistics.mean(times)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--harness", default=",".join(sorted(all_harnesses())), help="a,b,c")
    p.add_argument("--steps", type=int, default=3)
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="og-bench-", dir="/tmp") as root:
        bare = bare_step_seconds(root, a.steps)
        rows = [bench(n, root, a.steps) for n in a.harness.split(",")]
    print(f"bare Orchard/SWE-v0 step (`true`): {bare:.2f} s")
    print("| harness | install on disk | start-up to first model call | per-step overhead |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| `{r['name']}` | {r['size'] / 2**20:.0f} MiB | {r['start']:.1f} s | {r['step'] - bare:+.2f} s |")


if __name__ == "__main__":
    main()
