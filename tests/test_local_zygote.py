"""The local backend's pre-forked agent (backends/zygote.py): what a forked sandbox can
reach (no fd, memory or process of the zygote or of a sibling), a crashed zygote is
restarted, and garbage on either of its sockets is refused. The rest of the local and
security tests run with the zygote on (spawner="auto", the default)."""

from __future__ import annotations

import array
import json
import os
import re
import signal
import socket

import pytest

from conftest import WHY_NO_BWRAP, marked_pids, wait_until
from components import needs
from orchard_gym import SandboxClient
from orchard_gym.backends import procs

WHY_NO_ZYGOTE = WHY_NO_BWRAP or ("" if os.geteuid() == 0 else "the zygote needs root")
needs_zygote = needs("bwrap", WHY_NO_ZYGOTE)


def _config(root, **extra) -> dict:
    return {"type": "local", "root": str(root), "isolation": "bwrap", "spawner": "zygote", **extra}


def _fd_identities(pid: int) -> dict[tuple[int, int], str]:
    """(st_dev, st_ino) -> link text of every open fd of a process (seen from the host)."""
    out = {}
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            st = os.stat(f"/proc/{pid}/fd/{name}")
            out[(st.st_dev, st.st_ino)] = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
    return out


def _writable_memory(pid: int) -> bytes:
    """The private writable memory of a process (heap, stacks, the interpreter's objects)."""
    chunks = []
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            fields = line.split()
            if not fields[1].startswith("rw") or (len(fields) > 5 and fields[5].startswith("[v")):
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            try:
                mem.seek(start)
                chunks.append(mem.read(end - start))
            except OSError:
                continue
    return b"".join(chunks)


@needs_zygote
def test_a_forked_sandbox_reaches_no_fd_memory_or_process_of_the_zygote_or_a_sibling(local_root):
    from orchard_gym.backends.base import token_sha256

    with SandboxClient(_config(local_root)) as client:
        a, b = client.create_sandbox(), client.create_sandbox()
        assert a.record.details["spawner"] == b.record.details["spawner"] == "zygote"
        zygote = client.backend.resources()["spawner"]["zygote"]["pid"]
        agent_a, agent_b = a.record.details["pid"]["pid"], b.record.details["pid"]["pid"]
        # fds: the agent holds its own log, socket, cgroup dirs; nothing the zygote or a sibling holds
        fds_b = _fd_identities(agent_b)
        assert not set(fds_b) & set(_fd_identities(zygote)), (fds_b, _fd_identities(zygote))
        assert not set(fds_b) & set(_fd_identities(agent_a))
        assert not any(a.sandbox_id in t or "zygote" in t for t in fds_b.values()), fds_b
        assert any(t.endswith(f"{b.sandbox_id}/agent.log") for t in fds_b.values()), fds_b
        inside = b.exec("ls /proc/self/fd").stdout.split()  # a command: stdio and ls's own listing
        assert set(inside) <= {"0", "1", "2", "3"}, inside
        # processes: its PID namespace holds the agent and this command only
        pids = [p for p in b.exec("ls /proc").stdout.split() if p.isdigit()]
        assert "1" in pids and len(pids) <= 3, pids
        assert b.exec(f"kill -0 {zygote} || kill -0 {agent_a}").exit_code != 0
        assert b.exec("cat /proc/1/environ").exit_code != 0  # the agent is not dumpable
        # memory: b's agent (a copy of the zygote) holds its own token hash, not a's
        memory = _writable_memory(agent_b)
        assert token_sha256(b.record.endpoint.token).encode() in memory  # the scan finds what is there
        for needle in (token_sha256(a.record.endpoint.token), a.record.endpoint.token, a.sandbox_id):
            assert needle.encode() not in memory, needle
        assert token_sha256(a.record.endpoint.token).encode() not in _writable_memory(zygote)


@needs_zygote
def test_a_crashed_zygote_is_detected_and_restarted(local_root):
    with SandboxClient(_config(local_root)) as client:
        first = client.create_sandbox()
        zygote = client.backend.zygote
        old = zygote.pid
        os.kill(old, signal.SIGKILL)
        assert wait_until(lambda: zygote.pid is None, 10)  # seen dead
        assert first.exec("echo still").stdout == "still\n"  # its sandboxes live on
        second = client.create_sandbox()
        assert second.exec("echo new").stdout == "new\n"
        described = client.backend.resources()["spawner"]["zygote"]
        assert described["restarts"] == 1 and described["pid"] not in (None, old)
        ids = [first.sandbox_id, second.sandbox_id]
    assert wait_until(lambda: not any(marked_pids(f"ORCHARD_SANDBOX={i}") for i in ids), 10)


