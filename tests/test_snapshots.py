"""Snapshots (docs/snapshots.md): fork correctness per backend, and garbage input."""

from __future__ import annotations

import os
import signal

import httpx
import pytest

from components import needs, require_module
from conftest import DOCKER_IMAGES, docker_engine, fake_k8s_unavailable, needs_bwrap, wait_until
from orchard_gym import InvalidRequest, SandboxClient, SandboxFailed, SandboxNotFound, SnapshotNotFound
from snapshot_checks import check_fork_correctness


@needs_bwrap
def test_local_forks_are_independent_copies(local_root):
    with SandboxClient({"type": "local", "root": str(local_root), "isolation": "bwrap"}) as client:
        check_fork_correctness(client)
        # a sandbox cannot see the snapshot store (it lives under the root bubblewrap hides)
        box = client.create_sandbox()
        box.exec("pwd > where")
        snap = box.snapshot()
        assert box.exec(f"ls {local_root}/.snapshots/{snap.snapshot_id}").exit_code != 0
        assert box.exec(f"ls {local_root}/.layers").exit_code != 0  # nor the layers (root: overlay snapshots)
        assert (local_root / ".snapshots" / snap.snapshot_id / "meta.json").is_file()
        # a fork sees its own folder at the snapshot's path: absolute paths written before still hold
        fork = client.create_sandbox(from_snapshot=snap.snapshot_id)
        assert fork.workdir == box.workdir != fork.record.details["host_workdir"]
        assert fork.exec("pwd; cat where").stdout == f"{box.workdir}\n{box.workdir}\n"
        fork.exec("echo mine > f")
        assert not os.path.exists(f"{box.workdir}/f") and box.exec("ls f").exit_code != 0
        fork2 = client.create_sandbox(from_snapshot=snap.snapshot_id)  # twice the same path, two folders
        assert fork2.exec("ls f").exit_code != 0
    # the client that took it is closed: its snapshots went with it
    assert not (local_root / ".snapshots" / snap.snapshot_id).exists()


def test_snapshot_garbage_gets_clear_errors(local_root):
    with SandboxClient({"type": "local", "root": str(local_root), "isolation": "none"}) as client:
        box = client.create_sandbox()
        box.exec("echo x > f")
        for bad in ("../../etc", "snap-../../x", "snap-0123", "", "SNAP-0123456789abcdef", "snap-0123456789abcdeg"):
            with pytest.raises(InvalidRequest, match="snapshot id"):
                client.create_sandbox(from_snapshot=bad)
            with pytest.raises(SnapshotNotFound):
                client.delete_snapshot(bad)
        with pytest.raises(SnapshotNotFound, match="snap-0123456789abcdef"):
            client.create_sandbox(from_snapshot="snap-0123456789abcdef")
        assert [r.sandbox_id for r in client.list_sandboxes()] == [box.sandbox_id]  # nothing half-made
        with pytest.raises(SandboxNotFound):
            client._loop.run(client._async._control.snapshot("sb-missing"))
        with pytest.raises(SandboxNotFound):
            client._loop.run(client._async._control.snapshot("../" + box.sandbox_id))
        snap = box.snapshot()
        os.kill(box.record.details["pid"]["pid"], signal.SIGKILL)  # a dead sandbox, its folder left
        wait_until(lambda: box.refresh().status == "failed", timeout=10)
        with pytest.raises(SandboxFailed, match="not running"):
            box.snapshot()
        fork = client.create_sandbox(from_snapshot=snap.snapshot_id)  # the snapshot outlives it
        assert fork.exec("cat f").stdout == "x\n"


