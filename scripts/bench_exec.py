#!/usr/bin/env python3
"""Round-trip latency of exec("true") through the SDK, against bare subprocess.

    python scripts/bench_exec.py [-n 500] [--backend local|docker]

Prints p50/p95 per variant and the ratio of each p50 to the same-run baseline
`subprocess.run(["sh", "-c", "true"])`. The SDK runs a string command with bash
when the sandbox has it (dash is faster to start), so the argv form
exec(["sh", "-c", "true"]) is measured too: that is the same process as the baseline.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import tempfile
import time

from tqdm import tqdm


def percentiles(samples: list[float]) -> tuple[float, float]:
    qs = statistics.quantiles(samples, n=100)
    return statistics.median(samples), qs[94]


def measure(label: str, fn, n: int, warmup: int = 20) -> dict:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in tqdm(range(n), desc=label, leave=False):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    p50, p95 = percentiles(samples)
    return {"label": label, "p50": p50, "p95": p95}


def sdk_variants(config: dict, image: str | None, n: int) -> list[dict]:
    from orchard_gym import SandboxClient

    out = []
    with SandboxClient(config) as client:
        box = client.create_sandbox(image=image)
        name = config.get("isolation", config["type"])
        out.append(measure(f"sdk exec('true') [{name}]", lambda: box.exec("true"), n))
        out.append(measure(f"sdk exec(['sh','-c','true']) [{name}]", lambda: box.exec(["sh", "-c", "true"]), n))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", type=int, default=500, help="samples per variant")
    p.add_argument("--backend", default="local", choices=["local", "docker"])
    p.add_argument("--image", default="localhost/orchard/bookworm:latest", help="image for --backend docker")
    args = p.parse_args()

    rows = [measure("subprocess.run(['sh','-c','true'])", lambda: subprocess.run(["sh", "-c", "true"]), args.n)]
    if shutil.which("bash"):  # what exec("true") runs: bash costs more to start than dash
        rows.append(measure("subprocess.run(['bash','-c','true'])", lambda: subprocess.run(["bash", "-c", "true"]),
                            args.n))
    root = tempfile.mkdtemp(prefix="og-bench-")
    if args.backend == "local":
        if shutil.which("bwrap"):
            rows += sdk_variants({"type": "local", "isolation": "bwrap", "root": root}, None, args.n)
        rows += sdk_variants({"type": "local", "isolation": "none", "root": root}, None, args.n)
    else:
        from bench_docker import docker_rows  # agent vs `podman exec` and SDK exec_run, same container

        rows += docker_rows(args)
    shutil.rmtree(root, ignore_errors=True)

    base = rows[0]["p50"]
    print(f"{'variant':48} {'p50 ms':>8} {'p95 ms':>8} {'p50 / baseline':>15}")
    for r in rows:
        print(f"{r['label']:48} {r['p50'] * 1e3:8.3f} {r['p95'] * 1e3:8.3f} {r['p50'] / base:14.2f}x")


if __name__ == "__main__":
    main()
