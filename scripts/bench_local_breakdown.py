#!/usr/bin/env python3
"""Where a local sandbox's CPU goes: N sandboxes one at a time (create, 4 execs, delete),
per spawner (LocalBackendConfig.spawner: bwrap = bwrap + python3 per sandbox, zygote =
forked from the pre-forked agent), CPU from cgroup accounting, so other users' load on the
machine does not count.

    sudo python scripts/bench_local_breakdown.py [-n 50] [--spawners bwrap,zygote] [--steps]

Per spawner, CPU ms per sandbox of: everything (a fresh cpuacct cgroup around the run);
the client process (SDK + backend: HTTP to the agent, meta.json, cgroup set-up, kills);
the client's reaped children (bwrap and the agent's interpreter start before it joins its
cgroup, bwrap path only); the zygote (its forks); the sandboxes' cgroups (the agent once
it joined, the commands); and wall ms per phase (create to ready, one exec, delete).
Needs root and a cgroup v1 cpuacct hierarchy (as the local backend's cgroups do here).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "scripts"))
EXECS = 4


def _proc_cpu(pid: int, children: bool = False) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if children else 0)
    return ticks / os.sysconf("SC_CLK_TCK")


def run(spawner: str, n: int, root: Path) -> dict:
    from bench_lifecycle import cpu_accounted

    from orchard_gym import SandboxClient

    os.environ["ORCHARD_LOCAL_SPAWNER"] = spawner
    phases = {"create": [], "exec": [], "delete": []}
    with cpu_accounted() as total:
        own_cgroup = Path("/sys/fs/cgroup/cpuacct") / f"ogb-{os.getpid()}"
        t0 = os.times()
        with SandboxClient({"type": "local", "root": str(root)}) as client:
            client.create_sandbox().delete()  # warm: the zygote's start is not per sandbox
            zygote = client.backend.zygote.pid if client.backend.zygote else None
            z0 = _proc_cpu(zygote, children=True) if zygote else 0.0
            sandboxes0 = _sandbox_cgroups_cpu(own_cgroup)
            t1 = os.times()
            for i in range(n):
                t = time.perf_counter()
                box = client.create_sandbox()
                phases["create"].append(time.perf_counter() - t)
                for k in range(EXECS):
                    t = time.perf_counter()
                    assert box.exec(f"echo {i}-{k}").stdout == f"{i}-{k}\n"
                    phases["exec"].append(time.perf_counter() - t)
                t = time.perf_counter()
                box.delete()
                phases["delete"].append(time.perf_counter() - t)
            t2 = os.times()
            sandboxes = _sandbox_cgroups_cpu(own_cgroup) - sandboxes0
            z = (_proc_cpu(zygote, children=True) - z0) if zygote else 0.0
        del t0
    ms = lambda s: s / n * 1000
    return {
        "client": ms(t2.user + t2.system - t1.user - t1.system),
        "client children (bwrap, agent start)": ms(t2.children_user + t2.children_system
                                                   - t1.children_user - t1.children_system),
        "zygote + its children": ms(z),
        "sandbox cgroups (agent, commands)": ms(sandboxes),
        "everything (cgroup of the run)": ms(total[0]) if total else float("nan"),
        "wall": {k: statistics.median(v) * 1000 for k, v in phases.items()},
    }


def steps(n: int = 20) -> None:
    """The start's parts alone, each n times: fork, unshare, the zygote child's mount set-up,
    an interpreter start, the agent's imports, bubblewrap (CPU of the reaped children)."""
    import resource
    import subprocess

    sys.path[:0] = [str(REPO / "backends"), str(REPO / "orchard_gym" / "agent")]
    import zygote_ns as ns

    def children() -> float:
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime

    def show(name: str, one) -> None:
        c, t = children(), time.perf_counter()
        for _ in range(n):
            one()
        print(f"  {name:<48} wall {(time.perf_counter() - t) / n * 1000:6.1f} ms  "
              f"CPU {(children() - c) / n * 1000:5.1f} ms")

    def forked(flags: int, mounts: bool = False):
        def one():
            pid = os.fork()
            if pid == 0:
                ns.unshare(flags)
                if mounts and os.fork() == 0:  # pid 1 of the new PID namespace
                    ns.set_up_mounts(work, work, [], [])
                    os._exit(0)
                os.wait() if mounts else None
                os._exit(0)
            os.waitpid(pid, 0)
        return one

    work = tempfile.mkdtemp(prefix="ogb-steps-", dir="/tmp")
    python = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)  # as the backend runs it
    every = ns.CLONE_NEWNS | ns.CLONE_NEWPID | ns.CLONE_NEWIPC | ns.CLONE_NEWUTS | ns.CLONE_NEWCGROUP | ns.CLONE_NEWNET
    agent = REPO / "orchard_gym" / "agent"
    imports = (f"import sys; sys.path.insert(0, {str(agent)!r}); import importlib.util as u; "
               f"s = u.spec_from_file_location('m', {str(agent / '__main__.py')!r}); s.loader.exec_module(u.module_from_spec(s))")
    bwrap = ("bwrap --ro-bind / / --dev /dev --proc /proc --tmpfs /tmp --unshare-pid --unshare-ipc --unshare-uts "
             "--unshare-net --unshare-cgroup-try --cap-drop ALL --new-session --").split()
    print(f"start steps, {n} times each (load average {os.getloadavg()[0]:.1f})")
    show("fork", forked(0))
    show("fork + unshare (mount pid ipc uts cgroup net)", forked(every))
    show("  + the zygote child's mounts (zygote_ns)", forked(every, mounts=True))
    show("python3 -I -S -B (empty)", lambda: subprocess.run([python, "-I", "-S", "-B", "-c", "pass"]))
    show("python3 -I -S -B + the agent's imports", lambda: subprocess.run([python, "-I", "-S", "-B", "-c", imports]))
    show("bwrap (the local backend's namespaces) /bin/true", lambda: subprocess.run(bwrap + ["/bin/true"]))
    os.rmdir(work)


def _sandbox_cgroups_cpu(own: Path) -> float:
    """CPU seconds charged to the sandboxes' parent cgroup (the backend's `orchard-gym`)."""
    try:
        return int((own / "orchard-gym" / "cpuacct.usage").read_text()) / 1e9
    except OSError:
        return 0.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", type=int, default=50)
    p.add_argument("--spawners", default="bwrap,zygote")
    p.add_argument("--steps", action="store_true", help="also time the start's parts alone")
    args = p.parse_args()
    if args.steps:
        steps()
    base = Path(tempfile.mkdtemp(prefix="ogb-breakdown-", dir="/tmp"))
    print(f"{args.n} sandboxes one at a time, create + {EXECS} execs + delete; CPU ms per sandbox "
          f"(load average {os.getloadavg()[0]:.1f})")
    try:
        for spawner in args.spawners.split(","):
            _report(spawner, run(spawner, args.n, base / spawner))
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _report(spawner: str, r: dict) -> None:
    print(f"spawner={spawner}")
    for key, value in r.items():
        if key != "wall":
            print(f"  {key:<40} {value:7.1f} ms CPU")
    print("  wall p50: " + ", ".join(f"{k} {v:.1f} ms" for k, v in r["wall"].items())
          + f"  (load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
