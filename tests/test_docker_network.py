"""Megabytes through a blocked docker sandbox after Kubernetes (fake kubelet) pods came and
went and other containers joined and left its bridge.

The stall this guards against (issue 11, "Stalled replies from docker sandboxes"): a Linux
bridge without an address of its own takes the lowest MAC of its ports, so it changes as
veths come and go. Unless the host announces the change (net.ipv4.conf.all.arp_notify=1,
set by scripts/setup_system.sh), a sandbox keeps sending to the old gateway MAC and a
reply in flight waits out TCP retransmit backoff (110 s measured by
scripts/stress_docker_network.py). So while the bridge's MAC changes under it the sandbox's
neighbour entry must follow, and the data must still arrive intact, without the sandbox
ever waiting out a retransmission timeout.
"""

from __future__ import annotations

import hashlib
import os
import threading
import uuid
from pathlib import Path

import pytest

from conftest import DOCKER_IMAGES, docker_engine, fake_k8s_unavailable, needs
from orchard_gym import SandboxClient
from orchard_gym.backends import host_guard

gateway, why_not = docker_engine()
k8s_why_not = fake_k8s_unavailable()
pytestmark = [pytest.mark.docker, pytest.mark.kubernetes,
              needs("docker", None if gateway else why_not), needs("kubernetes", k8s_why_not)]
BUSYBOX = DOCKER_IMAGES["busybox"]
MB = 2**20


ARP_NOTIFY = Path("/proc/sys/net/ipv4/conf/all/arp_notify")


def tcp_timeouts(box) -> int:
    """Retransmission timeouts that fired in the sandbox's network namespace (TcpExt)."""
    lines = box.exec("cat /proc/net/netstat").stdout.splitlines()
    for names, values in zip(lines, lines[1:]):
        if names.startswith("TcpExt:") and values.startswith("TcpExt:") and "TCPTimeouts" in names.split():
            return int(values.split()[names.split().index("TCPTimeouts")])
    raise AssertionError("no TCPTimeouts in /proc/net/netstat")


class Churn:
    """Replaces the one other container on the network again and again: the bridge's MAC
    (the lowest of its ports') changes whenever the old or the new one holds the lowest,
    and when it was the old one's, that MAC is gone from the bridge for good."""

    def __init__(self, api, network: str):
        self.api, self.network, self.cycles, self.errors = api, network, 0, []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self):
        holder = None
        while not self.stop.is_set():
            try:
                ctr = self.api.create_container(BUSYBOX, command=["sleep", "600"],
                                                labels={"orchard-net-test": self.network},
                                                host_config=self.api.create_host_config(network_mode=self.network))
                self.api.start(ctr)
                if holder is not None:
                    self.api.remove_container(holder, force=True)
                holder = ctr
                self.cycles += 1
            except Exception as e:  # pragma: no cover - reported by the test
                self.errors.append(e)
                self.stop.wait(1)

    def close(self):
        self.stop.set()
        self.thread.join(60)


@pytest.fixture
def own_network():
    """An internal network of this test's own: only our containers change its bridge."""
    name = f"orchard-net-{uuid.uuid4().hex[:8]}"
    yield name
    import docker

    from orchard_gym.backends.docker import default_base_url

    api = docker.APIClient(base_url=default_base_url())
    try:
        for c in api.containers(all=True, filters={"label": f"orchard-net-test={name}"}):
            api.remove_container(c["Id"], force=True)
        for config in api.inspect_network(name)["IPAM"]["Config"]:
            host_guard.remove(config["Subnet"])
        api.remove_network(name)
    except docker.errors.NotFound:
        pass
    finally:
        api.close()


def test_megabytes_each_way_after_kubernetes_pods_and_bridge_churn(fake_k8s, own_network):
    # what makes the stall rare is what makes it long: check the host setting that prevents it
    assert ARP_NOTIFY.read_text().strip() == "1", \
        "net.ipv4.conf.all.arp_notify is not 1: replies from sandboxes stall when a bridge's MAC changes; " \
        "run scripts/setup_system.sh"
    with SandboxClient(fake_k8s.backend_config(owner=f"t-{uuid.uuid4().hex[:10]}")) as k8s:
        for block in (True, False, True):  # pods on the kubelet's internal and open networks
            with k8s.create_sandbox(image=BUSYBOX, block_network=block) as pod:
                assert pod.exec("echo pod").stdout == "pod\n"

    with SandboxClient({"type": "docker", "network": own_network}) as client:
        with client.create_sandbox(image=BUSYBOX) as box:
            payload = os.urandom(4 * MB)
            timeouts = tcp_timeouts(box)
            churn = Churn(client.backend.api, own_network)
            try:
                for i in range(6):
                    box.upload_content(payload, f"up-{i}")  # the host sends
                    assert box.exec(f"md5sum up-{i}").stdout.split()[0] == hashlib.md5(payload).hexdigest()
                    assert box.download_content(f"up-{i}") == payload  # the sandbox sends
                    big = box.exec(f"head -c {3 * MB} /dev/zero | tr '\\0' x; rm up-{i}")  # a 3 MB exec reply
                    assert big.exit_code == 0 and big.stdout == "x" * (3 * MB)
            finally:
                churn.close()
            assert churn.cycles > 0 and not churn.errors, churn.errors
            # a stalled reply is one the sandbox had to resend on a timeout (fast retransmits are fine)
            assert tcp_timeouts(box) == timeouts
