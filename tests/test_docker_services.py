"""Sidecar services of docker sandboxes (`SandboxSpec.services`, backends/docker_services.py)
against a real engine: reached by name, started in dependency order after their
healthchecks, removed with the sandbox, on a failed create and by the sweep of a dead
owner; bad specs refused, and refused on backends that cannot run them."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

import pytest

from conftest import DOCKER_IMAGES, docker_engine, needs, wait_until
from orchard_gym import ImageNotFound, InvalidRequest, SandboxClient
from orchard_gym.errors import BackendError

gateway, why_not = docker_engine()
pytestmark = [pytest.mark.docker, needs("docker", why_not)]
BUSYBOX = DOCKER_IMAGES["busybox"]


def web(name: str = "web", text: str = "hello", delay: float = 0, **extra) -> dict:
    """A busybox httpd answering `text` on port 8000 (after `delay` seconds)."""
    serve = f"sleep {delay}; mkdir -p /www && echo {text} > /www/index.html && exec httpd -f -p 8000 -h /www"
    check = {"test": ["wget", "-q", "-O-", "http://127.0.0.1:8000/"], "interval": 0.3, "timeout": 5, "retries": 60}
    return {"name": name, "image": BUSYBOX, "command": ["sh", "-c", serve], "healthcheck": check, **extra}


@pytest.fixture
def client():
    c = SandboxClient({"type": "docker", "pull": "never"})
    yield c
    c.close()


def leftovers(backend, sandbox_id: str) -> list[str]:
    """The sandbox's services, network and container that still exist."""
    api, p = backend.api, backend.config.label_prefix
    found = [c["Names"][0] for c in api.containers(all=True, filters={"label": f"{p}.sandbox={sandbox_id}"})]
    return found + [n["Name"] for n in api.networks(filters={"label": f"{p}.sandbox={sandbox_id}"})]


def test_services_are_reached_by_name_and_go_with_the_sandbox(client):
    relay = {"name": "relay", "image": BUSYBOX, "depends_on": {"web": "service_healthy"},
             "env": {"UPSTREAM": "web"},  # a service reaches the ones started before it by name
             "command": ["sh", "-c", "wget -q -O /tmp/got http://$UPSTREAM:8000/ && exec sleep 1000000"]}
    box = client.create_sandbox(image=BUSYBOX, services=[relay, web(text="from-web")])
    sid, backend = box.sandbox_id, client.backend
    try:
        assert box.record.details["services"] == ["relay", "web"]
        assert box.exec("wget -q -O- http://web:8000/").stdout == "from-web\n"
        name = f"{backend.config.label_prefix}-{sid}-relay"

        def relayed() -> bytes:  # the relay's wget may still be writing when the sandbox is up
            return backend.api.exec_start(backend.api.exec_create(name, ["cat", "/tmp/got"])["Id"])

        assert wait_until(lambda: relayed() == b"from-web\n", 30), relayed()
        assert len(leftovers(backend, sid)) == 4  # two services, the sandbox, its network
    finally:
        box.delete()
    assert leftovers(backend, sid) == []


def test_the_sandbox_starts_once_the_healthchecks_pass(client):
    started = time.monotonic()
    with client.create_sandbox(image=BUSYBOX, services=[web(delay=2)]) as box:
        took = time.monotonic() - started
        r = box.exec("wget -q -O- http://web:8000/")  # at once: no retry needed
        assert r.exit_code == 0 and r.stdout == "hello\n", r
    assert took >= 2


@pytest.mark.parametrize("service, error, said", [
    ({"name": "dies", "image": BUSYBOX, "command": ["false"]}, BackendError, "'dies' .* is not running"),
    (web(name="sick", healthcheck={"test": ["false"], "interval": 0.2, "timeout": 2, "retries": 2}),
     BackendError, "'sick' .* did not turn healthy"),
    ({"name": "ghost", "image": "localhost/orchard/no-such-image:1"}, ImageNotFound, "no-such-image"),
])
def test_a_failing_service_fails_the_create_and_leaves_nothing(client, service, error, said):
    sid = f"svc-{uuid.uuid4().hex[:10]}"
    with pytest.raises(error, match=said):  # after a first service that did start
        client.create_sandbox(image=BUSYBOX, sandbox_id=sid, services=[web(), service], timeout=60)
    assert leftovers(client.backend, sid) == []


def test_a_sandbox_whose_agent_fails_takes_its_services_down(client, monkeypatch):
    sid = f"svc-{uuid.uuid4().hex[:10]}"
    with pytest.raises(ImageNotFound):  # the services start, then the sandbox's own image is missing
        client.create_sandbox(image="localhost/orchard/no-such-image:2", sandbox_id=sid, services=[web()])
    assert leftovers(client.backend, sid) == []


@pytest.mark.parametrize("services, said", [
    ([{"name": "main", "image": BUSYBOX}], "not 'main'"),
    ([{"name": "Bad Name", "image": BUSYBOX}], "service name"),
    ([{"name": "a", "image": BUSYBOX}, {"name": "a", "image": BUSYBOX}], "listed twice"),
    ([{"name": "a", "image": BUSYBOX, "depends_on": {"nope": "service_started"}}], "depends on 'nope'"),
    ([{"name": "a", "image": BUSYBOX, "depends_on": {"b": "service_started"}},
      {"name": "b", "image": BUSYBOX, "depends_on": {"a": "service_healthy"}}], "cycle"),
    ([{"name": "a", "image": BUSYBOX, "privileged": True}], "privileged"),
    ([{"name": "a", "image": BUSYBOX, "depends_on": {"a": "service_completed_successfully"}}], "depends_on"),
    ([{"name": "a", "image": BUSYBOX, "healthcheck": {"test": []}}], "test"),
    ("not a list", "services"),
])
def test_bad_service_specs_are_refused(client, services, said):
    with pytest.raises(InvalidRequest, match=said):
        client.create_sandbox(image=BUSYBOX, services=services)


def test_backends_without_services_refuse_them(tmp_path):
    with SandboxClient({"type": "local", "root": str(tmp_path)}) as local:
        with pytest.raises(InvalidRequest, match="local backend cannot run services .*web.*docker backend"):
            local.create_sandbox(services=[{"name": "web", "image": BUSYBOX}])
        assert local.list_sandboxes() == []


def test_a_snapshot_of_a_sandbox_with_services_is_refused(client):
    with client.create_sandbox(image=BUSYBOX, services=[web()]) as box:
        with pytest.raises(InvalidRequest, match="has services"):
            box.snapshot()


def test_a_dead_owners_services_and_network_are_swept():
    """A process that made a sandbox with services and died without deleting it: the next
    backend's start-up sweep removes the services and the network with the sandbox."""
    code = (f"import os; from orchard_gym import SandboxClient; c = SandboxClient({{'type': 'docker'}}); "
            f"b = c.create_sandbox(image={BUSYBOX!r}, services=[{{'name': 'w', 'image': {BUSYBOX!r}, "
            f"'command': ['sleep', '1000000']}}]); print(b.sandbox_id, flush=True); os._exit(0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    sid = out.stdout.strip()
    assert sid, out.stderr[-2000:]
    with SandboxClient({"type": "docker"}) as c:
        assert leftovers(c.backend, sid) == [] and sid in c.backend.swept
