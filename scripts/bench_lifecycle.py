#!/usr/bin/env python3
"""Sandbox lifecycle at scale: N sandboxes through create -> 4 execs -> delete, C at a time,
through the orchestrator (`orchard serve`, a real uvicorn subprocess) and, as the same-run
baseline, in-process (the SDK driving the backend directly).

    python scripts/bench_lifecycle.py [-n 1000] [-c 100] [--backend local|docker]
                                      [--only orchestrator|inprocess] [--redis]
                                      [--spawners bwrap,zygote --only inprocess]

Prints, per variant: success rate, wall time, commands/s, p50/p95 create and exec latency,
and what leaked after the run (processes still carrying a sandbox's marker, sandbox folders
or containers left). Reference (the Orchard paper, Kubernetes): 1,000 sandboxes, 100%
success, 26 s, ~154 commands/s.

`--backend` picks the config both variants use (`backend_config()` below is the hook a
docker variant extends: `scripts/bench_docker.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
API_KEY = "bench-key"
EXECS = 4


def backend_config(backend: str, root: Path) -> dict:
    """The backend config of a variant (in-process: the SDK's; orchestrator: its ORCHARD_BACKEND_CONFIG)."""
    if backend == "local":
        return {"type": "local", "root": str(root)}
    if backend == "docker":
        return {"type": "docker"}
    if backend == "kubernetes":  # through the fake API server + Podman kubelet of the tests (bench_k8s.py)
        from bench_k8s import kubernetes_config

        return kubernetes_config(root)
    raise SystemExit(f"unknown backend {backend!r}")


def pct(samples: list[float], q: int) -> float:
    if not samples:
        return float("nan")
    if len(samples) == 1:
        return samples[0]
    return statistics.quantiles(samples, n=100, method="inclusive")[q - 1]


async def run_lifecycles(client, n: int, concurrency: int, image: str | None) -> dict:
    create_lat, exec_lat, errors, ids = [], [], [], []
    limit = asyncio.Semaphore(concurrency)
    ok = 0

    async def one(i: int) -> None:
        nonlocal ok
        async with limit:
            box = None
            try:
                t = time.perf_counter()
                box = await client.create_sandbox(image=image)
                create_lat.append(time.perf_counter() - t)
                ids.append(box.sandbox_id)
                for k in range(EXECS):
                    t = time.perf_counter()
                    r = await box.exec(f"echo {i}-{k}", timeout=60)
                    exec_lat.append(time.perf_counter() - t)
                    if r.stdout != f"{i}-{k}\n":
                        raise RuntimeError(f"bad output {r.stdout!r}")
                await box.delete()
                box = None
                ok += 1
            except Exception as e:
                errors.append(f"{type(e).__name__}: {e}")
                if box is not None:
                    try:
                        await box.delete()
                    except Exception:
                        pass

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    wall = time.perf_counter() - started
    return {"n": n, "ok": ok, "wall": wall, "create": create_lat, "exec": exec_lat, "errors": errors, "ids": ids}


def leaked(ids: list[str], root: Path | None) -> dict:
    """Processes still carrying a sandbox's marker, and sandbox folders left behind."""
    from conftest import marked_pids

    time.sleep(0.5)  # let the last kills land
    wanted = {f"ORCHARD_SANDBOX={i}".encode() for i in ids}
    procs = [p for p in marked_pids("ORCHARD_SANDBOX=") if _marker(p) in wanted]
    folders = []
    if root is not None and root.exists():
        # sandbox folders, and deleted ones still in the trash; not the backend's own dot-entries
        folders = [p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")]
        trash = root / ".trash"
        folders += [f".trash/{p.name}" for p in trash.iterdir()] if trash.is_dir() else []
    return {"processes": len(procs), "folders": len(folders)}


def _marker(pid: int) -> bytes | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return next((e for e in f.read().split(b"\0") if e.startswith(b"ORCHARD_SANDBOX=")), None)
    except OSError:
        return None


def inprocess(args, root: Path) -> dict:
    from orchard_gym import AsyncSandboxClient

    async def main():
        async with AsyncSandboxClient(backend_config(args.backend, root)) as client:
            return await run_lifecycles(client, args.n, args.concurrency, args.image)

    cpu = cpu_seconds(os.getpid())
    result = asyncio.run(main())
    result["cpu"] = {"client": cpu_seconds(os.getpid()) - cpu}  # the SDK and the backend, in this process
    result["leaked"] = leaked(result["ids"], root if args.backend == "local" else None)
    return result


def orchestrated(args, root: Path) -> dict:
    from service_helpers import Orchestrator, RedisServer, remove_all_sandboxes

    from orchard_gym import AsyncSandboxClient
    from orchard_gym.retry import RetryPolicy

    redis = RedisServer(root.parent) if args.redis else None
    settings = {"log_level": args.log_level, "exec_concurrency": max(64, args.concurrency)}
    if redis is not None:
        settings["redis_url"] = redis.url
    config = backend_config(args.backend, root)
    settings["backend"] = config.pop("type")
    config.pop("root", None)
    orch = Orchestrator(root, api_key=API_KEY, log_dir=root.parent, backend_config=config, **settings)
    try:
        async def main():
            retry = RetryPolicy(attempts=10, deadline=60)
            async with AsyncSandboxClient(base_url=orch.url, api_key=API_KEY, retry=retry) as client:
                return await run_lifecycles(client, args.n, args.concurrency, args.image)

        self_cpu, orch_cpu = cpu_seconds(os.getpid()), cpu_seconds(orch.proc.pid)  # its start-up not counted
        result = asyncio.run(main())
        result["cpu"] = {"orchestrator": cpu_seconds(orch.proc.pid) - orch_cpu,
                         "client": cpu_seconds(os.getpid()) - self_cpu}
        result["requests"] = _requests_served(orch.url)  # read after the CPU: the scrape is not counted
    finally:
        orch.stop()
        if redis is not None:
            redis.close()
    result["leaked"] = leaked(result["ids"], root if args.backend == "local" else None)
    if args.backend == "local":
        remove_all_sandboxes(root)
    return result


@contextlib.contextmanager
def cpu_accounted():
    """Run the block in a fresh cpuacct cgroup (v1; root) and yield [CPU seconds] of everything
    in it afterwards: this process, bubblewrap, the zygote, every sandbox (their cgroups nest
    below). The machine's load from others does not count. Yields [] where it cannot."""
    acct = Path("/sys/fs/cgroup/cpuacct")
    used: list[float] = []
    mine = acct / f"ogb-{os.getpid()}"
    try:
        mine.mkdir()
        (mine / "cgroup.procs").write_text("0")
    except OSError:
        yield used
        return
    try:
        yield used
    finally:
        used.append(int((mine / "cpuacct.usage").read_text()) / 1e9)
        (acct / "cgroup.procs").write_text("0")
        for _ in range(50):  # leftover sandbox cgroups go with their processes
            try:
                for d in sorted(mine.rglob("*/"), key=lambda p: -len(p.parts)):
                    d.rmdir()
                mine.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def _requests_served(url: str) -> int:
    """How many HTTP requests the orchestrator answered (its orchard_http_requests_total)."""
    import httpx

    text = httpx.get(url + "/metrics", headers={"X-API-Key": API_KEY}, timeout=30).text
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("orchard_http_requests_total{")))


