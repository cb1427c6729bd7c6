"""Red team: one sandbox must not take its backend root offline, hog the host, or lose its
snapshots' owner.

- A policy fills its workdir with a tree no naive walk survives (10,000 levels deep, folders
  of mode 000, FIFOs, a socket; in a plain-process sandbox, which runs as root, also an
  immutable file and a bind mount of a host folder). Delete, the next client's start-up
  sweep and the orchestrator must all go on (no 500), and the host folder bound in keeps
  its files (backends/fstree.py).
- A sandbox that asks for no limits writes past /tmp's and the workdir's default sizes, and
  allocates past the default memory: each fails inside, the result says why in words, and
  the host holds no more than the limit (backends/workdir_fs.py, the agent's limits_hit).
- A pool-claimed sandbox's snapshot belongs to its claimer and expires
  (service/snapshots.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap

import httpx
import pytest

from components import needs, require, variant_limit
from conftest import DOCKER_IMAGES, docker_engine, fake_k8s_unavailable, kill_agent, needs_bwrap, wait_until
from service_helpers import Orchestrator, remove_all_sandboxes, short_root
from orchard_gym import SandboxClient
from orchard_gym.backends import procs
from orchard_gym.backends.local import TRASH_DIR, LocalBackend, LocalBackendConfig

DEPTH = 10_000  # what the attack used; QUICK is past both Python's recursion limit and PATH_MAX too
QUICK = 1_500

# Runs inside the sandbox, in its workdir. Each step that needs a privilege the sandbox may
# lack (chattr +i, mount) is tried and may fail: bubblewrap and zygote sandboxes have no
# capabilities; a plain process (isolation='none') run by root has them all.
HOSTILE = textwrap.dedent("""
    import os, socket, subprocess, sys
    os.mkdir("deep")
    fd = os.open("deep", os.O_RDONLY)
    for _ in range(int(sys.argv[1])):  # deeper than PATH_MAX can name, and than Python's recursion limit
        os.mkdir("ddd", dir_fd=fd)
        fd, old = os.open("ddd", os.O_RDONLY, dir_fd=fd), fd
        os.close(old)
    os.mkfifo("fifo", dir_fd=fd)
    os.close(fd)
    os.mkfifo("pipe")
    s = socket.socket(socket.AF_UNIX)
    s.bind("sock")
    os.makedirs("locked/inner/more")
    open("locked/inner/more/f", "w").write("x")
    os.chmod("locked/inner/more", 0)
    os.chmod("locked/inner", 0)
    os.chmod("locked", 0)
    open("frozen", "w").write("x")
    imm = subprocess.run(["chattr", "+i", "frozen"], capture_output=True).returncode == 0
    host = sys.argv[2] if len(sys.argv) > 2 else ""
    bound = False
    if host:
        os.mkdir("host")
        bound = subprocess.run(["mount", "--bind", host, "host"], capture_output=True).returncode == 0
    print("immutable" if imm else "mutable", "bound" if bound else "unbound")
