"""Docker sandboxes seen from inside, as an attacker in one would see them: capabilities,
no-new-privileges, a process limit that bites, and a host guard that stops a blocked
sandbox from opening the host's services through its network's gateway."""

from __future__ import annotations

import socket
import threading
import uuid

import pytest

from conftest import DOCKER_IMAGES, docker_engine, needs, wait_until
from orchard_gym import SandboxClient
from orchard_gym.backends import host_guard
from orchard_gym.backends.config import DOCKER_CAPABILITIES
from orchard_gym.errors import BackendError

gateway, why_not = docker_engine()
pytestmark = [pytest.mark.docker, needs("docker", None if gateway else why_not)]
BUSYBOX, BOOKWORM = DOCKER_IMAGES["busybox"], DOCKER_IMAGES["bookworm"]

# bit numbers of linux/capability.h
CAP_BITS = {"CHOWN": 0, "DAC_OVERRIDE": 1, "DAC_READ_SEARCH": 2, "FOWNER": 3, "FSETID": 4, "KILL": 5, "SETGID": 6,
            "SETUID": 7, "SETPCAP": 8, "NET_BIND_SERVICE": 10, "NET_RAW": 13, "SYS_CHROOT": 18, "SYS_ADMIN": 21,
            "MKNOD": 27, "AUDIT_WRITE": 29, "SETFCAP": 31}


def status_field(box, name: str) -> str:
    for line in box.exec("cat /proc/self/status").stdout.splitlines():
        if line.startswith(name + ":"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"no {name} in /proc/self/status")


def test_capabilities_and_no_new_privileges_seen_from_inside():
    with SandboxClient({"type": "docker"}) as client, client.create_sandbox(image=BOOKWORM) as box:
        assert box.exec("id -u").stdout.strip() == "0"  # root in the task image, as SWE images need
        want = sum(1 << CAP_BITS[c] for c in DOCKER_CAPABILITIES)
        assert int(status_field(box, "CapEff"), 16) == want
        assert int(status_field(box, "CapBnd"), 16) == want  # nothing to regain either
        assert status_field(box, "NoNewPrivs") == "1"
        # what a root agent does still works: chown/chmod, dropping to another uid (as apt does)
        r = box.exec("touch f && chown 65534:65534 f && chmod 4755 f && stat -c '%u %g %a' f && "
                     "setpriv --reuid=65534 --regid=65534 --clear-groups id -u")
        assert r.exit_code == 0 and r.stdout.split() == ["65534", "65534", "4755", "65534"], r
        # and what it does not need is gone: device nodes, chroot
        assert box.exec("mknod /tmp/null c 1 3").exit_code != 0
        assert box.exec("chroot / true").exit_code != 0


def test_capabilities_are_configurable():
    with SandboxClient({"type": "docker", "capabilities": ["CAP_KILL"]}) as client:
        with client.create_sandbox(image=BUSYBOX) as box:
            assert int(status_field(box, "CapEff"), 16) == 1 << CAP_BITS["KILL"]
            assert box.exec("chown 65534 /workspace").exit_code != 0


def test_fork_loop_stops_at_the_pids_limit():
    limit = 40
    with SandboxClient({"type": "docker", "pids_limit": limit}) as client:
        with client.create_sandbox(image=BUSYBOX) as box:
            v1, v2 = "/sys/fs/cgroup/pids/pids.max", "/sys/fs/cgroup/pids.max"
            assert box.exec(f"cat {v2} 2>/dev/null || cat {v1}").stdout.strip() == str(limit)
            # each round forks one long sleep and records how many it got (echo is a builtin)
            loop = ("n=0; while [ $n -lt 500 ]; do sleep 4 </dev/null >/dev/null 2>&1 & n=$((n+1)); "
                    "echo $n > /tmp/forks; done; echo all-forked")
            r = box.exec(["busybox", "sh", "-c", loop], timeout=60)
            assert "all-forked" not in r.stdout and r.exit_code != 0
            assert "fork" in r.stderr, r.stderr
            # the agent recovers once the sleeps end; the count never got near 500
            assert wait_until(lambda: _exec_ok(box, "cat /tmp/forks"), 30)
            forks = int(box.exec("cat /tmp/forks").stdout)
            assert 0 < forks < limit


def _exec_ok(box, command: str) -> bool:
    try:
        return box.exec(command, timeout=10).exit_code == 0
    except Exception:
        return False


