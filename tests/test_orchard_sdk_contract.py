"""Orchard Env's published SDK (`orchard_env.client`, microsoft/Orchard) against `orchard serve`.

That SDK is not on PyPI, so it cannot be installed and run here. Instead this test replays,
request by request, what its sync and async clients send (written from reading them: the
same methods, paths, query parameters and JSON bodies, with `X-API-Key`) and asserts every
field and status code those clients read from the answers. Each block names the SDK method.
The local backend runs here with `any_image_as_host`, as `orchard serve` would for an
image-agnostic benchmark. `exec(pty=True)` is replayed at the end, frame by frame.
"""

from __future__ import annotations

import base64
import json
import time

import httpx
import pytest
from service_helpers import Orchestrator, remove_all_sandboxes, short_root

from conftest import require_module

require_module("server", "fastapi")

IMAGE = "mirror.gcr.io/swerebenchv2/behat-gherkin:343-e522894"  # any name: it runs as the host image


@pytest.fixture(scope="module")
def orch(tmp_path_factory):
    root = short_root("osdk")
    o = Orchestrator(root, log_dir=tmp_path_factory.mktemp("logs"), backend_config={"any_image_as_host": True})
    yield o
    o.stop()
    remove_all_sandboxes(root)


@pytest.fixture(scope="module")
def http(orch):
    # SandboxClient: a requests.Session with X-API-Key on every request, 1200 s default timeout
    with httpx.Client(base_url=orch.url, headers={"X-API-Key": orch.api_key}, timeout=120) as h:
        yield h


def ok(response: httpx.Response) -> dict:
    """What `_request` does: raise_for_status(), then .json()."""
    assert response.status_code == 200, response.text
    return response.json()


def create_sandbox(http, **options) -> tuple[str, dict, dict]:
    """SandboxClient.create_sandbox(image, ...): POST, then the server-side /wait with the
    `timeout` the create answered (3600 if none), ready = `ready` or status == 'ready'."""
    payload = {"image": IMAGE, "block_network": True, **options}
    created = ok(http.post("/sandboxes", json=payload))
    sid = created["sandbox_id"]
    server_timeout = created.get("timeout", options.get("timeout") or 3600)
    assert isinstance(server_timeout, (int, float)) and server_timeout > 0
    waited = ok(http.get(f"/sandboxes/{sid}/wait", params={"timeout": server_timeout},
                         timeout=server_timeout + 30))
    assert waited.get("ready") or waited.get("status") == "ready", waited
    return sid, created, waited


@pytest.fixture(scope="module")
def box(http):
    # create_sandbox with a prefix: sandbox_id f"{prefix}-{uuid4().hex[:8]}", cpu/memory as quantities
    sid, created, waited = create_sandbox(http, sandbox_id="myapp-1a2b3c4d", cpu="2000m", memory="1Gi")
    assert sid == "myapp-1a2b3c4d"
    # SandboxInstance.__init__ reads these from the /wait answer
    assert waited["namespace"] and waited["image"] == IMAGE and waited["block_network"] is True
    assert waited["status_message"] == "" and created["timeout"] > 0
    yield sid
    ok(http.delete(f"/sandboxes/{sid}"))


def exec_wait(http, sid: str, command, timeout=None, cwd=None, env=None, login_shell=False) -> dict:
    """SandboxInstance.exec(command): POST .../exec with wait=True and its five other keys
    (timeout_seconds null when the caller gives none); complete = succeeded or failed."""
    body = {"command": command, "timeout_seconds": timeout, "cwd": cwd, "env": env,
            "login_shell": login_shell, "wait": True}
    data = ok(http.post(f"/sandboxes/{sid}/exec", json=body, timeout=(timeout or 300) + 60))
    assert data.get("status") in ("succeeded", "failed"), data
    # JobResult.__init__: these keys are indexed, not .get()
    for key in ("job_id", "sandbox_id", "command", "status", "created_at"):
        assert key in data, key
    assert data["sandbox_id"] == sid and isinstance(data["created_at"], float)
    return data


