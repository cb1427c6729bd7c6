"""What an isolated local sandbox can reach of the host, probed from inside (issue 24).

A sandbox once saw the whole host read-only: another backend root's meta.json (with the
agent token in plain text) and that sandbox's agent socket, /etc/shadow, home folders, the
project checkout, and host unix sockets (a rootful Podman socket is host root). Now it sees a
minimal view (backends/local_view.py), abstract sockets made outside it are out of reach
(Landlock scope, agent/scope.py), and no file holds a token in plain text.

One probe script runs inside a sandbox of every variant (bwrap and zygote spawners, network
blocked and open) and, as the positive control, on the host, against the same targets: the
host run must reach every one of them (so the probe can see what it looks for), the sandbox
none; inside, the probe must still reach the sandbox's own files and sockets.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from conftest import REPO, WHY_NO_BWRAP
from components import needs
from orchard_gym import InvalidRequest, SandboxClient
from orchard_gym.agent import scope
from orchard_gym.cache import cache_root

WHY_NO_ZYGOTE = WHY_NO_BWRAP or ("" if os.geteuid() == 0 else "the zygote needs root")
SPAWNERS = [pytest.param("bwrap", marks=needs("bwrap", WHY_NO_BWRAP)),
            pytest.param("zygote", marks=needs("bwrap", WHY_NO_ZYGOTE))]
NETWORKS = [pytest.param(True, id="blocked"), pytest.param(False, id="open")]

# reads (sha256 of what was read, None if refused), listings, and connects to unix sockets
# ("@name": abstract); `serve` first binds listeners of its own (the in-sandbox controls)
PROBE = r"""
import hashlib, json, os, socket, sys
t = json.loads(sys.stdin.read())
out = {"read": {}, "list": {}, "connect": {}}
def address(p):
    return "\0" + p[1:] if p.startswith("@") else p
held = []
for p in t.get("serve", []):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(address(p))
    s.listen(8)
    held.append(s)
for p in t["read"]:
    try:
        with open(p, "rb") as f:
            out["read"][p] = hashlib.sha256(f.read()).hexdigest()
    except OSError:
        out["read"][p] = None
for p in t["list"]:
    try:
        out["list"][p] = sorted(os.listdir(p))
    except OSError:
        out["list"][p] = None
for p in t["connect"]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect(address(p))
        out["connect"][p] = True
    except OSError:
        out["connect"][p] = False
    finally:
        s.close()