""")


def _make_hostile(box, depth: int = QUICK, host_dir: str = "") -> str:
    box.upload_content(HOSTILE, "hostile.py")
    r = box.exec(f"python3 hostile.py {depth} {host_dir}", timeout=300)
    assert r.exit_code == 0, r.stderr
    return r.stdout.strip()


def _assert_clean(root, sandbox_id: str) -> None:
    assert not (root / sandbox_id).exists()
    assert not any((root / TRASH_DIR).glob(f"{sandbox_id}.*")), "left in the trash"


ISOLATIONS = [pytest.param("bwrap", marks=needs_bwrap), "none"]


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_hostile_tree_is_deleted_and_the_root_stays_usable(local_root, tmp_path, isolation):
    canary = tmp_path / "host-folder"  # a host folder a root sandbox binds into its workdir
    canary.mkdir()
    (canary / "keep").write_text("host data")
    config = {"type": "local", "root": str(local_root), "isolation": isolation}
    with SandboxClient(config) as client:
        box = client.create_sandbox()
        made = _make_hostile(box, DEPTH if isolation == "bwrap" else QUICK, str(canary) if isolation == "none" else "")
        if isolation == "none" and os.geteuid() == 0:
            assert made == "immutable bound", made  # the positive control: root could do both
        client.delete_sandbox(box.sandbox_id)  # raised RecursionError (a 500 via the orchestrator)
        _assert_clean(local_root, box.sandbox_id)
        assert (canary / "keep").read_text() == "host data"
        again = client.create_sandbox()  # the root still serves
        assert again.exec("echo ok").stdout == "ok\n"


def test_the_next_clients_sweep_removes_a_dead_hostile_sandbox(local_root):
    """The agent dies with the tree in place: the start-up sweep of every later client on the
    root met it (and failed, so no client could start)."""
    config = {"type": "local", "root": str(local_root), "die_with_client": False}
    with SandboxClient(config, cleanup_at_exit=False) as client:
        box = client.create_sandbox()
        _make_hostile(box)
        kill_agent(local_root, box.sandbox_id, lambda: box.exec("kill -9 $PPID", timeout=5))
        assert wait_until(lambda: _dead(local_root, box.sandbox_id), 10)
        backend = LocalBackend(LocalBackendConfig(root=local_root))  # another client's start-up sweep
        assert box.sandbox_id in backend.swept
        _assert_clean(local_root, box.sandbox_id)


def _dead(root, sandbox_id: str) -> bool:
    meta = json.loads((root / sandbox_id / "meta.json").read_text())
    return not procs.alive(meta.get("pid"))


def test_the_orchestrator_deletes_a_hostile_sandbox_and_restarts_on_its_root(tmp_path):
    """Through `orchard serve`: the delete answered 500, and a restart on the root did not come up."""
    root = short_root("hostile")
    orch = Orchestrator(root, log_dir=tmp_path)
    try:
        http = orch.http()
        sid = http.post("/sandboxes", params={"wait": "true"}, json={}).json()["sandbox_id"]
        with orch.client() as client:
            _make_hostile(client.get_sandbox(sid), DEPTH)
        snap = http.post(f"/sandboxes/{sid}/snapshots")  # paths past PATH_MAX: no copy takes them
        assert snap.status_code == 502 and "cannot copy" in snap.json()["detail"], snap.text  # was a 500
        gone = http.delete(f"/sandboxes/{sid}")
        assert gone.status_code == 200, gone.text
        _assert_clean(root, sid)
        orch.stop()
        orch.start()  # its backend's start-up sweep meets whatever is left
        again = orch.http().post("/sandboxes", params={"wait": "true"}, json={})
        assert again.status_code == 200 and again.json()["status"] == "running", again.text
    finally:
        orch.stop()
        remove_all_sandboxes(root)
        shutil.rmtree(root, ignore_errors=True)


def test_a_deep_tree_that_fits_in_path_max_is_snapshotted_and_forked(local_root):
    """1,200 levels of one-letter folders: past Python's recursion limit (the snapshot's size
    walk raised RecursionError: a 500), within PATH_MAX (so `cp -a` copies it)."""
    with SandboxClient({"type": "local", "root": str(local_root)}) as client:
        box = client.create_sandbox()
        made = box.exec("python3 -c \"import os; os.mkfifo('p'); [(os.mkdir('d'), os.chdir('d')) for _ in range(1200)]; "
                        "open('f', 'w').write('bottom')\"")
        assert made.exit_code == 0, made.stderr
        snap = box.snapshot()
        assert snap.size_bytes and snap.size_bytes > 0
        fork = client.create_sandbox(from_snapshot=snap.snapshot_id)
        assert fork.exec("cat " + "/".join(["d"] * 1200) + "/f").stdout == "bottom"
        client.delete_snapshot(snap.snapshot_id)
        assert client.list_snapshots() == []


def test_leftovers_a_delete_could_not_remove_are_swept_later(local_root):
    """What a delete left (here an immutable file, as a root plain-process sandbox can make,
    in the trash) is removed by the next sweep, which also goes on to the other folders."""
    if os.geteuid() != 0:
        variant_limit("chattr +i needs root")
    backend = LocalBackend(LocalBackendConfig(root=local_root, die_with_client=False))
    stuck = local_root / TRASH_DIR / "sb-stuck.0000"
    (stuck / "sub").mkdir(parents=True)
    (stuck / "sub" / "f").write_text("x")
    subprocess.run(["chattr", "+i", str(stuck / "sub" / "f")], check=True)
    stale = local_root / "sb-crashed-create"  # no meta.json, older than a minute
    stale.mkdir()
    os.utime(stale, (0, 0))
    assert backend.sweep_sync() == ["sb-crashed-create"]
    assert not stuck.exists() and not stale.exists()


# --------------------------------------------------------------------------- pooled snapshots
ALICE, BOB = "alice-key-" + "a" * 20, "bob-key-" + "b" * 20


def test_a_pool_claimed_sandboxs_snapshot_is_its_claimers_and_expires(tmp_path):
    """A warm pool's sandbox is made (and labelled by the backend) before any key claims it:
    its snapshots carried no owner, so the claimer got 404 and the reconciler never expired
    them. The owner now comes from the claim's record."""
    root = short_root("pool-snap")
    orch = Orchestrator(root, log_dir=tmp_path, api_key=ALICE, api_keys=f"{ALICE},{BOB}", pools="host=1",
                        snapshot_ttl=3, reconcile_interval=1)
    try:
        alice = httpx.Client(base_url=orch.url, headers={"X-API-Key": ALICE}, timeout=60)
        bob = httpx.Client(base_url=orch.url, headers={"X-API-Key": BOB}, timeout=60)
        assert wait_until(lambda: alice.get("/resources").json()["pools"][0]["ready"] == 1, 60)
        sid = alice.post("/sandboxes", params={"wait": "true"}, json={}).json()["sandbox_id"]
        assert alice.get("/resources").json()["pools"][0]["claimed"] == 1  # it came from the pool
        snap = alice.post(f"/sandboxes/{sid}/snapshots")
        assert snap.status_code == 200, snap.text
        snap_id = snap.json()["snapshot_id"]
        assert [s["snapshot_id"] for s in alice.get("/snapshots").json()] == [snap_id]  # was []
        forked = alice.post("/sandboxes", params={"wait": "true"}, json={"from_snapshot": snap_id})
        assert forked.status_code == 200, forked.text  # was 404
        assert bob.get("/snapshots").json() == []
        assert bob.delete(f"/snapshots/{snap_id}").status_code == 404
        backend = LocalBackend(LocalBackendConfig(root=root, die_with_client=False))
        assert wait_until(lambda: backend.snapshots.get(snap_id) is None, 30), "the snapshot never expired"
        alice.close()
        bob.close()
    finally:
        orch.stop()
        remove_all_sandboxes(root)
        shutil.rmtree(root, ignore_errors=True)


