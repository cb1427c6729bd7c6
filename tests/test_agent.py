"""The in-sandbox agent, spoken to over HTTP as every backend does."""

from __future__ import annotations

import base64
import json
import time

import pytest

from conftest import wait_until


def test_health_needs_no_token(agent):
    body = agent.anon.get("/health").json()
    assert body["status"] == "ok" and body["version"] and body["uptime"] >= 0


def test_exit_codes_stdout_stderr(agent):
    r = agent.exec(command="echo out; echo err >&2; exit 7")
    assert (r["exit_code"], r["stdout"], r["stderr"]) == (7, "out\n", "err\n")
    assert r["timed_out"] is False and r["truncated"] is False and r["duration"] >= 0
    assert agent.exec(command=["false"])["exit_code"] == 1
    assert agent.exec(command=["sh", "-c", "kill -TERM $$"])["exit_code"] == -15


def test_env_cwd_stdin_login_shell(agent):
    r = agent.exec(command="echo $FOO; pwd", env={"FOO": "bar baz"}, cwd="/")
    assert r["stdout"] == "bar baz\n/\n"
    assert agent.exec(command="pwd")["stdout"].strip() == str(agent.cwd)
    resp = agent.http.post("/exec", json={"command": "pwd", "cwd": "does/not/exist"})
    assert resp.status_code == 422 and "cwd" in resp.json()["error"]
    assert agent.exec(command="tr a-z A-Z", stdin="hello\n")["stdout"] == "HELLO\n"
    login = agent.exec(command="shopt -q login_shell && echo login || echo plain", login_shell=True)
    assert login["stdout"] == "login\n"
    assert agent.exec(command="shopt -q login_shell && echo login || echo plain")["stdout"] == "plain\n"


def test_token_never_leaks_into_commands(agent):
    r = agent.exec(command="env")
    assert "secret-token" not in r["stdout"] and "ORCHARD_AGENT_TOKEN" not in r["stdout"]


def test_non_utf8_output_is_replaced_not_fatal(agent):
    r = agent.exec(command=["printf", "\\377\\376ok\\200"])
    assert r["exit_code"] == 0 and r["stdout"] == "\ufffd\ufffdok\ufffd"


def test_output_is_capped_and_flagged(agent):
    r = agent.exec(command="head -c 300000 /dev/zero | tr '\\0' a; echo done >&2")
    assert len(r["stdout"]) == 100000 and r["truncated"] is True
    assert r["stderr"] == "done\n" and r["exit_code"] == 0
    r = agent.exec(command="yes | head -c 5000", max_output=1000)
    assert len(r["stdout"]) == 1000 and r["truncated"]


def test_timeout_kills_setsid_and_double_fork_tree(agent):
    command = (
        "setsid sh -c 'sleep 301' & "           # its own session
        "(sh -c 'sleep 302 &' &) ; "             # double fork: orphaned grandchild
        "nohup sleep 303 >/dev/null 2>&1 & "     # ignores SIGHUP
        "sleep 304"
    )
    started = time.monotonic()
    r = agent.exec(command=command, timeout=1)
    assert r["timed_out"] is True and r["exit_code"] == -9
    assert time.monotonic() - started < 2.0  # within timeout + 1 s
    # no survivor: zombies are reaped within a second, live processes are gone at once
    for seconds in ("301", "302", "303", "304"):
        assert wait_until(lambda: not _sleepers(seconds), 3), f"sleep {seconds} survived"


def _sleepers(seconds: str) -> list[str]:
    import subprocess

    out = subprocess.run(["ps", "-eo", "stat=,args="], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line.split(None, 1)[-1] == f"sleep {seconds}"
            and not line.startswith("Z")]


def test_background_child_holding_pipes_does_not_block(agent):
    started = time.monotonic()
    r = agent.exec(command="sleep 5 & echo started $!")
    assert r["stdout"].startswith("started ") and time.monotonic() - started < 2
    agent.exec(command=f"kill {int(r['stdout'].split()[1])}")  # only the sleep this test started


def test_streaming_exec_yields_chunks_then_exit(agent):
    with agent.http.stream("POST", "/exec/stream", json={"command": "for i in 1 2 3; do echo $i; sleep 0.2; done"}) as resp:
        assert resp.status_code == 200
        events, stamps = [], []
        for line in resp.iter_lines():
            if line:
                events.append(json.loads(line))
                stamps.append(time.monotonic())
    assert [e["data"] for e in events[:-1]] == ["1\n", "2\n", "3\n"]
    assert events[-1]["type"] == "exit" and events[-1]["exit_code"] == 0
    assert stamps[2] - stamps[0] > 0.3  # chunks arrived as produced, not all at the end


