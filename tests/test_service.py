"""The orchestrator (one replica, in-memory store): its wire format, auth, errors, jobs,
serialisation, saturation, heartbeat expiry, reconciliation and adoption. Each test
talks to a real `orchard serve` subprocess over HTTP, raw or through the SDK."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
from service_helpers import API_KEY, REPO, Orchestrator, remove_all_sandboxes, short_root

from conftest import kill_agent, marked_pids, needs_bwrap, require_module, sandbox_pids, wait_until, zygote_agent_pid
from orchard_gym import AgentUnavailable, AuthenticationError, SandboxFailed, SandboxNotFound

require_module("server", "fastapi")


def _orchestrator(tmp_path_factory, **settings):
    root = short_root("svc")
    orch = Orchestrator(root, log_dir=tmp_path_factory.mktemp("logs"), **settings)
    return orch


def _teardown(orch):
    orch.stop()
    remove_all_sandboxes(orch.root)
    import shutil

    shutil.rmtree(orch.root, ignore_errors=True)


@pytest.fixture(scope="module")
def orch(tmp_path_factory):
    o = _orchestrator(tmp_path_factory, max_wait=1, reconcile_interval=0.3)
    yield o
    _teardown(o)


@pytest.fixture
def http(orch):
    with orch.http() as h:
        yield h


@pytest.fixture
def box(http):
    data = http.post("/sandboxes", json={}).json()
    assert http.get(f"/sandboxes/{data['sandbox_id']}/wait", params={"timeout": 30}).json()["status"] == "running"
    yield data["sandbox_id"]
    http.delete(f"/sandboxes/{data['sandbox_id']}")


# --------------------------------------------------------------------------- wire format


def test_banner_health_and_auth(orch):
    anon = httpx.Client(base_url=orch.url, timeout=10)
    assert anon.get("/").json()["name"] == "orchard-gym orchestrator"
    assert anon.get("/health").json()["status"] == "ok"
    for method, path in [("GET", "/resources"), ("GET", "/sandboxes"), ("POST", "/sandboxes"),
                         ("GET", "/sandboxes/x"), ("GET", "/jobs/x"), ("GET", "/metrics")]:
        assert anon.request(method, path).status_code == 401, path
        wrong = anon.request(method, path, headers={"X-API-Key": "nope"})
        assert wrong.status_code == 403 and wrong.json()["error"] == "AuthenticationError", path
    with pytest.raises(AuthenticationError):
        with httpx.Client() as _:
            from orchard_gym import SandboxClient

            with SandboxClient(base_url=orch.url, api_key="wrong") as c:
                c.create_sandbox()


def test_orchard_wire_format(http, box):
    record = http.get(f"/sandboxes/{box}").json()
    assert record["sandbox_id"] == box and record["status"] == "running"
    assert "endpoint" not in record and "token" not in json.dumps(record)
    assert record.get("details", {}) == {}  # absent or empty: backend details never leak
    queued = http.post(f"/sandboxes/{box}/exec", json={"command": "echo hi; exit 3", "timeout_seconds": 10})
    assert queued.json() == {"job_id": queued.json()["job_id"], "status": "queued"}
    job = http.get(f"/jobs/{queued.json()['job_id']}/wait", params={"timeout": 10}).json()
    assert {"job_id", "sandbox_id", "command", "status", "stdout", "stderr", "exit_code", "created_at", "started_at",
            "completed_at", "error"} <= set(job)
    assert (job["status"], job["stdout"], job["exit_code"], job["sandbox_id"]) == ("failed", "hi\n", 3, box)
    assert http.get(f"/jobs/{job['job_id']}").json()["status"] == "failed"
    done = http.post(f"/sandboxes/{box}/exec", json={"command": ["echo", "ok"], "wait": True, "cwd": "/",
                                                     "env": {"A": "1"}, "login_shell": False}).json()
    assert (done["status"], done["stdout"], done["exit_code"]) == ("succeeded", "ok\n", 0)

    up = http.post(f"/sandboxes/{box}/files", json={"path": "d/f.txt", "content": base64.b64encode(b"a\nb\n").decode()})
    assert up.json()["success"] is True and up.json()["size"] == 4
    down = http.get(f"/sandboxes/{box}/files", params={"path": "d/f.txt"}).json()
    assert base64.b64decode(down["content"]) == b"a\nb\n" and down["size"] == 4 and down["path"] == "d/f.txt"
    listing = http.get(f"/sandboxes/{box}/files/list", params={"path": "d"}).json()
    assert listing["path"] == "d" and [(f["name"], f["type"], f["size"]) for f in listing["files"]] == [("f.txt", "file", 4)]
    patch = "--- a/f.txt\n+++ b/f.txt\n@@ -1,2 +1,2 @@\n a\n-b\n+B\n"
    cwd = http.post(f"/sandboxes/{box}/exec", json={"command": "pwd", "wait": True}).json()["stdout"].strip() + "/d"
    applied = http.post(f"/sandboxes/{box}/apply_patch", json={"patch": patch, "timeout_seconds": 30, "cwd": cwd}).json()
    assert applied["success"] is True and applied["exit_code"] == 0 and {"stdout", "stderr"} <= set(applied)
    assert http.post(f"/sandboxes/{box}/heartbeat").status_code == 200
    res = http.get("/resources").json()
    assert res["backend"]["backend"] == "local" and res["sandboxes"]["running"] >= 1


def test_answers_built_without_validation_are_what_their_response_models_say(http, box):
    """The hot routes answer with records and jobs as built, unvalidated (api.py `_json`): each
    answer is exactly its response model's dump of itself, field for field."""
    from orchard_gym.models import JobResult
    from orchard_gym.service.api import Deleted, SandboxOut

    def same_as_model(model, data: dict) -> None:
        assert model.model_validate(data).model_dump(mode="json") == data, model.__name__

    created = http.post("/sandboxes", params={"wait": "true"}, json={"labels": {"k": "v"}, "env": {"SECRET": "x"}})
    sid = created.json()["sandbox_id"]
    answers = [created, http.get(f"/sandboxes/{sid}"), http.get(f"/sandboxes/{sid}/wait", params={"timeout": 10}),
               http.post(f"/sandboxes/{sid}/heartbeat"), http.get(f"/sandboxes/{box}")]
    for answer in answers:
        assert answer.status_code == 200, answer.text
        same_as_model(SandboxOut, answer.json())
        assert answer.json()["env"] == {"SECRET": "<hidden>"} or answer.json()["sandbox_id"] == box
    for record in http.get("/sandboxes").json():
        same_as_model(SandboxOut, record)
    job = http.post(f"/sandboxes/{sid}/exec", json={"command": "echo hi", "wait": True}).json()
    same_as_model(JobResult, job)
    assert "key_owner" not in job and job["stdout"] == "hi\n"
    same_as_model(JobResult, http.get(f"/jobs/{job['job_id']}").json())
    same_as_model(JobResult, http.get(f"/jobs/{job['job_id']}/wait", params={"timeout": 5}).json())
    deleted = http.delete(f"/sandboxes/{sid}").json()
    same_as_model(Deleted, deleted)
    assert deleted == {"status": "deleted", "sandbox_id": sid}


