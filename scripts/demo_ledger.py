"""The cost ledger against a known load on every backend this machine has: one sandbox each runs a
busy loop of known CPU length (a shell spinning on builtins until its own /proc/$$/stat counters
reach it) and a 64 MiB memory hog (`dd bs=64M`), then is deleted; the table is what the ledger read.

    .venv/bin/python scripts/demo_ledger.py --cpu 2.0            # local v1/v2, docker, fake kubernetes
    .venv/bin/python scripts/demo_ledger.py --backends local-v1,docker
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the fake Kubernetes cluster lives with the tests

from orchard_gym import SandboxClient  # noqa: E402

BUSYBOX = "localhost/orchard/busybox:latest"


def busy(seconds: float) -> str:
    ticks = int(seconds * os.sysconf("SC_CLK_TCK"))
    return ('while :; do read -r s < /proc/$$/stat; set -- ${s##*") "}; '
            f'[ $(( ${{12}} + ${{13}} )) -ge {ticks} ] && break; done; echo spun')


def run(config: dict, image: str | None, cpu: float, hog_mib: int):
    with SandboxClient(config) as client:
        box = client.create_sandbox(image=image)
        started = time.monotonic()
        assert box.exec(busy(cpu), timeout=600).stdout.strip() == "spun"
        loop_wall = time.monotonic() - started
        hog = f"dd if=/dev/zero of=/dev/null bs={hog_mib}M count=1 2>/dev/null; echo hogged"
        assert box.exec(hog, timeout=300).stdout.strip() == "hogged"
        box.delete()
        return box._inner.usage, loop_wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu", type=float, default=2.0, help="CPU seconds the busy loop spins")
    parser.add_argument("--hog-mib", type=int, default=64)
    parser.add_argument("--backends", default="local-v1,local-v2,docker,kubernetes")
    args = parser.parse_args()
    cluster = None
    rows = []
    try:
        for name in args.backends.split(","):
            if name.startswith("local-"):
                config, image = {"type": "local", "root": tempfile.mkdtemp(), "cgroups": name[6:]}, None
            elif name == "docker":
                config, image = {"type": "docker"}, BUSYBOX
            elif name == "kubernetes":
                from fake_k8s import FakeCluster

                cluster = FakeCluster(tempfile.mkdtemp(prefix="ledger-k8s-"), kubelet="podman")
                config, image = cluster.backend_config(), BUSYBOX
            else:
                raise SystemExit(f"unknown backend {name!r}")
            try:
                usage, loop_wall = run(config, image, args.cpu, args.hog_mib)
            except Exception as e:  # a backend this machine lacks: say so, go on
                rows.append((name, f"unavailable: {type(e).__name__}: {e}"[:100]))
                continue
            peak = "-" if usage.memory_peak_bytes is None else f"{usage.memory_peak_bytes / 2**20:.1f}"
            cpu = "-" if usage.cpu_seconds is None else f"{usage.cpu_seconds:.3f}"
            rows.append((name, f"| {name} | {usage.source} | {args.cpu:.2f} | {cpu} | {args.hog_mib} | {peak} | "
                               f"{usage.wall_seconds:.1f} | {loop_wall:.1f} | {usage.note or ''} |"))
    finally:
        if cluster is not None:
            cluster.stop()
    print("| backend | source | busy loop CPU-s | ledger CPU-s | hog MiB | ledger peak MiB | ledger wall s "
          "| loop wall s | note |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, row in rows:
        print(row if row.startswith("|") else f"| {name} | {row} |||||||")


if __name__ == "__main__":
    main()
