#!/usr/bin/env python3
"""Create + first exec + delete of a docker sandbox with sidecar services, against the same
without them, interleaved in one run (so machine load hits both alike).

    python scripts/bench_compose.py [-n 5]

Services: one busybox httpd with a healthcheck probed every 0.3 s (what a compose task's
`depends_on: service_healthy` waits for). Prints p50/max seconds per kind and the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from orchard_gym import SandboxClient

BUSYBOX = "localhost/orchard/busybox:latest"
WEB = {"name": "web", "image": BUSYBOX,
       "command": ["sh", "-c", "mkdir -p /w && echo hi > /w/index.html && exec httpd -f -p 8000 -h /w"],
       "healthcheck": {"test": ["wget", "-q", "-O-", "http://127.0.0.1:8000/"], "interval": 0.3}}


def one(client: SandboxClient, services: list, blocked: bool) -> float:
    started = time.perf_counter()
    box = client.create_sandbox(image=BUSYBOX, services=services, block_network=blocked)
    try:
        probe = "wget -q -O- http://web:8000/" if services else "true"
        assert box.exec(probe).exit_code == 0
    finally:
        box.delete()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=5)
    parser.add_argument("--open", action="store_true", help="block_network=False (default: blocked)")
    args = parser.parse_args()
    times: dict[str, list[float]] = {"plain": [], "1 service": []}
    with SandboxClient({"type": "docker", "pull": "never"}) as client:
        one(client, [], not args.open)  # warm: the agent bundle volume
        for _ in range(args.n):
            times["plain"].append(one(client, [], not args.open))
            times["1 service"].append(one(client, [WEB], not args.open))
    for kind, values in times.items():
        print(f"{kind:10s} create+exec+delete: p50 {statistics.median(values):.2f} s, max {max(values):.2f} s "
              f"(n={len(values)})")
    print(f"load average {os.getloadavg()[0]:.1f} (1 min)")


if __name__ == "__main__":
    main()
