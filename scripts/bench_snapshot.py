#!/usr/bin/env python3
"""Snapshot and fork-to-ready latency of a SWE task sandbox, per backend, against a fresh
create + set-up of the same task, all in one run (docs/snapshots.md).

A "SWE task sandbox" is what `Orchard/SWE-v0` makes for a built-in task: the repository
unpacked and committed, its test environment on PATH (local: the host venv; docker and
kubernetes: the task's `localhost/orchard/swe-*` image). Per backend and sample:

- fresh:    create_sandbox(image) + the env's setup() (what a reset costs without snapshots);
- snapshot: sandbox.snapshot() of the set-up sandbox;
- fork:     create_sandbox(from_snapshot=...) until its agent answers (fork-to-ready), then
            one `git status` in the repository proves the state is there (timed apart);
- bare:     create_sandbox(image) alone, the floor a fork cannot go below.

For the local backend it also times the ways of copying the workdir that were considered
(`cp -a`, `cp -a --reflink=always`, `cp -al`, an overlay mount in a user namespace).

    python scripts/bench_snapshot.py [--backends local,docker,kubernetes] [-n 5] [--task ID]

kubernetes runs against the fake cluster (tests/fake_k8s, Podman as its kubelet).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # fake_k8s


def _stats(samples: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples)
    return f"median {statistics.median(ms):8.1f} ms  min {ms[0]:8.1f}  max {ms[-1]:8.1f}  (n={len(ms)})"


async def bench_backend(name: str, config: dict, task_id: str, n: int) -> dict:
    from orchard_gym import AsyncSandboxClient
    from orchard_gym.envs.swe.env import SWEEnv

    client = AsyncSandboxClient(config)
    env = SWEEnv(client=client, runtime="host" if name == "local" else "image")
    task = env.get_task(task_id)
    image = env.image_for(task)
    fresh, bare, snaps, forks, checks = [], [], [], [], []
    try:
        for i in range(n + 1):  # the first round warms caches (venv, image layers); not counted
            t = time.perf_counter()
            box = await client.create_sandbox(image=image)
            ctx = await env.setup(box, task)
            made = time.perf_counter() - t
            t = time.perf_counter()
            snap = await box.snapshot()
            snapped = time.perf_counter() - t
            t = time.perf_counter()
            fork = await client.create_sandbox(image=image, from_snapshot=snap.snapshot_id)
            forked = time.perf_counter() - t
            t = time.perf_counter()
            r = await fork.exec("git status --porcelain && git log --oneline | head -1", cwd=ctx.cwd, timeout=120)
            checked = time.perf_counter() - t
            assert r.exit_code == 0 and r.stdout.strip(), (r.stdout, r.stderr)  # the set-up commit is there
            t = time.perf_counter()
            plain = await client.create_sandbox(image=image)  # the floor: a create with nothing to copy
            bared = time.perf_counter() - t
            await plain.delete()
            if i:
                fresh.append(made), snaps.append(snapped), forks.append(forked), checks.append(checked)
                bare.append(bared)
            size = snap.size_bytes
            for sb in (fork, box):
                await sb.delete()
            await client.delete_snapshot(snap.snapshot_id)
    finally:
        await client.aclose()
    return {"fresh create + setup": fresh, "bare create (no setup)": bare, "snapshot": snaps, "fork-to-ready": forks,
            "first command in fork": checks, "size_bytes": size}


def copy_methods(n: int, task_id: str) -> dict[str, list[float] | str]:
    """The local copy strategies on a set-up SWE workdir (a copy of one, made here)."""
    from orchard_gym import SandboxClient
    from orchard_gym.envs.swe.env import SWEEnv

    out: dict[str, list[float] | str] = {}
    root = Path(tempfile.mkdtemp(prefix="og-snapbench-"))
    try:
        with SandboxClient({"type": "local", "root": str(root / "sb")}) as client:
            env = SWEEnv(client=client._async, runtime="host")
            box = client.create_sandbox()
            client._loop.run(env.setup(box._inner, env.get_task(task_id)))
            work = Path(box.workdir)
            files = sum(len(f) for _, _, f in os.walk(work))
            out["workdir"] = f"{files} files, {_du(work)} KiB"
            methods = {
                "cp -a --reflink=auto (chosen)": ["cp", "-a", "--reflink=auto"],
                "cp -a --reflink=always": ["cp", "-a", "--reflink=always"],
                "cp -al (hardlinks: unsafe, writes in place reach the snapshot)": ["cp", "-al"],
            }
            for label, argv in methods.items():
                samples = []
                for i in range(n):
                    dst = root / f"copy-{i}"
                    t = time.perf_counter()
                    r = subprocess.run([*argv, f"{work}/.", str(dst)], capture_output=True, text=True)
                    samples.append(time.perf_counter() - t)
                    shutil.rmtree(dst, ignore_errors=True)
                    if r.returncode != 0:
                        out[label] = f"unsupported here: {r.stderr.strip().splitlines()[-1][:100]}"
                        break
                else:
                    out[label] = samples
            # overlayfs: mounting is O(1); what bubblewrap 0.8 lacks is a way to do it for the sandbox
            upper, wk, merged = (root / d for d in ("upper", "wk", "merged"))
            for d in (upper, wk, merged):
                d.mkdir()
            samples = []
            for _ in range(n):
                t = time.perf_counter()
                r = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t overlay overlay -o lowerdir={work},"
                                    f"upperdir={upper},workdir={wk},userxattr {merged} && ls {merged} >/dev/null"],
                                   capture_output=True, text=True)
                samples.append(time.perf_counter() - t)
                if r.returncode != 0:
                    out["overlay mount (unshare -rm)"] = f"unsupported here: {r.stderr.strip()[:100]}"
                    break
            else:
                out["overlay mount + ls in a new user namespace (unshare -rm)"] = samples
            box.delete()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return out


async def bench_changed(config: dict, image: str | None, n: int, size_mib: int, change_mib: int,
                        pool: int = 0) -> dict:
    """Snapshot and fork of a big workdir after a small change (issue 31): a sandbox writes
    `size_mib` MiB and is snapshotted (the set-up, once); a fork of it changes `change_mib` MiB
    per round, then is snapshotted (`snapshot`), a sandbox is forked from that until ready
    (`fork-to-ready`) and runs one command (`first command`)."""
    from orchard_gym import AsyncSandboxClient

    out: dict[str, list[float]] = {"set-up snapshot (whole workdir, once)": [], "snapshot after the change": [],
                                   "fork-to-ready": [], "first command in the fork": [],
                                   "snapshot + fork-to-ready": [], "fork to first command": []}
    added: list[int] = []
    async with AsyncSandboxClient(config, pool={image: pool} if pool else None) as client:
        base = await client.create_sandbox(image=image)
        r = await base.exec(f"yes orchard | head -c {size_mib * 1048576} > big && sync", timeout=600)
        assert r.exit_code == 0, r.stderr
        t = time.perf_counter()
        setup = await base.snapshot()
        out["set-up snapshot (whole workdir, once)"].append(time.perf_counter() - t)
        work = await client.create_sandbox(image=image, from_snapshot=setup.snapshot_id)
        await base.delete()
        for i in range(n + 1):  # the first round warms up; not counted
            r = await work.exec(f"head -c {change_mib * 1048576} /dev/urandom > change-{i}.bin", timeout=120)
            assert r.exit_code == 0, r.stderr
            if pool:
                await client.wait_pools(120)  # a warm pool that kept up (its refill is not timed)
            t0 = time.perf_counter()
            snap = await work.snapshot()
            t1 = time.perf_counter()
            fork = await client.create_sandbox(image=image, from_snapshot=snap.snapshot_id)
            t2 = time.perf_counter()
            r = await fork.exec(f"stat -c %s change-{i}.bin")
            t3 = time.perf_counter()
            assert r.stdout.strip() == str(change_mib * 1048576), (r.stdout, r.stderr)
            if i:
                for label, v in (("snapshot after the change", t1 - t0), ("fork-to-ready", t2 - t1),
                                 ("first command in the fork", t3 - t2), ("snapshot + fork-to-ready", t2 - t0),
                                 ("fork to first command", t3 - t1)):
                    out[label].append(v)
                added.append(snap.size_bytes or 0)
            await fork.delete()
            await client.delete_snapshot(snap.snapshot_id)
        await work.delete()
        await client.delete_snapshot(setup.snapshot_id)
    return {**out, "added_bytes": added}


def changed_main(backends: list[str], n: int, size_mib: int, change_mib: int, image: str) -> None:
    """Before (copy) and after (layers) on local, interleaved round by round; docker as it is."""
    print(f"\n== {size_mib} MiB workdir, {change_mib} MiB changed per round; load average {os.getloadavg()} ==")
    variants = []
    for name in backends:
        if name == "local":
            root = tempfile.mkdtemp(prefix="og-snapbench-gib-")
            copy, layers = ({"type": "local", "root": root, "snapshots": kind} for kind in ("copy", "layers"))
            variants += [("local copy (before)", copy, None, 0), ("local layers (after)", layers, None, 0),
                         ("local layers + warm pool of 2 (after)", layers, None, 2)]
        elif name == "docker":
            variants.append(("docker", {"type": "docker"}, image, 0))
    results: dict[str, dict] = {}
    rounds = max(1, n // 3)
    for r in range(rounds):  # alternate the variants so each sees the same load
        for label, config, img, pool in variants:
            part = asyncio.run(bench_changed(config, img, max(1, n // rounds), size_mib, change_mib, pool))
            into = results.setdefault(label, {})
            for k, v in part.items():
                into.setdefault(k, []).extend(v)
        print(f"  round {r + 1}/{rounds} done; load average {os.getloadavg()}", flush=True)
    for label, rows in results.items():
        print(f"  {label}")
        added = rows.pop("added_bytes")
        for k, samples in rows.items():
            print(f"    {k:38s} {_stats(samples)}")
        print(f"    bytes added per snapshot: median {statistics.median(added) if added else 0:.0f}")
    for _, config, *_ in variants:
        if "root" in config:
            shutil.rmtree(config["root"], ignore_errors=True)
    print(f"  load average at end: {os.getloadavg()}")


def _du(path: Path) -> int:
    return int(subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True).stdout.split()[0])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backends", default="local,docker,kubernetes")
    p.add_argument("-n", type=int, default=5, help="samples per backend (after one warm-up round)")
    p.add_argument("--task", default="marshmallow-3.21.1", help="built-in SWE task id")
    p.add_argument("--changed", metavar="SIZE_MIB,CHANGE_MIB",
                   help="instead: snapshot + fork of a SIZE_MIB workdir after a CHANGE_MIB change (e.g. 1024,1); "
                        "local before (snapshots='copy') and after ('layers') in the same run")
    p.add_argument("--image", default="localhost/orchard/bookworm", help="docker image for --changed")
    args = p.parse_args()
    print(f"load average at start: {os.getloadavg()}, cpus: {os.cpu_count()}")
    if args.changed:
        size, change = (int(x) for x in args.changed.split(","))
        changed_main(args.backends.split(","), args.n, size, change, args.image)
        return
    cluster, scratch = None, []
    for name in args.backends.split(","):
        config: dict = {"type": name}
        if name == "kubernetes":
            from fake_k8s import FakeCluster

            scratch += [tempfile.mkdtemp(prefix="og-snapbench-k8s-"), tempfile.mkdtemp(prefix="og-snapbench-store-")]
            cluster = FakeCluster(Path(scratch[-2]), kubelet="podman")
            config = cluster.backend_config(snapshot_dir=scratch[-1])
        print(f"\n== {name} (task {args.task}) ==", flush=True)
        try:
            rows = asyncio.run(bench_backend(name, config, args.task, args.n))
        finally:
            if cluster is not None:
                cluster.stop()
                cluster = None
            for path in scratch:
                shutil.rmtree(path, ignore_errors=True)
        size = rows.pop("size_bytes")
        for label, samples in rows.items():
            print(f"  {label:24s} {_stats(samples)}")
        print(f"  snapshot size: {size} bytes; load average now: {os.getloadavg()}")
        if name == "local":
            print("  copying the set-up workdir, by method:")
            for label, value in copy_methods(max(args.n, 5), args.task).items():
                print(f"    {label:60s} {value if isinstance(value, str) else _stats(value)}")
    print(f"\nload average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
