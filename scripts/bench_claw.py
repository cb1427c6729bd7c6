#!/usr/bin/env python3
"""Claw tool-call latency through each door, against a bare exec("true") in the same run.

    python scripts/bench_claw.py [--calls 50] [--backend local|docker]

One sandbox with the Claw service (task todo-cleanup-001); the same read-only call
(`todo_list`) N times through:
  exec-true   sandbox.exec("true"): the agent round trip every door pays at least once (baseline)
  function    env.step of the function call (door 1: jsonschema + exec of the claw client)
  cli         sandbox.exec("claw todo_list --json '{}'") (door 2: shell + python + socket)
  mcp         an MCP stdio session's call_tool, official client (door 3; local backend only:
              the server runs here and reaches the sandbox's service socket)
  socket      the service's own socket from here, no agent (local backend only): the floor
Medians and p90 in milliseconds, and each as a ratio to exec-true's median.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchard_gym import AsyncSandboxClient
from orchard_gym.envs.claw.env import ClawEnv
from orchard_gym.envs.claw.sandbox import claw_wire


async def timed(n: int, fn) -> list[float]:
    await fn()  # warm
    out = []
    for _ in range(n):
        t = time.perf_counter()
        await fn()
        out.append((time.perf_counter() - t) * 1000)
    return out


async def main(calls: int, backend: str) -> dict:
    results: dict[str, list[float]] = {}
    async with AsyncSandboxClient({"type": backend}) as client:
        env = ClawEnv(client=client, bash=True)
        await env.areset(options={"task_id": "todo-cleanup-001"})
        sandbox, ctx, service = env.sandbox, env.ctx, env.ctx.state["service"]

        async def exec_true():
            assert (await sandbox.exec("true", timeout=30)).exit_code == 0

        async def function():
            obs, *_ = await env.astep({"name": "todo_list", "arguments": {}})
            assert obs.startswith("{"), obs

        async def cli():
            r = await sandbox.exec("claw todo_list --json '{}'", env=ctx.env, cwd=ctx.cwd, timeout=30)
            assert r.exit_code == 0, r.stderr

        env.max_steps = 10 * calls + 10
        results["exec-true"] = await timed(calls, exec_true)
        results["function"] = await timed(calls, function)
        results["cli"] = await timed(calls, cli)
        if backend == "local":
            async def sock():
                assert (await asyncio.to_thread(claw_wire.call, "todo_list", {}, "bench", service.socket))["ok"]

            results["socket"] = await timed(calls, sock)
            from mcp import ClientSession, StdioServerParameters
            from mcp.client.stdio import stdio_client

            params = StdioServerParameters(command=sys.executable, args=["-I", "-S", f"{service.home}/claw_mcp.py"],
                                           env={"CLAW_SOCKET": service.socket})
            async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
                await session.initialize()

                async def mcp_call():
                    await session.call_tool("todo_list", {})

                results["mcp"] = await timed(calls, mcp_call)
        await env.aclose()
    base = statistics.median(results["exec-true"])
    return {name: {"median_ms": round(statistics.median(v), 2),
                   "p90_ms": round(sorted(v)[int(0.9 * (len(v) - 1))], 2),
                   "x_exec_true": round(statistics.median(v) / base, 2)} for name, v in results.items()}


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--backend", default="local", choices=["local", "docker"])
    opts = p.parse_args()
    print(json.dumps(asyncio.run(main(opts.calls, opts.backend)), indent=1))