def test_status_codes(http, box):
    assert http.get("/sandboxes/no-such").status_code == 404
    assert http.get("/sandboxes/no-such").json()["error"] == "SandboxNotFound"
    assert http.post("/sandboxes/no-such/exec", json={"command": "true"}).status_code == 404
    assert http.get("/jobs/no-such").json()["error"] == "JobNotFound"
    assert http.delete("/sandboxes/no-such").status_code == 404
    for bad in [{"command": ""}, {"command": 5}, {}, {"command": "true", "timeout_seconds": -1},
                {"command": "true", "surprise": 1}]:
        r = http.post(f"/sandboxes/{box}/exec", json=bad)
        assert r.status_code == 422 and r.json()["error"] == "InvalidRequest", bad
    assert http.post("/sandboxes", json={"sandbox_id": "Bad_Id"}).status_code == 422
    assert http.post("/sandboxes", json={"image": "ubuntu:22.04"}).status_code == 422
    assert http.post("/sandboxes", json={"sandbox_id": box}).status_code == 409
    assert http.post(f"/sandboxes/{box}/files", json={"path": "x", "content": "%%%"}).status_code == 422
    missing = http.get(f"/sandboxes/{box}/files", params={"path": "nope.txt"})
    assert missing.status_code == 404 and missing.json()["error"] == "FileNotFoundError"
    # a server-side wait that runs out: 408
    slow = http.post(f"/sandboxes/{box}/exec", json={"command": "sleep 0.9"}).json()
    timed_out = http.get(f"/jobs/{slow['job_id']}/wait", params={"timeout": 0.2})
    assert timed_out.status_code == 408 and timed_out.json()["error"] == "SandboxTimeout"
    assert http.get(f"/jobs/{slow['job_id']}/wait", params={"timeout": 5}).json()["status"] == "succeeded"


def test_request_ids_and_json_logs(orch, http):
    r = http.get("/sandboxes/nope", headers={"X-Request-ID": "trace-me-123"})
    assert r.headers["x-request-id"] == "trace-me-123"
    assert http.get("/health").headers["x-request-id"]
    assert wait_until(lambda: "trace-me-123" in orch.logs(), 3)
    line = next(json.loads(x) for x in orch.logs().splitlines() if "trace-me-123" in x)
    assert line["request_id"] == "trace-me-123" and line["status"] == 404 and line["route"] == "/sandboxes/{sandbox_id}"


