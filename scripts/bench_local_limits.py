#!/usr/bin/env python3
"""What the local backend's default limits cost: a sandbox's create, a 64 MiB write into its
workdir, and its delete, with the size-capped workdir (`workdir_size`, a loop-mounted ext4
image per sandbox: backends/workdir_fs.py) and without it (`workdir_size=None`, a folder on
the host's disk), interleaved in one run so both see the same load.

    sudo python scripts/bench_local_limits.py [-n 20]

Prints wall-clock medians per variant and the ratio to the baseline (no image). Root is
needed for the image (loop devices); elsewhere both variants are the baseline.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

from orchard_gym import SandboxClient

WRITE = "head -c 64m /dev/zero > fill && sync fill"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", type=int, default=20, help="sandboxes per variant")
    args = p.parse_args()
    root = tempfile.mkdtemp(prefix="og-bench-limits-", dir="/tmp")
    variants = {"baseline (no image)": None, "workdir image (10g)": "10g"}
    times: dict[str, dict[str, list[float]]] = {v: {"create": [], "write": [], "delete": []} for v in variants}
    try:
        clients = {name: SandboxClient({"type": "local", "root": root, "workdir_size": size})
                   for name, size in variants.items()}
        for client in clients.values():  # warm-up: the zygote's start, the first mkfs
            client.create_sandbox().delete()
        for _ in range(args.n):
            for name, client in clients.items():
                t0 = time.perf_counter()
                box = client.create_sandbox()
                t1 = time.perf_counter()
                assert box.exec(WRITE).exit_code == 0
                t2 = time.perf_counter()
                box.delete()
                t3 = time.perf_counter()
                for phase, seconds in (("create", t1 - t0), ("write", t2 - t1), ("delete", t3 - t2)):
                    times[name][phase].append(seconds * 1000)
        for client in clients.values():
            client.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    base = {phase: statistics.median(v) for phase, v in times["baseline (no image)"].items()}
    print(f"n={args.n} per variant, load average {os.getloadavg()[0]:.1f}, medians in ms (ratio to baseline)")
    for name, phases in times.items():
        cells = [f"{phase} {statistics.median(v):7.1f} ({statistics.median(v) / base[phase]:.2f}x)"
                 for phase, v in phases.items()]
        print(f"  {name:22s} " + "   ".join(cells))


if __name__ == "__main__":
    main()
