#!/usr/bin/env python3
"""Exec round trip of two agent versions, side by side in the same run.

    python scripts/bench_agent_versions.py OLD_AGENT [-n 400]
    # OLD_AGENT: a one-file agent.py or an agent folder, e.g. the one-file agent of before the split:
    # git show 4c0ffe6:orchard_gym/agent.py > /tmp/agent-old.py

Starts both agents on unix sockets and alternates `POST /exec {"command": ["true"]}` over
one keep-alive connection each (interleaved, so machine load hits both alike); prints p50/p95
per version and the ratio new/old. The old agent gets its token in the environment (what
older versions read), the new one `--token-sha256`.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

NEW = Path(__file__).resolve().parents[1] / "orchard_gym" / "agent"  # a folder: python runs its __main__.py
TOKEN = "bench-token"


def start(agent_py: str, tmp: Path, new: bool) -> tuple[subprocess.Popen, httpx.Client]:
    sock = str(tmp / ("new.sock" if new else "old.sock"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHARD_")}
    args = [sys.executable, "-I", "-S", agent_py, "--socket", sock, "--cwd", str(tmp)]
    if new:
        args += ["--token-sha256", hashlib.sha256(TOKEN.encode()).hexdigest()]
    else:
        env["ORCHARD_AGENT_TOKEN"] = TOKEN
    proc = subprocess.Popen(args, env=env)
    http = httpx.Client(transport=httpx.HTTPTransport(uds=sock), base_url="http://agent", timeout=30,
                        headers={"Authorization": f"Bearer {TOKEN}"})
    deadline = time.monotonic() + 10
    while True:
        try:
            if http.get("/health").status_code == 200:
                return proc, http
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("old", help="the agent (agent.py, or a folder with __main__.py) to compare against")
    p.add_argument("-n", type=int, default=400)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        old_proc, old = start(args.old, Path(tmp), new=False)
        new_proc, new = start(str(NEW), Path(tmp), new=True)
        samples: dict[str, list[float]] = {"old": [], "new": []}
        try:
            for i in range(args.n + 20):
                for name, http in (("old", old), ("new", new)) if i % 2 else (("new", new), ("old", old)):
                    t0 = time.perf_counter()
                    resp = http.post("/exec", json={"command": ["true"]})
                    dt = time.perf_counter() - t0
                    assert resp.status_code == 200 and resp.json()["exit_code"] == 0, resp.text
                    if i >= 20:  # warm-up
                        samples[name].append(dt)
        finally:
            for proc, http in ((old_proc, old), (new_proc, new)):
                http.close()
                proc.terminate()
                proc.wait(5)
    stats = {k: (statistics.median(v), statistics.quantiles(v, n=100)[94]) for k, v in samples.items()}
    for name, (p50, p95) in stats.items():
        print(f"{name}: p50 {p50 * 1e3:.2f} ms  p95 {p95 * 1e3:.2f} ms  (n={len(samples[name])})")
    print(f"new/old p50 ratio: {stats['new'][0] / stats['old'][0]:.2f}")


if __name__ == "__main__":
    main()