def test_metrics(http, box):
    http.post(f"/sandboxes/{box}/exec", json={"command": "true", "wait": True})
    text = http.get("/metrics").text
    assert 'orchard_http_requests_total{method="POST",route="/sandboxes/{sandbox_id}/exec",status="200"}' in text
    assert "orchard_jobs_total" in text and "orchard_sandboxes" in text


# --------------------------------------------------------------------------- jobs


def test_server_wait_ends_first_and_the_sdk_keeps_waiting(orch):
    # max_wait=1 on this orchestrator: the exec answers "running", the SDK waits on the job
    with orch.client() as client:
        box = client.create_sandbox()
        started = time.monotonic()
        r = box.exec("sleep 2.2; echo done", timeout=30)
        assert r.succeeded and r.stdout == "done\n" and time.monotonic() - started >= 2.2


def test_execs_on_one_sandbox_run_one_at_a_time(http, box):
    cmd = "date +%s.%N; sleep 0.4; date +%s.%N"
    ids = [http.post(f"/sandboxes/{box}/exec", json={"command": cmd}).json()["job_id"] for _ in range(3)]
    spans = []
    for job_id in ids:
        job = http.get(f"/jobs/{job_id}/wait", params={"timeout": 60}).json()  # three in turn, on a loaded machine
        spans.append(tuple(map(float, job["stdout"].split())))
    spans.sort()
    assert all(later[0] >= earlier[1] for earlier, later in zip(spans, spans[1:])), spans


def test_execs_on_different_sandboxes_overlap(orch):
    async def run():
        from orchard_gym import AsyncSandboxClient

        async with AsyncSandboxClient(base_url=orch.url, api_key=API_KEY) as client:
            boxes = await asyncio.gather(*(client.create_sandbox() for _ in range(3)))
            started = time.monotonic()
            await asyncio.gather(*(b.exec("sleep 0.6") for b in boxes))
            return time.monotonic() - started

    assert asyncio.run(run()) < 1.5


def test_saturation_gives_503_and_the_sdk_retries(tmp_path_factory):
    orch = _orchestrator(tmp_path_factory, exec_concurrency=1, exec_queue=0)
    try:
        from orchard_gym.retry import RetryPolicy

        with orch.http() as http, orch.client(retry=RetryPolicy(attempts=50, maximum=0.5)) as client:
            a, b = client.create_sandbox(), client.create_sandbox()
            busy = http.post(f"/sandboxes/{a.sandbox_id}/exec", json={"command": "sleep 1"}).json()
            refused = http.post(f"/sandboxes/{b.sandbox_id}/exec", json={"command": "true"})
            assert refused.status_code == 503 and refused.json()["error"] == "ServiceUnavailable"
            assert refused.headers["retry-after"]
            # the SDK retries 503s with backoff until a slot frees up
            assert b.exec("echo through").stdout == "through\n"
            assert http.get(f"/jobs/{busy['job_id']}/wait", params={"timeout": 10}).json()["status"] == "succeeded"
            assert "orchard_exec_rejected_total" in http.get("/metrics").text
    finally:
        _teardown(orch)


# --------------------------------------------------------------------------- failures


def test_agent_of_an_orchestrator_sandbox_refuses_a_wrong_token(orch, box):
    """The remote twin of the conformance suite's wrong-token test: the token stays with the
    backend (never in a record or on the wire), and the agent refuses any other."""
    from orchard_gym._loop import LoopThread
    from orchard_gym.agent_client import AgentClient
    from orchard_gym.backends.config import LocalBackendConfig
    from orchard_gym.backends.local import LocalBackend

    async def call():
        backend = LocalBackend(LocalBackendConfig(root=orch.root, die_with_client=False))
        endpoint = (await backend.get(box)).endpoint
        agent = AgentClient(endpoint.model_copy(update={"token": "wrong"}))
        try:
            await agent.list_files(".")
        finally:
            await agent.aclose()

    with pytest.raises(AuthenticationError):
        LoopThread.shared().run(call())


def test_vanished_backend_resource_is_marked_failed(orch, http, box):
    def argv(pid):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")

    zygote = zygote_agent_pid(orch.root, box)  # the zygote's agent carries no marker (conftest)
    agent = [zygote] if zygote is not None else [
        pid for pid in marked_pids(f"ORCHARD_SANDBOX={box}")
        if not argv(pid)[0].endswith(b"bwrap") and any(a.rstrip(b"/").endswith(b"/agent") for a in argv(pid))]
    assert len(agent) == 1
    os.kill(agent[0], signal.SIGKILL)  # the agent (and with it the sandbox) dies behind our back
    assert wait_until(lambda: http.get(f"/sandboxes/{box}").json()["status"] == "failed", 5)
    record = http.get(f"/sandboxes/{box}").json()
    assert "gone" in record["error"] or "vanished" in record["error"]
    r = http.post(f"/sandboxes/{box}/exec", json={"command": "true", "wait": True})
    assert r.status_code == 409 and r.json()["error"] == "SandboxFailed"
    assert wait_until(lambda: not sandbox_pids(orch.root, box), 5)


