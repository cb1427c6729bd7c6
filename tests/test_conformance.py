"""The SDK's behaviour, the same on every backend (see `conformance_params` in conftest).

Commands here use only what a busybox image has, so the suite runs unchanged against
images without Python or bash.
"""

from __future__ import annotations

import http.server
import threading
import time
import uuid

import pytest

from conftest import client_kwargs, kill_agent, marked_pids, skip_without_netns, variant_limit, wait_until
from orchard_gym import (
    AgentUnavailable,
    AsyncSandboxClient,
    AuthenticationError,
    InvalidRequest,
    OrchardError,
    SandboxFailed,
    SandboxNotFound,
)

LIVE_CMDLINES = (
    "for p in /proc/[0-9]*; do "
    "s=$(cut -d' ' -f3 $p/stat 2>/dev/null); [ \"$s\" = Z ] && continue; "
    "tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done"
)


def test_exec_exit_codes_env_cwd_stdin(sandbox):
    r = sandbox.exec("echo out; echo err >&2; exit 3")
    assert (r.exit_code, r.stdout, r.stderr, r.status) == (3, "out\n", "err\n", "failed")
    assert r.failed and r.is_complete and not r.succeeded and r.job_id
    ok = sandbox.exec(["echo", "a b"])
    assert ok.succeeded and ok.stdout == "a b\n" and ok.exit_code == 0
    assert sandbox.exec("echo $GREETING", env={"GREETING": "hej"}).stdout == "hej\n"
    assert sandbox.exec("pwd", cwd="/").stdout == "/\n"
    sandbox.exec("mkdir -p sub")
    assert sandbox.exec("pwd", cwd="sub").stdout.strip().endswith("/sub")
    assert sandbox.exec("cat", stdin="piped\n").stdout == "piped\n"


def test_non_utf8_output(sandbox):
    r = sandbox.exec("printf '\\377abc\\200'")
    assert r.exit_code == 0 and r.stdout == "\ufffdabc\ufffd"


def test_timeout_kills_whole_tree(sandbox):
    started = time.monotonic()
    r = sandbox.exec("setsid sh -c 'sleep 311' & (sh -c 'sleep 312 &' &); sleep 313", timeout=1)
    assert r.timed_out and r.exit_code == 124 and not r.succeeded and "timed out after 1s" in r.stderr
    assert time.monotonic() - started < 2.5
    still = lambda: [line for line in sandbox.exec(LIVE_CMDLINES).stdout.splitlines() if "sleep 31" in line]
    assert wait_until(lambda: not still(), 3), still()


def test_files_round_trip(sandbox, tmp_path):
    blob = bytes(range(256)) * 257
    assert sandbox.upload_content(blob, "data/blob.bin")["size"] == len(blob)
    assert sandbox.download_content("data/blob.bin") == blob
    src = tmp_path / "script.sh"
    src.write_text("#!/bin/sh\necho from-script\n")
    src.chmod(0o755)
    sandbox.upload_file(src, "data/script.sh")
    assert sandbox.exec("./data/script.sh").stdout == "from-script\n"  # mode travelled too
    out = sandbox.download_file("data/script.sh", tmp_path / "back.sh")
    assert out.read_text() == src.read_text()
    names = {(f.name, f.type) for f in sandbox.list_files("data")}
    assert names == {("blob.bin", "file"), ("script.sh", "file")}
    assert sandbox.exec("cat data/blob.bin | wc -c").stdout.strip() == str(len(blob))
    with pytest.raises(FileNotFoundError):
        sandbox.download_content("data/missing")


def test_apply_patch(sandbox):
    if sandbox.exec("command -v git || command -v patch").exit_code != 0:  # e.g. a Debian minbase image
        with pytest.raises(OrchardError, match="neither git nor patch"):
            sandbox.apply_patch("--- a/f.txt\n+++ b/f.txt\n")
        variant_limit("the image has neither git nor patch (and the agent says so clearly)")
    sandbox.upload_content("one\ntwo\nthree\n", "proj/f.txt")
    patch = "--- a/f.txt\n+++ b/f.txt\n@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n"
    cwd = sandbox.exec("pwd").stdout.strip() + "/proj"
    r = sandbox.apply_patch(patch, cwd=cwd)
    assert r.success, r
    assert sandbox.download_content("proj/f.txt") == b"one\nTWO\nthree\n"
    again = sandbox.apply_patch(patch, cwd=cwd)
    assert not again.success and again.exit_code != 0


def test_streaming_exec(sandbox):
    events = list(sandbox.exec_stream("for i in 1 2 3; do echo $i; done; echo e >&2; exit 4"))
    out = "".join(e.data for e in events if e.type == "stdout")
    assert out == "1\n2\n3\n"
    assert [e.data for e in events if e.type == "stderr"] == ["e\n"]
    assert events[-1].type == "exit" and events[-1].exit_code == 4


