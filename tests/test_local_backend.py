"""What only the local backend does: namespaces, crash cleanup, sweeping, adoption."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import pytest

from conftest import REPO, marked_pids, needs_bwrap, wait_until
from orchard_gym import InvalidRequest, SandboxClient
from orchard_gym.backends import procs

ISOLATIONS = [pytest.param("bwrap", marks=needs_bwrap), "none"]


@needs_bwrap
def test_bwrap_sandbox_sees_a_read_only_system_and_private_tmp(local_root, tmp_path):
    secret = tmp_path / "host-file"
    secret.write_text("host")
    with SandboxClient({"type": "local", "root": str(local_root), "isolation": "bwrap"}) as client:
        box = client.create_sandbox()
        other = client.create_sandbox()
        assert box.exec("touch /usr/orchard-test").exit_code != 0
        box.exec(f"touch {local_root}/intruder")  # lands in the sandbox's private tmpfs, if anywhere
        assert not (local_root / "intruder").exists()
        assert box.exec("touch here && echo ok > /tmp/t && cat /tmp/t").stdout == "ok\n"
        assert not os.path.exists("/tmp/t") or open("/tmp/t").read() != "ok\n"
        assert box.exec(f"cat {secret}").exit_code != 0  # the host's /tmp is not the sandbox's
        assert box.exec(f"ls {other.workdir}").exit_code != 0  # nor are other sandboxes
        assert box.exec(f"cat {local_root}/{box.sandbox_id}/meta.json").exit_code != 0  # nor its token
        assert box.exec("grep CapEff /proc/self/status").stdout.split()[1] == "0000000000000000"
        assert box.exec("echo $$").stdout.strip() != str(os.getpid())
        assert box.exec("hostname").stdout.strip() == box.sandbox_id
        assert (local_root / box.sandbox_id / "work" / "here").exists()


def test_cpu_limit_pins_cores_without_cgroups(local_root):
    with SandboxClient({"type": "local", "root": str(local_root), "cgroups": "off"}) as client:
        box = client.create_sandbox(cpu=1)
        assert box.exec("nproc").stdout.strip() == "1"
        assert box.resources()["enforced_by"]["cpu"] == "cpu affinity (whole cores)"


def test_cpu_limit_is_a_cgroup_quota_where_cgroups_can_hold_it(local_root):
    with SandboxClient({"type": "local", "root": str(local_root)}) as client:
        if "cpu" not in getattr(client.backend.cgroups, "limits", ()):
            pytest.skip(f"no cgroup CPU controller here: {client.backend.resources()['cgroups']}")
        box = client.create_sandbox(cpu=1)
        assert box.resources()["enforced_by"]["cpu"] == "cgroup"
        assert box.resources()["limits"]["cpu"] == 1.0
        assert box.exec("nproc").stdout.strip() == str(len(os.sched_getaffinity(0)))  # a quota, not a pin


def test_images_are_refused_with_a_clear_error(local_root):
    with SandboxClient({"type": "local", "root": str(local_root)}) as client:
        with pytest.raises(InvalidRequest, match="docker backend"):
            client.create_sandbox(image="python:3.11")
        assert client.create_sandbox(image="host").exec("true").succeeded


def test_any_image_as_host_is_opt_in_with_one_warning(local_root, monkeypatch, caplog):
    from pydantic import ValidationError

    from orchard_gym.backends.config import LocalBackendConfig

    with pytest.raises(InvalidRequest, match="any_image_as_host"):  # the refusal says how to opt in
        SandboxClient({"type": "local", "root": str(local_root)}).create_sandbox(image="python:3.11-slim")
    with pytest.raises(ValidationError, match="any_image_as_host"):
        LocalBackendConfig(any_image_as_host="sometimes")
    monkeypatch.setenv("ORCHARD_LOCAL_ANY_IMAGE", "1")
    assert LocalBackendConfig().any_image_as_host and not LocalBackendConfig(any_image_as_host=False).any_image_as_host
    with caplog.at_level("WARNING", logger="orchard_gym.backends.local"):
        with SandboxClient({"type": "local", "root": str(local_root)}) as client:
            boxes = [client.create_sandbox(image=name) for name in ("python:3.11-slim", "ubuntu:22.04")]
            assert [b.record.image for b in boxes] == ["python:3.11-slim", "ubuntu:22.04"]
            assert boxes[0].exec("python3 -c 'print(6*7)'").stdout == "42\n"  # the host's python
    warned = [r for r in caplog.records if "any_image_as_host" in r.getMessage()]
    assert len(warned) == 1 and "python:3.11-slim" in warned[0].getMessage()


def test_missing_bwrap_falls_back_with_one_warning(local_root, monkeypatch):
    from orchard_gym.backends import local

    monkeypatch.setattr(local.shutil, "which", lambda name: None)
    monkeypatch.setattr(local, "_warned_no_bwrap", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = local.LocalBackend(local.LocalBackendConfig(root=local_root))
        local.LocalBackend(local.LocalBackendConfig(root=local_root))
    assert first.bwrap is None
    assert [str(w.message) for w in caught if w.category is RuntimeWarning and "bubblewrap" in str(w.message)] \
        and len([w for w in caught if "bubblewrap" in str(w.message)]) == 1
    with pytest.raises(Exception, match="bubblewrap is not installed"):
        local.LocalBackend(local.LocalBackendConfig(root=local_root, isolation="bwrap"))


def _spawn_client(root, isolation: str, body: str) -> subprocess.Popen:
    script = textwrap.dedent(f"""
        import json, sys, time
        from orchard_gym import SandboxClient
        client = SandboxClient({{"type": "local", "root": {str(root)!r}, "isolation": {isolation!r}}})
    """) + textwrap.dedent(body)
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=REPO)


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_sigkilled_client_leaves_no_process_and_its_folders_are_swept(local_root, isolation):
    proc = _spawn_client(local_root, isolation, """
        ids = []
        for _ in range(2):
            box = client.create_sandbox()
            box.exec("setsid sleep 331 >/dev/null 2>&1 &")
            ids.append(box.sandbox_id)
        print(json.dumps(ids), flush=True)
        time.sleep(60)
    """)
    ids = json.loads(proc.stdout.readline())
    markers = [f"ORCHARD_SANDBOX={i}" for i in ids]
    assert all(marked_pids(m) for m in markers)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert wait_until(lambda: not any(marked_pids(m) for m in markers), 5), "processes survived the client"
    assert all((local_root / i).exists() for i in ids)  # nobody cleaned up yet...
    from orchard_gym.backends.local import LocalBackend, LocalBackendConfig

    swept = LocalBackend(LocalBackendConfig(root=local_root)).swept  # ...until the next start
    assert sorted(swept) == sorted(ids)
    assert not any((local_root / i).exists() for i in ids)


def test_orchard_sandbox_gc_sweeps_dead_clients(local_root):
    proc = _spawn_client(local_root, "auto", """
        print(client.create_sandbox().sandbox_id, flush=True)
        time.sleep(60)
    """)
    sandbox_id = proc.stdout.readline().strip()
    proc.kill()
    proc.wait()
    out = subprocess.run([sys.executable, "-m", "orchard_gym.cli", "sandbox", "gc", "--root", str(local_root)],
                         capture_output=True, text=True, check=True).stdout
    assert sandbox_id in out and not (local_root / sandbox_id).exists()


@pytest.mark.parametrize("how", ["exit", "sigterm", "sigint", "exception"])
def test_client_cleans_up_at_exit(local_root, how):
    ending = {
        "exit": "",
        "sigterm": "import os, signal; os.kill(os.getpid(), signal.SIGTERM); time.sleep(30)",
        # Ctrl-C as a fresh interpreter has it: a SIG_IGN inherited from the test process (a
        # library earlier in the suite may have set one) would keep the child sleeping
        "sigint": "import os, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
                  "os.kill(os.getpid(), signal.SIGINT); time.sleep(30)",
        "exception": "raise RuntimeError('boom')",
    }[how]
    proc = _spawn_client(local_root, "auto", f"""
        box = client.create_sandbox()
        print(box.sandbox_id, json.dumps(box.record.details["pid"]), flush=True)
        {ending}
    """)
    sandbox_id, agent = proc.stdout.readline().split(" ", 1)
    proc.wait(30)
    assert not (local_root / sandbox_id).exists()
    assert not marked_pids(f"ORCHARD_SANDBOX={sandbox_id}")
    assert not procs.alive(json.loads(agent))  # the agent too (a zygote's carries no marker)


def test_sandbox_outlives_client_when_asked_and_is_adopted(local_root):
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        from orchard_gym import SandboxClient
        client = SandboxClient({{"type": "local", "root": {str(local_root)!r}, "die_with_client": False}},
                               cleanup_at_exit=False)
        box = client.create_sandbox(sandbox_id="keeper")
        box.exec("echo kept > note")
    """)], cwd=REPO, check=True, timeout=60)
    assert proc.returncode == 0
    time.sleep(0.7)  # longer than the agent's parent watch
    config = {"type": "local", "root": str(local_root), "die_with_client": False}
    with SandboxClient(config) as client:
        box = client.get_sandbox("keeper")
        assert box.exec("cat note").stdout == "kept\n"
        box.delete()
    assert not (local_root / "keeper").exists()