def _ask(zygote, payload: bytes, fds: list[int]) -> dict:
    conn = zygote._open_request()
    try:
        conn.settimeout(20)
        conn.sendmsg([payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else [])
        return json.loads(conn.recv(65536))
    finally:
        conn.close()


@needs_zygote
def test_garbage_to_the_zygote_is_refused_and_it_keeps_serving(local_root):
    from orchard_gym.backends.zygote import zygote_request

    with SandboxClient(_config(local_root)) as client:
        client.create_sandbox()  # starts it
        zygote = client.backend.zygote
        pid = zygote.pid
        # the control socket: anything but b"S" with exactly one fd
        r, w = os.pipe()
        for data, fds in ((b"hello", []), (b"", []), (b"S", []), (b"S", [r, w]), (b"X", [r])):
            zygote._control.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
                                    if fds else [])
        # a request: JSON of the right shape and the fds it announces, or an error naming the fault
        meta = {"sandbox_id": "sb-garbage", "workdir": str(local_root / "x/work"), "network": "none",
                "socket": str(local_root / "x/run/agent.sock")}
        good = zygote_request(meta, {"PATH": "/bin"}, ["--socket", meta["socket"]], [["ro", "/usr"]], 0, None)
        log = os.open(os.devnull, os.O_WRONLY)
        bad = [b"not json", b"[1, 2]", json.dumps({**good, "extra": 1}).encode(),
               json.dumps({**good, "workdir": "relative/work"}).encode(),
               json.dumps({**good, "workdir": "/a/../etc"}).encode(),
               json.dumps({**good, "network": "bridge"}).encode(),
               json.dumps({**good, "sandbox_id": "../x"}).encode(),
               json.dumps({**good, "env": {"A=B": "c"}}).encode(),
               json.dumps({**good, "agent_args": ["ok", 3]}).encode(),
               json.dumps({**good, "cgroup_fds": True}).encode(),
               json.dumps({**good, "job_cgroup_index": 0}).encode(),
               json.dumps({**good, "v": 2}).encode(),
               json.dumps({**good, "view": [["ro", "/"]]}).encode(),
               json.dumps({**good, "view": [["ro", "/usr/../etc"]]}).encode(),
               json.dumps({**good, "view": [["bind", "/usr"]]}).encode(),
               json.dumps({**good, "view": [["symlink", "/usr"]]}).encode()]
        try:
            for payload in bad:
                assert _ask(zygote, payload, [log])["error"].startswith("refused"), payload
            assert "expected the log fd" in _ask(zygote, json.dumps(good).encode(), [])["error"]
            assert "expected the log fd" in _ask(zygote, json.dumps(good).encode(), [log, log])["error"]
        finally:
            for fd in (r, w, log):
                os.close(fd)
        assert zygote.pid == pid and zygote.restarts == 0  # still the same zygote
        assert client.create_sandbox().exec("echo fine").stdout == "fine\n"
    text = (local_root / ".zygote.log").read_text()
    assert len(re.findall(r"refused a control message", text)) == 5, text


def test_the_spawner_switch_and_its_fallback_are_visible(local_root):
    from pydantic import ValidationError

    from orchard_gym.backends.config import LocalBackendConfig
    from orchard_gym.errors import BackendError

    with pytest.raises(ValidationError, match="spawner"):
        LocalBackendConfig(spawner="sometimes")
    with pytest.raises(BackendError, match="spawner='zygote' but it cannot run here"):
        LocalBackendConfig(root=local_root, isolation="none", spawner="zygote").get_backend()
    with SandboxClient({"type": "local", "root": str(local_root), "isolation": "none"}) as client:
        box = client.create_sandbox()
        assert box.record.details["spawner"] == "process"
        assert "no zygote" in client.backend.resources()["spawner"]
        assert procs.alive(box.record.details["pid"])


@needs_zygote
def test_spawner_bwrap_keeps_the_old_path(local_root):
    with SandboxClient(_config(local_root, spawner="bwrap")) as client:
        box = client.create_sandbox()
        assert box.record.details["spawner"] == "bwrap" and client.backend.zygote is None
        assert client.backend.resources()["spawner"].startswith("bwrap (no zygote: spawner='bwrap'")
        assert box.exec("hostname").stdout.strip() == box.sandbox_id