class _HostServer:
    """A TCP server on every host address (0.0.0.0, as careless services are) that says
    `reached` and counts who connected."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("0.0.0.0", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            with conn:
                conn.sendall(b"reached\n")

    def close(self):
        self.sock.close()


def _probe(box, address: str, port: int) -> str:
    return box.exec(f"nc -w 3 {address} {port} </dev/null", timeout=20).stdout


@pytest.fixture
def guard_network():
    """An internal network of this test's own, so its guard rules are ours to add and remove
    (other tests on this machine keep theirs on the default network)."""
    name = f"orchard-guard-{uuid.uuid4().hex[:8]}"
    yield name
    import docker

    from orchard_gym.backends.docker import default_base_url

    api = docker.APIClient(base_url=default_base_url())
    try:
        subnets = [c["Subnet"] for c in api.inspect_network(name)["IPAM"]["Config"]]
        for subnet in subnets:
            host_guard.remove(subnet)
        api.remove_network(name)
    except docker.errors.NotFound:
        pass
    finally:
        api.close()


def test_host_guard_stops_blocked_sandboxes_reaching_host_services(guard_network):
    server, allowed = _HostServer(), _HostServer()
    try:
        base = {"type": "docker", "network": guard_network}
        with SandboxClient({**base, "host_guard": False}) as client, client.create_sandbox(image=BUSYBOX) as box:
            host = box.record.details["host_address"]
            subnet = client.backend.api.inspect_network(guard_network)["IPAM"]["Config"][0]["Subnet"]
            assert not host_guard.installed(subnet)
            assert client.backend.resources()["host_guard"] == "off"
            assert "reached" in _probe(box, host, server.port)  # the hole: the host through the gateway
            assert server.accepted == 1
        with SandboxClient({**base, "host_guard_allow_ports": [allowed.port]}) as client:
            with client.create_sandbox(image=BUSYBOX) as box:
                assert host_guard.installed(subnet)
                assert client.backend.resources()["host_guard"] == f"installed for {subnet}"
                assert "reached" not in _probe(box, host, server.port)
                assert server.accepted == 1  # refused before any connection was accepted
                assert "reached" in _probe(box, host, allowed.port)  # the allowed port still works
                assert box.exec("echo agent-still-reachable").stdout == "agent-still-reachable\n"
        with SandboxClient(base) as client:  # a second backend adds nothing twice
            client.create_sandbox(image=BUSYBOX).delete()
            listed = host_guard._run(host_guard._iptables(subnet), "-S", host_guard.CHAIN).stdout
            assert listed.count(f"-s {subnet} -p tcp -m tcp --tcp-flags") == 1, listed
            assert listed.count(f"-s {subnet} -p tcp -m tcp --dport {allowed.port} ") == 1, listed
    finally:
        server.close()
        allowed.close()


def test_host_guard_rules_refuse_garbage():
    for bad in ("not-a-subnet", "10.0.0.0/33", "10.0.0.0/8; reboot"):
        with pytest.raises(ValueError):
            host_guard.rules(bad, [])


def test_host_guard_that_cannot_be_installed_is_a_clear_error(monkeypatch, guard_network):
    import os

    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # as a non-root user would be
    with SandboxClient({"type": "docker", "network": guard_network}) as client:
        with pytest.raises(BackendError, match="host_guard=false"):
            client.create_sandbox(image=BUSYBOX, sandbox_id=f"guard-{uuid.uuid4().hex[:8]}")
        assert not client.list_sandboxes()  # nothing left behind


def test_arp_notify_off_is_warned(monkeypatch, tmp_path, caplog):
    from orchard_gym.backends import docker as docker_backend

    flag = tmp_path / "arp_notify"
    monkeypatch.setattr(docker_backend, "_warned", set())
    monkeypatch.setattr(docker_backend, "ARP_NOTIFY", str(flag))
    flag.write_text("1\n")
    assert docker_backend.warn_network_sysctls() is None
    flag.write_text("0\n")
    with caplog.at_level("WARNING", logger="orchard_gym.backends.docker"):
        assert "setup_system.sh" in docker_backend.warn_network_sysctls()
        docker_backend.warn_network_sysctls()
    assert sum("arp_notify" in r.getMessage() for r in caplog.records) == 1  # once per process


def test_a_blocked_sandbox_and_its_services_cannot_reach_host_services():
    """A blocked sandbox with services (docker_services.py) is on a network of its own: the host
    guard must cover that network's subnet too, for the sandbox and its services alike, and go
    with the network. With host_guard off the same probes reach the host (the hole it closes)."""
    server = _HostServer()
    sidecar = {"name": "side", "image": BUSYBOX, "command": ["sleep", "1000000"]}
    try:
        with SandboxClient({"type": "docker", "host_guard": False}) as client:
            with client.create_sandbox(image=BUSYBOX, services=[sidecar]) as box:
                host = box.record.details["host_address"]
                assert "reached" in _probe(box, host, server.port)
        opened = server.accepted
        with SandboxClient({"type": "docker"}) as client:
            with client.create_sandbox(image=BUSYBOX, services=[sidecar]) as box:
                api, host = client.backend.api, box.record.details["host_address"]
                network = api.inspect_network(f"orchard-gym-{box.sandbox_id}")
                subnet = network["IPAM"]["Config"][0]["Subnet"]
                assert "reached" not in _probe(box, host, server.port)
                assert network["Internal"] and host_guard.installed(subnet)
                side = api.exec_create(f"orchard-gym-{box.sandbox_id}-side",
                                       ["nc", "-w", "3", host, str(server.port)])
                assert b"reached" not in api.exec_start(side["Id"])  # the service is guarded too
                assert server.accepted == opened
                assert box.exec("cat /proc/net/route | awk '$2 == \"00000000\"' | wc -l").stdout.strip() == "0"
            assert not host_guard.installed(subnet)  # the rules went with the network
    finally:
        server.close()