def test_create_answers_the_fields_the_sdk_reads(http):
    # no timeout given: the SDK asks /wait for the create answer's `timeout` (else 3600)
    sid, created, waited = create_sandbox(http, cpu="0.5")
    try:
        assert created["sandbox_id"] == sid and created["status"] in ("pending", "running")
        assert isinstance(created["timeout"], (int, float))
        got = ok(http.get(f"/sandboxes/{sid}"))  # get_sandbox() and the polling fallback
        assert got["ready"] is True and got["sandbox_id"] == sid and got["cpu"] == 0.5
        assert {"namespace", "image", "block_network", "status_message"} <= got.keys()
        ok(http.post(f"/sandboxes/{sid}/heartbeat"))  # heartbeat(), start_heartbeat()
    finally:
        ok(http.delete(f"/sandboxes/{sid}"))  # delete(): raise_for_status
    # delete_sandbox() swallows errors; a second delete is a 404, not a crash
    assert http.delete(f"/sandboxes/{sid}").status_code == 404
    # a wait of up to an hour is accepted (the SDK's default), not cut to 408 at max_wait
    sid, _, _ = create_sandbox(http, timeout=3600)
    ok(http.delete(f"/sandboxes/{sid}"))


def test_bad_quantities_get_a_clear_422(http):
    for cpu in ("lots", "2000x", "-1", "0m"):
        r = http.post("/sandboxes", json={"image": IMAGE, "block_network": True, "cpu": cpu})
        assert r.status_code == 422 and "cpu" in r.text, (cpu, r.text)


def test_exec_wait_true_with_null_timeout(http, box):
    data = exec_wait(http, box, "echo 'Hello from sandbox!'")
    assert data["status"] == "succeeded" and data["exit_code"] == 0
    assert data["stdout"] == "Hello from sandbox!\n" and data["stderr"] == "" and data["error"] is None
    assert data["started_at"] and data["completed_at"] >= data["started_at"]
    argv = exec_wait(http, box, ["printf", "%s|", "a b", "c"], cwd="/tmp", env={"X": "1"})
    assert argv["stdout"] == "a b|c|"
    failed = exec_wait(http, box, "echo oops >&2; exit 3")
    assert failed["status"] == "failed" and failed["exit_code"] == 3 and failed["stderr"] == "oops\n"


def test_exec_timeout_is_124_with_a_message(http, box):
    # sandbox.exec("sleep 600 && echo 'Awake now!'", timeout=10), here 1 s
    started = time.monotonic()
    data = exec_wait(http, box, "sleep 600 && echo 'Awake now!'", timeout=1)
    assert time.monotonic() - started < 30
    assert data["status"] == "failed" and data["exit_code"] == 124 and data["stdout"] == ""
    assert "timed out after 1s" in data["stderr"] and "timed out" in data["error"]


def test_exec_without_wait_then_poll_jobs(http, box):
    # the SDK's fallback: POST without `wait`, then GET /jobs/{id} every poll_interval
    body = {"command": "sleep 0.3; echo late", "timeout_seconds": 30, "cwd": None, "env": None, "login_shell": False}
    queued = ok(http.post(f"/sandboxes/{box}/exec", json=body))
    assert queued["status"] == "queued" and queued["job_id"]
    deadline = time.monotonic() + 30
    while True:
        job = ok(http.get(f"/jobs/{queued['job_id']}"))
        if job["status"] in ("succeeded", "failed"):
            break
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert job["stdout"] == "late\n" and job["exit_code"] == 0 and job["sandbox_id"] == box


def test_check_env_probes(http, box):
    # check_env(): a bare probe, then a login-shell probe, both parsed line by line
    bare = exec_wait(http, box, 'echo "__BARE_PATH=$PATH"; echo "__BARE_HISTCONTROL=${HISTCONTROL:-}"', timeout=10)
    assert "__BARE_PATH=/" in bare["stdout"]
    login = exec_wait(http, box, 'echo "__PYTHON3=$(command -v python3 2>/dev/null || echo none)"',
                      timeout=15, login_shell=True)
    assert login["status"] == "succeeded" and "__PYTHON3=/" in login["stdout"]


