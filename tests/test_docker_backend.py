"""The docker backend against a real engine (Podman's Docker API in CI): what the
conformance suite cannot see from outside — injection into an image without Python,
limits and network blocking seen from inside, image errors, sweeps, leftovers."""

from __future__ import annotations

import asyncio
import subprocess
import uuid

import pytest

from conftest import DOCKER_IMAGES, docker_engine, needs, remove_prefix_volumes, wait_until
from orchard_gym import ImageNotFound, InvalidRequest, SandboxClient
from orchard_gym.backends.config import DockerBackendConfig, parse_backend_config
from orchard_gym.errors import BackendError, OrchardError

gateway, why_not = docker_engine()
pytestmark = [pytest.mark.docker, needs("docker", why_not)]
BUSYBOX = DOCKER_IMAGES["busybox"]


@pytest.fixture
def client():
    c = SandboxClient({"type": "docker"})
    yield c
    c.close()


def leftovers(backend, sandbox_id: str) -> list[str]:
    """Names of the sandbox's container (and the per-sandbox volume of earlier versions) that still exist."""
    import docker

    name, found = backend._name(sandbox_id), []
    for kind, obj in (("container", name), ("volume", name)):
        try:
            (backend.api.inspect_container if kind == "container" else backend.api.inspect_volume)(obj)
            found.append(f"{kind} {obj}")
        except docker.errors.NotFound:
            pass
    return found


def test_agent_runs_in_an_image_without_python(client):
    with client.create_sandbox(image=BUSYBOX) as box:
        assert box.exec("which python3").exit_code != 0
        assert box.exec("ls /usr/lib /lib 2>/dev/null | wc -l").stdout.strip() == "0"  # no libc either
        r = box.exec(["busybox", "sh", "-c", "echo $((6*7)) $ORCHARD_SANDBOX; pwd"])
        assert r.exit_code == 0 and r.stdout == f"42 {box.sandbox_id}\n/workspace\n"
        # the agent's token is not passed on to commands
        assert "ORCHARD_AGENT_TOKEN" not in box.exec("env").stdout
        # the bundle is mounted read-only
        assert box.exec("touch /opt/orchard-agent/x").exit_code != 0


def _cgroup(box, v2: str, v1: str) -> str:
    return box.exec(f"cat /sys/fs/cgroup/{v2} 2>/dev/null || cat /sys/fs/cgroup/{v1}").stdout.split()


def test_cpu_and_memory_limits_seen_from_inside(client):
    with client.create_sandbox(image=BUSYBOX, cpu=0.5, memory="96m") as box:
        mem = _cgroup(box, "memory.max", "memory/memory.limit_in_bytes")
        assert mem == [str(96 * 2**20)]
        cpu = _cgroup(box, "cpu.max", "cpu/cpu.cfs_quota_us /sys/fs/cgroup/cpu/cpu.cfs_period_us")
        assert int(cpu[0]) / int(cpu[1]) == 0.5
        # and it bites: a busy loop gets at most half a core. (An upper bound holds however loaded
        # the machine is; counting throttled periods does not, when the loop barely runs.)
        usage = ("if [ -f /sys/fs/cgroup/cpu.stat ]; then grep usage_usec /sys/fs/cgroup/cpu.stat | cut -d' ' -f2; "
                 "else expr $(cat /sys/fs/cgroup/cpuacct/cpuacct.usage) / 1000; fi")  # cgroup v2, else v1
        loop = "s=$(date +%s); e=$((s + 3)); while [ $(date +%s) -lt $e ]; do :; done"
        r = box.exec(f"{usage}; cut -d' ' -f1 /proc/uptime; {loop}; {usage}; cut -d' ' -f1 /proc/uptime", timeout=30)
        u0, t0, u1, t1 = r.stdout.split()
        used_us, wall_us = int(u1) - int(u0), (float(t1) - float(t0)) * 1e6
        assert 0 < used_us <= 0.6 * wall_us, (used_us, wall_us)
    with client.create_sandbox(image=BUSYBOX) as box:  # no limits asked, none set
        quota = _cgroup(box, "cpu.max", "cpu/cpu.cfs_quota_us")[0]
        assert quota in ("max", "-1")


def test_network_blocked_from_inside(client):
    no_default_route = "! grep -q '^[a-z0-9]*\t00000000\t' /proc/net/route"
    with client.create_sandbox(image=BUSYBOX) as box:
        assert box.exec(no_default_route).exit_code == 0, box.exec("cat /proc/net/route").stdout
        r = box.exec(f"nc -w 2 {gateway} 1 </dev/null", timeout=20)  # the engine's routed bridge
        assert r.exit_code != 0 and "unreachable" in r.stderr.lower()
        assert box.record.details["host_address"] != gateway
    with client.create_sandbox(image=BUSYBOX, block_network=False) as box:
        assert box.exec(no_default_route).exit_code == 1
    network = client.backend.api.inspect_network(client.backend.config.network)
    assert network["Internal"] is True


