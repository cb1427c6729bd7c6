"""The orchestrator as an attacker and a careless user would meet it (issue 11), each over a
real uvicorn server with real sandboxes:

- a sandbox belongs to the API key that created it: every other key gets 404 on every
  route of it and its jobs and never sees it listed; an admin key sees all; `env` values
  are never shown; garbage keys are refused without a 5xx;
- `orchard serve` never adopts or reaps a sandbox an in-process `SandboxClient()` made;
- a delete that arrives while the backend is still creating leaves nothing behind.

Redis authentication: tests/test_security_service_redis.py.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from service_helpers import (REPO, Orchestrator, RedisServer, free_port, need_redis_server, remove_all_sandboxes,
                             short_root)

from conftest import marked_pids, needs, require_module, wait_until

require_module("server", "fastapi")

ALICE, BOB, ADMIN = "alice-key-" + "a" * 20, "bob-key-" + "b" * 20, "admin-key-" + "c" * 20
SECRET = "s3cr3t-value-never-shown"


def _operations() -> list[tuple[str, str]]:
    """Every (method, path) of the API, from the app's own OpenAPI document: routes added
    later are checked too."""
    from orchard_gym.service import ServiceSettings, create_app

    paths = create_app(ServiceSettings()).openapi()["paths"]
    return [(method.upper(), path) for path, item in paths.items() for method in item]


# a valid request for each kind of route, so that a 404 is the scoping, not a bad body
BODIES = {
    "/exec": {"command": "echo pwned > pwned.txt", "timeout_seconds": 5, "wait": True},
    "/exec/stream": {"command": "echo pwned > pwned.txt", "timeout_seconds": 5},
    "/apply_patch": {"patch": "--- a/x\n+++ b/x\n@@ -0,0 +1 @@\n+x\n", "timeout_seconds": 5},
    "/files": {"path": "pwned.txt", "content": base64.b64encode(b"pwned").decode()},
    "/services": {"port": 8080},
}


def _request(http: httpx.Client, method: str, path: str, **ids: str) -> httpx.Response:
    ids.setdefault("snapshot_id", "snap-0000000000000000")
    url = path.format(**{"port": "8080", **ids})
    body = next((b for suffix, b in BODIES.items() if path.endswith(suffix)), None) if method == "POST" else None
    params = {"path": "pwned.txt", "timeout": 0.2} if method == "GET" else None
    return http.request(method, url, json=body, params=params)


@pytest.fixture(scope="module")
def orch(tmp_path_factory):
    root = short_root("sec")
    o = Orchestrator(root, log_dir=tmp_path_factory.mktemp("sec-logs"), api_key=ALICE,
                     api_keys=f"{ALICE},{BOB}", admin_keys=ADMIN, max_wait=2, reconcile_interval=0.3)
    yield o
    o.stop()
    remove_all_sandboxes(root)
    shutil.rmtree(root, ignore_errors=True)


def _client(orch, key):
    return httpx.Client(base_url=orch.url, headers={"X-API-Key": key}, timeout=30)


@pytest.fixture(scope="module")
def alice_box(orch):
    with _client(orch, ALICE) as alice:
        r = alice.post("/sandboxes", params={"wait": "true"},
                       json={"env": {"TOKEN": SECRET}, "labels": {"team": "a"}})
        assert r.status_code == 200 and r.json()["status"] == "running", r.text
        sid = r.json()["sandbox_id"]
        job = alice.post(f"/sandboxes/{sid}/exec", json={"command": "echo $TOKEN", "wait": True}).json()
        assert job["stdout"] == SECRET + "\n"  # the sandbox does get the value
        snap = alice.post(f"/sandboxes/{sid}/snapshots")
        assert snap.status_code == 200 and snap.json()["labels"] == {"team": "a"}, snap.text
        yield sid, job["job_id"], snap.json()["snapshot_id"]


def test_other_keys_get_404_on_every_route_of_a_sandbox(orch, alice_box):
    sid, job_id, snap_id = alice_box
    checked = []
    with _client(orch, BOB) as bob, _client(orch, ALICE) as alice:
        for method, path in _operations():
            if "{sandbox_id}" not in path and "{job_id}" not in path and "{snapshot_id}" not in path:
                continue
            theirs = _request(bob, method, path, sandbox_id=sid, job_id=job_id, snapshot_id=snap_id)
            unknown = _request(bob, method, path, sandbox_id="no-such-box", job_id="no-such-job",
                               snapshot_id="snap-0123456789abcdef")
            expected = ("SandboxNotFound" if "{sandbox_id}" in path else
                        "JobNotFound" if "{job_id}" in path else "SnapshotNotFound")
            assert theirs.status_code == 404 and theirs.json()["error"] == expected, (method, path, theirs.text)
            # no oracle: someone else's sandbox looks exactly like one that does not exist
            assert (unknown.status_code, unknown.json()["error"]) == (404, expected), (method, path)
            assert theirs.json()["detail"].replace(sid, "X").replace(job_id, "X").replace(snap_id, "X") == \
                unknown.json()["detail"].replace("no-such-box", "X").replace("no-such-job", "X").replace(
                    "snap-0123456789abcdef", "X")
            assert SECRET not in theirs.text
            checked.append((method, path))
        # nothing bob tried happened: the sandbox lives, no file was written, no command ran
        assert alice.get(f"/sandboxes/{sid}").json()["status"] == "running"
        ls = alice.post(f"/sandboxes/{sid}/exec", json={"command": "ls", "wait": True}).json()
        assert ls["exit_code"] == 0 and "pwned" not in ls["stdout"]
        assert alice.get(f"/jobs/{job_id}").json()["stdout"] == SECRET + "\n"
        assert snap_id in [s["snapshot_id"] for s in alice.get("/snapshots").json()]  # bob's DELETE did nothing
        assert snap_id not in [s["snapshot_id"] for s in bob.get("/snapshots").json()]
        forked = bob.post("/sandboxes", json={"from_snapshot": snap_id})  # nor can bob start from it
        assert (forked.status_code, forked.json()["error"]) == (404, "SnapshotNotFound"), forked.text
    # the owner and an admin reach every one of those routes (DELETE last: it ends the sandbox)
    with _client(orch, ALICE) as alice, _client(orch, ADMIN) as admin:
        for who in (alice, admin):
            for method, path in sorted(checked, key=lambda op: op[0] == "DELETE"):
                if method == "DELETE":
                    continue
                r = _request(who, method, path, sandbox_id=sid, job_id=job_id, snapshot_id=snap_id)
                assert r.status_code != 404 or "FileNotFoundError" in r.text, (method, path, r.text)
                assert r.status_code < 500 and "SandboxNotFound" not in r.text and "JobNotFound" not in r.text
    routes = {p for _, p in checked}
    for must in ("/sandboxes/{sandbox_id}", "/sandboxes/{sandbox_id}/exec", "/sandboxes/{sandbox_id}/exec/stream",
                 "/sandboxes/{sandbox_id}/files", "/sandboxes/{sandbox_id}/files/list", "/jobs/{job_id}",
                 "/jobs/{job_id}/wait", "/sandboxes/{sandbox_id}/heartbeat", "/sandboxes/{sandbox_id}/wait",
                 "/sandboxes/{sandbox_id}/apply_patch", "/sandboxes/{sandbox_id}/services",
                 "/sandboxes/{sandbox_id}/services/{port}", "/sandboxes/{sandbox_id}/snapshots",
                 "/snapshots/{snapshot_id}"):
        assert must in routes, must
    assert ("DELETE", "/sandboxes/{sandbox_id}") in checked


def test_listings_show_only_your_own_and_admin_sees_all(orch, alice_box):
    sid, _, _ = alice_box
    with _client(orch, BOB) as bob, _client(orch, ALICE) as alice, _client(orch, ADMIN) as admin:
        bobs = bob.post("/sandboxes", params={"wait": "true"}, json={"env": {"BOB_TOKEN": SECRET}}).json()["sandbox_id"]
        try:
            bob_list = bob.get("/sandboxes").json()
            alice_list = alice.get("/sandboxes").json()
            admin_list = admin.get("/sandboxes").json()
            assert [r["sandbox_id"] for r in bob_list] == [bobs]
            assert sid in {r["sandbox_id"] for r in alice_list} and bobs not in {r["sandbox_id"] for r in alice_list}
            assert {sid, bobs} <= {r["sandbox_id"] for r in admin_list}
            # env names, never values; no owner label, even for the owner or an admin
            for listing in (bob_list, alice_list, admin_list):
                assert SECRET not in json.dumps(listing)
                for r in listing:
                    assert set(r["env"].values()) <= {"<hidden>"} and not any(k.startswith("orchard-gym.") for k in r["labels"])
            mine = next(r for r in alice_list if r["sandbox_id"] == sid)
            assert mine["env"] == {"TOKEN": "<hidden>"} and mine["labels"] == {"team": "a"}
            for who in (alice, admin):
                for path in (f"/sandboxes/{sid}", f"/sandboxes/{sid}/wait"):
                    assert who.get(path).json()["env"] == {"TOKEN": "<hidden>"}, path
                assert who.post(f"/sandboxes/{sid}/heartbeat").json()["env"] == {"TOKEN": "<hidden>"}
            created = bob.post("/sandboxes", json={"env": {"X": SECRET}})
            assert created.json()["env"] == {"X": "<hidden>"}
            bob.delete(f"/sandboxes/{created.json()['sandbox_id']}")
            # an admin acts on anyone's sandbox; the job it runs there stays readable by the owner
            job = admin.post(f"/sandboxes/{sid}/exec", json={"command": "echo by-admin", "wait": True}).json()
            assert job["stdout"] == "by-admin\n" and "key_owner" not in job
            assert alice.get(f"/jobs/{job['job_id']}").json()["stdout"] == "by-admin\n"
            assert bob.get(f"/jobs/{job['job_id']}").status_code == 404
            assert admin.get(f"/jobs/{job['job_id']}/wait").json()["status"] == "succeeded"
        finally:
            assert admin.delete(f"/sandboxes/{bobs}").json() == {"status": "deleted", "sandbox_id": bobs}
        assert bob.get(f"/sandboxes/{bobs}").status_code == 404


def test_reserved_labels_cannot_be_set(orch):
    with _client(orch, BOB) as bob:
        for labels in ({"orchard-gym.owner": "sha256:" + "0" * 64}, {"orchard-gym.anything": "x"}):
            r = bob.post("/sandboxes", json={"labels": labels})
            assert r.status_code == 422 and r.json()["error"] == "InvalidRequest" and "reserved" in r.text, labels
        assert bob.get("/sandboxes").json() == []  # nothing was created


def _raw_get(port: int, path: str, header_lines: list[bytes]) -> int | None:
    """Send a request byte for byte (clients refuse to send garbage headers); the status, or
    None when the server closed the connection without one."""
    data = b""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        try:
            s.sendall(b"GET " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"".join(
                line + b"\r\n" for line in header_lines) + b"Connection: close\r\n\r\n")
            while b"\r\n" not in data:
                chunk = s.recv(4096)
                if not chunk:
                    return None
                data += chunk
        except (ConnectionResetError, BrokenPipeError):
            return None
    m = re.match(rb"HTTP/1\.[01] (\d{3})", data)
    return int(m.group(1)) if m else None


def test_garbage_api_keys_are_refused_without_5xx(orch, alice_box):
    sid, job_id, _ = alice_box
    rng = random.Random(11)
    garbage: list[bytes] = [b"", b" ", ALICE.upper().encode(), ALICE[:-1].encode(), ALICE.encode() + b"x",
                            ADMIN[:-1].encode(), b"x" * 100_000, b"\xff\xfe" + ALICE.encode(), ALICE.encode() + b"\x80",
                            b"alice\x00key", b"\x7f", "ключ".encode(), b"${ORCHARD_API_KEYS}", b"*", b"null",
                            b"sha256:" + b"0" * 64, b"%s%s%n", b"../../etc/passwd", b"\t" + b"\x01" * 30]
    garbage += [bytes(rng.randrange(1, 256) for _ in range(rng.randrange(1, 300))) for _ in range(60)]
    garbage += [rng.choice((ALICE, BOB, ADMIN)).encode()[:rng.randrange(0, 20)] for _ in range(20)]
    answered = 0
    for value in garbage:
        for path in ("/sandboxes", f"/sandboxes/{sid}", f"/jobs/{job_id}"):
            status = _raw_get(orch.port, path, [b"X-API-Key: " + value])
            assert status is None or status in (400, 401, 403, 431), (value[:40], path, status)
            answered += status is not None
    assert answered > len(garbage)  # most garbage reached the app and was answered, not dropped
    # a valid key next to a garbage one, and a key in the wrong header, get nowhere
    assert _raw_get(orch.port, f"/sandboxes/{sid}", [b"X-Api-Key-2: " + ALICE.encode()]) == 401
    assert _raw_get(orch.port, f"/sandboxes/{sid}", [b"Authorization: Bearer " + ALICE.encode()]) == 401
    assert _raw_get(orch.port, f"/sandboxes/{sid}", [b"X-API-Key: " + BOB.encode()]) == 404
    assert _raw_get(orch.port, f"/sandboxes/{sid}", [b"x-api-key: " + ALICE.encode()]) == 200  # names are case-blind
    with _client(orch, ALICE) as alice:
        assert alice.get(f"/sandboxes/{sid}").json()["status"] == "running"
    errors = [line for line in orch.logs().splitlines()
              if line.startswith("{") and json.loads(line).get("level") in ("error", "critical")]
    assert not errors, errors[:3]


def test_keys_settings_refuse_garbage():
    from pydantic import ValidationError

    from orchard_gym.service.settings import ServiceSettings

    for bad in (["ключ"], ["a\nb"], ["tab\tkey"]):
        with pytest.raises(ValidationError, match="printable ASCII"):
            ServiceSettings(api_keys=bad)
    with pytest.raises(ValidationError, match="printable ASCII"):
        ServiceSettings(admin_keys=["\x00"])
    s = ServiceSettings(api_keys=" a , b ", admin_keys="c")
    assert (s.api_keys, s.admin_keys, s.auth_required) == (["a", "b"], ["c"], True)
    assert not ServiceSettings().auth_required


def test_garbage_keys_in_the_environment_stop_serve_with_one_line():
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHARD_")}
    r = subprocess.run([sys.executable, "-m", "orchard_gym.cli", "serve", "--host", "0.0.0.0", "--port", "1"],
                       env={**env, "ORCHARD_API_KEYS": "ключ"}, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "ORCHARD_API_KEYS" in r.stderr and "Traceback" not in r.stderr, r.stderr


def _backend_params():
    from conftest import DOCKER_IMAGES, docker_engine, fake_k8s_unavailable

    gateway, why_not = docker_engine()
    k8s_why_not = fake_k8s_unavailable()
    return [pytest.param("local", None, id="local"),
            pytest.param("docker", DOCKER_IMAGES["busybox"], id="docker",
                         marks=[pytest.mark.docker, needs("docker", None if gateway else why_not)]),
            pytest.param("kubernetes", DOCKER_IMAGES["busybox"], id="kubernetes",
                         marks=[pytest.mark.kubernetes,
                                needs("kubernetes", k8s_why_not)])]


@pytest.mark.parametrize("backend, image", _backend_params())
def test_scoping_holds_on_every_backend(backend, image, request, tmp_path):
    """The owner label travels through each backend's own storage (meta.json, container
    labels, the pod's annotation), and the scoping holds on each."""
    from orchard_gym import SandboxClient
    from orchard_gym.service.auth import OWNER_LABEL, key_owner

    root = short_root("scope")
    config = {}
    if backend == "kubernetes":
        config = {k: v for k, v in request.getfixturevalue("fake_k8s").backend_config().items() if k != "type"}
        config["owner"] = f"scope-{os.getpid()}"
    orch = Orchestrator(root, log_dir=tmp_path, api_key=ALICE, api_keys=f"{ALICE},{BOB}", admin_keys=ADMIN,
                        backend=backend, backend_config=config, ready_timeout=180, max_wait=120)
    try:
        with _client(orch, ALICE) as alice, _client(orch, BOB) as bob, _client(orch, ADMIN) as admin:
            r = alice.post("/sandboxes", params={"wait": "true"},
                           json={"image": image, "env": {"TOKEN": SECRET}, "labels": {"team": "a"}}, timeout=200)
            assert r.status_code == 200 and r.json()["status"] == "running", r.text
            sid = r.json()["sandbox_id"]
            try:
                assert r.json()["env"] == {"TOKEN": "<hidden>"} and r.json()["labels"] == {"team": "a"}
                assert alice.post(f"/sandboxes/{sid}/exec", json={"command": "echo $TOKEN", "wait": True}
                                  ).json()["stdout"] == SECRET + "\n"
                for method, path in (("GET", f"/sandboxes/{sid}"), ("DELETE", f"/sandboxes/{sid}")):
                    assert bob.request(method, path).status_code == 404
                assert bob.post(f"/sandboxes/{sid}/exec", json={"command": "true"}).status_code == 404
                assert sid not in {x["sandbox_id"] for x in bob.get("/sandboxes").json()}
                listed = {x["sandbox_id"]: x for x in admin.get("/sandboxes").json()}
                assert listed[sid]["env"] == {"TOKEN": "<hidden>"} and SECRET not in json.dumps(listed)
                # the backend itself keeps the owner (a hash of the key), so an adopting replica keeps it too
                in_process = {"type": backend, **({"root": str(root)} if backend == "local" else config)}
                with SandboxClient(in_process, cleanup_at_exit=False) as direct:
                    labels = direct.get_sandbox(sid).record.labels
                assert labels[OWNER_LABEL] == key_owner(ALICE) and ALICE not in json.dumps(labels)
            finally:
                assert alice.delete(f"/sandboxes/{sid}").json()["status"] == "deleted"
    finally:
        orch.stop()
        remove_all_sandboxes(root)
        shutil.rmtree(root, ignore_errors=True)