print(json.dumps(out))
"""


def _sha(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _python() -> str:
    """The interpreter every isolated sandbox sees (the agent's own)."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


class HostBait:
    """Secrets and listening sockets planted on the host; removed at close()."""

    def __init__(self):
        tag = f"og-iso-{uuid.uuid4().hex[:10]}"
        self.needle = f"host-secret-{uuid.uuid4().hex}"
        self.files: list[Path] = []
        self.dirs: list[Path] = []
        for folder in (Path("/root"), Path("/home"), Path("/srv"), Path("/opt"), Path("/var/tmp"), Path("/tmp"),
                       cache_root() / "claw"):  # the cache's non-shared part (AgentDojo ground truths live there)
            folder.mkdir(parents=True, exist_ok=True)
            self._plant(folder / tag / "secret.txt")
        self.shared = cache_root() / "swe" / "venvs" / tag / "public.txt"  # a shared folder: visible (control)
        self._plant(self.shared)
        self.listeners: list[socket.socket] = []
        self.sockets = [f"/run/{tag}.sock", f"/var/tmp/{tag}.sock", f"/tmp/{tag}.sock", f"@{tag}"]
        for path in self.sockets:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.bind("\0" + path[1:] if path.startswith("@") else path)
            s.listen(8)
            self.listeners.append(s)

    def _plant(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.dirs.append(path.parent)
        path.write_text(self.needle)
        self.files.append(path)

    def close(self) -> None:
        for s in self.listeners:
            s.close()
        for path in self.sockets:
            if not path.startswith("@"):
                Path(path).unlink(missing_ok=True)
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def bait():
    b = HostBait()
    yield b
    b.close()


@pytest.fixture
def roots():
    """Two backend roots outside /tmp (so the private /tmp does not hide them by chance)."""
    made = [Path(f"/var/tmp/og-iso-{name}-{os.getpid()}-{uuid.uuid4().hex[:6]}") for name in ("a", "b")]
    yield made
    for root in made:
        shutil.rmtree(root, ignore_errors=True)


def _probe_host(targets: dict) -> dict:
    r = subprocess.run([_python(), "-I", "-S", "-c", PROBE], input=json.dumps(targets), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("block_network", NETWORKS)
@pytest.mark.parametrize("spawner", SPAWNERS)
def test_nothing_of_the_host_or_another_tenant_is_reachable_from_inside(spawner, block_network, roots, bait):
    if not block_network and scope.abi() < scope.SCOPE_ABI:
        pytest.skip(f"this kernel's Landlock ABI is {scope.abi()}: an open-network sandbox shares the host's "
                    f"abstract sockets (scopes need ABI {scope.SCOPE_ABI}, Linux 6.12)")
    config = {"type": "local", "isolation": "bwrap", "spawner": spawner}
    with SandboxClient({**config, "root": str(roots[0])}) as mine, \
            SandboxClient({**config, "root": str(roots[1])}) as theirs:
        box = mine.create_sandbox(block_network=block_network)
        assert box.record.details["spawner"] == spawner
        sibling = mine.create_sandbox(block_network=block_network)  # same root, another tenant
        victim = theirs.create_sandbox(block_network=block_network, env={"API_KEY": bait.needle})
        for other in (sibling, victim):
            other.upload_content(bait.needle, "secret.txt")
        box.upload_content(bait.needle, "own.txt")
        workdir = box.exec("pwd").stdout.strip()
        # what must stay out of reach, and its sha256 on the host
        hidden = {"/etc/shadow": _sha("/etc/shadow"), str(REPO / "pyproject.toml"): _sha(REPO / "pyproject.toml")}
        for root, other in ((roots[0], sibling), (roots[1], victim)):
            hidden[f"{root}/{other.sandbox_id}/meta.json"] = _sha(root / other.sandbox_id / "meta.json")
            hidden[f"{other.record.details['host_workdir']}/secret.txt"] = hashlib.sha256(bait.needle.encode()).hexdigest()
            hidden[f"{root}/.key"] = _sha(root / ".key")
        for path in bait.files:
            if path != bait.shared:
                hidden[str(path)] = hashlib.sha256(bait.needle.encode()).hexdigest()
        sockets = [*bait.sockets, sibling.record.endpoint.uds, victim.record.endpoint.uds]
        listings = [str(roots[0]), str(roots[1]), "/root", "/home", str(REPO)]
        targets = {"read": sorted(hidden), "connect": sockets, "list": listings}

        # the positive control: from the host, the same probe reaches every target
        host = _probe_host(targets)
        assert host["read"] == hidden, "the probe must read every planted file on the host"
        assert all(host["connect"].values()), host["connect"]
        assert all(host["list"][p] for p in listings), host["list"]

        own = {"read": [f"{workdir}/own.txt", "/etc/passwd", str(bait.shared)],
               "serve": [f"{workdir}/own.sock", f"@own-{box.sandbox_id}"], "list": [workdir],
               "connect": [f"{workdir}/own.sock", f"@own-{box.sandbox_id}", box.record.endpoint.uds]}
        r = box.exec([_python(), "-I", "-S", "-c", PROBE],
                     stdin=json.dumps({k: targets[k] + own.get(k, []) for k in targets} | {"serve": own["serve"]}))
        assert r.exit_code == 0, r.stderr
        inside = json.loads(r.stdout)

        # ... and from inside, the sandbox's own files and sockets (the probe works in there)
        needle_sha = hashlib.sha256(bait.needle.encode()).hexdigest()
        assert inside["read"][f"{workdir}/own.txt"] == needle_sha
        assert inside["read"]["/etc/passwd"] == _sha("/etc/passwd")
        assert inside["read"][str(bait.shared)] == needle_sha  # a shared cache folder
        assert "own.txt" in inside["list"][workdir]
        assert all(inside["connect"][p] for p in own["connect"]), inside["connect"]

        # ... but nothing of the host or another tenant
        # listings show at most the folders leading to the sandbox's own and the shared mounts
        mounts = [step[-1] for step in mine.backend.view if step[0] == "ro"] + [box.record.details["host_workdir"]]
        allowed = {p: {Path(m).relative_to(p).parts[0] for m in mounts if m.startswith(p + "/")} for p in listings}
        leaks = {"read": sorted(p for p in hidden if inside["read"][p] == hidden[p]),
                 "connected": [p for p in sockets if inside["connect"][p]],
                 "listed": {p: sorted(set(inside["list"][p]) - allowed[p]) for p in listings
                            if set(inside["list"][p] or ()) - allowed[p]}}
        assert leaks == {"read": [], "connected": [], "listed": {}}, json.dumps(leaks, indent=1)
        assert bait.needle not in box.exec("cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'").stdout


def holds(path: Path, needle: bytes, chunk: int = 1 << 20) -> bool:
    """Whether `needle` is in the file, reading only its data: the workdir filesystem images
    (10 GiB, sparse) are mostly holes, all zeros, which no token is in. (Reading them whole
    took minutes and 10 GiB of memory each.)"""
    with open(path, "rb") as f:
        fd, end, offset = f.fileno(), os.fstat(f.fileno()).st_size, 0
        while offset < end:
            try:
                offset = os.lseek(fd, offset, os.SEEK_DATA)
            except OSError as e:
                if e.errno == errno.ENXIO:  # no data after offset
                    return False
                raise
            stop = os.lseek(fd, offset, os.SEEK_HOLE)
            f.seek(offset)
            tail = b""
            while offset < stop:
                data = f.read(min(chunk, stop - offset))
                if not data:
                    return False
                if needle in tail + data:
                    return True
                offset += len(data)
                tail = (tail + data)[-(len(needle) - 1):]
    return False


def test_holds_finds_a_needle_after_holes_and_across_reads(tmp_path):
    """The check above reads only a sparse file's data, yet misses no needle in it."""
    path = tmp_path / "sparse.img"
    with open(path, "wb") as f:
        f.truncate(64 << 20)
        f.seek(40 << 20)
        f.write(b"x" * 10 + b"NEEDLE" + b"y" * 10)
    assert holds(path, b"NEEDLE") and not holds(path, b"OTHER")
    assert holds(path, b"NEEDLE", chunk=13)  # split across two reads
    path.write_bytes(b"NEEDLE")  # no holes at all
    assert holds(path, b"NEEDLE") and not holds(path, b"NEEDLES")


def test_no_file_holds_a_token_and_a_new_backend_on_the_root_still_adopts(local_root):
    """Tokens are derived from the root's key (0600); meta.json keeps the digest only. A new
    client on the same root (a restarted orchestrator, `orchard sandbox gc`) reaches the
    sandbox with the token it derives; a wrong key cannot."""
    config = {"type": "local", "root": str(local_root), "die_with_client": False}
    client = SandboxClient(config)
    try:
        box = client.create_sandbox()
        token = box.record.endpoint.token
        assert len(token) >= 32
        for path in local_root.rglob("*"):
            if path.is_file():
                assert not holds(path, token.encode()), path
        meta = json.loads((local_root / box.sandbox_id / "meta.json").read_text())
        assert meta["token_sha256"] == hashlib.sha256(token.encode()).hexdigest() and "token" not in meta
        assert (local_root / ".key").stat().st_mode & 0o777 == 0o600
        with SandboxClient(config) as again:
            adopted = again.get_sandbox(box.sandbox_id)
            assert adopted.record.endpoint.token == token
            assert adopted.exec("echo adopted").stdout == "adopted\n"
    finally:
        client.cleanup_all()
        client.close()


@pytest.mark.parametrize("spawner", SPAWNERS)
def test_read_only_paths_are_shared_but_never_the_root_under_them(spawner):
    """`read_only_paths` adds host folders to the view, read-only; a backend root inside one
    stays covered (no sibling through the share)."""
    share = Path(f"/var/tmp/og-iso-share-{os.getpid()}-{uuid.uuid4().hex[:6]}")
    (share / "data").mkdir(parents=True)
    (share / "data" / "f.txt").write_text("shared\n")
    try:
        config = {"type": "local", "isolation": "bwrap", "spawner": spawner, "root": str(share / "root"),
                  "read_only_paths": [str(share)]}
        with SandboxClient(config) as client:
            box, sibling = client.create_sandbox(), client.create_sandbox()
            assert box.exec(f"cat {share}/data/f.txt").stdout == "shared\n"
            assert box.exec(f"touch {share}/data/new").exit_code != 0  # read-only
            assert box.exec(f"ls {share / 'root' / sibling.sandbox_id}").exit_code != 0
            assert box.exec(f"cat {share / 'root' / '.key'}").exit_code != 0
            assert box.exec("echo ok > own && cat own").stdout == "ok\n"
    finally:
        shutil.rmtree(share, ignore_errors=True)
    with pytest.raises(InvalidRequest, match="read_only_paths must be absolute"):
        SandboxClient({"type": "local", "read_only_paths": ["relative/dir"]})
