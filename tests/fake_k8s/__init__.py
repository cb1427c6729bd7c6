"""A fake Kubernetes cluster for tests: an API server speaking the real wire protocol to the
real `kubernetes` client, and a kubelet that runs pods with Podman (or an instant one that
runs nothing). Never shipped as a backend: `orchard_gym.backends.kubernetes` talks to it
exactly as to a real cluster, through a kubeconfig.

    cluster = FakeCluster(tmp_dir, kubelet="podman")
    config = cluster.backend_config()      # {"type": "kubernetes", "kubeconfig": ..., "namespace": ...}
    cluster.fault(throttle=3)              # the next 3 API requests answer 429
    cluster.stats()                        # request counts, watches, 410s, kubelet counters
    cluster.ready_times()                  # instant kubelet: pod name -> when it turned Ready
    cluster.stop()                         # removes every container and volume it made
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


class FakeCluster:
    def __init__(self, workdir: str | os.PathLike, *, kubelet: str = "podman", namespace: str = "orchard-test",
                 bookmark_interval: float = 5.0, instant_delay: float = 0.0, log_level: str = "WARNING",
                 extra_args: tuple[str, ...] = ()):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.kubeconfig = self.workdir / "kubeconfig.yaml"
        self.namespace = namespace
        self.log = self.workdir / "fake-k8s.log"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}
        args = [sys.executable, "-m", "fake_k8s", "--kubeconfig", str(self.kubeconfig), "--kubelet", kubelet,
                "--bookmark-interval", str(bookmark_interval), "--instant-delay", str(instant_delay),
                "--log-level", log_level, *extra_args]
        self._log = open(self.log, "ab")
        self.proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=self._log, stdin=subprocess.DEVNULL)
        line = self.proc.stdout.readline().decode()
        if not line.startswith("READY "):
            self.stop()
            raise RuntimeError(f"the fake API server did not start:\n{self.log.read_text()[-3000:]}")
        self.url = line.split()[1]

    def backend_config(self, **overrides) -> dict:
        return {"type": "kubernetes", "kubeconfig": str(self.kubeconfig), "namespace": self.namespace, **overrides}

    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        req = urllib.request.Request(self.url + path, method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())

    def kube(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        """A raw API call with the cluster's token (someone else's kubectl): (status, body)."""
        token = next(line.split(":", 1)[1].strip() for line in self.kubeconfig.read_text().splitlines()
                     if line.strip().startswith("token:"))
        req = urllib.request.Request(self.url + path, method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def pod_path(self, name: str = "", namespace: str | None = None, kind: str = "pods") -> str:
        group = "apis/networking.k8s.io/v1" if kind == "networkpolicies" else "api/v1"
        return f"/{group}/namespaces/{namespace or self.namespace}/{kind}" + (f"/{name}" if name else "")

    def fault(self, **faults) -> dict:
        """throttle=N, retry_after=S, errors=N, error_code=C, refuse_watches=N, cut_watches=True, compact=True,
        slow_lists=S (the next list is answered S seconds after it was read)"""
        return self._call("POST", "/_fake/faults", faults)

    def stats(self) -> dict:
        return self._call("GET", "/_fake/stats")

    def ready_times(self) -> dict[str, float]:
        """The instant kubelet's pod name -> time.time() the pod turned Ready."""
        return self._call("GET", "/_fake/ready_times")

    def reset_stats(self) -> None:
        self._call("DELETE", "/_fake/stats")

    def fail_pod(self, name: str, reason: str = "Evicted", message: str = "fake: the node ran out of memory",
                 namespace: str | None = None) -> dict:
        return self._call("POST", f"/_fake/pods/{namespace or self.namespace}/{name}/fail",
                          {"reason": reason, "message": message})

    def wait_for(self, predicate, timeout: float = 10.0, interval: float = 0.05):
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value or time.monotonic() > deadline:
                return value
            time.sleep(interval)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc.stdout:
            self.proc.stdout.close()
        self._log.close()
