"""Interactive processes (`exec(pty=True)`, `shell()`) on every backend: a python3 REPL and
bash driven through the SDK, resize, kill, and a client that hangs up leaving nothing behind.
One sandbox per backend; the remote case goes through the orchestrator's WebSocket route."""

from __future__ import annotations

import pytest

import conftest
from conftest import client_kwargs, fake_k8s_unavailable, needs, wait_until
from orchard_gym import InvalidRequest, PtyError, SandboxClient

# python3 and bash: the SWE base image (scripts/build_swe_images.py), besides the local host
IMAGE = "localhost/orchard/swe-base:latest"
LIVE = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done"


def _cases():
    image_why_not = conftest.image_why_not(IMAGE, "python scripts/build_swe_images.py") or ""
    return [pytest.param({"config": {"type": "local"}, "image": None}, id="local"),
            pytest.param({"config": {"type": "local"}, "image": None, "remote": True}, id="remote-local"),
            pytest.param({"config": {"type": "docker"}, "image": IMAGE}, id="docker",
                         marks=[pytest.mark.docker, needs("docker", image_why_not)]),
            # the fake cluster's kubelet runs pods with Podman: the same image
            pytest.param({"config": {"type": "kubernetes"}, "image": IMAGE, "fake_k8s": True}, id="kubernetes",
                         marks=[pytest.mark.kubernetes, needs("kubernetes", fake_k8s_unavailable() or image_why_not)])]


@pytest.fixture(scope="module", params=_cases())
def box(request, tmp_path_factory):
    case = dict(request.param)
    config = dict(case["config"])
    if config["type"] == "local":
        config["root"] = str(tmp_path_factory.mktemp("pty-root"))
    if case.get("fake_k8s"):
        config = request.getfixturevalue("fake_k8s").backend_config(**config)
    case["config"] = config
    if case.get("remote"):
        orch = request.getfixturevalue("remote_orchestrator")
        case["base_url"], case["api_key"] = orch.url, orch.api_key
    with SandboxClient(**client_kwargs(case)) as client:
        sandbox = client.create_sandbox(image=case["image"])
        yield sandbox
        sandbox.delete()


def _gone(sandbox, needle: str) -> bool:
    return not [line for line in sandbox.exec(LIVE).stdout.splitlines() if needle in line and "for p in" not in line]


def test_python_repl(box):
    with box.exec(["python3", "-q"], pty=True, rows=30, cols=100) as repl:
        assert repl.pid and repl.poll() is None
        repl.read_until(">>> ", timeout=30)
        repl.send("import os, shutil; print(6 * 7, os.isatty(0), tuple(shutil.get_terminal_size()))\n")
        assert b"42 True (100, 30)\r\n>>> " in repl.read_until(r"\r\n>>> ")
        repl.resize(50, 132)
        repl.send("print(tuple(shutil.get_terminal_size()))\n")
        assert b"(132, 50)" in repl.read_until(r"\(\d+, \d+\)\r\n>>> ")
        repl.send("exit(3)\n")
        assert repl.wait(timeout=30) == 3 and repl.returncode == 3
        repl.read_all(timeout=5)
        assert repl.read(timeout=1) == b""  # ended and drained
        with pytest.raises(PtyError, match="exit status 3"):
            repl.send("print(1)\n")


def test_bash_resize_kill(box):
    with box.shell(rows=24, cols=80, env={"PS1": "$ "}) as sh:
        sh.send("stty size; echo $((6*7))-${TERM:+has-term}\n")
        out = sh.read_until(r"42-\S+\r\n", timeout=30)
        assert b"24 80" in out and b"42-has-term" in out
        sh.resize(40, 120)
        sh.send("stty size\n")
        assert b"40 120" in sh.read_until(r"40 120\r\n")
        sh.send("sleep 4343\n")
        assert wait_until(lambda: not _gone(box, "sleep 4343"), 20)
        sh.kill("KILL")  # the shell's process group; the session's end takes the rest
        assert sh.wait(timeout=30) == -9
    assert wait_until(lambda: _gone(box, "sleep 4343"), 20)


def test_client_that_hangs_up_leaves_no_process(box):
    sh = box.exec("echo started; exec sleep 4545", pty=True)
    sh.read_until("started", timeout=30)
    assert not _gone(box, "sleep 4545")
    # drop the connection as a crashed client would: no close frame, just gone
    sh._run(sh._inner._channel.aclose())
    assert wait_until(lambda: _gone(box, "sleep 4545"), 20)
    with pytest.raises(PtyError):
        sh.wait(timeout=20)


def test_bad_input_is_refused_clearly(box):
    for kwargs, message in [({"command": ""}, "command is empty"), ({"command": "sh", "rows": 0}, "rows"),
                            ({"command": "sh", "stdin": "x"}, "stdin and job_id"),
                            ({"command": [1, 2]}, "list of strings")]:
        command = kwargs.pop("command")
        with pytest.raises(InvalidRequest, match=message):
            box.exec(command, pty=True, **kwargs)
    with pytest.raises(InvalidRequest, match="cwd does not exist"):
        box.exec("sh", pty=True, cwd="no/such/dir")
    with box.exec("cat", pty=True) as cat:
        with pytest.raises(InvalidRequest, match="unknown signal"):
            cat.kill("NOPE")
        with pytest.raises(InvalidRequest, match="str or bytes"):
            cat.send(42)
        cat._run(cat._inner._channel.send({"type": "bogus"}))  # what a broken client might send
        with pytest.raises(PtyError, match="unknown frame type 'bogus'"):
            cat.wait(timeout=20)
        assert "unknown frame type" in cat.error