def test_reach_by_published_loopback_port():
    with SandboxClient({"type": "docker", "reach": "port"}) as client:
        with client.create_sandbox(image=BUSYBOX, block_network=False) as box:
            assert box.record.endpoint.base_url.startswith("http://127.0.0.1:")
            assert box.exec("echo via-port").stdout == "via-port\n"
        with pytest.raises(InvalidRequest, match="block_network=False"):
            client.create_sandbox(image=BUSYBOX)


@pytest.mark.parametrize("pull", ["never", "if-missing"])
def test_missing_image_is_named(pull):
    image = "localhost/orchard/no-such-image:v1"
    with SandboxClient({"type": "docker", "pull": pull}) as client:
        with pytest.raises(ImageNotFound, match="no-such-image:v1") as err:
            client.create_sandbox(image=image, sandbox_id=f"missing-{pull}")
        assert ("'never'" in str(err.value)) == (pull == "never")
        assert not leftovers(client.backend, f"missing-{pull}")


def test_missing_injector_image_is_named():
    with SandboxClient({"type": "docker", "pull": "never", "injector_image": "localhost/nope/injector"}) as client:
        with pytest.raises(ImageNotFound, match="localhost/nope/injector.*build_injector_image"):
            client.create_sandbox(image=BUSYBOX)


def test_delete_leaves_no_container_or_volume(client):
    box = client.create_sandbox(image=BUSYBOX)
    assert leftovers(client.backend, box.sandbox_id) == [f"container {client.backend._name(box.sandbox_id)}"]
    box.delete()
    assert not leftovers(client.backend, box.sandbox_id)
    assert client.backend._destroy(client.backend._name(box.sandbox_id)) is False


@pytest.mark.parametrize("lost", [1, 2])
def test_a_container_the_engine_loses_while_starting_is_made_again_once(client, lost):
    """Podman 4.3, under concurrent creates, has answered a fresh container's start with "no such
    container". Here the container really is removed between create and start (the same answer
    from the real engine): once is retried, twice is a BackendError; nothing is left behind."""
    backend = client.backend
    real_start, removed = backend.api.start, []

    def start_after_removal(name, *args, **kwargs):
        if len(removed) < lost and not name.endswith("-fill"):  # a sandbox's, not the bundle filler's
            backend.api.remove_container(name, force=True)
            removed.append(name)
        return real_start(name, *args, **kwargs)

    backend.api.start = start_after_removal
    try:
        if lost == 1:
            with client.create_sandbox(image=BUSYBOX) as box:
                assert box.exec("echo up").stdout == "up\n"
            assert len(removed) == 1 and not leftovers(backend, box.sandbox_id)
        else:
            with pytest.raises(BackendError, match="lost the container of a new sandbox twice"):
                client.create_sandbox(image=BUSYBOX, sandbox_id="lost-twice")
            assert not leftovers(backend, "lost-twice")
    finally:
        backend.api.start = real_start


def test_a_bundle_filler_the_engine_loses_is_made_again_once():
    """The same Podman answer for the agent bundle's filler container (started by a backend's
    first create): the create is made once more, and the sandbox works."""
    with SandboxClient({"type": "docker"}) as fresh:  # its first create fills the bundle volume
        backend = fresh.backend
        # as with a remote engine: the marker is not read on this host, a filler container checks
        backend.bundle._filled_seen_from_host = lambda name: False
        real_start, removed = backend.api.start, []

        def start_after_removal(name, *args, **kwargs):
            if not removed and name.endswith("-fill"):
                backend.api.remove_container(name, force=True)
                removed.append(name)
            return real_start(name, *args, **kwargs)

        backend.api.start = start_after_removal
        try:
            with fresh.create_sandbox(image=BUSYBOX) as box:
                assert box.exec("echo up").stdout == "up\n"
        finally:
            backend.api.start = real_start
        assert len(removed) == 1 and not leftovers(backend, box.sandbox_id)


def test_failed_container_says_why(client):
    box = client.create_sandbox(image=BUSYBOX)
    with pytest.raises(OrchardError):  # a typed error, whichever the race gives
        box.exec("kill -9 $PPID", timeout=5)
    wait_until(lambda: box.refresh().status == "failed", 10)  # the engine notices the exit
    record = box.refresh()
    assert record.status == "failed" and "with code" in record.error, record.error
    box.delete()


def test_another_process_adopts_a_sandbox(client):
    box = client.create_sandbox(image=BUSYBOX, labels={"task": "t1"}, env={"TASK": "t1"})
    with SandboxClient({"type": "docker"}) as other:
        same = other.get_sandbox(box.sandbox_id)
        assert same.record.labels == {"task": "t1"} and same.record.env == {"TASK": "t1"}
        assert same.exec("echo $TASK").stdout == "t1\n"
    box.delete()


