"""Latency the recording proxy adds to a model call, against calling the upstream directly.

    python scripts/bench_proxy.py [-n 400] [--concurrency 16]

Starts the stub upstream (`orchard_gym.wrappers.proxy.stub`) and the proxy (`orchard proxy
--upstream ...`) as processes of their own on loopback, opens one rollout, then, per
door (chat completions, Responses, Anthropic Messages), alternates calls to the stub
directly and through the proxy (same client, keep-alive, same prompt), non-streaming and
streaming (to the last byte). The Messages door's direct baseline is the chat call it
makes upstream (the stub speaks no Messages API). Prints p50/p95 of both and the added
latency, measured in the same run. Then the same with `--concurrency`
clients at once (throughput). Everything stops by itself.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def one(http: httpx.Client, url: str, headers: dict, body: dict) -> float:
    started = time.perf_counter()
    if body.get("stream"):
        with http.stream("POST", url, json=body, headers=headers) as r:
            for _ in r.iter_bytes():
                pass
            r.raise_for_status()
    else:
        r = http.post(url, json=body, headers=headers)
        r.raise_for_status()
        r.json()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=400, help="calls per series")
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()

    stub_port, proxy_port = free_port(), free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = [subprocess.Popen([sys.executable, "-m", "orchard_gym.wrappers.proxy.stub", "--port", str(stub_port)], env=env),
             subprocess.Popen([sys.executable, "-m", "orchard_gym.cli", "proxy", "--port", str(proxy_port),
                               "--upstream", f"http://127.0.0.1:{stub_port}/v1", "--admin-key", "bench"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        stub, proxy = f"http://127.0.0.1:{stub_port}/v1", f"http://127.0.0.1:{proxy_port}"
        wait_up(stub + "/models")
        wait_up(proxy + "/health")
        rollout = httpx.post(proxy + "/rollouts", json={}, headers={"Authorization": "Bearer bench"}).json()
        auth = {"Authorization": f"Bearer {rollout['token']}"}
        via = {"url": rollout["base_url"] + "/chat/completions", "headers": auth}
        direct = {"url": stub + "/chat/completions", "headers": {}}
        system, task = "You are a coding agent. " * 20, "Fix the failing test in tests/test_parse.py. " * 10
        messages = [{"role": "system", "content": system}, {"role": "user", "content": task}]
        chat = {"model": "stub", "messages": messages, "temperature": 0.0, "max_tokens": 256}
        responses = {"model": "stub", "instructions": system, "input": task, "temperature": 0.0}
        anthropic = {"model": "stub", "system": system, "messages": [{"role": "user", "content": task}],
                     "max_tokens": 256}
        # (label, direct url, direct body, proxied url, its headers, proxied body)
        doors = [("chat", direct["url"], chat, via["url"], auth, chat),
                 ("responses", stub + "/responses", responses, rollout["base_url"] + "/responses", auth, responses),
                 ("messages", direct["url"], chat, rollout["base_url"] + "/messages",
                  {"x-api-key": rollout["token"], "anthropic-version": "2023-06-01"}, anthropic)]
        print(f"recording proxy vs direct upstream (stub on loopback), {args.n} calls per series, "
              f"{os.cpu_count()} CPUs\n")
        print(f"{'series':<26}{'direct p50':>12}{'p95':>9}{'proxy p50':>12}{'p95':>9}{'added p50':>12}{'p95':>9}{'ratio p50':>11}")
        with httpx.Client(timeout=30, limits=httpx.Limits(max_keepalive_connections=64)) as http:
            for (door, d_url, d_body, p_url, p_headers, p_body), stream in (
                    (door, stream) for door in doors for stream in (False, True)):
                label = f"{door}, {'streaming (SSE)' if stream else 'non-streaming'}"
                d_body, p_body = {**d_body, "stream": stream}, {**p_body, "stream": stream}
                for _ in range(20):  # warm-up: connections, code paths
                    one(http, d_url, {}, d_body)
                    one(http, p_url, p_headers, p_body)
                d, p = [], []
                for _ in range(args.n):  # interleaved: both series see the same machine
                    d.append(one(http, d_url, {}, d_body))
                    p.append(one(http, p_url, p_headers, p_body))
                ms = [1000 * x for x in (pct(d, .5), pct(d, .95), pct(p, .5), pct(p, .95))]
                print(f"{label:<26}{ms[0]:>10.2f}ms{ms[1]:>7.2f}ms{ms[2]:>10.2f}ms{ms[3]:>7.2f}ms"
                      f"{ms[2] - ms[0]:>10.2f}ms{ms[3] - ms[1]:>7.2f}ms{ms[2] / ms[0]:>10.2f}x")

            body = chat
            print(f"\nthroughput, {args.concurrency} concurrent clients, non-streaming:")
            for label, target in (("direct", direct), ("proxy", via)):
                with ThreadPoolExecutor(args.concurrency) as pool:
                    started = time.perf_counter()
                    lat = list(pool.map(lambda _: one(http, target["url"], target["headers"], body), range(args.n)))
                    wall = time.perf_counter() - started
                print(f"  {label:<8}{args.n / wall:>8.0f} calls/s   p50 {1000 * statistics.median(lat):.2f}ms   "
                      f"p95 {1000 * pct(lat, .95):.2f}ms")
        record = httpx.get(f"{proxy}/rollouts/{rollout['rollout_id']}", headers={"Authorization": "Bearer bench"}).json()
        ok = sum(1 for c in record["calls"] if c["error"] is None)
        by_door = {e: sum(1 for c in record["calls"] if c["endpoint"] == e) for e in ("chat.completions", "responses",
                                                                                    "messages")}
        print(f"\nrecorded {len(record['calls'])} calls in the rollout ({ok} ok; {by_door}); "
              f"proxy-internal median latency {1000 * statistics.median(c['latency'] for c in record['calls']):.2f}ms")
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    main()
