#!/usr/bin/env python3
"""Reset as restore on SWE tasks: reset latency with `snapshot_setup=True` (the task's set-up
is snapshotted on its first reset; later resets restore the snapshot instead of extracting
the repository and running the set-up commands again) against plain resets, and the fork
latency of a live episode, per backend, in the same run.

    python scripts/bench_snapshot_env.py [--backend local|docker] [--task semver-3.0.2] [-n 10]
    python scripts/bench_snapshot_env.py --variants [-n 10] [--rounds 3] [--pool 4]   # local: before/after

Plain and restored resets alternate so both see the same load. The first (snapshotting)
reset is reported on its own. Each measured reset is followed by one step (`git status`) so
a restore that left a broken tree would show.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time

from orchard_gym import AsyncSandboxClient
from orchard_gym.envs.swe.env import SWEEnv


def med(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1000:8.0f} ms (min {min(xs) * 1000:.0f}, max {max(xs) * 1000:.0f})"


async def bench(backend: dict, task: str, n: int, forks: int) -> None:
    client = AsyncSandboxClient(backend=backend)
    plain, restoring = SWEEnv(client=client), SWEEnv(client=client, snapshot_setup=True)
    step = {"name": "bash", "arguments": {"command": "git status --short | wc -l"}}
    try:
        t = time.perf_counter()
        await restoring.areset(options={"task_id": task})
        first = time.perf_counter() - t
        times: dict[str, list[float]] = {"plain": [], "restored": []}
        for _ in range(n):
            for name, env in (("plain", plain), ("restored", restoring)):
                t = time.perf_counter()
                await env.areset(options={"task_id": task})
                times[name].append(time.perf_counter() - t)
                obs, *_ = await env.astep(step)
                assert obs.strip() == "0", f"{name}: the tree is not clean after reset: {obs!r}"
        bare = []  # the floor: a sandbox with nothing in it, created and deleted
        for _ in range(n):
            t = time.perf_counter()
            sandbox = await client.create_sandbox()
            bare.append(time.perf_counter() - t)
            await sandbox.delete()
        fork_times = []
        for _ in range(forks):
            t = time.perf_counter()
            children = await plain.afork(1)
            fork_times.append(time.perf_counter() - t)
            for c in children:
                await c.aclose()
        print(f"backend {backend['type']}, task {task}, {n} resets each (alternating), {forks} forks")
        print(f"  first reset with snapshot_setup (set-up + snapshot): {first * 1000:.0f} ms")
        print(f"  plain reset (create + set-up):     {med(times['plain'])}")
        print(f"  restored reset (from the set-up):  {med(times['restored'])}")
        print(f"  bare create (no set-up, floor):    {med(bare)}")
        saved = statistics.median(times["plain"]) - statistics.median(times["restored"])
        print(f"  saving per reset: {saved * 1000:.0f} ms ({saved / statistics.median(times['plain']):.0%})")
        print(f"  fork of a live episode (snapshot + create from it + resume): {med(fork_times)}")
    finally:
        await plain.aclose()
        await restoring.aclose()
        await client.aclose()


async def restored_resets(label: str, backend: dict, pool: int, task: str, n: int,
                          awaited_delete: bool = False) -> list[float]:
    """`n` restored resets (+ one step each) of `task` with this backend config and warm pool;
    `awaited_delete`: the reset waits for the last sandbox's whole delete (as before)."""
    client = AsyncSandboxClient(backend=backend, pool={None: pool} if pool else None)
    env = SWEEnv(client=client, snapshot_setup=True)
    if awaited_delete:
        release = env.release_sandbox

        async def awaited(background: bool = False) -> None:
            await release(False)

        env.release_sandbox = awaited  # type: ignore[method-assign]
    step = {"name": "bash", "arguments": {"command": "git status --short | wc -l"}}
    times = []
    try:
        await env.areset(options={"task_id": task})  # the set-up and its snapshot
        for _ in range(n):
            if pool:
                await client.wait_pools(120)  # a warm pool is one that kept up; the refill is not timed
            t = time.perf_counter()
            await env.areset(options={"task_id": task})
            times.append(time.perf_counter() - t)
            obs, *_ = await env.astep(step)
            assert obs.strip() == "0", f"{label}: the tree is not clean after reset: {obs!r}"
    finally:
        await env.aclose()
        await client.aclose()
    return times


def variants_main(task: str, n: int, rounds: int, pool: int) -> None:
    """Restored resets on local: copy snapshots with the reset awaiting the last sandbox's delete
    (before), then each change alone and together (layers, a warm pool serving the fork, the
    delete going on in the background); the variants alternate round by round (same load)."""
    root = tempfile.mkdtemp(prefix="og-snapenv-")
    copy, layers = {"type": "local", "root": root, "snapshots": "copy"}, {"type": "local", "root": root,
                                                                           "snapshots": "layers"}
    variants = [("copy, awaited delete (before)", copy, 0, True),
                ("copy, no pool", copy, 0, False),
                ("layers, no pool", layers, 0, False),
                (f"layers, pool of {pool}, awaited delete", layers, pool, True),
                (f"layers, warm pool of {pool}", layers, pool, False)]
    print(f"task {task}; {rounds} rounds x {n} restored resets per variant; load average {os.getloadavg()}")
    times: dict[str, list[float]] = {label: [] for label, *_ in variants}
    try:
        for r in range(rounds):
            for label, backend, size, awaited in variants:
                times[label] += asyncio.run(restored_resets(label, backend, size, task, n, awaited))
            print(f"  round {r + 1}/{rounds}; load average {os.getloadavg()}", flush=True)
        base = statistics.median(times[variants[0][0]])
        for label, xs in times.items():
            xs = sorted(xs)
            print(f"  {label:36s} p50 {med(xs)}  p90 {xs[int(0.9 * (len(xs) - 1))] * 1000:.0f} ms  "
                  f"p50/before {statistics.median(xs) / base:.2f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"load average at end: {os.getloadavg()}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="local")
    ap.add_argument("--task", default="semver-3.0.2")
    ap.add_argument("-n", type=int, default=10)
    ap.add_argument("--forks", type=int, default=5)
    ap.add_argument("--variants", action="store_true",
                    help="local only: restored resets with copy snapshots, layers, and layers + a warm pool")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pool", type=int, default=4, help="warm pool size for --variants")
    args = ap.parse_args()
    if args.variants:
        variants_main(args.task, args.n, args.rounds, args.pool)
        return
    backend = {"type": args.backend}
    if args.backend == "local":
        backend["root"] = tempfile.mkdtemp(prefix="og-snapenv-")
    try:
        asyncio.run(bench(backend, args.task, args.n, args.forks))
    finally:
        if "root" in backend:
            shutil.rmtree(backend["root"], ignore_errors=True)


if __name__ == "__main__":
    main()
