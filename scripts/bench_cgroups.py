#!/usr/bin/env python3
"""What cgroups cost on the local backend: exec and create/delete latency with cgroups on
and off, interleaved in the same run (so machine load hits both alike); medians.

    python scripts/bench_cgroups.py [--rounds 40] [--execs 40] [--isolation bwrap|none] [--mode auto|v1|v2]

Each round creates one sandbox per variant (on, off, in alternating order), times
`create` (until the agent answers), `--execs` runs of `true`, one exec that times out
with a background `sleep` (the kill path), and `delete`. Prints medians per variant and
on/off ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchard_gym import SandboxClient  # noqa: E402


def one_round(client: SandboxClient, execs: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"create": [], "exec": [], "timeout_kill": [], "delete": []}
    t = time.perf_counter()
    box = client.create_sandbox()
    out["create"].append(time.perf_counter() - t)
    for _ in range(execs):
        t = time.perf_counter()
        assert box.exec("true").exit_code == 0
        out["exec"].append(time.perf_counter() - t)
    t = time.perf_counter()
    result = box.exec("sleep 1000 & sleep 1000", timeout=0.2)
    assert result.timed_out
    out["timeout_kill"].append(time.perf_counter() - t - 0.2)  # the kill, past the 0.2 s timeout
    box.exec("sleep 1000 >/dev/null 2>&1 &")  # left running: delete must kill it
    t = time.perf_counter()
    box.delete()
    out["delete"].append(time.perf_counter() - t)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--execs", type=int, default=40)
    p.add_argument("--isolation", default="bwrap", choices=["bwrap", "none"])
    p.add_argument("--mode", default="auto", choices=["auto", "v1", "v2"], help="the cgroups of the 'on' variant")
    args = p.parse_args()

    root = Path(tempfile.mkdtemp(prefix="bench-cg-", dir="/tmp"))
    clients = {name: SandboxClient({"type": "local", "root": str(root / name), "isolation": args.isolation,
                                    "cgroups": mode})
               for name, mode in (("on", args.mode), ("off", "off"))}
    print(f"cgroups on: {clients['on'].backend.resources()['cgroups']}; isolation {args.isolation}", flush=True)
    samples = {name: {"create": [], "exec": [], "timeout_kill": [], "delete": []} for name in clients}
    try:
        for _ in range(2):  # warm both (imports, page cache)
            for c in clients.values():
                one_round(c, 2)
        for i in range(args.rounds):
            order = ("on", "off") if i % 2 == 0 else ("off", "on")
            for name in order:
                for key, values in one_round(clients[name], args.execs).items():
                    samples[name][key].extend(values)
    finally:
        for c in clients.values():
            c.close()

    report = {}
    print(f"{'median ms':<14}{'on':>10}{'off':>10}{'on/off':>9}")
    for key in ("create", "exec", "timeout_kill", "delete"):
        on, off = (statistics.median(samples[n][key]) * 1000 for n in ("on", "off"))
        report[key] = {"on_ms": round(on, 3), "off_ms": round(off, 3), "ratio": round(on / off, 3),
                       "n": len(samples["on"][key])}
        print(f"{key:<14}{on:>10.2f}{off:>10.2f}{on / off:>9.2f}")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
