#!/usr/bin/env python3
"""The control plane at scale, simulated: N sandboxes through two orchestrator replicas
(sharing one Redis) and the Kubernetes backend, against the tests' fake API server with a
kubelet that runs nothing (pods turn Ready at once, with made-up IPs). What it measures is
ours: the orchestrator, the kubernetes backend's API calls and its watch, Redis.

- creates/s sustained (`POST /sandboxes?wait=true`, C at a time, replicas taken in turn);
- readiness wake-up latency: from the moment the fake kubelet marked the pod Ready to the
  moment the create answered (p50/p99);
- orchestrator memory (RSS) per 1,000 live sandboxes, per replica;
- Redis commands per lifecycle (create + delete);
- a watch expiry (the API server forgets its history and cuts every watch: re-connects get
  410) and an API-server throttle (the next K requests answer 429 with Retry-After) injected
  while the creates run;
- 0 lost: every sandbox is listed ready by both replicas, the API server holds exactly N
  pods; after the deletes, none.

    python scripts/bench_k8s_scale.py [-n 10000] [-c 200] [--throttle 200]

Run from the repository root with the venv's python (the fake cluster lives in tests/).
"""

from __future__ import annotations

import argparse
from collections import Counter
import asyncio
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "scripts"))

import httpx  # noqa: E402
from bench_lifecycle import cpu_seconds  # noqa: E402


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def redis_commands(url: str) -> int:
    import redis

    r = redis.Redis.from_url(url)
    try:
        return int(r.info("stats")["total_commands_processed"])
    finally:
        r.close()


def api_requests(stats: dict) -> int:
    """The fake API server's request counters ("POST pods", "GET pods/name", ...), watches left out."""
    return sum(v for k, v in stats.items()
               if isinstance(v, int) and k.split(" ")[0] in ("GET", "POST", "PUT", "PATCH", "DELETE")
               and not k.endswith(" watch"))


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


async def run_phase(name: str, items: list, worker, concurrency: int, events: dict[int, callable]) -> dict:
    """Run `worker(item)` over items, `concurrency` at a time; events[i] fires when item i starts."""
    from tqdm import tqdm

    sem = asyncio.Semaphore(concurrency)
    errors: list[str] = []
    bar = tqdm(total=len(items), desc=name, unit="sandbox", file=sys.stderr, mininterval=2)
    started = time.perf_counter()

    async def one(i, item):
        async with sem:
            if i in events:
                await asyncio.to_thread(events[i])
            try:
                await worker(item)
            except Exception as e:  # counted and shown: a benchmark reports, it does not stop
                errors.append(f"{type(e).__name__}: {e}"[:300])
            bar.update()

    await asyncio.gather(*(one(i, item) for i, item in enumerate(items)))
    bar.close()
    wall = time.perf_counter() - started
    return {"phase": name, "n": len(items), "wall_s": wall, "per_s": len(items) / wall, "errors": errors}


