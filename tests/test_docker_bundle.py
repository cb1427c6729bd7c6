"""The docker backend's shared agent bundle (backends/docker_bundle.py) on a real engine:
one read-only volume per injector version that every sandbox mounts, filled once under
concurrent creates, refilled after a crashed filler, old versions swept, and no sandbox able
to change the bundle another one runs."""

from __future__ import annotations

import os
import threading
import uuid

import pytest

from conftest import DOCKER_IMAGES, INJECTOR_IMAGE, docker_engine, needs, remove_prefix_volumes
from orchard_gym import InvalidRequest, SandboxClient

gateway, why_not = docker_engine()
pytestmark = [pytest.mark.docker, needs("docker", why_not)]
BUSYBOX = DOCKER_IMAGES["busybox"]
BUNDLE_SUM = "cd /opt/orchard-agent && find . -type f | sort | xargs md5sum | md5sum"


def _bundle_mounts(backend, name: str) -> list[dict]:
    mounts = backend.api.inspect_container(name)["Mounts"]
    return [m for m in mounts if m["Destination"] == "/opt/orchard-agent"]


def test_sandboxes_share_one_read_only_bundle_none_can_change(tmp_path):
    with SandboxClient({"type": "docker"}) as client:
        backend = client.backend
        with client.create_sandbox(image=BUSYBOX) as a, client.create_sandbox(image=BUSYBOX) as b:
            ma = _bundle_mounts(backend, a.record.details["container"])
            mb = _bundle_mounts(backend, b.record.details["container"])
            assert len(ma) == len(mb) == 1 and ma[0]["Name"] == mb[0]["Name"]
            assert ma[0]["Name"] == backend.bundle.volume_name(backend.api.inspect_image(INJECTOR_IMAGE)["Id"])
            assert ma[0]["RW"] is False and mb[0]["RW"] is False
            before = b.exec(BUNDLE_SUM).stdout
            # root in sandbox a tries every way to change what b runs
            for attack in ("echo x > /opt/orchard-agent/agent/__main__.py", "rm -rf /opt/orchard-agent/lib",
                           "touch /opt/orchard-agent/new", "mount -o remount,rw /opt/orchard-agent",
                           "chmod 777 /opt/orchard-agent/bin/python3"):
                r = a.exec(attack)
                assert r.exit_code != 0, (attack, r)
            assert a.exec("cat /proc/mounts | grep ' /opt/orchard-agent '").stdout.split()[3].startswith("ro")
            assert b.exec(BUNDLE_SUM).stdout == before and before
            assert b.exec("echo still-fine").stdout == "still-fine\n"
            # a taken id is refused by the engine's name check, and the sandbox holding it is untouched
            with pytest.raises(InvalidRequest, match="already exists"):
                client.create_sandbox(image=BUSYBOX, sandbox_id=a.sandbox_id)
            assert a.exec("echo a-fine").stdout == "a-fine\n"


def test_concurrent_creates_fill_once_and_crashed_fill_is_redone():
    """Two backends (as two processes would) and 6 threads race to fill a fresh version's volume."""
    from orchard_gym.backends.docker import DockerBackend
    from orchard_gym.backends.config import DockerBackendConfig
    from orchard_gym.backends.docker_bundle import MARKER

    prefix = f"ogt-{uuid.uuid4().hex[:8]}"
    backends = [DockerBackend(DockerBackendConfig(label_prefix=prefix)) for _ in range(2)]
    api = backends[0].api
    info = api.inspect_image(INJECTOR_IMAGE)
    name = backends[0].bundle.volume_name(info["Id"])
    try:
        # a filler that crashed half-way: the volume exists, with junk and no marker
        api.create_volume(name, labels={backends[0].role_label: "bundle"})
        junk = api.create_container(BUSYBOX, entrypoint=["/bin/sh", "-c", "mkdir -p /v/lib && echo junk > /v/lib/junk"],
                                    host_config=api.create_host_config(binds={name: {"bind": "/v", "mode": "rw"}}))
        api.start(junk)
        assert api.wait(junk)["StatusCode"] == 0
        api.remove_container(junk)

        names, errors = [], []

        def ensure(backend):
            try:
                names.append(backend.bundle.ensure(info))
            except Exception as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=ensure, args=(backends[i % 2],)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors and names == [name] * 6
        vols = api.volumes(filters={"label": [f"{prefix}.role=bundle"]})["Volumes"]
        assert [v["Name"] for v in vols] == [name]
        assert not api.containers(all=True, filters={"name": f"{name}-fill"})  # fillers gone
        # a sandbox of that prefix runs from it; the junk is gone, the marker is there
        with SandboxClient({"type": "docker", "label_prefix": prefix}) as client:
            with client.create_sandbox(image=BUSYBOX) as box:
                r = box.exec(f"test ! -e /opt/orchard-agent/lib/junk && test -f /opt/orchard-agent/{MARKER} && echo ok")
                assert r.stdout == "ok\n", r
    finally:
        for v in api.volumes(filters={"label": [f"{prefix}.role=bundle"]})["Volumes"] or []:
            api.remove_volume(v["Name"], force=True)
        for b in backends:
            b.client.close()