def test_agent_refuses_wrong_token(sandbox, client, backend_case):
    if backend_case.get("remote"):
        variant_limit("remote mode never sees the agent's token; test_service.py checks the orchestrator's "
                    "agents refuse a wrong token, and its API refuses a wrong key")
    from orchard_gym._loop import LoopThread
    from orchard_gym.agent_client import AgentClient

    endpoint = sandbox.record.endpoint.model_copy(update={"token": "wrong"})

    async def call():
        agent = AgentClient(endpoint)
        try:
            await agent.list_files(".")
        finally:
            await agent.aclose()

    with pytest.raises(AuthenticationError):
        LoopThread.shared().run(call())


class _HostServer:
    """An HTTP server on this machine that a sandbox with network can reach."""

    def __init__(self):
        handler = type("H", (http.server.BaseHTTPRequestHandler,), {
            "do_GET": lambda self: (self.send_response(200), self.end_headers(), self.wfile.write(b"reached")),
            "log_message": lambda *a: None,
        })
        self.server = http.server.ThreadingHTTPServer(("0.0.0.0", 0), handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


def _fetch(address: str, port: int) -> str:
    """A shell command that prints the page, with whatever the image has. BusyBox's wget gets
    no -T: Debian's busybox-static is built without it and segfaults on it (the exec timeout
    bounds it instead); a minimal Debian has none of the tools but bash's /dev/tcp."""
    url = f"http://{address}:{port}/"
    return (f"if command -v curl >/dev/null; then curl -s -m 3 {url}; "
            f"elif command -v wget >/dev/null; then wget -q -O - {url}; "
            f"elif command -v python3 >/dev/null; then "
            f"python3 -c 'import urllib.request as u; print(u.urlopen(\"{url}\", timeout=3).read().decode())'; "
            f"elif [ -n \"$BASH_VERSION\" ]; then exec 3<>/dev/tcp/{address}/{port} && "
            f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' >&3 && cat <&3; else exit 127; fi")


def test_network_blocked_by_default_and_opened_on_request(client, backend_case):
    server = _HostServer()
    try:
        fetch = _fetch(backend_case["host_address"], server.port)
        with client.create_sandbox(image=backend_case["image"], block_network=False) as open_box:
            assert "reached" in open_box.exec(fetch, timeout=20).stdout
        skip_without_netns(backend_case)
        with client.create_sandbox(image=backend_case["image"]) as box:
            r = box.exec(fetch, timeout=20)
            assert "reached" not in r.stdout and r.exit_code != 0
            interfaces = box.exec("cat /proc/net/dev").stdout
            assert "lo:" in interfaces
    finally:
        server.close()


def test_memory_limit(client, backend_case):
    # a shell variable of ~100 MB (its read buffer and the variable: more) needs more than the 64 MB we allow
    grow = "x=$(head -c 100000000 /dev/zero | tr '\\0' a); echo ${#x}"
    with client.create_sandbox(image=backend_case["image"], memory="64m") as small:
        assert small.exec(grow, timeout=60).exit_code != 0
    with client.create_sandbox(image=backend_case["image"]) as big:
        r = big.exec(grow, timeout=60)
        assert r.exit_code == 0 and r.stdout.strip() == "100000000"


def test_commands_go_before_the_agent_when_memory_runs_out(sandbox):
    # a command's oom_score_adj is 1000 (the agent's stays as it was): at the memory limit the
    # kernel kills the command, not the agent that would report it (test_memory_limit's 64 MB
    # sandbox lost its agent now and then). The agent writes right after the spawn: the shell waits
    # for its own value to be set (the exec's timeout fails the test if it never is), then forks `cat`.
    wait = "until [ \"$(cat /proc/$$/oom_score_adj)\" = 1000 ]; do sleep 0.01; done; cat /proc/self/oom_score_adj"
    assert sandbox.exec(wait, timeout=20).stdout == "1000\n"
    assert sandbox.exec(["sh", "-c", wait], timeout=20).stdout == "1000\n"


def test_delete_leaves_no_process(client, backend_case):
    box = client.create_sandbox(image=backend_case["image"])
    box.exec("sleep 321 >/dev/null 2>&1 &")
    marker = f"ORCHARD_SANDBOX={box.sandbox_id}"
    assert marked_pids(marker), "the sandbox's processes carry its marker"
    box.delete()
    assert wait_until(lambda: not marked_pids(marker), 5)
    with pytest.raises(SandboxNotFound):
        client.get_sandbox(box.sandbox_id)
    with pytest.raises(SandboxNotFound):
        client.delete_sandbox(box.sandbox_id)
    assert box.sandbox_id not in {r.sandbox_id for r in client.list_sandboxes()}


def test_get_list_and_cleanup_all(client, backend_case):
    a = client.create_sandbox(image=backend_case["image"], sandbox_id="conf-a", labels={"k": "v"})
    client.create_sandbox(image=backend_case["image"])
    same = client.get_sandbox("conf-a")
    assert same.sandbox_id == "conf-a" and same.exec("echo hi").stdout == "hi\n"
    assert {"conf-a"} <= {r.sandbox_id for r in client.list_sandboxes()}
    assert a.record.labels == {"k": "v"} and a.status == "running"
    with pytest.raises(InvalidRequest):
        client.create_sandbox(image=backend_case["image"], sandbox_id="conf-a")  # taken
    assert client.cleanup_all() == 2
    assert not [r for r in client.list_sandboxes() if r.status != "deleted"]


def test_dead_sandbox_gives_typed_error(sandbox, client, backend_case, request):
    root = None  # local sandboxes (in-process or the orchestrator's): their folder, for a zygote agent
    if backend_case["config"]["type"] == "local":
        root = (request.getfixturevalue("remote_orchestrator").root if backend_case.get("remote")
                else backend_case["config"]["root"])

    def from_inside():
        with pytest.raises((AgentUnavailable, SandboxFailed)):
            sandbox.exec("kill -9 $PPID", timeout=5)  # the agent dies under its own request

    if root is None:
        from_inside()
    else:
        kill_agent(root, sandbox.sandbox_id, from_inside)
    with pytest.raises((AgentUnavailable, SandboxFailed)):
        sandbox.exec("echo still?", timeout=5)
    assert wait_until(lambda: sandbox.refresh().status == "failed", 5)


def test_heartbeat_beats_until_stopped(sandbox, client):
    control = client._async._control
    beats = []
    real = control.heartbeat

    async def counting(sandbox_id):
        beats.append(sandbox_id)
        await real(sandbox_id)

    control.heartbeat = counting
    sandbox.start_heartbeat(interval=0.05)
    assert wait_until(lambda: len(beats) >= 3, 3)
    sandbox.stop_heartbeat()
    count = len(beats)
    time.sleep(0.2)
    assert len(beats) == count and set(beats) == {sandbox.sandbox_id}
    with pytest.raises(InvalidRequest):
        sandbox.start_heartbeat(interval=0)


GARBAGE_EXEC = [
    {"command": ""},
    {"command": []},
    {"command": None},
    {"command": 42},
    {"command": "true", "timeout": -1},
    {"command": "true", "timeout": "soon"},
    {"command": "true", "env": {"A": 1}},
    {"command": "true", "cwd": 7},
]


def test_garbage_exec_arguments_are_refused(sandbox):
    # one sandbox takes every piece of garbage in turn (a sandbox each cost ~1 s on docker and
    # kubernetes) and must still work after each
    for kwargs in GARBAGE_EXEC:
        try:
            sandbox.exec(**kwargs)
        except InvalidRequest:
            pass
        else:
            pytest.fail(f"exec(**{kwargs}) was not refused")
        assert sandbox.exec("echo fine").stdout == "fine\n", f"the sandbox after exec(**{kwargs})"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"sandbox_id": "Not_A_Label"},
        {"sandbox_id": "x" * 64},
        {"memory": "lots"},
        {"memory": -5},
        {"cpu": 0},
        {"cpu": "two"},
        {"timeout": -3},
    ],
)
def test_garbage_create_arguments_are_refused(client, backend_case, kwargs):
    with pytest.raises(InvalidRequest):
        client.create_sandbox(image=backend_case["image"], **kwargs)