async def main_async(args) -> int:
    from fake_k8s import FakeCluster
    from service_helpers import Orchestrator, RedisServer

    work = Path(tempfile.mkdtemp(prefix="ogb-k8s-scale-", dir="/tmp"))
    redis_server = cluster = None
    replicas: list = []
    try:
        (work / "redis").mkdir()
        redis_server = RedisServer(work / "redis")
        cluster = FakeCluster(work / "k8s", kubelet="instant", bookmark_interval=5.0)
        config = cluster.backend_config(verify_reach=False)
        for i in range(args.replicas):
            (work / f"r{i}").mkdir()
            replicas.append(Orchestrator(work / f"r{i}", backend="kubernetes", backend_config=config,
                                         redis_url=redis_server.url, replica_id=f"bench-{i}"))
        clients = [httpx.AsyncClient(base_url=r.url, headers=r.headers, timeout=300,
                                     limits=httpx.Limits(max_connections=args.concurrency))
                   for r in replicas]
        pids = [r.proc.pid for r in replicas]
        rss0 = [rss_mib(p) for p in pids]
        cpu0 = [cpu_seconds(p) for p in pids]
        others = {"fake API server": cluster.proc.pid, "redis-server": redis_server.proc.pid}
        others0 = {k: cpu_seconds(p) for k, p in others.items()}
        cmd0 = redis_commands(redis_server.url)
        cluster.reset_stats()

        created: dict[str, tuple[int, float]] = {}  # sandbox id -> (replica, time.time() the create answered)
        counter = iter(range(args.n))

        async def create(_):
            i = next(counter) % len(clients)
            r = await clients[i].post("/sandboxes", params={"wait": "true"},
                                      json={"image": "busybox", "labels": {"bench": "k8s-scale"}})
            r.raise_for_status()
            body = r.json()
            if body["status"] != "running":
                raise RuntimeError(f"not ready: {body['status']} {body.get('error')}")
            created[body["sandbox_id"]] = (i, time.time())

        third = args.n // 3
        events = {
            third: lambda: cluster.fault(compact=True, cut_watches=True),
            2 * third: lambda: cluster.fault(throttle=args.throttle, retry_after=1),
        }
        creates = await run_phase("create (wait ready)", list(range(args.n)), create, args.concurrency, events)
        cpu1 = [cpu_seconds(p) for p in pids]
        others1 = {k: cpu_seconds(p) for k, p in others.items()}
        cmd1 = redis_commands(redis_server.url)
        rss1 = [rss_mib(p) for p in pids]
        api = cluster.stats()

        ready_at = cluster.ready_times()
        prefix_len = len(next(iter(ready_at), "")) - len(next(iter(created), "")) if created and ready_at else 0
        by_id = {name[prefix_len:]: t for name, t in ready_at.items()}
        wake = [(t_done - by_id[sid]) * 1000 for sid, (_, t_done) in created.items() if sid in by_id]

        listed = []
        for c in clients:
            resp = await c.get("/sandboxes")
            resp.raise_for_status()
            listed.append(sum(1 for s in resp.json() if s["status"] == "running"
                              and s.get("labels", {}).get("bench") == "k8s-scale"))
        status, pods = cluster.kube("GET", cluster.pod_path())
        pods_live = len(pods.get("items", [])) if status == 200 else -1

        async def delete(sid):
            r = await clients[created[sid][0]].delete(f"/sandboxes/{sid}")
            r.raise_for_status()

        deletes = await run_phase("delete", list(created), delete, args.concurrency, {})
        cmd2 = redis_commands(redis_server.url)
        cpu2 = [cpu_seconds(p) for p in pids]
        deadline = time.monotonic() + 120
        while True:
            status, pods = cluster.kube("GET", cluster.pod_path())
            pods_left = len(pods.get("items", [])) if status == 200 else -1
            if pods_left == 0 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        for c in clients:
            await c.aclose()

        n_ok = len(created)
        print(f"# {args.n} sandboxes, {args.replicas} replicas + Redis, kubernetes backend against the fake API "
              f"server (instant kubelet), {args.concurrency} at a time; load {os.getloadavg()[0]:.1f}")
        print(f"# faults while creating: a watch expiry (history compacted, watches cut) at #{third}, "
              f"{args.throttle} throttled (429, Retry-After 1 s) API requests from #{2 * third}")
        print("| measure | value |\n|---|---:|")
        rows = [
            ("creates/s sustained (wait ready)", f"{creates['per_s']:.0f}"),
            ("create failures", f"{len(creates['errors'])}"),
            ("readiness wake-up p50 / p99 ms", f"{pct(wake, .5):.0f} / {pct(wake, .99):.0f}"),
            ("readiness wake-ups measured", f"{len(wake)}"),
            ("listed ready by each replica", " / ".join(map(str, listed))),
            ("pods in the API server after the creates", f"{pods_live}"),
            ("orchestrator RSS growth per 1,000 sandboxes in the cluster, MiB (per replica)",
             " / ".join(f"{(b - a) / max(n_ok, 1) * 1000:.1f}" for a, b in zip(rss0, rss1))),
            ("orchestrator RSS after the creates, MiB (per replica)", " / ".join(f"{b:.0f}" for b in rss1)),
            ("orchestrator CPU ms per create (all replicas)", f"{(sum(cpu1) - sum(cpu0)) / max(n_ok, 1) * 1000:.1f}"),
            ("orchestrator CPU ms per delete (all replicas)",
             f"{(sum(cpu2) - sum(cpu1)) / max(len(created), 1) * 1000:.1f}"),
            *((f"{k} CPU ms per create", f"{(others1[k] - others0[k]) / max(n_ok, 1) * 1000:.1f}") for k in others),
            ("Redis commands per lifecycle (create + delete)", f"{(cmd2 - cmd0) / max(n_ok, 1):.1f}"),
            ("  of which the create", f"{(cmd1 - cmd0) / max(n_ok, 1):.1f}"),
            ("API requests per create (not watches)", f"{api_requests(api) / max(n_ok, 1):.1f}"),
            ("watches answered 410 / cut / 429s answered",
             f"{api.get('watch_410', 0)} / {api.get('watch_cut', 0)} / {api.get('fault_429', 0)}"),
            ("deletes/s", f"{deletes['per_s']:.0f}"),
            ("delete failures", f"{len(deletes['errors'])}"),
            ("pods left after the deletes", f"{pods_left}"),
        ]
        for k, v in rows:
            print(f"| {k} | {v} |")
        if args.verbose:
            print("# API server stats:", {k: v for k, v in api.items() if not isinstance(v, (dict, list))})
        for phase in (creates, deletes):
            for err, count in Counter(phase["errors"]).most_common(5):
                print(f"# {phase['phase']} error x{count}: {err}")
        lost = args.n - n_ok + len(deletes["errors"]) + (pods_left != 0)
        return 1 if lost else 0
    finally:
        for r in replicas:
            r.stop()
        if cluster is not None:
            cluster.stop()
        if redis_server is not None:
            redis_server.close()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", type=int, default=10_000, help="sandboxes")
    p.add_argument("-c", "--concurrency", type=int, default=200, help="requests in flight")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--throttle", type=int, default=200, help="API requests answered 429 in the throttle fault")
    p.add_argument("-v", "--verbose", action="store_true", help="print the fake API server's counters")
    args = p.parse_args()
    if args.n < 3 or args.concurrency < 1 or args.replicas < 1:
        p.error("-n must be at least 3, -c and --replicas at least 1")
    # SIGTERM (e.g. `timeout`) unwinds like Ctrl-C, so the replicas, the fake cluster and Redis are stopped
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    sys.exit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
