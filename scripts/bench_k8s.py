#!/usr/bin/env python3
"""The kubernetes backend's share of the benchmarks, through the fake API server of the tests
(tests/fake_k8s: the real client and wire protocol, a kubelet running pods with Podman), so
that the figures measure our overhead, not a real cluster's scheduler and kubelet:

- `kubernetes_config(root)` for `bench_lifecycle.py --backend kubernetes`: starts one fake
  cluster for the run (stopped at exit) and returns the backend config of both variants;
- `k8s_lifecycle_rows(args)`: create -> ready and delete of one sandbox at a time, against
  the same-run baselines `podman run --rm IMAGE true` and the docker backend (same
  injection, no API server), and the control plane alone (a kubelet that runs nothing:
  API calls, watch, readiness wake-up; what the kubernetes backend adds per sandbox).

    python scripts/bench_k8s.py [-n N] [--image IMAGE]
"""

from __future__ import annotations

import argparse
import atexit
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "scripts"))

LIFECYCLE_SAMPLES = 20
CONTROL_PLANE_SAMPLES = 200
_clusters: dict[str, object] = {}


def fake_cluster(kubelet: str = "podman", workdir: Path | None = None):
    """One fake cluster per kubelet kind for this process, stopped at exit."""
    if kubelet not in _clusters:
        from fake_k8s import FakeCluster

        if workdir is None:
            workdir = Path(tempfile.mkdtemp(prefix="ogb-k8s-", dir="/tmp"))
            atexit.register(shutil.rmtree, workdir, True)  # registered first: runs after the stop
        cluster = FakeCluster(workdir / f"fake-{kubelet}", kubelet=kubelet)
        atexit.register(cluster.stop)
        _clusters[kubelet] = cluster
    return _clusters[kubelet]


def kubernetes_config(root: Path) -> dict:
    """The backend config for bench_lifecycle's variants (the orchestrator gets it as JSON)."""
    return fake_cluster("podman", root.parent).backend_config()


def _image(args) -> str:
    from orchard_gym.backends.config import KubernetesBackendConfig

    return getattr(args, "image", None) or KubernetesBackendConfig().default_image


def k8s_lifecycle_rows(args) -> list[dict]:
    """One sandbox at a time: create -> ready and delete, against the same run's baselines."""
    from bench_docker import _cli, _measure, _row

    from orchard_gym import SandboxClient

    image, cli = _image(args), _cli()
    n = max(2, min(args.n, LIFECYCLE_SAMPLES))
    rows = [_measure(f"{cli.rsplit('/', 1)[-1]} run --rm IMAGE true [CLI, baseline]",
                     lambda: __import__("subprocess").run([cli, "run", "--rm", "--network", "none", image, "true"],
                                                          check=True), n, warmup=1)]

    def lifecycle(label: str, config: dict, samples: int, **create) -> None:
        ready, deleted = [], []
        with SandboxClient(config) as client:
            client.delete_sandbox(client.create_sandbox(image=image, **create).sandbox_id)  # warm-up
            for _ in range(samples):
                t = time.perf_counter()
                box = client.create_sandbox(image=image, **create)
                ready.append(time.perf_counter() - t)
                t = time.perf_counter()
                box.delete()
                deleted.append(time.perf_counter() - t)
        rows.extend([_row(f"{label} create->ready", ready), _row(f"{label} delete", deleted)])

    lifecycle("docker backend [baseline]", {"type": "docker"}, n)
    cluster = fake_cluster("podman")
    lifecycle("kubernetes [fake API, Podman]", cluster.backend_config(), n)
    lifecycle("kubernetes [open network]", cluster.backend_config(), n, block_network=False)
    instant = fake_cluster("instant")
    lifecycle("  of which control plane", instant.backend_config(verify_reach=False),
              max(n, min(args.n, CONTROL_PLANE_SAMPLES)))
    return rows


def main() -> None:
    from bench_docker import print_rows

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", type=int, default=20, help="samples per variant (capped for the slow ones)")
    p.add_argument("--image", default=None, help="task image (default: the backend's default_image)")
    args = p.parse_args()
    print_rows(k8s_lifecycle_rows(args))


if __name__ == "__main__":
    main()