# --------------------------------------------------------------------------- in-process sandboxes


def test_in_process_sandboxes_survive_an_orchestrator_on_the_default_roots(tmp_path):
    """`orchard serve` (no root configured) and `SandboxClient()` use different roots."""
    from orchard_gym import SandboxClient
    from orchard_gym.backends.local import default_root
    from orchard_gym.service.settings import default_serve_root

    assert default_serve_root().resolve() != default_root().resolve()
    with SandboxClient({"type": "local"}) as inproc:
        box = inproc.create_sandbox()
        orch = Orchestrator(tmp_path, backend_config={"root": None}, sandbox_ttl=1, reconcile_interval=0.2,
                            admin_keys=ADMIN)
        try:
            with _client(orch, ADMIN) as admin:
                assert admin.get("/resources").json()["backend"]["root"] == str(default_serve_root().resolve())
                # more than a TTL, then several reconcile passes (counted: a loaded machine makes fewer in a
                # fixed time)
                time.sleep(1.0)  # the TTL (sandbox_ttl=1): a duration this test is about, not a wait for an event
                passes = orch.reconcile_passes()
                assert wait_until(lambda: orch.reconcile_passes() >= passes + 3, 30)
                assert box.sandbox_id not in {r["sandbox_id"] for r in admin.get("/sandboxes").json()}
                assert admin.get(f"/sandboxes/{box.sandbox_id}").status_code == 404
                assert box.exec("echo alive").stdout == "alive\n"
                made = admin.post("/sandboxes", params={"wait": "true"}, json={}).json()
                assert made.get("workdir", "").startswith(str(default_serve_root().resolve()) + "/"), made
                admin.delete(f"/sandboxes/{made['sandbox_id']}")
        finally:
            orch.stop()
        assert box.exec("echo still").stdout == "still\n"
        box.delete()