def test_garbage_file_arguments_are_refused(sandbox):
    with pytest.raises(InvalidRequest):
        sandbox.upload_content(12345, "x")
    with pytest.raises(InvalidRequest):
        sandbox.upload_content(b"x", "a\0b")
    with pytest.raises(InvalidRequest):
        sandbox.apply_patch(None)
    assert sandbox.exec("echo fine").stdout == "fine\n"


async def test_async_client_runs_many_sandboxes_concurrently(backend_case):
    import asyncio

    async with AsyncSandboxClient(**client_kwargs(backend_case)) as client:
        boxes = await asyncio.gather(*(client.create_sandbox(image=backend_case["image"]) for _ in range(4)))
        results = await asyncio.gather(*(b.exec(f"echo {i}") for i, b in enumerate(boxes)))
        assert [r.stdout for r in results] == [f"{i}\n" for i in range(4)]
        async with boxes[0] as first:
            assert (await first.exec("true")).succeeded
        with pytest.raises(SandboxNotFound):
            await client.get_sandbox(boxes[0].sandbox_id)
        assert await client.cleanup_all() == 3


# --------------------------------------------------------------------------- the token, from inside
# The needle comes on stdin (so no process holds it in its environ; only the short-lived
# greps in their argv). NULs become newlines first: busybox grep stops a line at a NUL.
SEARCH = """read -r n
for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do
  tr '\\0' '\\n' < "$f" 2>/dev/null | grep -q -F -e "$n" && echo "$f"
done
[ $# -gt 0 ] && grep -r -l -F -s -e "$n" "$@"
exit 0"""


