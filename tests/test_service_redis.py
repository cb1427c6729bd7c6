"""Several orchestrator replicas over one real Redis: shared records, jobs, locks and
events; a replica killed mid-exec loses nothing, and a restarted one picks up again."""

from __future__ import annotations

import shutil
import threading
import time
import uuid

import pytest
from service_helpers import Orchestrator, RedisServer, remove_all_sandboxes, short_root

from conftest import docker_engine, marked_pids, needs, remove_prefix_volumes, require, require_module, wait_until

require_module("redis", "redis")
require("redis", None if shutil.which("redis-server") else "redis-server is not installed (bash scripts/setup_system.sh)")

FAST = {"reconcile_interval": 0.3, "replica_ttl": 1.0, "lock_ttl": 1.0}


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.close()


gateway, why_not = docker_engine()
BACKENDS = [pytest.param("local", id="local"),
            pytest.param("docker", id="docker",
                         marks=[pytest.mark.docker, needs("docker", None if gateway else why_not)])]


@pytest.fixture(scope="module", params=BACKENDS)
def replicas(request, redis_server, tmp_path_factory):
    """Two replicas sharing one Redis and one backend: a local root, or the docker engine,
    where `orchard serve` gives both one owner (derived from the Redis URL) so that each
    lists the other's sandboxes and a restarted one sweeps none of them."""
    root = short_root("rds")
    logs = tmp_path_factory.mktemp("replica-logs")
    over = {}
    if request.param == "docker":  # a label prefix of its own: names cannot clash with other runs
        over = {"backend": "docker", "backend_config": {"label_prefix": f"og-rds-{uuid.uuid4().hex[:8]}"}}
    a = Orchestrator(root, log_dir=logs, redis_url=redis_server.url, replica_id="replica-a", **FAST, **over)
    b = Orchestrator(root, log_dir=logs, redis_url=redis_server.url, replica_id="replica-b", **FAST, **over)
    yield a, b
    a.stop()
    b.stop()
    if request.param == "docker":
        remove_docker_sandboxes(over["backend_config"]["label_prefix"])
        assert remove_prefix_volumes(over["backend_config"]["label_prefix"]) == []
    remove_all_sandboxes(root)
    shutil.rmtree(root, ignore_errors=True)


def remove_docker_sandboxes(prefix: str) -> None:
    """Delete what the replicas left on the engine (their sandboxes outlive them)."""
    from orchard_gym.backends.config import DockerBackendConfig

    backend = DockerBackendConfig(label_prefix=prefix).get_backend()
    try:
        for c in backend.api.containers(all=True, filters={"label": f"{prefix}.sandbox"}):
            backend._destroy(backend._name(c["Labels"][f"{prefix}.sandbox"]))
    finally:
        backend.client.close()


def test_created_through_one_replica_used_and_deleted_through_the_other(replicas):
    a, b = replicas
    with a.client() as on_a, b.client() as on_b:
        box = on_a.create_sandbox(sandbox_id="shared-one", labels={"who": "a"})
        # three reconciliation passes after the create (by the leader, whichever replica leads):
        # neither replica may fail the other's sandbox
        passes = lambda: a.reconcile_passes() + b.reconcile_passes()
        after = passes() + 3
        assert wait_until(lambda: passes() >= after, 30)
        same = on_b.get_sandbox("shared-one")
        assert same.status == "running" and same.record.labels == {"who": "a"}
        assert same.exec("echo via-b").stdout == "via-b\n"
        same.upload_content(b"payload", "f.bin")
        assert box.download_content("f.bin") == b"payload"  # written through b, read through a
        assert "shared-one" in {r.sandbox_id for r in on_a.list_sandboxes()}
        assert "shared-one" in {r.sandbox_id for r in on_b.list_sandboxes()}
        on_b.delete_sandbox("shared-one")
        with a.http() as http:
            assert http.get("/sandboxes/shared-one").status_code == 404
        assert wait_until(lambda: not marked_pids("ORCHARD_SANDBOX=shared-one"), 5)


def test_waits_are_woken_across_replicas(replicas):
    a, b = replicas
    with a.http() as ha, b.http() as hb:
        sid = ha.post("/sandboxes", json={}).json()["sandbox_id"]
        assert hb.get(f"/sandboxes/{sid}/wait", params={"timeout": 30}).json()["status"] == "running"
        job = ha.post(f"/sandboxes/{sid}/exec", json={"command": "sleep 0.5; echo hi"}).json()
        started = time.monotonic()
        done = hb.get(f"/jobs/{job['job_id']}/wait", params={"timeout": 10}).json()
        assert done["stdout"] == "hi\n" and time.monotonic() - started < 5  # woken, not the 10 s timeout (1.5 s flaked under load)
        ha.delete(f"/sandboxes/{sid}")