def test_in_process_sandbox_in_the_orchestrators_root_is_never_adopted(tmp_path):
    """Even in the very same root, only the orchestrator's own sandboxes are adopted and reaped."""
    from orchard_gym import SandboxClient

    root = short_root("shared")
    try:
        with SandboxClient({"type": "local", "root": str(root)}) as inproc:
            box = inproc.create_sandbox()
            orch = Orchestrator(root, log_dir=tmp_path, sandbox_ttl=1, reconcile_interval=0.2, admin_keys=ADMIN)
            try:
                with _client(orch, ADMIN) as admin:
                    mine = admin.post("/sandboxes", params={"wait": "true"}, json={"sandbox_id": "orch-own"}).json()
                    assert mine["status"] == "running"
                    # never heartbeated: reaped after its TTL, as it should be (waited for, not slept on)
                    listed = lambda: {r["sandbox_id"] for r in admin.get("/sandboxes").json()}
                    assert wait_until(lambda: "orch-own" not in listed(), 30), listed()
                    assert box.sandbox_id not in listed()  # by then several reconcile passes have seen it
                assert box.exec("echo alive").stdout == "alive\n"
                # a restart (in-memory store: all it runs is adopted again) takes its own only
                with _client(orch, ADMIN) as admin:
                    sid = admin.post("/sandboxes", params={"wait": "true"}, json={"sandbox_id": "orch-two"}).json()
                    assert sid["status"] == "running"
                    orch.kill()
                    orch.start()
                    listed = {r["sandbox_id"] for r in admin.get("/sandboxes").json()}
                    assert "orch-two" in listed and box.sandbox_id not in listed, listed
                    admin.delete("/sandboxes/orch-two")
                assert box.exec("echo survived").stdout == "survived\n"
            finally:
                orch.stop()
            box.delete()
    finally:
        remove_all_sandboxes(root)
        shutil.rmtree(root, ignore_errors=True)


