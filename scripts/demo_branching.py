"""Branching rollouts on Orchard/Toy-v0: per-turn Monte Carlo values against the closed-form
success probabilities of a scripted stochastic policy (envs/toy/stochastic.py).

Each tree: a root episode of the "progress" task; at every turn k in --branch-at, --branches
continuations are forked from the sandbox state and run to the end. For every branch point
the table shows the analytic V(s_k) (given the lines the root had written by then), the
Monte Carlo estimate, its binomial standard error and the z-score; the last rows pool all
trees by (k, lines written).

    .venv/bin/python scripts/demo_branching.py --trees 4 --branches 32
    .venv/bin/python scripts/demo_branching.py --backend docker --trees 2 --branches 16
"""

from __future__ import annotations

import argparse
import asyncio
import math
import shutil
import tempfile
import time
from collections import defaultdict

from orchard_gym.client import AsyncSandboxClient
from orchard_gym.envs.branching import run_trees
from orchard_gym.envs.toy.env import ToyEnv
from orchard_gym.envs.toy.stochastic import StochasticProgressPolicy, progress_tasks, steps_done, success_probability


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--p", type=float, nargs="+", default=[0.5, 0.3, 0.8], help="per-turn step probabilities")
    ap.add_argument("--need", type=int, default=2, help="lines progress.txt must hold")
    ap.add_argument("--trees", type=int, default=4)
    ap.add_argument("--branches", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backend", default="local", help="local | docker | kubernetes")
    args = ap.parse_args()
    branch_at = list(range(len(args.p)))
    tasks = progress_tasks(args.need)

    async def run():
        backend = {"type": args.backend}
        if args.backend == "local":
            backend["root"] = tempfile.mkdtemp(prefix="og-branch-")
        client = AsyncSandboxClient(backend=backend)
        try:
            return await run_trees(lambda c: ToyEnv(tasks=tasks, client=c), StochasticProgressPolicy(args.p, args.seed),
                                   ["progress-000"] * args.trees, branch_at=branch_at, branches=args.branches,
                                   client=client, concurrency=args.concurrency)
        finally:
            await client.aclose()
            if "root" in backend:
                shutil.rmtree(backend["root"], ignore_errors=True)

    started = time.monotonic()
    trees = asyncio.run(run())
    wall = time.monotonic() - started
    episodes = sum(len(t.trajectories()) for t in trees)
    print(f"p={args.p} need={args.need} backend={args.backend}: {len(trees)} trees x {len(branch_at)} branch points "
          f"x {args.branches} branches = {episodes} episodes in {wall:.1f}s")
    print(f"{'tree':>4} {'k':>2} {'lines':>5} {'analytic':>8} {'MC':>6} {'n':>4} {'stderr':>6} {'z':>6}")
    pooled: dict[tuple[int, int], list[int]] = defaultdict(lambda: [0, 0])
    worst = 0.0
    for i, tree in enumerate(trees):
        for k, point in sorted(tree.points.items()):
            c = steps_done(tree.root.turns, k)
            p = success_probability(args.p, args.need, k, c)
            se = math.sqrt(p * (1 - p) / point.samples) if point.samples else float("nan")
            z = (point.value - p) / se if se > 0 else 0.0
            worst = max(worst, abs(z))
            pooled[(k, c)][0] += point.successes
            pooled[(k, c)][1] += point.samples
            print(f"{i:>4} {k:>2} {c:>5} {p:>8.3f} {point.value:>6.3f} {point.samples:>4} {se:>6.3f} {z:>6.2f}")
    print("pooled by (k, lines written):")
    for (k, c), (s, n) in sorted(pooled.items()):
        p = success_probability(args.p, args.need, k, c)
        se = math.sqrt(p * (1 - p) / n)
        z = (s / n - p) / se if se > 0 else 0.0
        print(f"   k={k} lines={c}: analytic {p:.3f}  MC {s / n:.3f} (n={n}, stderr {se:.3f}, z {z:+.2f})")
    print(f"largest |z| over {sum(len(t.points) for t in trees)} branch points: {worst:.2f}")


if __name__ == "__main__":
    main()
