"""Per-step overhead of each trainer adapter against `env.step`, measured in the same run.

    .venv/bin/python scripts/bench_integrations.py [--steps 40] [--root /tmp/og-bench]

Orchard/Toy-v0 on the local backend; every path runs the same action (`bash true`) the same
number of times on one episode, after one warm-up step:
- `env.step`         the Gymnasium env (the baseline);
- `core`             `Episode.step` (orchard_gym.integrations.core) from a sync caller;
- `trl`              the TRL environment's tool method, awaited on another event loop, as
                     TRL's tool loop does;
- `openenv`          OpenEnv's own sync client over WebSocket to `create_app` on this machine;
- `openenv mcp`      OpenEnv's own `MCPToolClient.call_tool` (JSON-RPC over HTTP `/mcp`) to the
                     same server;
- `skyrl`            SkyRL-Gym's `env.step` with the model's text (parsed by Orchard);
- `verifiers step`   inside verifiers' own eval loop (below): one env step as the adapter runs
                     it (`hub.arun(episode.step(text))`, the trace's `orchard_step_ms`, median);
- `verifiers turn`   verifiers' own eval loop (`vf-eval` in .venv-verifiers, a process of its
                     own: verifiers 0.4 cannot share this venv) against the stub model scripted
                     to make the calls: one step is a whole verifiers turn (its chat-program
                     harness, its interception server, a stub model call, the env step), timed
                     as the difference in verifiers' `agent` phase between an episode of N calls
                     and one of none, over N (fixed costs cancel).
Prints ms/step and the ratio to `env.step`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path

import gymnasium as gym

import orchard_gym  # noqa: F401

ACTION = {"name": "bash", "arguments": {"command": "true"}}
TASK = "write-000"


def timed(step, n: int) -> float:
    step()  # warm-up
    times = []
    for _ in range(n):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


def bench_gym(backend, n):
    env = gym.make("Orchard/Toy-v0", backend=backend, max_steps=n + 5)
    env.reset(options={"task_id": TASK})
    try:
        return timed(lambda: env.step(ACTION), n)
    finally:
        env.close()


def bench_core(backend, n):
    from orchard_gym.integrations.core import EnvHub

    hub = EnvHub("Orchard/Toy-v0", backend=backend, max_steps=n + 5)
    episode = hub.episode()
    hub.run(episode.start(TASK))
    try:
        return timed(lambda: hub.run(episode.step(ACTION)), n)
    finally:
        hub.close()


def bench_trl(backend, n):
    from orchard_gym.integrations.trl import environment_factory

    factory = environment_factory("Orchard/Toy-v0", backend=backend, max_steps=n + 5)
    env = factory()
    env.reset(task_id=TASK)
    loop = asyncio.new_event_loop()  # TRL's own async loop stands apart from the package's
    try:
        return timed(lambda: loop.run_until_complete(env.bash(command="true")), n)
    finally:
        loop.close()
        factory.close()


def bench_openenv(backend, n):
    import uvicorn
    from openenv.core.generic_client import GenericEnvClient
    from openenv.core.mcp_client import MCPToolClient

    from orchard_gym.integrations.openenv import create_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app("Orchard/Toy-v0", backend=backend, max_steps=n + 5),
                                           host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{port}"
    try:
        with GenericEnvClient(base_url=url).sync() as client:
            client.reset(task_id=TASK)
            ws = timed(lambda: client.step({"tool": "bash", "arguments": {"command": "true"}}), n)
        with MCPToolClient(base_url=url).sync() as mcp:
            mcp.reset(task_id=TASK)
            return {"": ws, " mcp": timed(lambda: mcp.call_tool("bash", command="true"), n)}
    finally:
        server.should_exit = True
        thread.join(30)


def bench_skyrl(backend, n):
    import skyrl_gym

    from orchard_gym.integrations.skyrl import register_envs

    register_envs(["Orchard/Toy-v0"])
    env = skyrl_gym.make("Orchard/Toy-v0", env_config={"backend": backend, "max_steps": n + 5},
                         extras={"task_id": TASK})
    env.init([])
    text = f"<tool_call>{json.dumps(ACTION)}</tool_call>"
    try:
        return timed(lambda: env.step(text), n)
    finally:
        env.close()


def bench_verifiers(backend, n):
    from orchard_gym.integrations.verifiers_run import venv_missing, vf_eval
    from orchard_gym.wrappers.proxy.stub import StubUpstream

    if (why := venv_missing()) is not None:
        raise ImportError(why)
    text = f"<tool_call>{json.dumps(ACTION)}</tool_call>"
    submit = '<tool_call>{"name": "submit", "arguments": {}}</tool_call>'
    with StubUpstream(scripts={"steps": [text] * n + [submit], "none": [submit]}) as stub, \
            tempfile.TemporaryDirectory() as out:
        episodes = {}
        for model in ("none", "steps"):
            [episode] = vf_eval("Orchard/Toy-v0", model=model, base_url=stub.url, tasks=[TASK], out_dir=out,
                                env_kwargs={"backend": backend, "max_steps": n + 5})
            assert episode.error is None and episode.turns == (n + 1 if model == "steps" else 1), episode
            episodes[model] = episode
    step = episodes["steps"].metrics["orchard_step_ms"]
    turn = (episodes["steps"].agent_seconds - episodes["none"].agent_seconds) / n * 1000
    return step, turn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--root", default="/tmp/og-bench-integrations")
    args = parser.parse_args()
    Path(args.root).mkdir(parents=True, exist_ok=True)
    backend = {"type": "local", "root": args.root}
    base = bench_gym(backend, args.steps)
    print(f"{'path':<15} {'ms/step':>9} {'x env.step':>11}")
    print(f"{'env.step':<15} {base:9.2f} {1.0:11.2f}")
    print(f"load average {os.getloadavg()[0]:.1f}", flush=True)
    for name, bench in (("core", bench_core), ("trl", bench_trl), ("openenv", bench_openenv), ("skyrl", bench_skyrl),
                        ("verifiers", bench_verifiers)):
        try:
            result = bench(backend, args.steps)
        except ImportError as e:
            print(f"{name:<10} skipped: {e}")
            continue
        rows = (result.items() if isinstance(result, dict) else zip((" step", " turn"), result)
                if isinstance(result, tuple) else [("", result)])
        for suffix, ms in rows:
            print(f"{name + suffix:<15} {ms:9.2f} {ms / base:11.2f}", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