def _search(sandbox, needle: str, places: list[str]) -> list[str]:
    r = sandbox.exec(["sh", "-c", SEARCH, "sh", *places], stdin=needle + "\n", timeout=120)
    return sorted(set(r.stdout.split()))


def test_agent_token_is_not_readable_inside_the_sandbox(sandbox, backend_case):
    """Every /proc/*/environ and cmdline, the work and run folders, /tmp and the agent bundle
    are searched from inside for the token; the same search finds a planted string in each
    kind of place (the positive control)."""
    if backend_case.get("remote"):
        variant_limit("remote mode: the SDK never holds the token to search for (local-bwrap is the same sandbox)")
    token = sandbox.record.endpoint.token
    assert len(token) >= 32
    workdir = sandbox.exec("pwd").stdout.strip()
    # local-plain has no filesystem of its own: its /tmp is the host's, where the backend keeps
    # the root's key (the token derives from it) beside the workdir; see docs/backends.md
    places = [workdir] + ([] if backend_case["config"].get("isolation") == "none" else ["/tmp"])
    uds = sandbox.record.endpoint.uds
    if uds:  # local: the run folder with the agent's socket, and the agent's code
        import os

        from orchard_gym.agent import AGENT_DIR

        places += [os.path.dirname(uds), os.path.realpath(AGENT_DIR)]
    else:
        places.append("/opt/orchard-agent")
    plant = "planted-" + uuid.uuid4().hex
    sandbox.upload_content(f"x {plant} y\n", "planted.txt")
    sandbox.exec(f"(PLANT_ENV={plant} sleep 300 &) ; (sh -c 'sleep 300; true' {plant} &)")
    hits = _search(sandbox, plant, places)
    assert any(h.endswith("/environ") for h in hits), hits
    assert any(h.endswith("/cmdline") for h in hits), hits
    assert f"{workdir}/planted.txt" in hits, hits
    assert _search(sandbox, token, places) == []
    # where the host can look: the agent process's own environ and cmdline hold no token
    pid = str((sandbox.record.details or {}).get("pid") or "").split(":")[0]
    if uds and pid.isdigit():
        for name in ("environ", "cmdline"):
            with open(f"/proc/{pid}/{name}", "rb") as f:
                assert token.encode() not in f.read()


# --------------------------------------------------------------------------- file paths (docs/backends.md)
def test_file_routes_stay_in_the_workdir(sandbox):
    """Paths resolve against the workdir; after `..` and symlinks are resolved they must lie
    under it, else a clear refusal (the policy in docs/backends.md, "File paths")."""
    workdir = sandbox.exec("pwd").stdout.strip()
    sandbox.upload_content(b"inside", "sub/in.txt")
    assert sandbox.download_content(f"{workdir}/sub/in.txt") == b"inside"  # absolute, inside
    assert sandbox.download_content("sub/../sub/in.txt") == b"inside"  # .. that stays inside
    assert sandbox.exec("ln -s /etc link-out && ln -s sub/in.txt link-in && ln -s / root-link").exit_code == 0
    assert sandbox.download_content("link-in") == b"inside"  # a symlink that stays inside
    depth = "../" * (workdir.count("/") + 2)
    for path in (f"{depth}etc/passwd", "/etc/passwd", "link-out/passwd", "root-link/etc/passwd", ".."):
        with pytest.raises(InvalidRequest, match="outside"):
            sandbox.download_content(path)
        with pytest.raises(InvalidRequest, match="outside"):
            sandbox.upload_content(b"evil", path if path != ".." else "../evil")
        with pytest.raises(InvalidRequest, match="outside"):
            sandbox.list_files(path)
    with pytest.raises(InvalidRequest, match="outside"):
        sandbox.upload_content(b"evil", "link-out/evil-orchard")
    assert sandbox.exec("test -e /etc/evil-orchard").exit_code != 0  # nothing was written
    with pytest.raises(InvalidRequest, match="outside"):
        sandbox.apply_patch("--- a/x\n+++ b/x\n", cwd="/etc")
    assert {f.name for f in sandbox.list_files(".")} >= {"sub", "link-in", "link-out"}
