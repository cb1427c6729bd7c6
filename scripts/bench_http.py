#!/usr/bin/env python3
"""The host's hand-written HTTP/1.1 client (orchard_gym/http1.py) against httpx, same run,
interleaved, on a real agent: why http1.py exists (docs/performance.md).

    python scripts/bench_http.py [-n 300] [--rounds 5] [--tcp] [--before REV]

Starts the agent (`python3 -I -S -B orchard_gym/agent/`) on a unix socket (or 127.0.0.1 with --tcp) and sends
`GET /health` and `POST /exec {"command": ["true"]}` through each client in turn, round after
round, so that both see the same load. Prints per request: wall p50/p95 and this process's
CPU time (the client's own cost; the agent runs in another process). On a loaded machine the
CPU column is the one to trust. `--before REV` adds the agent client of git revision REV
(`orchard_gym/agent_http.py`, before the two hand-written clients became http1.py): the
same-run before/after of the exec hot path.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from orchard_gym.http1 import HTTP1Client

EXEC_BODY = json.dumps({"command": ["true"]}).encode()


def start_agent(tmp: Path, token: str, tcp: bool) -> tuple[subprocess.Popen, dict]:
    ready = tmp / "ready"
    if tcp:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        where, endpoint = ["--port", str(port), "--host", "127.0.0.1"], {"base_url": f"http://127.0.0.1:{port}"}
    else:
        sock = str(tmp / "agent.sock")
        where, endpoint = ["--socket", sock], {"uds": sock}
    agent = Path(__file__).resolve().parents[1] / "orchard_gym" / "agent"  # a folder run as a script
    proc = subprocess.Popen([sys.executable, "-I", "-S", "-B", str(agent), *where, "--ready-file", str(ready),
                             "--cwd", str(tmp)], env={**os.environ, "ORCHARD_AGENT_TOKEN": token})
    deadline = time.monotonic() + 30
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the agent did not start")
        time.sleep(0.01)
    return proc, endpoint


def load_before(rev: str):
    """AgentHTTP of `orchard_gym/agent_http.py` at git revision `rev`, loaded as a module."""
    import importlib.util

    source = subprocess.run(["git", "show", f"{rev}:orchard_gym/agent_http.py"], check=True,
                            capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1]).stdout
    path = Path(tempfile.mkdtemp(prefix="og-bh-")) / "agent_http_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("agent_http_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module.AgentHTTP


def clients(endpoint: dict, token: str, before: str | None):
    auth = {"Authorization": f"Bearer {token}"}
    ours = HTTP1Client(**endpoint, headers=auth, max_idle=8, server="orchard-agent/", peer="the agent")
    transport = httpx.AsyncHTTPTransport(uds=endpoint.get("uds"))
    theirs = httpx.AsyncClient(base_url=endpoint.get("base_url", "http://agent"), headers=auth, transport=transport)

    async def http1_health():
        assert (await ours.request("GET", "/health")).status == 200

    async def httpx_health():
        assert (await theirs.get("/health")).status_code == 200

    async def http1_exec():
        assert (await ours.request("POST", "/exec", body=EXEC_BODY)).json()["exit_code"] == 0

    async def httpx_exec():
        resp = await theirs.post("/exec", content=EXEC_BODY, headers={"Content-Type": "application/json"})
        assert resp.json()["exit_code"] == 0

    variants = {"GET /health": {"http1.py": http1_health, "httpx": httpx_health},
                "POST /exec true": {"http1.py": http1_exec, "httpx": httpx_exec}}
    closers = [ours.aclose, theirs.aclose]
    if before:
        old = load_before(before)(**endpoint, token=token)

        async def before_health():
            assert (await old.request("GET", "/health")).status == 200

        async def before_exec():
            assert (await old.request("POST", "/exec", body=EXEC_BODY)).json()["exit_code"] == 0

        variants["GET /health"][before] = before_health
        variants["POST /exec true"][before] = before_exec
        closers.append(old.aclose)
    return variants, closers


async def run(args, endpoint: dict, token: str) -> None:
    variants, closers = clients(endpoint, token, args.before)
    samples = {(v, c): ([], []) for v in variants for c in variants[v]}
    for by_client in variants.values():  # warm up: connections, imports, caches
        for fn in by_client.values():
            for _ in range(20):
                await fn()
    for _ in range(args.rounds):
        for route, by_client in variants.items():
            for name, fn in by_client.items():
                walls, cpus = samples[(route, name)]
                for _ in range(args.n):
                    w, c = time.perf_counter(), time.process_time()
                    await fn()
                    walls.append(time.perf_counter() - w)
                    cpus.append(time.process_time() - c)
    for close in closers:
        await close()
    print(f"{'route':18} {'client':10} {'wall p50 ms':>12} {'wall p95 ms':>12} {'client CPU ms/req':>18}")
    for (route, name), (walls, cpus) in samples.items():
        p95 = statistics.quantiles(walls, n=100)[94]
        print(f"{route:18} {name:10} {statistics.median(walls) * 1e3:12.3f} {p95 * 1e3:12.3f} "
              f"{sum(cpus) / len(cpus) * 1e3:18.3f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", type=int, default=300, help="requests per client, route and round")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    p.add_argument("--tcp", action="store_true", help="TCP on 127.0.0.1 instead of a unix socket")
    p.add_argument("--before", metavar="REV", help="also the agent client of this git revision (agent_http.py)")
    args = p.parse_args()
    token = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="og-bh-", dir="/tmp") as tmp:
        proc, endpoint = start_agent(Path(tmp), token, args.tcp)
        try:
            asyncio.run(run(args, endpoint, token))
        finally:
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    main()
