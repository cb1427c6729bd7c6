#!/usr/bin/env python3
"""The docker backend's share of the benchmarks, each against the engine's own way of doing
the same thing, measured in the same run:

- `docker_rows(args)` for `bench_exec.py --backend docker`: exec round trip through the
  agent vs `podman exec` (the CLI) and the docker SDK's `exec_run`, on the same container;
- `docker_lifecycle_rows(args)` for `bench_lifecycle.py --backend docker`: create -> ready
  (and delete) of one sandbox at a time vs the floor: a bare `podman run -d` of the same image,
  bundle volume and network, with the agent as entrypoint, until its first /health answers.
  `--before PYTHON` adds another checkout's create -> ready in the same run.

    python scripts/bench_docker.py [exec|lifecycle] [-n N] [--image IMAGE] [--before PYTHON]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import time

LIFECYCLE_SAMPLES = 20  # create->ready runs one at a time: ~0.4 s each here (1.4 s copying the bundle)
CLI_SAMPLES = 100  # `podman exec` costs ~100 ms each


def _cli() -> str:
    cli = shutil.which("podman") or shutil.which("docker")
    if cli is None:
        raise SystemExit("neither podman nor docker CLI found")
    return cli


def _measure(label: str, fn, n: int, warmup: int = 3) -> dict:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return _row(label, samples)


def _row(label: str, samples: list[float]) -> dict:
    p95 = statistics.quantiles(samples, n=100)[94] if len(samples) > 1 else samples[0]
    return {"label": label, "p50": statistics.median(samples), "p95": p95, "n": len(samples)}


def _image(args) -> str:
    from orchard_gym.backends.config import DockerBackendConfig

    return getattr(args, "image", None) or DockerBackendConfig().default_image


def docker_rows(args) -> list[dict]:
    """exec('true') through the agent vs `podman exec` and SDK exec_run, same container."""
    from orchard_gym import SandboxClient

    image, cli, rows = _image(args), _cli(), []
    with SandboxClient({"type": "docker"}) as client:
        box = client.create_sandbox(image=image)
        name = box.record.details["container"]
        container = client.backend.client.containers.get(name)
        rows.append(_measure("sdk exec('true') [docker, agent]", lambda: box.exec("true"), args.n))
        rows.append(_measure("sdk exec(['true']) [docker, agent]", lambda: box.exec(["true"]), args.n))
        rows.append(_measure(f"{cli.rsplit('/', 1)[-1]} exec CTR true [CLI]",
                             lambda: subprocess.run([cli, "exec", name, "true"], check=True),
                             min(args.n, CLI_SAMPLES)))
        rows.append(_measure("docker SDK exec_run(['true'])",
                             lambda: container.exec_run(["true"]), min(args.n, CLI_SAMPLES * 2)))
    return rows


# create -> ready of one sandbox at a time, run by another checkout's interpreter (--before)
BEFORE_SNIPPET = """
import json, sys, time
from orchard_gym import SandboxClient
image, n = sys.argv[1], int(sys.argv[2])
out = []
with SandboxClient({"type": "docker"}) as client:
    client.create_sandbox(image=image).delete()  # warm-up
    for _ in range(n):
        t = time.perf_counter()
        box = client.create_sandbox(image=image)
        out.append(time.perf_counter() - t)
        box.delete()
print(json.dumps(out))
"""


def _health_over_socket(path: str, deadline: float) -> None:
    """Poll GET /health on the agent's unix socket (the backoff of Backend.wait_ready)."""
    import socket

    delay = 0.002
    while True:
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(2)
                s.connect(path)
                s.sendall(b"GET /health HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
                if s.recv(64).split(b" ")[1:2] == [b"200"]:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"bare container's agent not healthy at {path}")
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


