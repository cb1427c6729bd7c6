"""Local sandboxes in cgroups: complete kills, pids/memory/CPU limits, accounting, fallback.

Real agents, real processes, the host's real cgroupfs (v1 and, where mounted, v2). Commands
run in the sandbox's private /tmp, so they use /usr/bin/python3 or the shell, never the
venv's interpreter.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from conftest import HAS_BWRAP, wait_until
from orchard_gym import InvalidRequest, SandboxClient
from orchard_gym.backends import cgroups
from orchard_gym.backends.config import LocalBackendConfig
from orchard_gym.errors import BackendError, SandboxNotFound

V1_OK = cgroups.detect("v1", "orchard-gym-test")[0] is not None
V2_OK = cgroups.detect("v2", "orchard-gym-test")[0] is not None
needs_v1 = pytest.mark.skipif(not V1_OK, reason=cgroups.detect("v1", "orchard-gym-test")[1] or "")
needs_v2 = pytest.mark.skipif(not V2_OK, reason=cgroups.detect("v2", "orchard-gym-test")[1] or "")
needs_bwrap = pytest.mark.skipif(not HAS_BWRAP, reason="bubblewrap not installed")
ISOLATIONS = [pytest.param("bwrap", marks=needs_bwrap), "none"]
MODES = [pytest.param("v1", marks=needs_v1), pytest.param("v2", marks=needs_v2)]


def config(root, **kw) -> dict:
    return {"type": "local", "root": str(root), **kw}


def sleepers(*seconds: int) -> dict[int, list[int]]:
    """Host pids of live `sleep N` processes, by N (unique N per test: no one else's)."""
    found: dict[int, list[int]] = {n: [] for n in seconds}
    want = {f"sleep\0{n}\0".encode(): n for n in seconds}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in (b"Z", b"X") and cmd in want:
            found[want[cmd]].append(int(name))
    return found


def end(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


ESCAPES = ("env -i setsid sleep {0} & nohup sleep {1} >/dev/null 2>&1 & (sh -c 'sleep {2} &' &); "
           "sleep 100")


# --------------------------------------------------------------------------- complete kills


@pytest.mark.parametrize("isolation", ISOLATIONS)
@pytest.mark.parametrize("mode", MODES)
def test_timeout_kills_setsid_env_i_nohup_and_double_forks(local_root, isolation, mode):
    n = [random.randint(10**6, 10**7) for _ in range(3)]
    with SandboxClient(config(local_root, isolation=isolation, cgroups=mode)) as client:
        box = client.create_sandbox()
        assert box.resources()["kill"].startswith(f"cgroup {mode}")
        result = box.exec(ESCAPES.format(*n), timeout=2)
        assert result.timed_out
        left = wait_until(lambda: not any(sleepers(*n).values()), timeout=5)
        survivors = sleepers(*n)
        end(p for ps in survivors.values() for p in ps)
        assert left, f"survivors after the timeout: {survivors}"
        assert box.exec("echo alive").stdout == "alive\n"


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_without_cgroups_the_marker_kill_misses_env_i(local_root, isolation):
    """The old path, for contrast: it is what the test above would catch."""
    n = [random.randint(10**6, 10**7) for _ in range(3)]
    with SandboxClient(config(local_root, isolation=isolation, cgroups="off")) as client:
        box = client.create_sandbox()
        assert box.resources()["kill"].startswith("marker (no writable cgroups: cgroups='off'")
        assert box.exec(ESCAPES.format(*n), timeout=2).timed_out
        # the marker kill has reached the two that kept the marker (waited for, not slept on)
        wait_until(lambda: not sleepers(n[1])[n[1]] and not sleepers(n[2])[n[2]], 10)
        survivors = sleepers(*n)
        try:
            assert survivors[n[0]], "env -i setsid sleep should outlive the marker kill"
            assert not survivors[n[1]] and not survivors[n[2]], survivors  # they kept the marker
        finally:
            box.delete()
            end(sleepers(*n)[n[0]])


@needs_v1
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_delete_kills_background_jobs_and_thaws_frozen_cgroups(local_root, isolation):
    n = random.randint(10**6, 10**7)
    with SandboxClient(config(local_root, isolation=isolation, cgroups="v1")) as client:
        box = client.create_sandbox()
        freezer = Path(box.resources()["cgroup"])
        assert box.exec("true").succeeded
        assert not list(freezer.glob("job-*")), "a finished job's empty cgroup is removed"
        assert box.exec(f"env -i setsid sleep {n} >/dev/null 2>&1 &").succeeded
        jobs = list(freezer.glob("job-*"))
        assert len(jobs) == 1 and wait_until(lambda: sleepers(n)[n])  # its cgroup lives on with it
        (jobs[0] / "freezer.state").write_text("FROZEN")  # e.g. an agent killed mid-kill
        assert wait_until(lambda: (jobs[0] / "freezer.state").read_text().strip() == "FROZEN")
        dirs = [Path(d) for d in client.backend._meta(box.sandbox_id)["cgroup"]["dirs"].values()]
        started = time.monotonic()
        box.delete()
        assert time.monotonic() - started < 15
        survivors = sleepers(n)[n]
        end(survivors)
        assert not survivors
        assert not [d for d in dirs if d.exists()]


@needs_bwrap
@needs_v1
def test_sandboxed_code_cannot_raise_its_own_limits(local_root):
    """The cgroupfs is read-only in the sandbox, and the agent's directory fds cannot be
    reopened through /proc/<agent>/fd (the agent is not dumpable)."""
    with SandboxClient(config(local_root, isolation="bwrap", cgroups="v1", pids_limit=100)) as client:
        box = client.create_sandbox()
        pids_dir = Path(client.backend._meta(box.sandbox_id)["cgroup"]["dirs"]["pids"])
        attempt = box.exec(f"echo 5000 > {pids_dir}/pids.max; "
                           "for f in /proc/[0-9]*/fd/*; do echo 5000 > $f/pids.max; "
                           "echo 5000 > $f/../pids.max; done 2>/dev/null; ls /proc/2/fd 2>&1; true")
        assert attempt.succeeded
        assert (pids_dir / "pids.max").read_text().strip() == "100"
        assert box.resources()["limits"]["pids"] == 100


# --------------------------------------------------------------------------- limits


@needs_v1
def test_fork_bomb_is_bounded_by_the_pids_limit_and_the_agent_lives(local_root):
    with SandboxClient(config(local_root, cgroups="v1", pids_limit=64)) as client:
        box = client.create_sandbox()
        pids_dir = Path(client.backend._meta(box.sandbox_id)["cgroup"]["dirs"]["pids"])
        peak, done = [0], threading.Event()

        def sample():
            while not done.is_set():
                peak[0] = max(peak[0], int((pids_dir / "pids.current").read_text()))
                time.sleep(0.01)

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            result = box.exec("bomb() { bomb | bomb & }; bomb; sleep 100", timeout=4)
        finally:
            done.set()
            sampler.join()
        assert result.timed_out
        failed_forks = int((pids_dir / "pids.events").read_text().split()[1])
        assert failed_forks > 0, "the bomb never hit the limit"
        assert 0 < peak[0] <= 64
        assert box.exec("echo alive").stdout == "alive\n"
        assert wait_until(lambda: box.resources()["usage"]["pids"] < 20, timeout=5)


@needs_v1
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_memory_hog_is_oom_killed_and_the_agent_lives(local_root, isolation):
    with SandboxClient(config(local_root, isolation=isolation, cgroups="v1")) as client:
        box = client.create_sandbox(memory="96m")
        res = box.resources()
        assert res["enforced_by"]["memory"] == "cgroup" and res["limits"]["memory_bytes"] == 96 * 2**20
        hog = box.exec("/usr/bin/python3 -c \"b = b'x' * (400 * 2**20); print(len(b))\"", timeout=60)
        assert hog.exit_code in (-9, 137), (hog.exit_code, hog.stdout, hog.stderr)
        usage = box.resources()["usage"]
        assert usage["oom_kills"] >= 1
        assert usage["memory_peak_bytes"] <= 96 * 2**20
        assert box.exec("echo alive").stdout == "alive\n"
        # below the limit the same allocation works: the limit, not the code, stopped it
        assert box.exec("/usr/bin/python3 -c \"b = b'x' * (30 * 2**20); print(len(b))\"").stdout == f"{30 * 2**20}\n"


@needs_v1
def test_cpu_half_bounds_two_busy_loops(local_root):
    with SandboxClient(config(local_root, cgroups="v1")) as client:
        box = client.create_sandbox(cpu=0.5)
        assert box.resources()["limits"]["cpu"] == 0.5
        before = box.resources()["usage"]["cpu_seconds"]
        started = time.monotonic()
        box.exec("for i in 1 2; do (while :; do :; done) & done; wait", timeout=4)
        wall = time.monotonic() - started
        used = box.resources()["usage"]["cpu_seconds"] - before
        # two loops on two cores would use up to 2 s per second; the quota allows 0.5
        assert used / wall <= 0.75, (used, wall)
        assert used > 0.05, (used, wall)  # and they did run


@pytest.mark.parametrize("mode", MODES)
def test_cpu_seconds_of_a_one_second_loop_read_about_one(local_root, mode):
    loop = ("/usr/bin/python3 -c \"import time\nwhile time.process_time() < 1.0: pass\"")
    with SandboxClient(config(local_root, cgroups=mode)) as client:
        box = client.create_sandbox()
        before = box.resources()["usage"]["cpu_seconds"]
        assert box.exec(loop, timeout=120).succeeded
        used = box.resources()["usage"]["cpu_seconds"] - before
        assert 0.9 <= used <= 1.6, used


# --------------------------------------------------------------------------- v2, fallback, drivers


@needs_v2
def test_v2_reports_what_it_can_and_cannot_enforce(local_root):
    driver, _ = cgroups.detect("v2", "orchard-gym")
    with SandboxClient(config(local_root, cgroups="v2")) as client:
        box = client.create_sandbox(memory="256m", cpu=1)
        res = box.resources()
        assert res["kill"] == "cgroup v2 (cgroup.kill)"
        for limit, stand_in in (("memory", "rlimit-as"), ("cpu", "cpu affinity")):
            if limit in driver.limits:
                assert res["enforced_by"][limit] == "cgroup"
            else:  # a hybrid host: the controller is bound to v1, so today's stand-in holds
                assert res["enforced_by"][limit].startswith(stand_in)
        assert res["usage"]["cpu_seconds"] > 0


@pytest.mark.parametrize("mode", MODES)
def test_driver_freezes_then_kills_a_forking_loop(mode):
    driver, why = cgroups.detect(mode, "orchard-gym-test")
    cg = driver.create(f"drv-{os.getpid()}-{random.randint(0, 10**6)}", pids=200, memory=None, cpu=None)
    procs = cg.job_dir / "cgroup.procs"
    fds = [os.open(d / "cgroup.procs", os.O_WRONLY) for d in cg.unique_dirs]
    try:
        # bash: at the pids limit its fork retries and the loop goes on (dash exits 2 on a failed
        # fork, and under load the loop reached the limit before the freeze)
        loop = subprocess.Popen(["bash", "-c", "while :; do sleep 0.001 & done"], start_new_session=True,
                                stderr=subprocess.DEVNULL, preexec_fn=lambda: [os.write(fd, b"0") for fd in fds])
    finally:
        for fd in fds:
            os.close(fd)
    try:
        assert wait_until(lambda: len(procs.read_text().split()) > 2)
        cg._freeze(cg.job_dir, time.monotonic() + 5)
        if mode == "v1":
            assert (cg.job_dir / "freezer.state").read_text().strip() == "FROZEN"
        else:
            assert "frozen 1" in (cg.job_dir / "cgroup.events").read_text()
        frozen = procs.read_text().split()
        time.sleep(0.1)
        assert procs.read_text().split() == frozen, "nothing forks while frozen"
        cg.kill()
        assert loop.wait(5) == -signal.SIGKILL
        assert not any(d.exists() for d in cg.unique_dirs)
    finally:
        if loop.poll() is None:
            loop.kill()
        if cg.job_dir.exists():
            cg.kill()


def test_unwritable_cgroups_fall_back_to_the_marker_and_say_why(local_root, monkeypatch):
    # a "cgroup" hierarchy nobody can write: /proc stands in for the mount
    monkeypatch.setattr(cgroups, "_mounts", lambda: [("cgroup", "/proc", "/", {"freezer", "pids"})])
    with SandboxClient(config(local_root, cgroups="auto")) as client:
        res = client.backend.resources()
        assert re.match(r"off: v1 \w+ hierarchy not writable \(/proc/orchard-gym", res["cgroups"]), res["cgroups"]
        box = client.create_sandbox(memory="128m")
        sandbox = box.resources()
        assert re.match(r"marker \(no writable cgroups: v1 \w+ hierarchy not writable", sandbox["kill"])
        assert sandbox["usage"]["cpu_seconds"] is None
        assert sandbox["enforced_by"]["memory"].startswith("rlimit-as")
        assert box.exec("echo ok").stdout == "ok\n"
    with pytest.raises(BackendError, match="cgroups='v1' but none is usable"):
        SandboxClient(config(local_root, cgroups="v1"))


@needs_v1
def test_resources_through_the_orchestrator(remote_orchestrator):
    with SandboxClient(base_url=remote_orchestrator.url, api_key=remote_orchestrator.api_key) as client:
        box = client.create_sandbox(memory="128m")
        res = box.resources()
        assert res["sandbox_id"] == box.sandbox_id and res["kill"].startswith("cgroup v")
        assert res["usage"]["cpu_seconds"] > 0 and res["usage"]["memory_peak_bytes"] > 0
        with pytest.raises(SandboxNotFound):
            client._loop.run(client._async._control.resources("sb-nope"))
    headers = {"X-API-Key": remote_orchestrator.api_key}
    with httpx.Client(base_url=remote_orchestrator.url, headers=headers, timeout=30) as http:
        for garbage in ("sb-nope", "..%2F..%2Fetc", "x" * 5000, "%00", "sb-%E2%98%83"):
            resp = http.get(f"/sandboxes/{garbage}/resources")
            assert resp.status_code == 404, (garbage, resp.status_code, resp.text)
        assert http.get("/sandboxes/sb-nope/resources", headers={"X-API-Key": "wrong"}).status_code == 403


def test_bad_cgroup_config_is_refused():
    for bad in ({"cgroups": "v3"}, {"cgroup_parent": "../escape"}, {"cgroup_parent": "a/./b"},
                {"cgroup_parent": ""}, {"pids_limit": 0}, {"pids_limit": "many"}, {"cgroup_parent": "a b"}):
        with pytest.raises(InvalidRequest):
            SandboxClient({"type": "local", **bad})
    assert LocalBackendConfig(pids_limit=None).pids_limit is None


def test_resources_of_an_unknown_sandbox(local_root):
    with SandboxClient(config(local_root)) as client:
        with pytest.raises(SandboxNotFound):
            client._loop.run(client._async._control.resources("sb-none"))
        with pytest.raises(SandboxNotFound):
            client._loop.run(client._async._control.resources("../etc"))


@pytest.mark.parametrize("mode", MODES)
def test_commands_join_their_job_cgroup_and_inherit_no_cgroup_fd(local_root, mode):
    hierarchy = "freezer" if mode == "v1" else ""
    with SandboxClient(config(local_root, cgroups=mode)) as client:
        box = client.create_sandbox()
        sandbox_cg = box.resources()["cgroup"]

        def job_of(text: str) -> str:
            line = next(x for x in text.splitlines() if x.split(":")[1] == hierarchy)
            return line.split(":", 2)[2]

        shell = box.exec("cat /proc/self/cgroup; echo FDS; ls -l /proc/$$/fd; true")  # bash -c: joins by itself
        listed = box.exec(["cat", "/proc/self/cgroup"])  # argv: joined before exec
        for out in (shell.stdout.split("FDS")[0], listed.stdout):
            path = job_of(out)
            assert path.rsplit("/", 2)[-2] == sandbox_cg.rsplit("/", 1)[-1] and "/job-" in path, path
        fds = shell.stdout.split("FDS")[1]
        assert "/dev/null" in fds and "cgroup" not in fds and "procs" not in fds, fds
        listed_fds = box.exec(["ls", "-l", "/proc/self/fd"]).stdout
        assert "/dev/null" in listed_fds and "cgroup" not in listed_fds, listed_fds
        assert box.exec("echo 'a;b'; exit 3").exit_code == 3  # the prefix leaves the command as it was
        assert box.exec("echo $# $0").stdout.split()[0] == "0"  # no arguments appear


@pytest.mark.skipif(not os.path.isdir("/sys/fs/cgroup/cpuset") or os.geteuid() != 0,
                    reason="needs a v1 cpuset hierarchy, as root")
def test_cgroups_where_processes_cannot_move_fall_back(local_root, monkeypatch):
    """mkdir works but migration fails (a v1 cpuset child has no CPUs until told: ENOSPC),
    as in a delegated subtree: detection says so instead of failing every create."""
    monkeypatch.setattr(cgroups, "_mounts", lambda: [("cgroup", "/sys/fs/cgroup/cpuset", "/", {"freezer"})])
    monkeypatch.setattr(cgroups, "_own_paths", lambda: {"freezer": "/"})
    driver, why = cgroups.detect("auto", "orchard-gym-test")
    assert driver is None and "cannot move a process into /sys/fs/cgroup/cpuset/orchard-gym-test" in why, why
    with SandboxClient(config(local_root)) as client:
        box = client.create_sandbox()
        assert box.resources()["kill"].startswith("marker (no writable cgroups: cannot move a process")
        assert box.exec("echo ok").stdout == "ok\n"


@pytest.mark.parametrize("mode", MODES)
def test_two_roots_hold_the_same_sandbox_id_each_in_its_own_cgroup(tmp_path, mode):
    """cgroups are machine-wide, sandbox roots are not: an `orchard serve` and in-process clients
    (or two test workers) may each make a sandbox `twin`. Each gets its own cgroup, with its own
    limit; deleting one leaves the other's. (Named by the id alone, the second create failed on
    the first's cgroup folder, and the first delete removed the other's cgroup.)"""
    from service_helpers import short_root

    roots = [short_root("twin-a"), short_root("twin-b")]
    try:
        with SandboxClient(config(roots[0], cgroups=mode, pids_limit=64)) as a, \
                SandboxClient(config(roots[1], cgroups=mode, pids_limit=96)) as b:
            box_a, box_b = a.create_sandbox(sandbox_id="twin"), b.create_sandbox(sandbox_id="twin")
            dirs = [{k: Path(d) for k, d in c.backend._meta("twin")["cgroup"]["dirs"].items()} for c in (a, b)]
            pids = [d.get("pids") or d["unified"] for d in dirs]  # v1: the pids hierarchy; v2: the one folder
            assert pids[0] != pids[1]
            if "pids" in a.backend.cgroups.limits:  # v2 here may not delegate the pids controller
                limits = [(p / "pids.max").read_text().strip() for p in pids]
                assert limits == ["64", "96"], limits
            box_a.delete()
            assert not any(d.exists() for d in dirs[0].values())
            assert all(d.exists() for d in dirs[1].values()) and box_b.exec("echo alive").stdout == "alive\n"
            box_b.delete()
            assert not any(d.exists() for d in dirs[1].values())
    finally:
        for root in roots:
            shutil.rmtree(root, ignore_errors=True)