def test_remote_forks_and_garbage_over_the_api(remote_orchestrator):
    require_module("server", "fastapi")
    with SandboxClient(base_url=remote_orchestrator.url, api_key=remote_orchestrator.api_key) as client:
        check_fork_correctness(client)
        with pytest.raises(InvalidRequest, match="snapshot id"):
            client.create_sandbox(from_snapshot="../../etc")
        with pytest.raises(SnapshotNotFound):
            client.create_sandbox(from_snapshot="snap-0123456789abcdef")
        with pytest.raises(SnapshotNotFound):
            client.delete_snapshot("snap-../../x")
        with pytest.raises(SandboxNotFound):
            client._loop.run(client._async._control.snapshot("no-such-box"))
    headers = {"X-API-Key": remote_orchestrator.api_key}
    for bad in ("snap-..", "%2e%2e", "%00", "snap-0123456789ABCDEF", "x" * 300):  # past the client's checks
        r = httpx.delete(f"{remote_orchestrator.url}/snapshots/{bad}", headers=headers)
        assert (r.status_code, r.json()["error"]) == (404, "SnapshotNotFound"), r.text


_gateway, _why_no_docker = docker_engine()


@needs("docker", _why_no_docker)
def test_docker_forks_are_independent_containers():
    with SandboxClient({"type": "docker"}) as client:
        backend = client.backend

        def check_image(snap, fork):
            image = backend.api.inspect_image(f"{backend.snapshots.repo}:{snap.snapshot_id}")
            assert image["Config"]["Labels"][backend.token_label] == ""  # the parent's agent token is not in it
            assert snap.image == fork.record.image == DOCKER_IMAGES["busybox"]
            with pytest.raises(InvalidRequest, match="is of image"):
                client.create_sandbox(DOCKER_IMAGES["bookworm"], from_snapshot=snap.snapshot_id)
            mounts = backend.api.inspect_container(fork.record.details["container"])["Mounts"]
            agent = next(m for m in mounts if m["Destination"] == "/opt/orchard-agent")
            assert agent["Name"].startswith("orchard-gym-bundle-") and not agent["RW"]  # the shared bundle

        def check_graveyard(snap):
            # deleted while its forks run on it, the image was only untagged (to the graveyard), and no
            # sweep can remove it yet. Checked here: once they are gone, any docker backend starting
            # on this host (a documented example's, say) may sweep it first
            assert any(i["Config"]["Labels"].get(backend.role_label) == "snapshot"
                       for i in map(backend.api.inspect_image, _graveyard(backend)))
            assert backend.snapshots.graveyard + ":" + snap.snapshot_id in _graveyard(backend)
            client._loop.run(backend.sweep())  # in use: kept
            assert backend.snapshots.graveyard + ":" + snap.snapshot_id in _graveyard(backend)

        check_fork_correctness(client, DOCKER_IMAGES["busybox"], outside="/etc/marker", hook=check_image,
                               deleted_hook=check_graveyard)
        client._loop.run(backend.sweep())  # now nothing uses it: swept (if no other backend did first)
        assert _graveyard(backend) == []


def _graveyard(backend) -> list[str]:
    return [t for i in backend.api.images(filters={"label": [f"{backend.owner_label}={backend.owner}"]})
            for t in i.get("RepoTags") or [] if t.startswith(backend.snapshots.graveyard + ":")]


@needs("kubernetes", fake_k8s_unavailable())
def test_kubernetes_forks_unpack_the_workdir_tarball(fake_k8s, tmp_path):
    store = tmp_path / "k8s-snapshots"
    with SandboxClient(fake_k8s.backend_config(snapshot_dir=str(store))) as client:
        def check_pod(snap, fork):
            status, pod = fake_k8s.kube("GET", fake_k8s.pod_path(fork.record.details["pod"]))
            inits = [c["name"] for c in pod["spec"]["initContainers"]]
            assert status == 200 and inits == ["inject-agent", "restore-snapshot"], inits
            assert (store / f"{snap.snapshot_id}.tgz").stat().st_size == snap.size_bytes > 0

        check_fork_correctness(client, DOCKER_IMAGES["busybox"], hook=check_pod)
        assert sorted(p.name for p in store.iterdir()) == []  # deleted: tarball and record
