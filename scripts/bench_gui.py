#!/usr/bin/env python3
"""Orchard/GUI-v0 on the local backend: the oracle sweep, the random policy, latency, memory, isolation.

    python scripts/bench_gui.py --oracle                 # every built-in task, scripted oracle
    python scripts/bench_gui.py --random --episodes 2    # seeded action_space.sample()-style random clicks
    python scripts/bench_gui.py --latency --steps 100    # step p50/p95 vs a bare xdotool + grab, reset, memory
    python scripts/bench_gui.py --concurrent 8           # 8 GUI sandboxes at once, each sees only its display

Figures go to stdout (and --out JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchard_gym import AsyncSandboxClient
from orchard_gym.envs.gui.env import DEFAULT_IMAGE, GUIEnv
from orchard_gym.envs.gui.tasks import load_tasks
from orchard_gym.envs.rollout import run_episode


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


async def oracle_sweep(client, task_ids: list[str], seeds: int, **env_kwargs) -> dict:
    results = {}
    miniwob = GUIEnv(client=client, max_steps=40, **env_kwargs)
    try:
        for task_id in task_ids:
            for seed in range(seeds):
                env = miniwob if task_id.startswith("miniwob/") else GUIEnv(client=client, max_steps=40, **env_kwargs)
                started = time.monotonic()
                try:
                    traj = await run_episode(env, env.oracle_policy(), task_id, seed=seed)
                finally:
                    if env is not miniwob:
                        await env.aclose()
                ok = traj.reward > 0 and traj.error is None
                results[f"{task_id}@{seed}"] = {"reward": traj.reward, "ok": ok, "steps": traj.steps,
                                                "seconds": round(time.monotonic() - started, 2), "error": traj.error,
                                                "report": {k: v for k, v in traj.report.items() if k != "checks"}
                                                if not ok else None}
                print(f"{'PASS' if ok else 'FAIL'} {task_id} seed={seed} reward={traj.reward} steps={traj.steps} "
                      f"{traj.error or ''}", flush=True)
    finally:
        await miniwob.aclose()
    solved = sum(r["ok"] for r in results.values())
    return {"episodes": len(results), "solved": solved, "failed": [k for k, r in results.items() if not r["ok"]],
            "results": results}


class RandomPolicy:
    """Seeded random computer_use actions (clicks, keys, typing, scrolls, terminate), as
    action_space.sample() would give if the space were the tool calls."""

    NAMES = ["left_click", "double_click", "right_click", "type", "key", "scroll", "mouse_move", "terminate"]

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    async def __call__(self, messages, tools):
        name = self.NAMES[int(self.rng.integers(0, len(self.NAMES)))]
        point = [float(self.rng.random()) * 0.3, float(self.rng.random()) * 0.4]  # the MiniWoB area, mostly
        if name == "type":
            return {"name": "type", "arguments": {"text": "".join(chr(int(c)) for c in self.rng.integers(97, 123, 5))}}
        if name == "key":
            return {"name": "key", "arguments": {"keys": str(self.rng.choice(["Enter", "Tab", "ctrl+a", "BackSpace"]))}}
        if name == "scroll":
            return {"name": "scroll", "arguments": {"pixels": int(self.rng.integers(-300, 300))}}
        if name == "terminate":
            return {"name": "terminate", "arguments": {"status": "success"}}
        return {"name": name, "arguments": {"coordinate": point}}


async def random_rate(client, task_ids: list[str], episodes: int, max_steps: int) -> dict:
    env = GUIEnv(client=client, max_steps=max_steps, tasks="miniwob")
    solved = total = 0
    try:
        for task_id in task_ids:
            for ep in range(episodes):
                traj = await run_episode(env, RandomPolicy(1000 * ep + hash(task_id) % 1000), task_id, seed=ep)
                total += 1
                solved += traj.reward > 0
    finally:
        await env.aclose()
    return {"episodes": total, "solved": solved, "rate": solved / max(total, 1), "max_steps": max_steps}


async def latency(client, steps: int, rounds: int = 5) -> dict:
    """Env steps (action + screenshot through the daemon) against the bare pair, in the same sandbox and
    display: `xdotool mousemove` as a process plus one XShm grab (the daemon's grabber, in-process)."""
    out: dict = {}
    env = GUIEnv(client=client, max_steps=10 * steps + 10)
    try:
        resets = []
        t = time.monotonic()
        await env.areset(seed=0, options={"task_id": "miniwob/click-test"})
        resets.append(time.monotonic() - t)
        out["reset_cold_s"] = resets[0]
        warm = []
        for s in range(3):
            t = time.monotonic()
            await env.areset(seed=s + 1, options={"task_id": "miniwob/click-test"})
            warm.append(time.monotonic() - t)
        out["reset_warm_s_p50"] = statistics.median(warm)
        display = env.display.hello["display"]
        if not env.display.direct:
            raise SystemExit("the latency bench needs the local backend's direct socket")
        # the bare pair, inside the same sandbox (its display is private to it): a command that
        # loops xdotool + an XShm grab, timing each pair. Env steps and bare pairs alternate in
        # rounds, so a change in the host's load hits both alike.
        script = ("import sys, time, subprocess; sys.path.insert(0, sys.argv[1]); import xgrab\n"
                  "g = xgrab.Grabber(sys.argv[2]); out = []\n"
                  "for i in range(int(sys.argv[3])):\n"
                  "    t = time.perf_counter()\n"
                  "    subprocess.run(['xdotool', 'mousemove', str(600 + i % 10), '650'], check=True)\n"
                  "    g.grab(); out.append(time.perf_counter() - t)\n"
                  "print(' '.join(map(str, out)))\n")
        home = env.display.home
        await env.sandbox.upload_content(script.encode(), f"{home}/bare.py")
        rounds = max(1, min(rounds, steps))
        per = max(1, steps // rounds)
        times: dict[str, list[float]] = {"env_settle0": [], "env_settle_frame": [], "bare_xdotool_plus_grab": []}
        for _ in range(rounds):
            for settle, label in ((0, "env_settle0"), ("frame", "env_settle_frame")):
                env.settle = env.ctx.state["settle"] = settle
                for i in range(per):
                    t = time.perf_counter()
                    await env.astep({"name": "mouse_move", "arguments": {"coordinate": [0.5 + (i % 10) / 100, 0.9]}})
                    times[label].append(time.perf_counter() - t)
            r = await env.sandbox.exec([*env.display.python, f"{home}/bare.py", home, display, str(per)],
                                       env={"DISPLAY": display}, timeout=600)
            bare = [float(v) for v in r.stdout.split()]
            if not bare:
                raise SystemExit(f"the bare pair failed: {r.stderr[-500:]}")
            times["bare_xdotool_plus_grab"] += bare
        for label, values in times.items():
            out[label] = {"p50_ms": pct(values, 50) * 1e3, "p95_ms": pct(values, 95) * 1e3, "n": len(values)}
        bare50, bare95 = out["bare_xdotool_plus_grab"]["p50_ms"], out["bare_xdotool_plus_grab"]["p95_ms"]
        for label, key in (("env_settle0", "settle0"), ("env_settle_frame", "settle_frame")):
            out[f"ratio_p50_{key}"] = out[label]["p50_ms"] / bare50
            out[f"ratio_p95_{key}"] = out[label]["p95_ms"] / bare95
        out["shared_frames"] = getattr(env.display, "shared_frames", False)
        # where a step's time goes: the daemon's stages (profile_ms), the request round trip as the
        # host sees it (socket, JSON, the frame to RGB), and the env's step on top of it
        env.settle = env.ctx.state["settle"] = 0
        stages: dict[str, list[float]] = {}
        for i in range(per):
            t = time.perf_counter()
            head, _ = await env.display.request({"op": "act", "settle": 0, "profile": True,
                                                 "action": {"name": "mouse_move", "coordinate": [640 + i % 10, 650]}})
            stages.setdefault("request_round_trip", []).append((time.perf_counter() - t) * 1e3)
            for name, ms in (head.get("profile_ms") or {}).items():
                stages.setdefault(f"daemon_{name}", []).append(ms)
        out["profile_p50_ms"] = {name: round(pct(v, 50), 2) for name, v in stages.items()}
        head, _ = await env.display.request({"op": "memory"})
        out["sandbox_pss_mib"] = head["pss_kib"] / 1024
        out["grab_method"] = env.display.hello["grab"]
    finally:
        await env.aclose()
    return out


async def concurrent(client, n: int) -> dict:
    """n browser sandboxes at once; each paints a different colour and must see only its own."""
    envs = [GUIEnv(client=client, max_steps=50, tasks="miniwob") for _ in range(n)]
    t = time.monotonic()
    try:
        await asyncio.gather(*(e.areset(seed=i, options={"task_id": "miniwob/click-test"}) for i, e in enumerate(envs)))
        started = time.monotonic() - t
        displays = [e.display.hello["display"] for e in envs]
        colours = [(37 * i % 256, 255 - 29 * i % 256, 80 + 17 * i % 176) for i in range(n)]
        for e, c in zip(envs, colours):  # through the env's own action space: goto a data-less colour page
            await e.display.evaluate(f"document.body.style.background = 'rgb{c}'")
        shots = await asyncio.gather(*(e.display.shot(settle="frame") for e in envs))  # once painted
        seen = [tuple(int(v) for v in frame[700, 1270]) for _, frame in shots]
        mem = await asyncio.gather(*(e.display.request({"op": "memory"}) for e in envs))
        return {"sandboxes": n, "start_all_s": started, "displays": displays, "painted": colours, "seen": seen,
                "isolated": seen == colours, "pss_mib_each": [m[0]["pss_kib"] / 1024 for m in mem]}
    finally:
        await asyncio.gather(*(e.aclose() for e in envs))


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--oracle", action="store_true")
    ap.add_argument("--random", action="store_true")
    ap.add_argument("--latency", action="store_true")
    ap.add_argument("--concurrent", type=int, default=0)
    ap.add_argument("--tasks", default="", help="comma-separated substrings of task ids (default: all)")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--episodes", type=int, default=2)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--max-steps", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=5, help="--latency: env steps and bare pairs alternate in rounds")
    ap.add_argument("--out")
    ap.add_argument("--backend", choices=["local", "docker"], default="local",
                    help="--oracle only: docker runs in scripts/build_gui_image.sh's image")
    args = ap.parse_args()
    ids = sorted(load_tasks("builtin"))
    if args.tasks:
        ids = [t for t in ids if any(s in t for s in args.tasks.split(","))]
    root = tempfile.mkdtemp(prefix="bench-gui-")
    report = {}
    backend = {"type": "local", "root": root} if args.backend == "local" else {"type": "docker"}
    image = {} if args.backend == "local" else {"image": DEFAULT_IMAGE}
    async with AsyncSandboxClient(backend) as client:
        if args.oracle:
            report["oracle"] = await oracle_sweep(client, ids, args.seeds, **image)
            print(f"oracle: {report['oracle']['solved']}/{report['oracle']['episodes']} solved; "
                  f"failed: {report['oracle']['failed']}")
        if args.random:
            report["random"] = await random_rate(client, [t for t in ids if t.startswith("miniwob/")],
                                                 args.episodes, args.max_steps)
            print("random:", json.dumps(report["random"]))
        if args.latency:
            report["latency"] = await latency(client, args.steps, args.rounds)
            print("latency:", json.dumps(report["latency"], indent=1))
        if args.concurrent:
            report["concurrent"] = await concurrent(client, args.concurrent)
            print("concurrent:", json.dumps(report["concurrent"]))
    report["load_average"] = os.getloadavg()
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    asyncio.run(main())
