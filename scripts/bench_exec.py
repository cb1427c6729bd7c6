#!/usr/bin/env python3
"""Round-trip latency and CPU of one command through the SDK, against the same argv run bare.

    python scripts/bench_exec.py [-n 300] [--idle 0,0.05,2] [--idle-n 25] [--backend local|docker]

Per spacing (back-to-back, then each call separated by `--idle` seconds of sleep, as an RL
loop's exec follows generation), the methods are interleaved call by call (one of each
in turn, the order rotating), so load from others falls on all of them alike:

- bare `subprocess.run(["sh","-c","true"])` and `["bash","-c","true"]`;
- per local isolation (bwrap when installed, none): SDK `exec("true")` (a string runs
  with bash where the sandbox has it) and `exec(["sh","-c","true"])` (the same process as
  the first baseline).

Prints p50/p95 wall ms, CPU ms per call and the ratio of each p50 to the bare run of the
same argv (string: bash; argv: sh). CPU is counted in a fresh cpuacct cgroup around this
process (root, cgroup v1; everything below it: the zygote, the agents, the commands), so
others' load does not count; "-" where it cannot be counted. Wall figures on a loaded
machine are noisy: the ratios of one run are what compares.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ACCT = Path("/sys/fs/cgroup/cpuacct")


class CpuMeter:
    """CPU seconds of everything in a fresh cpuacct cgroup that this process moved into."""

    def __init__(self) -> None:
        self.dir: Path | None = ACCT / f"ogbe-{os.getpid()}"
        try:
            self.dir.mkdir()
            (self.dir / "cgroup.procs").write_text("0")
        except OSError:
            self.dir = None

    def read(self) -> float | None:
        return int((self.dir / "cpuacct.usage").read_text()) / 1e9 if self.dir else None

    def close(self) -> None:
        if self.dir is None:
            return
        (ACCT / "cgroup.procs").write_text("0")
        for _ in range(100):  # sandbox cgroups below go with their processes
            try:
                for d in sorted(self.dir.rglob("*/"), key=lambda p: -len(p.parts)):
                    d.rmdir()
                self.dir.rmdir()
                return
            except OSError:
                time.sleep(0.1)


def interleaved(methods: dict, n: int, idle: float, meter: CpuMeter, warmup: int = 10) -> dict:
    """name -> (wall samples, CPU samples), one call of each method in turn, `idle` s apart."""
    names = list(methods)
    for _ in range(warmup):
        for name in names:
            methods[name]()
    out = {name: ([], []) for name in names}
    for i in range(n):
        order = names[i % len(names):] + names[:i % len(names)]
        for name in order:
            if idle:
                time.sleep(idle)
            c, t = meter.read(), time.perf_counter()
            methods[name]()
            wall, c2 = time.perf_counter() - t, meter.read()
            out[name][0].append(wall)
            if c is not None:
                out[name][1].append(c2 - c)
    return out


def sdk_methods(config: dict, stack: contextlib.ExitStack) -> tuple[dict, str]:
    from orchard_gym import SandboxClient

    client = stack.enter_context(SandboxClient(config))
    box = client.create_sandbox()
    stack.callback(box.delete)
    name = box.record.details.get("spawner", config.get("isolation", config["type"]))
    label = f"{config.get('isolation', 'auto')}/{name}"
    return {f"sdk exec('true') [{label}]": lambda: box.exec("true"),
            f"sdk exec(['sh','-c','true']) [{label}]": lambda: box.exec(["sh", "-c", "true"])}, label


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", type=int, default=300, help="samples per method, back-to-back")
    p.add_argument("--idle", default="0,0.05,2", help="spacings in seconds, comma-separated")
    p.add_argument("--idle-n", type=int, default=25, help="samples per method at each spacing >= 1 s")
    p.add_argument("--isolation", default="auto", help="local: comma-separated isolations (auto: bwrap and none)")
    p.add_argument("--backend", default="local", choices=["local", "docker"])
    p.add_argument("--image", default="localhost/orchard/bookworm:latest", help="image for --backend docker")
    args = p.parse_args()
    if args.backend == "docker":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_docker import docker_rows  # agent vs `podman exec` and SDK exec_run, same container

        for r in docker_rows(args):
            print(f"{r['label']:52} p50 {r['p50'] * 1e3:8.3f} ms  p95 {r['p95'] * 1e3:8.3f} ms")
        return

    bare = {"bare sh -c true": lambda: subprocess.run(["sh", "-c", "true"]),
            "bare bash -c true": lambda: subprocess.run(["bash", "-c", "true"])}
    isolations = ["bwrap", "none"] if args.isolation == "auto" else args.isolation.split(",")
    meter = CpuMeter()
    root = tempfile.mkdtemp(prefix="og-bench-", dir="/tmp")
    print(f"load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs, CPU counted: {meter.dir is not None}")
    try:
        with contextlib.ExitStack() as stack:
            methods = dict(bare)
            for iso in isolations:
                found, _ = sdk_methods({"type": "local", "isolation": iso, "root": root}, stack)
                methods.update(found)
            for idle in (float(s) for s in args.idle.split(",")):
                n = args.idle_n if idle >= 1 else args.n
                rows = interleaved(methods, n, idle, meter)
                base = {"sh": statistics.median(rows["bare sh -c true"][0]),
                        "bash": statistics.median(rows["bare bash -c true"][0])}
                print(f"\n{'back-to-back' if not idle else f'each call {idle * 1e3:.0f} ms apart'}, {n} calls "
                      f"per method, interleaved (load average {os.getloadavg()[0]:.1f})")
                print(f"{'method':52} {'p50 ms':>8} {'p95 ms':>8} {'CPU ms':>7} {'p50 / bare':>11}")
                for name, (wall, cpu) in rows.items():
                    same = base["sh" if "sh -c" in name or "'sh'" in name else "bash"]
                    p50, p95 = statistics.median(wall), statistics.quantiles(wall, n=20)[18]
                    cpu_ms = f"{statistics.mean(cpu) * 1e3:7.2f}" if cpu else f"{'-':>7}"
                    print(f"{name:52} {p50 * 1e3:8.3f} {p95 * 1e3:8.3f} {cpu_ms} {p50 / same:10.2f}x")
    finally:
        meter.close()
        subprocess.run(["rm", "-rf", root], check=False)


if __name__ == "__main__":
    main()
