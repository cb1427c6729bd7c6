"""Run the fake API server (and its kubelet) as a process:

    python -m fake_k8s --kubeconfig /tmp/kc.yaml [--kubelet podman|instant] [--port 0]

(with tests/ on PYTHONPATH). Prints `READY <url>` once serving; SIGTERM/SIGINT stop it and
remove every container and volume its kubelet made.
"""

from __future__ import annotations

import argparse
import logging
import secrets
import signal
import sys
import threading

from .apiserver import FakeApiServer
from .kubelet import InstantKubelet, PodmanKubelet


def write_kubeconfig(path: str, url: str, token: str, namespace: str = "default") -> None:
    """A kubeconfig for the real client: one cluster, one bearer-token user, one context."""
    text = f"""apiVersion: v1
kind: Config
clusters:
- name: fake
  cluster:
    server: {url}
users:
- name: fake
  user:
    token: {token}
contexts:
- name: fake
  context:
    cluster: fake
    user: fake
    namespace: {namespace}
current-context: fake
"""
    with open(path, "w") as f:
        f.write(text)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="fake_k8s", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--kubeconfig", required=True, help="write a kubeconfig for this server here")
    p.add_argument("--kubelet", choices=["podman", "instant", "none"], default="podman")
    p.add_argument("--docker-url", default="unix:///run/podman/podman.sock", help="Podman's Docker API")
    p.add_argument("--open-network", default="bridge")
    p.add_argument("--internal-network", default="fake-k8s-internal")
    p.add_argument("--instant-delay", type=float, default=0.0)
    p.add_argument("--bookmark-interval", type=float, default=5.0)
    p.add_argument("--no-validate", action="store_true", help="skip schema validation of created objects")
    p.add_argument("--log-level", default="WARNING")
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s fake_k8s %(levelname)s %(message)s")

    token = secrets.token_urlsafe(16)
    server = FakeApiServer((args.host, args.port), token=token, bookmark_interval=args.bookmark_interval,
                           validate=not args.no_validate)
    if args.kubelet == "podman":
        server.kubelet = PodmanKubelet(server.store, args.docker_url, open_network=args.open_network,
                                       internal_network=args.internal_network)
    elif args.kubelet == "instant":
        server.kubelet = InstantKubelet(server.store, delay=args.instant_delay)
    write_kubeconfig(args.kubeconfig, server.url, token)

    done = threading.Event()

    def stop(signum, frame):
        done.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
    print(f"READY {server.url}", flush=True)
    done.wait()
    server.shutdown()
    if server.kubelet is not None:
        server.kubelet.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