def test_a_filled_volume_is_found_on_the_host_without_a_filler_container():
    """Each backend made (each client, each process) found the filled volume by starting a filler
    container that saw the marker and exited; on a local engine the marker is read on the host.
    A volume without the marker (a filler that crashed) is still filled."""
    from orchard_gym.backends.config import DockerBackendConfig
    from orchard_gym.backends.docker import DockerBackend
    from orchard_gym.backends.docker_bundle import MARKER

    prefix = f"ogt-{uuid.uuid4().hex[:8]}"
    backends = [DockerBackend(DockerBackendConfig(label_prefix=prefix)) for _ in range(3)]
    api = backends[0].api
    info = api.inspect_image(INJECTOR_IMAGE)
    fills: list[int] = []
    for i, backend in enumerate(backends):
        fill = backend.bundle._fill
        backend.bundle._fill = lambda *a, i=i, fill=fill: (fills.append(i), fill(*a))
    try:
        name = backends[0].bundle.ensure(info)
        assert fills == [0]
        assert backends[1].bundle.ensure(info) == name and fills == [0]  # read on the host: no filler
        os.remove(os.path.join(api.inspect_volume(name)["Mountpoint"], MARKER))  # as a crashed filler leaves it
        assert backends[2].bundle.ensure(info) == name and fills == [0, 2]
        assert os.path.isfile(os.path.join(api.inspect_volume(name)["Mountpoint"], MARKER))
    finally:
        remove_prefix_volumes(prefix)
        for b in backends:
            b.client.close()


def test_sweep_removes_bundles_of_gone_injector_versions_only():
    from orchard_gym.backends.docker import DockerBackend
    from orchard_gym.backends.config import DockerBackendConfig

    prefix = f"ogt-{uuid.uuid4().hex[:8]}"
    backend = DockerBackend(DockerBackendConfig(label_prefix=prefix))
    api = backend.api
    current = backend.bundle.ensure(api.inspect_image(INJECTOR_IMAGE))
    gone_id = "sha256:" + "0" * 64  # an injector image that no longer exists
    gone = backend.bundle.volume_name(gone_id)
    api.create_volume(gone, labels={backend.role_label: "bundle", f"{prefix}.bundle-image": gone_id})
    busy_id = "sha256:" + "1" * 64
    busy = backend.bundle.volume_name(busy_id)  # gone version, but a container still uses it
    api.create_volume(busy, labels={backend.role_label: "bundle", f"{prefix}.bundle-image": busy_id})
    user = api.create_container(BUSYBOX, command=["true"],
                                host_config=api.create_host_config(binds={busy: {"bind": "/b", "mode": "ro"}}))
    try:
        assert gone in backend._sweep()
        left = {v["Name"] for v in api.volumes(filters={"label": [f"{prefix}.role=bundle"]})["Volumes"]}
        assert left == {current, busy}
    finally:
        api.remove_container(user, force=True)
        for v in api.volumes(filters={"label": [f"{prefix}.role=bundle"]})["Volumes"] or []:
            api.remove_volume(v["Name"], force=True)
        backend.client.close()