def test_files_upload_download_list(http, box):
    content = b"\x00binary\xffdata\n"
    # upload_content() / upload_file(): {path, content: base64}
    up = ok(http.post(f"/sandboxes/{box}/files",
                      json={"path": "sub/data.bin", "content": base64.b64encode(content).decode()}))
    assert up["success"] is True and up["size"] == len(content)
    # download_content() / download_file(): GET ?path= -> {content: base64}
    down = ok(http.get(f"/sandboxes/{box}/files", params={"path": "sub/data.bin"}))
    assert base64.b64decode(down["content"]) == content
    # list_files(): GET .../files/list ?path= -> {files: [{name, type, size, modified: str}]}
    files = ok(http.get(f"/sandboxes/{box}/files/list", params={"path": "sub"}))["files"]
    assert [(f["name"], f["type"], f["size"]) for f in files] == [("data.bin", "file", len(content))]
    assert isinstance(files[0]["modified"], str) and files[0]["modified"].startswith(time.strftime("%Y-"))
    missing = http.get(f"/sandboxes/{box}/files", params={"path": "nope.bin"})
    assert missing.status_code == 404  # raise_for_status: an HTTPError, as Orchard's own 404


def test_apply_patch(http, box):
    ok(http.post(f"/sandboxes/{box}/files", json={"path": "p/a.txt", "content": base64.b64encode(b"one\n").decode()}))
    patch = "--- a/p/a.txt\n+++ b/p/a.txt\n@@ -1 +1 @@\n-one\n+two\n"
    # apply_patch(patch, timeout=30): {patch, timeout_seconds}; the SDK returns the dict as is
    data = ok(http.post(f"/sandboxes/{box}/apply_patch", json={"patch": patch, "timeout_seconds": 30}))
    assert data["success"] is True and "exit_code" in data and "stdout" in data and "stderr" in data
    assert exec_wait(http, box, "cat p/a.txt")["stdout"] == "two\n"


def test_health_and_unknown_ids(http):
    assert isinstance(ok(http.get("/health")), dict)  # health()
    assert http.get("/sandboxes/no-such-box/wait", params={"timeout": 1}).status_code == 404
    assert http.get("/jobs/no-such-job").status_code == 404


# --------------------------------------------------------------------------- exec(pty=True)
# ContainerProcess: websocket-client to ws://HOST/sandboxes/{id}/exec/pty?api_key=KEY, then the
# init frame as its first message; text frames with base64 data both ways.
def pty_url(orch, sandbox_id: str, key: str | None) -> str:
    return orch.url.replace("http://", "ws://") + f"/sandboxes/{sandbox_id}/exec/pty" + \
        (f"?api_key={key}" if key else "")


def init(command: str, rows: int = 24, cols: int = 80) -> str:
    """_build_init_frame: a string command becomes ["bash", "-c", command]."""
    return json.dumps({"type": "init", "cmd": ["bash", "-c", command], "env": {}, "cwd": None,
                       "rows": rows, "cols": cols, "login_shell": False})


def frames(ws, until: str, timeout: float = 30) -> tuple[bytes, dict]:
    """Its reader loop: stdout frames decoded, until a frame of type `until` (returned)."""
    out = b""
    while True:
        frame = json.loads(ws.recv(timeout=timeout))
        if frame["type"] == "stdout":
            out += base64.b64decode(frame["data"])
        if frame["type"] == until or frame["type"] in ("exit", "error"):
            return out, frame


def stdin(text: str) -> str:
    return json.dumps({"type": "stdin", "data": base64.b64encode(text.encode()).decode("ascii")})


def test_pty_session_as_orchard_drives_it(orch, box):
    from websockets.sync.client import connect

    with connect(pty_url(orch, box, orch.api_key), max_size=4 << 20) as ws:
        ws.send(init("stty size; read line; echo got-$line; sleep 0.2; stty size; exit 7", rows=30, cols=100))
        _, ready = frames(ws, "ready")
        assert ready["type"] == "ready" and isinstance(ready["pid"], int)
        out, _ = frames(ws, "stdout")
        ws.send(json.dumps({"type": "resize", "rows": 40, "cols": 120}))  # resize()
        ws.send(stdin("hello\n"))  # write_stdin()
        rest, end = frames(ws, "exit")
        out += rest
        assert end == {"type": "exit", "code": 7}, end
        assert b"30 100" in out and b"got-hello" in out and b"40 120" in out
    # kill("TERM"): a signal frame; the exit code is negative for a signal
    with connect(pty_url(orch, box, orch.api_key)) as ws:
        ws.send(init("echo up; sleep 300"))
        frames(ws, "stdout")
        ws.send(json.dumps({"type": "signal", "sig": "TERM"}))
        assert frames(ws, "exit")[1]["code"] == -15