def bare_run_ready(cli: str, image: str, bundle: str, network: str, n: int) -> list[float]:
    """The floor: `podman run -d` of the same image, bundle volume (read-only) and network, with the
    bundle's agent as entrypoint, until its first /health answers (on a unix socket in a bind-mounted
    folder, so no inspect is needed to find it); removed after each sample, untimed."""
    import hashlib
    import tempfile

    from orchard_gym.backends.docker import AGENT_ARGS, AGENT_DIR, LOADER

    samples = []
    for i in range(n + 1):  # the first is a warm-up
        with tempfile.TemporaryDirectory(prefix="ogb-bare-") as d:
            name = f"orchard-gym-bench-bare-{i}"
            argv = [cli, "run", "-d", "--rm", "--init", "--name", name, "--network", network,
                    "--mount", f"type=volume,src={bundle},dst={AGENT_DIR},ro=true", "-v", f"{d}:/run/orchard",
                    "--entrypoint", LOADER, image, *AGENT_ARGS, "--socket", "/run/orchard/a.sock", "--cwd", "/",
                    "--token-sha256", hashlib.sha256(b"bench").hexdigest()]
            t = time.perf_counter()
            subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
            _health_over_socket(f"{d}/a.sock", time.monotonic() + 60)
            if i:
                samples.append(time.perf_counter() - t)
            subprocess.run([cli, "rm", "-f", "-t", "0", name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return samples


def docker_lifecycle_rows(args) -> list[dict]:
    """One sandbox at a time: create -> ready and delete, against the floor (`podman run -d` of the
    same container + first health check) and, with --before PYTHON, another checkout's code."""
    import json

    from orchard_gym import SandboxClient

    image, cli = _image(args), _cli()
    n = max(2, min(args.n, LIFECYCLE_SAMPLES))
    cli_name = cli.rsplit("/", 1)[-1]
    rows, floor = [], []
    with SandboxClient({"type": "docker"}) as client:
        backend = client.backend
        client.create_sandbox(image=image).delete()  # the network and the bundle volume exist from here
        bundle = backend.bundle.ensure(backend.api.inspect_image(backend.config.injector_image))
        floor += bare_run_ready(cli, image, bundle, backend.config.network, n)
        before = getattr(args, "before", None)
        if before:
            # cwd "/": `python -c` puts the cwd first on sys.path, which would mix this checkout in
            out = subprocess.run([before, "-c", BEFORE_SNIPPET, image, str(n)], check=True, cwd="/",
                                 stdout=subprocess.PIPE, text=True).stdout  # its errors show on stderr
            rows.append(_row(f"sandbox create -> ready [blocked] (before: {before})", json.loads(out.splitlines()[-1])))
        for block in (True, False):
            ready, deleted = [], []
            for _ in range(n):
                t = time.perf_counter()
                box = client.create_sandbox(image=image, block_network=block)
                ready.append(time.perf_counter() - t)
                t = time.perf_counter()
                box.delete()
                deleted.append(time.perf_counter() - t)
            net = "blocked" if block else "open"
            rows += [_row(f"sandbox create -> ready [{net}]", ready), _row(f"sandbox delete [{net}]", deleted)]
        floor += bare_run_ready(cli, image, bundle, backend.config.network, n)  # again: the load drifts
    rows.insert(0, _row(f"{cli_name} run -d + first /health [CLI, floor]", floor))
    rows.append(_measure(f"{cli_name} run --rm IMAGE true [CLI]",
                         lambda: subprocess.run([cli, "run", "--rm", image, "true"], check=True), n, warmup=1))
    return rows


def print_rows(rows: list[dict]) -> None:
    base = rows[0]["p50"]
    print(f"{'variant':48} {'n':>4} {'p50 ms':>9} {'p95 ms':>9} {'p50 / first':>12}")
    for r in rows:
        print(f"{r['label']:48} {r['n']:4d} {r['p50'] * 1e3:9.1f} {r['p95'] * 1e3:9.1f} {r['p50'] / base:11.2f}x")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", nargs="?", default="exec", choices=["exec", "lifecycle"])
    p.add_argument("-n", type=int, default=200, help="samples per variant (capped for the slow ones)")
    p.add_argument("--image", default=None, help="task image (default: the backend's default_image)")
    p.add_argument("--before", metavar="PYTHON", default=None,
                   help="lifecycle: also time create -> ready with this interpreter's orchard_gym (e.g. a main "
                        "checkout's .venv/bin/python), in the same run")
    args = p.parse_args()
    print_rows(docker_rows(args) if args.what == "exec" else docker_lifecycle_rows(args))


if __name__ == "__main__":
    main()