def test_client_that_stops_heartbeating_has_its_sandboxes_reaped(tmp_path_factory):
    ttl, interval = 1.5, 0.3
    orch = _orchestrator(tmp_path_factory, sandbox_ttl=ttl, reconcile_interval=interval)
    script = (
        "import sys, time\n"
        "from orchard_gym import SandboxClient\n"
        f"c = SandboxClient(base_url={orch.url!r}, api_key={API_KEY!r})\n"
        "box = c.create_sandbox(); box.exec('sleep 300 >/dev/null 2>&1 &')\n"
        "print(box.sandbox_id, flush=True); time.sleep(600)\n"
    )
    try:
        with orch.http() as http, orch.client() as keeper:
            kept = keeper.create_sandbox()  # its client lives and beats in the background
            trainer = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=REPO)
            dead_id = trainer.stdout.readline().strip()
            assert dead_id and http.get(f"/sandboxes/{dead_id}").status_code == 200
            time.sleep(ttl)  # it stays while its client beats
            assert http.get(f"/sandboxes/{dead_id}").status_code == 200
            trainer.send_signal(signal.SIGKILL)  # the client dies: no cleanup, no more heartbeats
            trainer.wait(5)
            killed = time.monotonic()
            assert wait_until(lambda: http.get(f"/sandboxes/{dead_id}").status_code == 404, ttl + interval + 3)
            reaped_after = time.monotonic() - killed
            assert reaped_after <= ttl + interval + 1.0, reaped_after
            assert wait_until(lambda: not marked_pids(f"ORCHARD_SANDBOX={dead_id}"), 5)
            assert kept.exec("echo alive").stdout == "alive\n"  # the live client's sandbox stayed
            assert http.get(f"/sandboxes/{kept.sandbox_id}").json()["status"] == "running"
    finally:
        _teardown(orch)


def test_restarted_replica_adopts_its_sandboxes(tmp_path_factory):
    orch = _orchestrator(tmp_path_factory)
    try:
        with orch.http() as http:
            sid = http.post("/sandboxes", json={"sandbox_id": "survivor"}).json()["sandbox_id"]
            http.get(f"/sandboxes/{sid}/wait", params={"timeout": 30})
            http.post(f"/sandboxes/{sid}/exec", json={"command": "echo before > mark.txt", "wait": True})
        orch.kill()  # SIGKILL: the in-memory store is gone, the sandbox is not
        assert sandbox_pids(orch.root, sid)
        orch.start()
        with orch.http() as http:
            assert http.get(f"/sandboxes/{sid}").json()["status"] == "running"
            out = http.post(f"/sandboxes/{sid}/exec", json={"command": "cat mark.txt", "wait": True}).json()
            assert out["stdout"] == "before\n"
            assert http.delete(f"/sandboxes/{sid}").json() == {"status": "deleted", "sandbox_id": sid}
        assert wait_until(lambda: not sandbox_pids(orch.root, sid), 5)
    finally:
        _teardown(orch)


def test_refuses_to_serve_on_a_public_address_without_keys():
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHARD_")}
    r = subprocess.run([sys.executable, "-m", "orchard_gym.cli", "serve", "--host", "0.0.0.0", "--port", "1"],
                       env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "ORCHARD_API_KEYS" in r.stderr
    from orchard_gym.service.settings import ServiceSettings, is_loopback

    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")
    os.environ["ORCHARD_API_KEYS"] = " a, b ,,c"
    try:
        assert ServiceSettings().api_keys == ["a", "b", "c"]
    finally:
        del os.environ["ORCHARD_API_KEYS"]


def test_sdk_errors_are_typed_in_remote_mode(orch):
    with orch.client() as client:
        with pytest.raises(SandboxNotFound):
            client.get_sandbox("never-was")
        box = client.create_sandbox()

        def from_inside():
            with pytest.raises((AgentUnavailable, SandboxFailed)):
                box.exec("kill -9 $PPID", timeout=5)  # the agent dies under its own request

        kill_agent(orch.root, box.sandbox_id, from_inside)
        assert wait_until(lambda: box.refresh().status == "failed", 5)
        with pytest.raises(SandboxFailed):
            box.exec("true")


@needs_bwrap
def test_no_leftover_processes_after_delete(orch):
    with orch.client() as client:
        box = client.create_sandbox()
        box.exec("sleep 333 >/dev/null 2>&1 &")
        marker = f"ORCHARD_SANDBOX={box.sandbox_id}"
        assert marked_pids(marker)
        box.delete()
        assert wait_until(lambda: not marked_pids(marker), 5)