def test_pty_refusals_and_garbage(orch, box):
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    # refused after the upgrade: an error frame (what its reader loop reports), then a close code
    for key, sandbox_id, code in [(None, box, 4401), ("wrong-key", box, 4403), (orch.api_key, "no-such-box", 4404)]:
        with connect(pty_url(orch, sandbox_id, key)) as ws:
            frame = json.loads(ws.recv(timeout=10))
            assert frame["type"] == "error" and frame["message"], frame
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=10)
            assert closed.value.rcvd.code == code
    for first, message in [("not json at all", "bad init frame"), (json.dumps({"type": "init", "cmd": 7}), "cmd: command must be"),
                           (json.dumps([1, 2]), "bad init frame")]:
        with connect(pty_url(orch, box, orch.api_key)) as ws:
            ws.send(first)
            frame = json.loads(ws.recv(timeout=10))
            assert frame["type"] == "error" and message in frame["message"], frame
    with connect(pty_url(orch, box, orch.api_key)) as ws:  # garbage after a good start
        ws.send(init("cat"))
        frames(ws, "ready")
        ws.send("{{{ garbage")
        _, frame = frames(ws, "error")
        assert frame["type"] == "error" and "bad frame" in frame["message"]


def test_pty_client_gone_leaves_no_process(orch, http, box):
    from websockets.sync.client import connect

    running = lambda: "sleep 4646" in exec_wait(http, box, "ps -eo args 2>/dev/null || cat /proc/*/cmdline")["stdout"]
    with connect(pty_url(orch, box, orch.api_key)) as ws:
        ws.send(init("echo up; sleep 4646"))
        frames(ws, "stdout")
        assert running()
        ws.socket.close()  # the process of the client died: no close frame, the TCP connection just ends
        deadline = time.monotonic() + 20
        while running():
            assert time.monotonic() < deadline, "the session's command outlived its client"
            time.sleep(0.2)


# --------------------------------------------------------------------------- expose_service
def test_service_endpoints(orch, http, box):
    # expose_service(port, wait_ready=True, health_path="/"): its docstring's own example
    exec_wait(http, box, "nohup python3 -m http.server 8123 --bind 127.0.0.1 >/dev/null 2>&1 &")
    ok(http.post(f"/sandboxes/{box}/files", json={"path": "hello.txt", "content": base64.b64encode(b"hi\n").decode()}))
    payload = {"port": 8123, "wait_ready": True, "health_path": "/", "ready_timeout": 30}
    endpoint = ok(http.post(f"/sandboxes/{box}/services", json=payload))
    assert endpoint["sandbox_id"] == box and endpoint["port"] == 8123 and endpoint["expires_at"] > time.time()
    url = endpoint["url"]
    assert url.startswith(orch.url + "/s/")
    with httpx.Client(timeout=30) as anyone:  # no X-API-Key: the URL is the credential
        page = anyone.get(url + "/hello.txt")
        assert page.status_code == 200 and page.text == "hi\n" and page.headers["content-type"] == "text/plain"
        assert anyone.get(url + "/no-such-file").status_code == 404  # the service's own 404
        assert ok(http.get(f"/sandboxes/{box}/services")) ["ports"] == [8123]  # list_services()
        ok(http.delete(f"/sandboxes/{box}/services/8123"))  # revoke_service(): at once
        assert anyone.get(url + "/hello.txt").status_code == 404
        assert ok(http.get(f"/sandboxes/{box}/services"))["ports"] == []
        assert anyone.get(url[:-4] + "AAAA/hello.txt").status_code == 404  # a forged token
    # a port nothing listens on: 502 from the proxy; a bad port: 422
    silent = ok(http.post(f"/sandboxes/{box}/services", json={"port": 8999, "ttl_seconds": 60}))
    assert httpx.get(silent["url"] + "/", timeout=30).status_code == 502
    assert http.post(f"/sandboxes/{box}/services", json={"port": 0}).status_code == 422
    waited = http.post(f"/sandboxes/{box}/services", json={"port": 8999, "wait_ready": True, "ready_timeout": 1})
    assert waited.status_code == 408 and "did not answer /health" in waited.text