def test_files_round_trip_binary(agent):
    blob = bytes(range(256)) * 1000
    resp = agent.http.put("/files", params={"path": "dir/sub/blob.bin", "mode": "750"}, content=blob)
    assert resp.status_code == 200 and resp.json()["size"] == len(blob)
    assert agent.http.get("/files", params={"path": "dir/sub/blob.bin"}).content == blob
    assert (agent.cwd / "dir/sub/blob.bin").stat().st_mode & 0o777 == 0o750
    payload = {"path": str(agent.cwd / "b64.txt"), "content": base64.b64encode(b"\x00hi\xff").decode()}
    assert agent.http.post("/files", json=payload).json()["size"] == 4
    assert (agent.cwd / "b64.txt").read_bytes() == b"\x00hi\xff"
    listing = agent.http.get("/files/list", params={"path": "dir"}).json()
    assert listing["files"] == [{"name": "sub", "type": "directory", "size": listing["files"][0]["size"],
                                 "modified": listing["files"][0]["modified"]}]
    assert agent.http.get("/files", params={"path": "missing"}).status_code == 404
    assert agent.http.get("/files", params={"path": "dir"}).status_code == 409
    assert agent.http.get("/files/list", params={"path": "missing"}).status_code == 404


def test_apply_patch(agent):
    agent.exec(command="git init -q . && printf 'a\\nb\\nc\\n' > f.txt && git add f.txt")
    patch = "--- a/f.txt\n+++ b/f.txt\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n"
    r = agent.http.post("/patch", json={"patch": patch}).json()
    assert r["success"] is True and r["exit_code"] == 0, r
    assert (agent.cwd / "f.txt").read_text() == "a\nB\nc\n"
    bad = agent.http.post("/patch", json={"patch": patch}).json()  # no longer applies
    assert bad["success"] is False and bad["exit_code"] != 0 and bad["stderr"]


def test_auth_refused_without_or_with_wrong_token(agent):
    assert agent.anon.post("/exec", json={"command": "true"}).status_code == 401
    wrong = agent.anon.post("/exec", json={"command": "true"}, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert agent.anon.get("/files", params={"path": "/etc/hostname"}).status_code == 401


@pytest.mark.parametrize(
    "method,path,body,status",
    [
        ("POST", "/exec", b"{not json", 400),
        ("POST", "/exec", b"[1, 2]", 422),
        ("POST", "/exec", b"{}", 422),
        ("POST", "/exec", b'{"command": 5}', 400),
        ("POST", "/exec", b'{"command": ""}', 400),
        ("POST", "/exec", b'{"command": []}', 400),
        ("POST", "/exec", b'{"command": "true", "timeout": -1}', 422),
        ("POST", "/exec", b'{"command": "true", "timeout": "x"}', 422),
        ("POST", "/exec", b'{"command": "true", "env": {"A": 1}}', 422),
        ("POST", "/exec", b'{"command": "true", "bogus": 1}', 422),
        ("POST", "/exec", b'{"command": ["no-such-binary-xyz"]}', 422),
        ("POST", "/exec", b"\xff\xfe\x00", 400),
        ("POST", "/files", b'{"path": "x", "content": "***"}', 422),
        ("POST", "/files", b'{"path": "", "content": ""}', 422),
        ("POST", "/files", b'{"path": "a\\u0000b", "content": ""}', 422),
        ("POST", "/files", b'{"path": "x", "content": "", "mode": "999"}', 422),
        ("POST", "/patch", b'{"patch": 3}', 422),
        ("POST", "/patch", b'{"patch": "   "}', 422),
        ("GET", "/nowhere", b"", 404),
        ("DELETE", "/exec", b"", 405),
        ("GET", "/files", b"", 422),
    ],
)
def test_garbage_requests_get_4xx(agent, method, path, body, status):
    resp = agent.http.request(method, path, content=body)
    assert resp.status_code == status, resp.text
    assert "error" in resp.json()
    assert agent.exec(command="echo alive")["stdout"] == "alive\n"  # and the agent lives on


def test_raw_protocol_garbage_does_not_hang_or_kill(agent):
    assert agent.raw(b"\x00\x01garbage\r\n\r\n").startswith(b"HTTP/1.")  # 400 from the parser
    assert b"413" in agent.raw(b"POST /exec HTTP/1.1\r\nAuthorization: Bearer secret-token\r\n"
                               b"Content-Length: 99999999999\r\n\r\n")
    assert b"400" in agent.raw(b"POST /exec HTTP/1.1\r\nContent-Length: abc\r\n"
                               b"Authorization: Bearer secret-token\r\n\r\n")
    assert agent.exec(command="echo alive")["stdout"] == "alive\n"


def test_sigterm_kills_running_jobs(tmp_path):
    from conftest import AgentProcess

    a = AgentProcess(tmp_path, "t")
    import threading

    import httpx

    def run_long():
        try:
            a.http.post("/exec", json={"command": "sleep 305"})
        except httpx.HTTPError:
            pass  # the agent dies under it: expected

    threading.Thread(target=run_long, daemon=True).start()
    assert wait_until(lambda: _sleepers("305"), 5)
    a.close()
    assert wait_until(lambda: not _sleepers("305"), 5)