def cpu_seconds(pid: int) -> float:
    """user+system CPU seconds a process has used (not its children)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def report(label: str, r: dict) -> str:
    cmds = r["ok"] * EXECS
    line = (f"{label:<28} success {r['ok']}/{r['n']} ({r['ok'] / r['n']:.1%})  wall {r['wall']:.1f}s  "
            f"{cmds / r['wall']:.0f} commands/s  create p50/p95 {pct(r['create'], 50) * 1000:.0f}/"
            f"{pct(r['create'], 95) * 1000:.0f} ms  exec p50/p95 {pct(r['exec'], 50) * 1000:.1f}/"
            f"{pct(r['exec'], 95) * 1000:.1f} ms  leaked: {r['leaked']['processes']} processes, "
            f"{r['leaked']['folders']} folders")
    if "cpu" in r and "orchestrator" not in r["cpu"]:
        line += f"\n{'':<28} CPU: this process (SDK + backend) {r['cpu']['client']:.1f}s"
    elif "cpu" in r:
        per = r["cpu"]["orchestrator"] / max(1, r["requests"]) * 1000
        line += (f"\n{'':<28} CPU: orchestrator {r['cpu']['orchestrator']:.1f}s over {r['requests']} requests "
                 f"({per:.2f} ms per request), client {r['cpu']['client']:.1f}s")
    if r["errors"]:
        line += f"\n{'':<28} {len(r['errors'])} errors, first: {r['errors'][0]}"
    return line


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", type=int, default=1000, help="sandboxes")
    p.add_argument("-c", "--concurrency", type=int, default=100, help="sandboxes in flight at once")
    p.add_argument("--backend", default="local", choices=["local", "docker", "kubernetes"])
    p.add_argument("--image", default=None, help="task image (local: none)")
    p.add_argument("--only", choices=["orchestrator", "inprocess"], help="run one variant")
    p.add_argument("--redis", action="store_true", help="orchestrator state in a local redis-server")
    p.add_argument("--log-level", default="WARNING", help="the orchestrator's (INFO logs every request)")
    p.add_argument("--json", action="store_true", help="also print the figures as JSON")
    p.add_argument("--no-ledger", action="store_true", help="skip the cost ledger's usage read before each "
                                                             "delete (client.account_usage = False): the bare floor")
    p.add_argument("--spawners", help="local, in-process only: one run per spawner, e.g. bwrap,zygote "
                                      "(LocalBackendConfig.spawner; see docs/backends.md)")
    args = p.parse_args()
    if args.no_ledger:
        from orchard_gym import AsyncSandboxClient

        AsyncSandboxClient.account_usage = False  # every client this run makes (orchard_gym.ledger)

    base = Path(tempfile.mkdtemp(prefix="ogb-", dir="/tmp"))
    results = {}
    try:
        print(f"{args.n} sandboxes x (create, {EXECS} execs, delete), concurrency {args.concurrency}, "
              f"backend {args.backend}, {os.cpu_count()} CPUs", flush=True)
        if args.backend == "docker":  # one at a time: create -> ready vs a bare `podman run` (bench_docker.py)
            from bench_docker import docker_lifecycle_rows, print_rows

            print_rows(docker_lifecycle_rows(args))
        if args.backend == "kubernetes":  # one at a time, vs podman run, the docker backend, the control plane
            from bench_docker import print_rows
            from bench_k8s import k8s_lifecycle_rows

            print_rows(k8s_lifecycle_rows(args))
        for spawner in (args.spawners.split(",") if args.spawners else []):  # local: old path vs zygote
            os.environ["ORCHARD_LOCAL_SPAWNER"] = spawner  # LocalBackendConfig's default
            (base / f"in-{spawner}").mkdir(exist_ok=True)
            load = os.getloadavg()[0]
            label = f"in-process (spawner={spawner})"
            with cpu_accounted() as used:
                results[label] = inprocess(args, base / f"in-{spawner}")
            cpu = f"CPU {used[0]:.1f}s in all ({used[0] / args.n * 1000:.1f} ms per sandbox), " if used else ""
            print(report(label, results[label]) + f"\n{'':<28} {cpu}load average {load:.1f} before, "
                  f"{os.getloadavg()[0]:.1f} after", flush=True)
        if args.only in (None, "inprocess") and not args.spawners:
            (base / "in").mkdir()
            load = os.getloadavg()[0]
            results["in-process (baseline)"] = inprocess(args, base / "in")
            print(report("in-process (baseline)", results["in-process (baseline)"])
                  + f"\n{'':<28} load average {load:.1f} before, {os.getloadavg()[0]:.1f} after", flush=True)
        if args.only in (None, "orchestrator"):
            (base / "orch").mkdir()
            label = "orchestrator" + (" (redis)" if args.redis else "")
            load = os.getloadavg()[0]
            results[label] = orchestrated(args, base / "orch")
            print(report(label, results[label])
                  + f"\n{'':<28} load average {load:.1f} before, {os.getloadavg()[0]:.1f} after", flush=True)
        if len(results) == 2 and not args.spawners:
            (a, ra), (b, rb) = results.items()
            print(f"orchestrator / in-process: wall x{rb['wall'] / ra['wall']:.2f}, "
                  f"exec p50 x{pct(rb['exec'], 50) / pct(ra['exec'], 50):.2f}, "
                  f"create p50 x{pct(rb['create'], 50) / pct(ra['create'], 50):.2f}")
            if "cpu" in ra and "requests" in rb:  # the same backend work runs in the orchestrator instead
                extra = rb["cpu"]["orchestrator"] + rb["cpu"]["client"] - ra["cpu"]["client"]
                print(f"orchestrator CPU (server + client) beyond in-process: {extra:.1f}s, "
                      f"{extra / rb['requests'] * 1000:.2f} ms per request; CPU x"
                      f"{(rb['cpu']['orchestrator'] + rb['cpu']['client']) / ra['cpu']['client']:.2f}")
        if args.json:
            print(json.dumps({k: {"n": v["n"], "ok": v["ok"], "wall": v["wall"], "leaked": v["leaked"],
                                  "create_p50": pct(v["create"], 50), "create_p95": pct(v["create"], 95),
                                  "exec_p50": pct(v["exec"], 50), "exec_p95": pct(v["exec"], 95),
                                  "errors": len(v["errors"])} for k, v in results.items()}))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if any(r["ok"] < r["n"] or r["leaked"]["processes"] for r in results.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
