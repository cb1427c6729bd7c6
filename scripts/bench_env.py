#!/usr/bin/env python3
"""Env overhead: SWE-v0 step against a raw SDK exec, reset latency, and grading cost, per backend.

    python scripts/bench_env.py [-n 200] [--resets 20] [--gradings 3] [--backend local|docker] [--pool N]
    python scripts/bench_env.py --grading-only --gradings 5 [--task marshmallow-3.21.1] [--backend docker]
    python scripts/bench_env.py --grading-only --gradings 5 --grading-pool 2    # local: + set-up forks from a warm pool

A step parses the action, runs the bash tool and (by default) fingerprints the working
tree with `git status`/`git diff`; the baseline is the same command through the SDK
(`sandbox.exec`) in the same sandbox, measured in the same run.

Grading: episodes that apply the gold patch and submit, grading alternately in a fresh
sandbox (the default: a new sandbox, the repository, the diff, the tests), in place
(`grade_in_place=True`: the tests in the policy's sandbox) and in a fresh sandbox with the
tamper defence off (`tamper_check=False`: no static scan, no verdict run), and in fresh sandboxes
forked from the task's set-up snapshot (`snapshot_setup=True`: the reset snapshots the set-up, the
grading and verdict sandboxes start from it instead of being set up again), so all see the same
load; the time of the submit step is the grading cost, set against the whole episode.
`--grading-only --task ID` measures only those, on any built-in task.

--pool N: `env.reset` (and a bare `create_sandbox`) cold and from a warm pool of N
(docs/pools.md), alternating cold and warm runs of --resets each, in the same run. The pool
is full when a warm run starts (a trainer's episodes give it the time to refill); each
reset also deletes the previous episode's sandbox, as in training, so "reset, previous
deleted first" shows the reset alone. --pool-only skips the other measurements. The toy rows: Orchard/Toy-v0 (a `write` task,
no files to upload: the reset is the sandbox plus the env's own work), beside SWE-v0's
(sandbox + repository archive + git).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time

from orchard_gym import AsyncSandboxClient
from orchard_gym.envs.swe.env import SWEEnv

TASK = "semver-3.0.2"


def stats(samples: list[float]) -> tuple[float, float]:
    return statistics.median(samples), statistics.quantiles(samples, n=100)[94]


async def timed(coro_fn, n: int) -> list[float]:
    for _ in range(10):
        await coro_fn()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        await coro_fn()
        out.append(time.perf_counter() - t)
    return out


GRADINGS = [  # label, SWEEnv kwargs: alternated within one run, so every variant sees the same load
    ("grading in place", {"grade_in_place": True}),
    ("grading in a fresh sandbox", {}),
    ("fresh sandbox, tamper defence off", {"tamper_check": False}),
    ("fresh sandbox forked from the set-up", {"snapshot_setup": True}),  # the reset snapshots the set-up
]


async def grading_costs(client, n: int, task_id: str = TASK, pooled=None,
                        pool_size: int = 0) -> list[tuple[str, list[float], list[float]]]:
    """(label, submit-step seconds, episode seconds) per variant of GRADINGS; with `pooled` (a client
    with a warm pool of the task's sandboxes) one more: forks of the set-up from that pool."""
    variants = GRADINGS + ([(f"forked from the set-up, warm pool of {pool_size}", {"snapshot_setup": True})]
                           if pooled is not None else [])
    samples = {label: ([], []) for label, _ in variants}
    for i in range(len(variants) * n):
        label, kwargs = variants[i % len(variants)]
        on = pooled if pooled is not None and i % len(variants) == len(GRADINGS) else client
        if on is pooled:
            await pooled.wait_pools(120)  # a full pool, as a trainer's episodes leave it time to refill
        env = SWEEnv(client=on, **kwargs)
        started = time.perf_counter()
        await env.areset(options={"task_id": task_id})
        await env.astep({"name": "bash", "arguments": {"command": f"git apply <<'EOF'\n{env.task.patch}\nEOF"}})
        t = time.perf_counter()
        _, reward, _, _, info = await env.astep({"name": "submit"})
        samples[label][0].append(time.perf_counter() - t)
        samples[label][1].append(time.perf_counter() - started)
        await env.aclose()
        if reward != 1.0 or info["report"].get("tampering"):
            raise SystemExit(f"the gold patch graded {reward} ({label}): {info['report'].get('tampering')}")
    return [(label, *samples[label]) for label, _ in variants]


def make_env(name: str, client):
    if name == "toy":  # a task with no files: the reset is the sandbox and the env's own work
        from orchard_gym.envs.toy.env import ToyEnv

        return ToyEnv(client=client, kinds=["write"], num_tasks=1)
    return SWEEnv(client=client)


async def reset_times(client, n: int, release_first: bool, env_name: str = "swe") -> list[float]:
    env = make_env(env_name, client)
    task_id = env.task_ids()[0] if env_name == "toy" else TASK
    out = []
    for _ in range(n):
        if release_first:
            await env.release_sandbox()
        t = time.perf_counter()
        await env.areset(options={"task_id": task_id})
        out.append(time.perf_counter() - t)
    await env.aclose()
    return out


async def claim_times(client, image, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        box = await client.create_sandbox(image=image)
        out.append(time.perf_counter() - t)
        await box.delete()
    return out


async def pool_rows(args, config) -> list[tuple[str, list[float]]]:
    """Cold and warm, alternated in rounds so both see the same load."""
    probe = SWEEnv(client=AsyncSandboxClient(config, cleanup_at_exit=False))
    image = probe.image_for(probe.get_task(TASK))
    await probe.client.aclose()
    samples: dict[str, list[float]] = {}
    async with AsyncSandboxClient(config) as cold, \
            AsyncSandboxClient(config, pool={i: {"size": args.pool, "parallel": 4} for i in {image, None}}) as warm:
        await reset_times(cold, 2, False)  # the task's venv and archive, once
        for _ in range(args.rounds):
            for label, client in (("cold", cold), ("warm", warm)):
                if client is warm and not await warm.wait_pools(600):
                    raise SystemExit(f"the pool did not fill: {warm.pool_stats()}")
                samples.setdefault(f"create_sandbox ({label})", []).extend(await claim_times(client, image, args.resets))
                if client is warm:
                    await warm.wait_pools(600)
                samples.setdefault(f"env.reset ({label})", []).extend(await reset_times(client, args.resets, False))
                if client is warm:
                    await warm.wait_pools(600)
                samples.setdefault(f"env.reset, previous deleted first ({label})", []).extend(
                    await reset_times(client, args.resets, True))
                if client is warm:
                    await warm.wait_pools(600)
                samples.setdefault(f"toy env.reset, previous deleted first ({label})", []).extend(
                    await reset_times(client, args.resets, True, "toy"))
        print(f"pool: {warm.pool_stats()}")
    return sorted(samples.items(), key=lambda kv: (kv[0].split(" (")[0], "warm" in kv[0]))


async def main(args) -> None:
    config = {"type": args.backend}
    if args.backend == "local":
        config["root"] = tempfile.mkdtemp(prefix="og-bench-env-")
    if args.pool:
        rows = await pool_rows(args, config)
        print(f"backend {args.backend}, pool of {args.pool}, {args.rounds} rounds of {args.resets} per variant")
        print(f"{'variant':50} {'p50 ms':>9} {'p95 ms':>9} {'n':>4}")
        for label, samples in rows:
            p50, p95 = stats(samples)
            print(f"{label:50} {p50 * 1e3:9.2f} {p95 * 1e3:9.2f} {len(samples):4}")
        if args.pool_only:
            return
    rows = []
    if args.grading_only:
        async with AsyncSandboxClient(config) as client:
            if not args.grading_pool:
                print_gradings(await grading_costs(client, args.gradings, args.task), args.task)
                return
            async with AsyncSandboxClient(config, pool={None: args.grading_pool}) as pooled:
                print_gradings(await grading_costs(client, args.gradings, args.task, pooled, args.grading_pool),
                               args.task)
        return
    async with AsyncSandboxClient(config) as client:
        for fingerprint in (False, True):
            env = SWEEnv(client=client, max_steps=10**6, track_fingerprint=fingerprint)
            await env.areset(options={"task_id": TASK})
            ctx = env.ctx
            raw = await timed(lambda: ctx.sandbox.exec("true", cwd=ctx.cwd, env=ctx.env), args.n)
            step = await timed(lambda: env.astep({"name": "bash", "arguments": {"command": "true"}}), args.n)
            rows.append(("raw sdk exec('true')", raw))
            rows.append((f"env.step(bash 'true'){' + fingerprint' if fingerprint else ''}", step))
            await env.aclose()
        env = SWEEnv(client=client)
        resets = []
        for _ in range(args.resets):
            t = time.perf_counter()
            await env.areset(options={"task_id": TASK})
            resets.append(time.perf_counter() - t)
        await env.aclose()
        bare = []
        for _ in range(args.resets):
            t = time.perf_counter()
            box = await client.create_sandbox(image=None if args.backend == "local" else env.get_task(TASK).image)
            bare.append(time.perf_counter() - t)
            await box.delete()
        gradings = await grading_costs(client, args.gradings, args.task) if args.gradings else []
    print(f"backend {args.backend}")
    print(f"{'variant':42} {'p50 ms':>9} {'p95 ms':>9} {'ratio':>7}")
    for i in range(0, len(rows), 2):
        base = stats(rows[i][1])[0]
        for label, samples in rows[i : i + 2]:
            p50, p95 = stats(samples)
            print(f"{label:42} {p50 * 1e3:9.2f} {p95 * 1e3:9.2f} {p50 / base:6.2f}x")
    for label, samples in (("create_sandbox (bare)", bare), ("env.reset (sandbox + repo + git)", resets)):
        p50, p95 = stats(samples)
        print(f"{label:42} {p50 * 1e3:9.2f} {p95 * 1e3:9.2f}")
    if gradings:
        print_gradings(gradings, args.task)


def print_gradings(gradings, task_id: str) -> None:
    print(f"\n{'grading (gold patch, ' + task_id + ')':42} {'median s':>9} {'max s':>9} {'ratio':>7} "
          f"{'episode s':>10}")
    base = statistics.median(gradings[0][1])
    for label, grade_s, episode_s in gradings:
        print(f"{label:42} {statistics.median(grade_s):9.2f} {max(grade_s):9.2f} "
              f"{statistics.median(grade_s) / base:6.2f}x {statistics.median(episode_s):10.2f}")
    median = {label: statistics.median(grade_s) for label, grade_s, _ in gradings}
    n = len(gradings[0][1])
    print(f"fresh-sandbox grading costs {median['grading in a fresh sandbox'] - base:+.2f}s per episode over "
          f"in-place (n={n} each, alternated)")
    print(f"the tamper defence (static scan + verdict run) costs "
          f"{median['grading in a fresh sandbox'] - median['fresh sandbox, tamper defence off']:+.2f}s per resolved "
          f"grading (n={n} each, alternated)")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", type=int, default=200, help="steps per variant")
    p.add_argument("--resets", type=int, default=20)
    p.add_argument("--gradings", type=int, default=3, help="episodes per grading mode (0: skip)")
    p.add_argument("--backend", default="local", choices=["local", "docker"])
    p.add_argument("--pool", type=int, default=0, help="also time resets from a warm pool of this size (0: no)")
    p.add_argument("--rounds", type=int, default=2, help="cold/warm rounds of --resets each (with --pool)")
    p.add_argument("--pool-only", action="store_true", help="with --pool: only the cold/warm comparison")
    p.add_argument("--grading-only", action="store_true", help="only the grading variants (--gradings each)")
    p.add_argument("--task", default=TASK, help="the built-in task whose gold patch the gradings submit")
    p.add_argument("--grading-pool", type=int, default=0,
                   help="local: also grade in set-up forks served by a warm pool of this many sandboxes")
    asyncio.run(main(p.parse_args()))