# --------------------------------------------------------------------------- default limits
SMALL = {"tmp_size": "8m", "workdir_size": "16m", "default_memory": "128m"}


@needs_bwrap
@pytest.mark.parametrize("spawner", ["auto", "bwrap"])  # auto: the zygote where it can run (root)
def test_writing_past_the_tmp_and_workdir_limits_fails_inside_with_words(local_root, spawner):
    """Without limits /tmp was a tmpfs as large as host memory and the workdir was the host's
    disk: 5 GB written went to the host. Small limits here, written slightly past."""
    config = {"type": "local", "root": str(local_root), "isolation": "bwrap", "spawner": spawner, **SMALL}
    with SandboxClient(config) as client:
        box = client.create_sandbox()  # no limit asked for: the defaults hold
        tmp = box.exec("head -c 12m /dev/zero > /tmp/fill")
        assert tmp.exit_code != 0 and "No space left on device" in tmp.stderr, tmp
        assert tmp.error and "no space left" in tmp.error and "/tmp" in tmp.error, tmp.error
        assert int(box.exec("df -B1 --output=size /tmp | tail -1").stdout) <= 8 << 20
        box.exec("rm -f /tmp/fill")
        work = box.exec("head -c 24m /dev/zero > fill")
        assert work.exit_code != 0 and "No space left on device" in work.stderr, work
        assert work.error and "no space left" in work.error and box.record.workdir in work.error, work.error
        image = local_root / box.sandbox_id / "work.img"  # what the host's disk holds for it
        assert os.stat(image).st_blocks * 512 <= 17 << 20
        assert box.exec("echo fine > small && cat small").stdout == "fine\n"  # after rm, usable again
        assert box.exec("rm fill && head -c 4m /dev/zero > fill").exit_code == 0


def test_a_sandbox_without_memory_gets_the_default_and_an_oom_says_so(local_root):
    config = {"type": "local", "root": str(local_root), **SMALL}
    with SandboxClient(config) as client:
        if not (client.backend.cgroups and "memory" in client.backend.cgroups.limits):
            variant_limit(f"no memory cgroup: the default memory is not enforced ({client.backend.no_cgroups_reason})")
        box = client.create_sandbox()
        hog = box.exec("python3 -c 'x = bytearray(300 << 20); x[:] = b\"a\" * len(x)'", timeout=60)
        assert hog.exit_code != 0 and hog.error and "out of memory" in hog.error, hog
        assert "orchard: out of memory" in hog.stderr
        assert box.resources()["limits"]["memory_bytes"] == 128 << 20
        assert box.exec("echo alive").stdout == "alive\n"  # the sandbox lives on


def _owner_follows(client) -> None:
    """backend.snapshot(labels=...) stamps the owner the orchestrator passes from the claim."""
    backend = client.backend
    box = client.create_sandbox(DOCKER_IMAGES["busybox"])
    owner = {"orchard-gym.owner": "sha256:" + "ab" * 32}
    snap = client._loop.run(backend.snapshot(box.sandbox_id, owner))
    try:
        assert snap.labels["orchard-gym.owner"] == owner["orchard-gym.owner"]
        assert client._loop.run(backend.get_snapshot(snap.snapshot_id)).labels["orchard-gym.owner"] == \
            owner["orchard-gym.owner"]
    finally:
        client.delete_snapshot(snap.snapshot_id)


@pytest.mark.docker  # drives Podman: the full suite, in the one Podman xdist group (tests/tiers.py)
def test_docker_snapshots_carry_the_owner_they_are_given():
    require("docker", docker_engine()[1])
    with SandboxClient({"type": "docker"}) as client:
        _owner_follows(client)


@needs("kubernetes", fake_k8s_unavailable())
def test_kubernetes_snapshots_carry_the_owner_they_are_given(fake_k8s, tmp_path):
    with SandboxClient(fake_k8s.backend_config(snapshot_dir=str(tmp_path / "snaps"))) as client:
        _owner_follows(client)