# --------------------------------------------------------------------------- delete during create


class _InThreadServer:
    """A real uvicorn server in a thread, for an app built here (a backend we can hold)."""

    def __init__(self, app):
        import uvicorn

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_config=None,
                                                    access_log=False, lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        assert wait_until(lambda: self.server.started, 30), "uvicorn did not start"

    def close(self):
        self.server.should_exit = True
        self.thread.join(30)


def _gated_backend(root: Path):
    from orchard_gym.backends.config import LocalBackendConfig
    from orchard_gym.backends.local import LocalBackend

    class GatedLocalBackend(LocalBackend):
        """The real local backend whose create waits at a gate: a create that is slow."""

        def __init__(self, config):
            super().__init__(config)
            self.entered, self.gate = threading.Event(), threading.Event()

        async def create(self, spec):
            self.entered.set()
            await asyncio.to_thread(self.gate.wait, 60)
            return await super().create(spec)

    return GatedLocalBackend(LocalBackendConfig(root=root, die_with_client=False))


@pytest.mark.parametrize("delete_via", ["same-replica", "other-replica"])
def test_delete_during_a_slow_create_leaves_no_sandbox(delete_via, tmp_path):
    """other-replica: the delete goes to a second replica (a subprocess) sharing Redis and
    the root with the one whose backend is still creating."""
    from orchard_gym.service import ServiceSettings, create_app

    root = short_root("slow")
    backend = _gated_backend(root)
    redis_server = other = None
    settings = {"api_keys": [ALICE], "reconcile_interval": 60}
    if delete_via == "other-replica":
        need_redis_server()
        redis_server = RedisServer(tmp_path)
        settings.update(redis_url=redis_server.url, replica_id="gated")
    server = _InThreadServer(create_app(ServiceSettings(**settings), backend=backend))
    try:
        if redis_server is not None:
            other = Orchestrator(root, log_dir=tmp_path, api_key=ALICE, redis_url=redis_server.url,
                                 replica_id="deleter", reconcile_interval=60)
        deleter = other.http() if other else httpx.Client(base_url=server.url, headers={"X-API-Key": ALICE}, timeout=60)
        with httpx.Client(base_url=server.url, headers={"X-API-Key": ALICE}, timeout=60) as http, deleter:
            for sandbox_id, wait in (("late-one", "false"), ("late-two", "true")):
                backend.entered.clear()
                backend.gate.clear()
                answer: dict = {}
                creating = threading.Thread(target=lambda: answer.update(r=http.post(
                    "/sandboxes", params={"wait": wait}, json={"sandbox_id": sandbox_id})))
                creating.start()
                assert backend.entered.wait(30)
                deleted = deleter.delete(f"/sandboxes/{sandbox_id}")
                assert deleted.json() == {"status": "deleted", "sandbox_id": sandbox_id}
                backend.gate.set()  # the backend now makes the sandbox the delete did not find
                creating.join(60)
                r = answer["r"]
                assert r.status_code == 404 and r.json()["error"] == "SandboxNotFound", r.text
                assert "deleted while it was being created" in r.json()["detail"]
                for h in (http, deleter):
                    assert h.get(f"/sandboxes/{sandbox_id}").status_code == 404
                assert wait_until(lambda: asyncio.run(backend.get(sandbox_id)) is None, 10)
                assert not (root / sandbox_id).exists()
                assert wait_until(lambda: not marked_pids(f"ORCHARD_SANDBOX={sandbox_id}"), 10)
            # the gate itself breaks nothing: an undisturbed slow create still works
            backend.gate.set()
            ok = http.post("/sandboxes", params={"wait": "true"}, json={"sandbox_id": "on-time"}).json()
            assert ok["status"] == "running"
            assert deleter.delete("/sandboxes/on-time").status_code == 200
    finally:
        backend.gate.set()
        server.close()
        if other is not None:
            other.stop()
        if redis_server is not None:
            redis_server.close()
        remove_all_sandboxes(root)
        shutil.rmtree(root, ignore_errors=True)