@needs_bwrap
def test_a_start_that_loses_bwraps_mount_race_is_started_again(local_root, tmp_path, monkeypatch):
    """bubblewrap fails when a mount (a container's overlay) vanishes while it binds `/`; the
    backend starts such a sandbox again instead of failing it. Other start failures still fail."""
    import shutil

    from orchard_gym.backends import local as local_backend

    real = shutil.which("bwrap")
    count, fails = tmp_path / "starts", tmp_path / "fail-starts"
    fails.write_text("2")
    wrapper = tmp_path / "bwrap"
    wrapper.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        echo x >> {count}
        if [ "$(wc -l < {count})" -le "$(cat {fails})" ]; then
            echo 'bwrap: Can'"'"'t bind mount /oldroot/ on /newroot/: Unable to apply mount flags: remount "/newroot/var/lib/containers/storage/overlay/x/merged": No such file or directory' >&2
            exit 1
        fi
        exec {real} "$@"
    """))
    wrapper.chmod(0o755)
    monkeypatch.setattr(local_backend.shutil, "which", lambda name: str(wrapper) if name == "bwrap" else real)
    config = {"type": "local", "root": str(local_root), "isolation": "bwrap", "spawner": "bwrap"}  # the zygote has no race
    with SandboxClient(config) as client:
        box = client.create_sandbox()
        assert box.exec("echo up").stdout == "up\n"
        assert len(count.read_text().splitlines()) == 3  # two lost races, then the start that worked
        count.write_text("")
        fails.write_text("99")  # a race lost every time: the create fails, naming it
        with pytest.raises(Exception, match="mount"):
            client.create_sandbox()
        assert len(count.read_text().splitlines()) == local_backend.MOUNT_RACE_RETRIES + 1
