"""`SandboxSpec.disk`: a sandbox's writable disk space, held where the backend can hold it
(local: the loop-mounted workdir and the /tmp tmpfs; kubernetes: the pod's ephemeral-storage
limit; docker: the container's storage size, where the storage driver has quotas) and refused
with the reason where it cannot."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from orchard_gym.backends.docker import storage_quota_reason
from orchard_gym.client import SandboxClient
from orchard_gym.errors import InvalidRequest
from orchard_gym.models import SandboxSpec
from orchard_gym.pool import match_key

from conftest import DOCKER_IMAGES, docker_engine, fake_k8s_unavailable, needs, needs_bwrap

_GATEWAY, _WHY_NOT = docker_engine()
MB = 1 << 20


@pytest.mark.parametrize("bad", ["lots", "", "-5m", 0, -1, True, "10 parsecs", 1.5, 1, "1k", "15m", "2t"])
def test_garbage_disk_sizes_are_refused(bad):
    with pytest.raises(ValidationError, match="disk"):
        SandboxSpec(disk=bad)


def test_a_disk_limited_spec_never_takes_a_pooled_sandbox():
    # pooled sandboxes are made without one: serving a disk-limited spec from them would drop the limit
    assert match_key(SandboxSpec(image="x")) is not None
    assert match_key(SandboxSpec(image="x", disk="1g")) is None


def test_the_docker_engines_storage_driver_decides():
    assert storage_quota_reason({"Driver": "overlay2", "DriverStatus": [["Backing Filesystem", "xfs"]]}) is None
    assert storage_quota_reason({"Driver": "btrfs"}) is None
    said = storage_quota_reason({"Driver": "overlay", "DriverStatus": [["Backing Filesystem", "extfs"]]})
    assert "overlay on extfs" in said and "XFS" in said and "pquota" in said
    for garbage in ({}, {"Driver": None, "DriverStatus": "nonsense"}, {"Driver": "vfs", "DriverStatus": [[1]]}):
        assert "cannot cap" in storage_quota_reason(garbage) or "unknown" in storage_quota_reason(garbage)


@needs_bwrap
def test_local_disk_caps_the_workdir_and_tmp_and_without_it_the_write_fits(local_root):
    """Red team: a sandbox asking for 32 MB writes 48 MB in its workdir and in /tmp and gets
    ENOSPC; a sandbox of the same backend without `disk` (the 10 GB default workdir, 1 GB
    /tmp) writes the same. Without the spec's disk reaching the workdir, the first write fits."""
    with SandboxClient({"type": "local", "root": str(local_root), "isolation": "bwrap"}) as client:
        assert client.backend.disk_limit_unavailable() is None
        with client.create_sandbox(disk="32m") as box:
            work = box.exec("head -c 48m /dev/zero > fill")
            assert work.exit_code != 0 and "No space left on device" in work.stderr, work
            tmp = box.exec("head -c 48m /dev/zero > /tmp/fill")
            assert tmp.exit_code != 0 and "No space left on device" in tmp.stderr, tmp
            assert int(box.exec("df -B1 --output=size . | tail -1").stdout) <= 32 * MB
            assert box.exec("rm -f fill && head -c 8m /dev/zero > fill").exit_code == 0  # usable within it
            said = box.resources()
            assert said["sizes"] == {"workdir_bytes": 32 * MB, "tmp_bytes": 32 * MB}, said
            assert said["enforced_by"]["workdir"].startswith("loop-mounted ext4")
        with client.create_sandbox() as plain:
            assert plain.exec("head -c 48m /dev/zero > fill && head -c 48m /dev/zero > /tmp/fill").exit_code == 0


def test_local_without_isolation_refuses_a_disk_limit(local_root):
    with SandboxClient({"type": "local", "root": str(local_root), "isolation": "none"}) as client:
        assert "isolation='none'" in client.backend.disk_limit_unavailable()
        with pytest.raises(InvalidRequest, match="disk='64m' cannot be held on the local backend: isolation='none'"):
            client.create_sandbox(disk="64m")
        assert not client.list_sandboxes()


@pytest.mark.docker
@needs("docker", None if _GATEWAY else _WHY_NOT)
def test_docker_holds_the_disk_or_refuses_it_with_the_engines_reason():
    with SandboxClient({"type": "docker"}) as client:
        why = client.backend.disk_limit_unavailable()
        if why is not None:  # this machine's Podman: overlay on ext4, which has no quotas
            with pytest.raises(InvalidRequest, match="cannot be held on the docker backend: the engine's storage"):
                client.create_sandbox(image=DOCKER_IMAGES["busybox"], disk="64m")
            assert not client.list_sandboxes()
            return
        with client.create_sandbox(image=DOCKER_IMAGES["busybox"], disk="64m") as box:  # an engine with quotas
            r = box.exec("head -c 96m /dev/zero > /fill")
            assert r.exit_code != 0 and "No space left on device" in r.stderr, r


@pytest.mark.kubernetes
@needs("kubernetes", fake_k8s_unavailable())
def test_kubernetes_disk_is_the_pods_ephemeral_storage_limit(fake_k8s):
    """Through the fake API server (real wire protocol): the pod as stored carries the limit
    (a real kubelet evicts the pod past it; the fake one does not enforce it)."""
    with SandboxClient(fake_k8s.backend_config(security="restricted")) as client:
        assert client.backend.disk_limit_unavailable() is None
        with client.create_sandbox(image=DOCKER_IMAGES["busybox"], disk="64m") as box:
            _, pod = fake_k8s.kube("GET", fake_k8s.pod_path(box.record.details["pod"]))
            container = pod["spec"]["containers"][0]
            assert container["resources"]["limits"]["ephemeral-storage"] == str(64 * MB)
            workspace = next(v for v in pod["spec"]["volumes"] if v["name"] == "workspace")
            assert workspace["emptyDir"] == {"sizeLimit": str(64 * MB)}  # the workdir emptyDir counts too
            assert box.exec("echo ok").stdout == "ok\n"
        with client.create_sandbox(image=DOCKER_IMAGES["busybox"]) as plain:
            _, pod = fake_k8s.kube("GET", fake_k8s.pod_path(plain.record.details["pod"]))
            assert "ephemeral-storage" not in pod["spec"]["containers"][0]["resources"].get("limits", {})
