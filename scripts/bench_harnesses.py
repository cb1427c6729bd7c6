#!/usr/bin/env python3
"""The harnesses side by side on one SWE task, local backend, against the bare env in the same run.

    python scripts/bench_harnesses.py [--harness openclaw,codex,...] [--steps 3] [--task-id semver-3.0.2]

Per harness (default: every built-in one):
  install MB     the size of its installs on the host (npm prefix and/or venv)
  reset s        gym reset: sandbox, task set-up, harness start-up, up to its first model call
  start-up s     reset minus the bare env's reset (the same sandbox and set-up): the harness's own start
  step ms        median env.step of its shell tool running `true` (the harness runs it, asks again)
  overhead ms    step minus the bare env's median step of the bash tool running `true`
The scripted policy answers every call; the episode ends with the harness's finishing answer.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gymnasium as gym

import orchard_gym  # noqa: F401 - registers the env ids
from orchard_gym.wrappers.harness import all_harnesses, get_harness


def du_mb(paths: list[Path]) -> float:
    if not paths:
        return 0.0
    out = subprocess.run(["du", "-scb", *map(str, paths)], capture_output=True, text=True, check=True).stdout
    return int(out.strip().splitlines()[-1].split()[0]) / 2**20


def run(env: gym.Env, task_id: str, step, finish, steps: int) -> tuple[float, list[float]]:
    t = time.perf_counter()
    env.reset(options={"task_id": task_id})
    reset = time.perf_counter() - t
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        *_, terminated, truncated, info = env.step(step)
        times.append((time.perf_counter() - t) * 1000)
        if terminated or truncated:
            raise RuntimeError(f"the episode ended early: {info}")
    env.step(finish)
    return reset, times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--harness", default=",".join(sorted(all_harnesses())))
    p.add_argument("--task-id", default="semver-3.0.2")
    p.add_argument("--steps", type=int, default=3)
    a = p.parse_args()
    backend = {"type": "local"}
    bare = gym.make("Orchard/SWE-v0", backend=backend)
    try:
        bare_reset, bare_steps = run(bare, a.task_id, {"name": "bash", "arguments": {"command": "true"}},
                                     {"name": "submit", "arguments": {}}, a.steps)
    finally:
        bare.close()
    base_step = statistics.median(bare_steps)
    print(f"{'harness':16} {'install MB':>10} {'reset s':>8} {'start-up s':>10} {'step ms':>8} {'overhead ms':>11}")
    print(f"{'(bare env)':16} {'':>10} {bare_reset:8.1f} {'':>10} {base_step:8.0f} {'':>11}")
    for name in a.harness.split(","):
        h = get_harness(name)
        installs = [x for x in (h.install(), h.install_npm()) if x is not None]
        env = gym.make("Orchard/SWE-v0", harness=name, backend=backend, max_seconds=900)
        try:
            reset, steps = run(env, a.task_id, h.shell("true"), h.finish, a.steps)
        finally:
            env.close()
        step = statistics.median(steps)
        print(f"{name:16} {du_mb(installs):10.0f} {reset:8.1f} {reset - bare_reset:10.1f} {step:8.0f} "
              f"{step - base_step:11.0f}", flush=True)


if __name__ == "__main__":
    main()
