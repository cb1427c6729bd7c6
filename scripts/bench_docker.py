#!/usr/bin/env python3
"""The docker backend's share of the benchmarks, each against the engine's own way of doing
the same thing, measured in the same run:

- `docker_rows(args)` for `bench_exec.py --backend docker`: exec round trip through the
  agent vs `podman exec` (the CLI) and the docker SDK's `exec_run`, on the same container;
- `docker_lifecycle_rows(args)` for `bench_lifecycle.py --backend docker`: create -> ready
  (and delete) of one sandbox at a time vs a bare `podman run --rm IMAGE true`.

    python scripts/bench_docker.py [exec|lifecycle] [-n N] [--image IMAGE]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import time

LIFECYCLE_SAMPLES = 20  # create->ready runs one at a time: ~1.5 s each here
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


def docker_lifecycle_rows(args) -> list[dict]:
    """One sandbox at a time: create -> ready and delete, vs `podman run --rm IMAGE true`."""
    from orchard_gym import SandboxClient

    image, cli = _image(args), _cli()
    n = max(2, min(args.n, LIFECYCLE_SAMPLES))
    rows = [_measure(f"{cli.rsplit('/', 1)[-1]} run --rm IMAGE true [CLI, baseline]",
                     lambda: subprocess.run([cli, "run", "--rm", image, "true"], check=True),
                     n, warmup=1)]
    with SandboxClient({"type": "docker"}) as client:
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
        # where create's time goes: copying the bundle into a fresh volume (the init container)
        backend, inject = client.backend, []
        for i in range(n):
            volume = f"{backend.config.label_prefix}-bench-inject-{i}"
            backend.api.create_volume(volume, labels={backend.owner_label: backend.owner})
            t = time.perf_counter()
            backend._inject(volume, {backend.owner_label: backend.owner})
            inject.append(time.perf_counter() - t)
            backend.api.remove_volume(volume, force=True)
        rows.append(_row("  of which: agent injection (init container)", inject))
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
    args = p.parse_args()
    print_rows(docker_rows(args) if args.what == "exec" else docker_lifecycle_rows(args))


if __name__ == "__main__":
    main()