def test_execs_on_one_sandbox_are_serialised_across_replicas(replicas):
    a, b = replicas
    with a.http() as ha, b.http() as hb:
        sid = ha.post("/sandboxes", json={}).json()["sandbox_id"]
        ha.get(f"/sandboxes/{sid}/wait", params={"timeout": 30})
        cmd = "date +%s.%N; sleep 0.4; date +%s.%N"
        jobs = [h.post(f"/sandboxes/{sid}/exec", json={"command": cmd}).json()["job_id"] for h in (ha, hb, ha, hb)]
        spans = sorted(tuple(map(float, ha.get(f"/jobs/{j}/wait", params={"timeout": 20}).json()["stdout"].split()))
                       for j in jobs)
        assert all(later[0] >= earlier[1] for earlier, later in zip(spans, spans[1:])), spans
        hb.delete(f"/sandboxes/{sid}")


def test_replica_killed_mid_exec_loses_no_record_and_restarts(replicas):
    a, b = replicas
    with a.http() as ha:
        sid = ha.post("/sandboxes", json={"sandbox_id": "mid-exec"}).json()["sandbox_id"]
        ha.get(f"/sandboxes/{sid}/wait", params={"timeout": 30})
        job = ha.post(f"/sandboxes/{sid}/exec", json={"command": "sleep 1; echo finished > out.txt"}).json()
        # the command is running on replica a
        assert wait_until(lambda: ha.get(f"/jobs/{job['job_id']}").json()["status"] == "running", 10)
    a.kill()  # SIGKILL mid-exec
    try:
        with b.http() as hb:
            record = hb.get(f"/sandboxes/{sid}")
            assert record.status_code == 200 and record.json()["status"] == "running"
            # the job's replica is gone: the reconciler on b fails it instead of leaving it "running"
            failed = hb.get(f"/jobs/{job['job_id']}/wait", params={"timeout": 10}).json()
            assert failed["status"] == "failed" and "replica-a" in failed["error"]
            # the lock a held expires; the sandbox takes commands through b. The command died with
            # its replica: the agent kills a job whose client hung up, so nothing runs untracked
            again = hb.post(f"/sandboxes/{sid}/exec", json={"command": "sleep 1; cat out.txt || echo gone",
                                                            "wait": True}).json()
            assert again["stdout"] == "gone\n", again
    finally:
        a.start()  # same replica id, same Redis: it picks its sandboxes back up
    with a.http() as ha:
        assert ha.get(f"/sandboxes/{sid}").json()["status"] == "running"
        assert ha.post(f"/sandboxes/{sid}/exec", json={"command": "echo back", "wait": True}).json()["stdout"] == "back\n"
        assert ha.delete(f"/sandboxes/{sid}").json()["status"] == "deleted"


def test_sdk_exec_survives_concurrent_use_from_both_replicas(replicas):
    a, b = replicas
    errors = []
    with a.client() as on_a, b.client() as on_b:
        box = on_a.create_sandbox()
        twin = on_b.get_sandbox(box.sandbox_id)

        def hammer(handle, tag):
            try:
                for i in range(10):
                    assert handle.exec(f"echo {tag}{i}").stdout == f"{tag}{i}\n"
            except Exception as e:  # pragma: no cover - reported below
                errors.append(e)

        threads = [threading.Thread(target=hammer, args=(h, t)) for h, t in ((box, "a"), (twin, "b"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors


def test_serve_owner_is_one_per_deployment_and_hides_the_password():
    from pydantic import ValidationError

    from orchard_gym.service.settings import ServiceSettings

    def owner(**kw):
        return ServiceSettings(backend="docker", **kw).backend_config_dict().get("owner")

    url = "redis://user:s3cret@10.0.0.5:6380/2"
    assert owner(redis_url=url) == owner(redis_url=url.replace("s3cret", "other"))  # same deployment
    assert "s3cret" not in owner(redis_url=url)
    assert owner(redis_url=url) != owner(redis_url=url, redis_prefix="staging")
    assert owner(redis_url=url) != owner(redis_url=url.replace("/2", "/3"))
    assert owner() is None  # in memory: per-process, as a restart loses the records anyway
    assert owner(owner="team-a") == owner(owner="team-a", redis_url=url) == "team-a"
    assert ServiceSettings(backend="docker", owner="team-a",
                           backend_config={"owner": "mine"}).backend_config_dict()["owner"] == "mine"
    assert "owner" not in ServiceSettings(backend="local", owner="team-a").backend_config_dict()
    for bad in ("has:colons", "", "x" * 80, "-dash"):
        with pytest.raises(ValidationError):
            ServiceSettings(owner=bad)