def test_sweep_removes_only_dead_owners():
    from orchard_gym.backends.docker import owner_identity

    # a label prefix of its own: the other backends on this machine sweep at start-up too
    config = {"type": "docker", "label_prefix": f"og-sweep-{uuid.uuid4().hex[:8]}"}
    creator = subprocess.Popen(["sleep", "60"])  # alive while it creates
    with SandboxClient(config) as orphaned, SandboxClient(config) as alive:
        # as if a client that has since died had created it (per-process: owner = creator)
        orphaned.backend.owner = orphaned.backend.identity = owner_identity(creator.pid)
        orphan = orphaned.create_sandbox(image=BUSYBOX)
        orphaned.backend.owner = orphaned.backend.identity = "other-host:x:1:1"  # a host we cannot judge
        foreign = orphaned.create_sandbox(image=BUSYBOX)
        kept = alive.create_sandbox(image=BUSYBOX)
        creator.kill()
        creator.wait()
        assert leftovers(alive.backend, orphan.sandbox_id)
        swept = parse_backend_config(config).get_backend().swept  # sweeps at start-up
        assert orphan.sandbox_id in swept and kept.sandbox_id not in swept and foreign.sandbox_id not in swept
        assert not leftovers(alive.backend, orphan.sandbox_id)
        assert kept.exec("echo alive").stdout == "alive\n"
        foreign.delete()
    assert remove_prefix_volumes(config["label_prefix"]) == []


def test_named_owner_outlives_its_creator_and_is_shared():
    """A restarted orchestrator replica (same `owner`, new process) must find its sandboxes,
    not sweep them because the process that made them is gone."""
    from orchard_gym.backends.docker import owner_identity

    dead = subprocess.Popen(["sleep", "60"])
    dead_identity = owner_identity(dead.pid)
    dead.kill()
    dead.wait()
    owner = f"t-{uuid.uuid4().hex[:10]}"
    with SandboxClient({"type": "docker", "owner": owner}) as first:
        first.backend.identity = dead_identity  # its creator has died since
        box = first.create_sandbox(image=BUSYBOX)
        try:
            assert box.record.details["owner"] == owner
            restarted = parse_backend_config({"type": "docker", "owner": owner}).get_backend()
            try:
                assert box.sandbox_id not in restarted.swept
                assert leftovers(restarted, box.sandbox_id)
                listed = asyncio.run(restarted.list())
                assert [r.sandbox_id for r in listed] == [box.sandbox_id]  # the replicas share the listing
                assert restarted.resources()["owner"] == owner
            finally:
                asyncio.run(restarted.aclose())
            with SandboxClient({"type": "docker"}) as per_process:  # another owner does not list it
                assert box.sandbox_id not in {r.sandbox_id for r in per_process.list_sandboxes()}
            assert box.exec("echo kept").stdout == "kept\n"
        finally:
            box.delete()


@pytest.mark.parametrize(
    "bad",
    [
        {"base_url": "ftp://engine"},
        {"agent_port": 0},
        {"agent_port": 70000},
        {"reach": "pigeon"},
        {"pull": "always"},
        {"label_prefix": "Bad Prefix"},
        {"network": "-bad"},
        {"workers": 0},
        {"workdir": "relative/dir"},
        {"api_timeout": -1},
        {"default_image": ""},
        {"no_such_option": 1},
        {"owner": "host:boot:1:2"},  # colons: it would look like a process identity
        {"owner": ""},
        {"capabilities": ["NOT_A_CAP"]},
        {"capabilities": "CHOWN"},
        {"pids_limit": 0},
        {"pids_limit": "many"},
        {"host_guard": "maybe"},
        {"host_guard_allow_ports": [0]},
        {"host_guard_allow_ports": [70000]},
    ],
)
def test_garbage_config_refused(bad):
    with pytest.raises(InvalidRequest):
        parse_backend_config({"type": "docker", **bad})


def test_unreachable_engine_and_routed_network_refused():
    with pytest.raises(BackendError, match="cannot reach the container engine"):
        DockerBackendConfig(base_url="unix:///nonexistent/docker.sock").get_backend()
    with SandboxClient({"type": "docker", "network": "bridge"}) as client:  # a routed network
        with pytest.raises(BackendError, match="not internal"):
            client.create_sandbox(image=BUSYBOX)


def test_the_engine_is_asked_its_version_once_per_process(monkeypatch):
    """Podman answers GET /version by running dpkg-query once per component (8 processes): a
    backend per episode made thousands. The answer is asked once (docker-py, given an API
    version, does not ask first) and kept per engine address; each later client speaks the API
    version it gave."""
    import docker

    from orchard_gym.backends import engine

    asked = []
    real = docker.api.client.APIClient.version

    def counting(api, *args, **kwargs):
        asked.append(api.base_url)
        return real(api, *args, **kwargs)

    monkeypatch.setattr(engine, "_versions", {})
    monkeypatch.setattr(docker.api.client.APIClient, "version", counting)
    backends = [DockerBackendConfig().get_backend() for _ in range(3)]
    try:
        # one request in all: our read of the whole answer (before it, docker-py's own negotiation made two)
        assert len(asked) == 1, asked
        api_version = backends[0].client.version()["ApiVersion"]
        assert {b.api._version for b in backends} == {api_version}
        assert len({b.engine for b in backends}) == 1 and "?" not in backends[0].engine
    finally:
        for b in backends:
            b.client.close()
