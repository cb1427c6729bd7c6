"""The local backend: a sandbox is a working directory plus one agent process.

Where bubblewrap (`bwrap`) is installed the agent runs in its own PID, mount, IPC,
UTS and (unless `block_network=False`) network namespaces: the sandbox directory is
writable, `/tmp` private, every capability dropped, and of the host it sees only a minimal
view, read-only (the userland, a filtered `/etc`, the interpreter and agent: local_view.py);
no abstract unix socket made outside it is reachable (Landlock scope, agent/scope.py).
The agent listens on a unix socket in a folder bound into the namespace.
Without bubblewrap (macOS, minimal hosts) the agent is a plain process and a
warning says so once.

State lives on disk (`ROOT/<id>/meta.json`), so another process — a restarted
orchestrator, `orchard sandbox gc` — can find, adopt or sweep sandboxes. meta.json holds no
token, only its digest and a nonce: a sandbox's token is an HMAC of the backend root's key
(`ROOT/.key`, 0600, in no sandbox's view) over its id and nonce.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from pathlib import Path

from orchard_gym.agent import AGENT_DIR, scope
from orchard_gym._loop import run_in_thread
from orchard_gym.errors import BackendError, InvalidRequest, SandboxFailed, SandboxNotFound
from orchard_gym.models import HOST_IMAGES, AgentEndpoint, SandboxRecord, SandboxSpec, SnapshotRecord, parse_memory

from . import fstree, local_view, procs, snapshot_attach, workdir_fs
from .base import Backend, new_sandbox_id, new_token, token_sha256
from .cgroups import CgroupError, SandboxCgroup, detect
from .config import LocalBackendConfig
from .snapshots_local import LocalSnapshotStore
from .zygote import Zygote, ZygoteChild, unavailable_reason, zygote_request

log = logging.getLogger(__name__)

# bubblewrap binds `/` recursively, then remounts every submount read-only; a mount that
# goes away in between (a container's overlay, a netns file of Podman's) fails the start
# with "bwrap: Can't ... mount ...". Nothing is wrong with the sandbox: start it again.
_MOUNT_RACE = re.compile(r"^bwrap: Can't .*mount", re.M)
MOUNT_RACE_RETRIES = 3
TRASH_DIR = ".trash"  # deleted sandboxes' folders, until removed (a dot-name: list and sweep skip it)
_warned_no_bwrap = False


def default_root() -> Path:
    env = os.environ.get("ORCHARD_LOCAL_ROOT")
    return Path(env) if env else Path(tempfile.gettempdir()) / f"orchard-gym-{os.getuid()}"


def _compile_agent() -> None:
    """Byte-compile the agent's modules once, so that each agent start (read-only inside
    bubblewrap) loads them instead of compiling ~1,500 lines again. Best effort."""
    import compileall

    try:
        compileall.compile_dir(AGENT_DIR, quiet=2, legacy=False)
    except OSError:
        pass


def _python() -> tuple[str, str]:
    """The real interpreter (not a venv shim) and its prefix, for running the agent."""
    exe = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    return exe, os.path.realpath(sys.base_prefix)


class LocalBackend(Backend):
    name = "local"

    def __init__(self, config: LocalBackendConfig | None = None):
        self.config = config or LocalBackendConfig()
        self.root = (self.config.root or default_root()).resolve()
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.bwrap = self._find_bwrap()
        self._key = _root_key(self.root / ".key")
        missing = [str(p) for p in self.config.read_only_paths if not p.exists()]
        if missing:
            raise BackendError(f"read_only_paths: {', '.join(missing)} not found on this host")
        if self.bwrap:  # what every sandbox sees of the host, planned once (walking /etc)
            python, prefix = _python()
            shares = [python, prefix, os.path.realpath(AGENT_DIR), *map(str, local_view.cache_shares()),
                      *map(str, self.config.read_only_paths)]
            self.view = local_view.plan(shares, str(self.root))
            self.view += self._hidden_steps()  # e.g. Harbor task folders (their solutions) inside the view
            self.scoped_sockets = scope.abi() >= scope.SCOPE_ABI
            if not self.scoped_sockets:
                log.warning("Landlock ABI %d < %d: sandboxes with block_network=False can reach the host's abstract "
                            "unix sockets", scope.abi(), scope.SCOPE_ABI)
        self.no_zygote_reason = unavailable_reason(self.config.spawner, self.bwrap)
        if self.no_zygote_reason and self.config.spawner == "zygote":
            raise BackendError(f"spawner='zygote' but it cannot run here: {self.no_zygote_reason}")
        self.zygote = None if self.no_zygote_reason else Zygote(
            _python()[0], os.path.realpath(AGENT_DIR), self.root / ".zygote.log", self.config.die_with_client)  # a dot-name: sweep skips it
        self.cgroups, self.no_cgroups_reason = detect(self.config.cgroups, self.config.cgroup_parent)
        # cgroups are machine-wide: a sandbox's is named by its id and this root, so two roots (an
        # `orchard serve` and in-process clients, parallel test workers) can hold the same id
        self._cgroup_suffix = "-" + uuid.uuid5(uuid.NAMESPACE_URL, str(self.root.resolve())).hex[:8]
        self.tmp_size, self.workdir_size = parse_memory(self.config.tmp_size), parse_memory(self.config.workdir_size)
        self.workdir_fs_reason = workdir_fs.unavailable_reason()  # why no workdir can be size-capped here
        self.no_workdir_limit = self.workdir_fs_reason if self.workdir_size else "workdir_size=None"
        if self.no_workdir_limit and self.workdir_size and "workdir_size" in self.config.model_fields_set:
            raise BackendError(f"workdir_size={self.config.workdir_size!r} cannot be held here: {self.no_workdir_limit}")
        if self.cgroups is None and self.config.cgroups in ("v1", "v2"):
            raise BackendError(f"cgroups={self.config.cgroups!r} but none is usable: {self.no_cgroups_reason}")
        self._procs: dict[str, subprocess.Popen] = {}
        self._warned_image = False
        _compile_agent()
        self._starting: dict[str, SandboxSpec] = {}  # created here, not ready yet: what a restart needs
        self.snapshots = LocalSnapshotStore(self.root, self.name, self.config.die_with_client,
                                            layered=self.config.snapshots != "copy")
        if self.config.snapshots == "layers" and self.snapshots.layers is None:
            raise BackendError(f"snapshots='layers' but overlay layers cannot be used here: "
                               f"{self.snapshots.no_layers_reason}")
        self.swept = self.sweep_sync()  # what crashed clients left behind

    def _warn_image_as_host(self, image: str) -> None:
        if self._warned_image:  # once per backend: a benchmark creates hundreds
            return
        self._warned_image = True
        logging.getLogger(__name__).warning("any_image_as_host: image %r (and every other image name) runs on "
                                            "the host's own userland, not in that image", image)

    def _find_bwrap(self) -> str | None:
        global _warned_no_bwrap
        if self.config.isolation == "none":
            return None
        path = shutil.which("bwrap")
        if path is None and self.config.isolation == "bwrap":
            raise BackendError("isolation='bwrap' but bubblewrap is not installed (apt-get install bubblewrap)")
        if path is None and not _warned_no_bwrap:
            _warned_no_bwrap = True
            warnings.warn(
                "bubblewrap (bwrap) not found: local sandboxes run as plain processes, "
                "without namespaces or network blocking",
                RuntimeWarning,
                stacklevel=3,
            )
        return path

    # ------------------------------------------------------------------ create
    async def create(self, spec: SandboxSpec) -> SandboxRecord:
        if self.config.die_with_client and self.zygote is None:
            return self._create(spec)  # here: bubblewrap's --die-with-parent follows the spawning thread
        # Nothing ties the sandbox to a thread: keep the event loop free while the folders are
        # made and the child starts (tens of ms on a busy host, stalling every other request).
        if self.zygote is not None:  # its own threads: a create waits on the zygote, not on the CPU
            return await asyncio.get_running_loop().run_in_executor(self.zygote.executor, self._create, spec)
        return await asyncio.to_thread(self._create, spec)

    def disk_limit_unavailable(self) -> str | None:
        if not self.bwrap:
            return "isolation='none': a plain process writes anywhere its user can (no private /tmp)"
        return self.workdir_fs_reason

    def _create(self, spec: SandboxSpec) -> SandboxRecord:
        if spec.disk is not None and (why := self.disk_limit_unavailable()):
            raise InvalidRequest(f"disk={spec.disk!r} cannot be held on the local backend: {why}")
        if spec.image not in HOST_IMAGES:
            if not self.config.any_image_as_host:
                raise InvalidRequest(
                    f"the local backend runs the host's own userland; image must be None or 'host', "
                    f"not {spec.image!r} (use the docker backend for images, or set any_image_as_host / "
                    f"ORCHARD_LOCAL_ANY_IMAGE=1 to run every image name on the host)"
                )
            self._warn_image_as_host(spec.image)
        sandbox_id = spec.sandbox_id or new_sandbox_id()
        home = self.root / sandbox_id
        try:
            home.mkdir(mode=0o700)
        except FileExistsError:
            raise InvalidRequest(f"sandbox {sandbox_id} already exists") from None
        work, run = home / "work", home / "run"
        work.mkdir()
        run.mkdir()
        # a fork's workdir is an overlay of its snapshot's layers (snapshots_local.py): what it
        # writes, and so the size cap, is its upper folder in `rw`
        layered = spec.from_snapshot is not None and self.snapshots.layers is not None
        writable = home / "rw" if layered else work
        writable.mkdir(exist_ok=True)
        # the spec's disk, else the backend's workdir_size; before anything is written there (a snapshot's tree)
        workdir_bytes = spec.disk_bytes or (None if self.no_workdir_limit else self.workdir_size)
        if workdir_bytes is not None:
            workdir_bytes = self._limit_workdir(home, writable, workdir_bytes, required=spec.disk is not None)
        source = None
        if spec.from_snapshot is not None:
            try:
                source = self.snapshots.restore(spec.from_snapshot, work, writable if layered else None, sandbox_id)
            except BaseException:
                _remove_quietly(home)
                raise
        nonce = new_token()
        isolation = "bwrap" if self.bwrap else "none"
        if not spec.block_network or isolation == "none":
            network = "host"
        else:
            network = "none"
        meta = {
            "sandbox_id": sandbox_id,
            "image": spec.image or "host",
            "token_nonce": nonce,  # the token: _token(), from the root's key; never written down
            "token_sha256": token_sha256(self._token({"sandbox_id": sandbox_id, "token_nonce": nonce})),
            "socket": str(run / "agent.sock"),
            "workdir": str(work),
            "isolation": isolation,
            "network": network,
            "block_network": spec.block_network,
            "cpu": spec.cpu,
            "memory": spec.memory,
            "env": spec.env,
            "labels": spec.labels,
            "created_at": time.time(),
            "owner": procs.identity(os.getpid()),
            "die_with_client": self.config.die_with_client,
        }
        if source is not None and isolation == "bwrap":  # at the snapshot's path, so absolute paths hold
            meta["sandbox_workdir"] = source["workdir"]
        if source is not None and "upper" in source:  # the layers it holds, where its changes go
            meta["layers"], meta["upper"] = source["layers"], source["upper"]
        cgroup, fds = self._make_cgroup(sandbox_id, spec, home)
        meta["cgroup"] = cgroup.to_meta() if cgroup else None
        meta["enforced_by"] = self._enforcement(meta, spec, workdir_bytes)
        tmp_bytes = min(filter(None, (self.tmp_size, spec.disk_bytes)), default=None)  # /tmp: no more than the disk
        meta["limits"] = {"memory_bytes": self._memory_bytes(spec) if meta["enforced_by"]["memory"] else None,
                          "tmp_bytes": tmp_bytes if self.bwrap else None, "workdir_bytes": workdir_bytes}
        try:
            self._spawn(meta, spec, fds)
        except OSError as e:
            if cgroup:
                cgroup.remove()
            _remove_quietly(home)
            self.snapshots.release_sandbox(meta)
            raise BackendError(f"cannot start the agent: {e}") from e
        self._starting[sandbox_id] = spec
        return self._record(meta, status="pending")

    def _limit_workdir(self, home: Path, work: Path, size: int, required: bool) -> int | None:
        """Mount the size-capped workdir (a fork's: the folder of its overlay's upper); its size,
        None when it is not capped. Asked for (the spec's disk, or workdir_size in the config),
        a failure fails the create; as the default it is said once and this backend's
        sandboxes go on without it."""
        try:
            workdir_fs.make(home / "work.img", work, size)
            return size
        except BackendError as e:
            if required or "workdir_size" in self.config.model_fields_set:
                _remove_quietly(home)
                raise
            self.no_workdir_limit = str(e)
            log.warning("%s; sandboxes of %s have no workdir limit", e, self.root)
            fstree.detach_mounts(work)
            (home / "work.img").unlink(missing_ok=True)
            return None
        except BaseException:
            _remove_quietly(home)
            raise

    def _spawn(self, meta: dict, spec: SandboxSpec, fds: list[int]) -> None:
        """Start the sandbox's agent (closing the cgroup fds it was handed) and record its pid."""
        work, home = meta["workdir"], Path(meta["workdir"]).parent
        # reserved names last: a spec's env never renames the sandbox (SandboxSpec refuses them too)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": meta.get("sandbox_workdir", work),
               "LANG": "C.UTF-8",
               **spec.env, "ORCHARD_SANDBOX": meta["sandbox_id"]}
        zygote = self.zygote
        meta["spawner"] = "zygote" if zygote else ("bwrap" if self.bwrap else "process")
        try:
            with open(home / "agent.log", "wb") as logf:
                if zygote:  # forked from the warm agent, set up as the bwrap line below would
                    job = str(SandboxCgroup.from_meta(meta["cgroup"]).job_dir) if fds else None
                    dirs = [str(d) for d in SandboxCgroup.from_meta(meta["cgroup"]).unique_dirs] if fds else []
                    req = zygote_request(meta, env, self._agent_args(meta, spec), self.view, len(fds),
                                         dirs.index(job) if fds else None)
                    proc = ZygoteChild(self.zygote.spawn(req, [logf.fileno(), *fds]))
                else:
                    proc = subprocess.Popen(self._argv(meta, spec, fds), env=env, cwd=work, stdin=subprocess.DEVNULL,
                                            stdout=logf, stderr=subprocess.STDOUT, start_new_session=True, pass_fds=fds)
        finally:
            for fd in fds:
                os.close(fd)
        self._procs[meta["sandbox_id"]] = proc
        meta["pid"] = procs.identity(proc.pid)
        _write_json(home / "meta.json", meta)

    async def wait_ready(self, record: SandboxRecord, timeout: float) -> SandboxRecord:
        deadline = time.monotonic() + timeout
        try:
            for attempt in range(MOUNT_RACE_RETRIES + 1):
                try:
                    return await super().wait_ready(record, max(0.5, deadline - time.monotonic()))
                except SandboxFailed:
                    spec = self._starting.get(record.sandbox_id)
                    logfile = self.root / record.sandbox_id / "agent.log"
                    if attempt == MOUNT_RACE_RETRIES or spec is None or not _lost_mount_race(logfile):
                        raise
                    log.warning("sandbox %s: bubblewrap lost a mount race at start; starting it again",
                                record.sandbox_id)
                    self._restart(record.sandbox_id, spec)
        finally:
            self._starting.pop(record.sandbox_id, None)

    def _restart(self, sandbox_id: str, spec: SandboxSpec) -> None:
        # in the caller's thread, as at create: --die-with-parent follows the spawning thread
        meta = self._meta(sandbox_id)
        if meta is None:
            raise SandboxFailed(f"sandbox {sandbox_id} was deleted while it started")
        cgroup = SandboxCgroup.from_meta(meta["cgroup"]) if meta.get("cgroup") else None
        self._spawn(meta, spec, cgroup.open_dirs() if cgroup else [])

    def _make_cgroup(self, sandbox_id: str, spec: SandboxSpec, home: Path) -> tuple[SandboxCgroup | None, list[int]]:
        """The sandbox's cgroup with its limits, and directory fds for the agent to join."""
        if self.cgroups is None:
            return None, []
        try:
            cgroup = self.cgroups.create(sandbox_id + self._cgroup_suffix, self.config.pids_limit, self._memory_bytes(spec), spec.cpu)
        except CgroupError as e:
            _remove_quietly(home)
            raise BackendError(str(e)) from None
        try:
            return cgroup, cgroup.open_dirs()
        except OSError as e:
            cgroup.remove()
            _remove_quietly(home)
            raise BackendError(f"cannot open the sandbox's cgroup: {e}") from None

    def _enforced_by_cgroup(self, meta: dict, limit: str) -> bool:
        return bool(meta.get("cgroup")) and self.cgroups is not None and limit in self.cgroups.limits

    def _memory_bytes(self, spec: SandboxSpec) -> int | None:
        """The spec's memory, else the backend's default_memory (held by a cgroup only: as an
        address-space rlimit a default would break programs that reserve much, e.g. Chromium)."""
        if spec.memory is not None:
            return spec.memory_bytes
        return parse_memory(self.config.default_memory) if self.cgroups and "memory" in self.cgroups.limits else None

    def _enforcement(self, meta: dict, spec: SandboxSpec, workdir_bytes: int | None) -> dict:
        """What holds each limit: the sandbox's cgroup, a per-process stand-in, or nothing."""
        def by(limit: str, requested, stand_in: str | None):
            if requested is None:
                return None
            return "cgroup" if self._enforced_by_cgroup(meta, limit) else stand_in
        return {"pids": by("pids", self.config.pids_limit, None),
                "memory": by("memory", self._memory_bytes(spec), "rlimit-as (address space of each process)"),
                "cpu": by("cpu", spec.cpu, "cpu affinity (whole cores)"),
                "tmp": "tmpfs size" if self.tmp_size and self.bwrap else None,  # a plain process has no own /tmp
                "workdir": "loop-mounted ext4 image (workdir_fs.py)" if workdir_bytes else None}

    def _agent_args(self, meta: dict, spec: SandboxSpec) -> list[str]:
        """The agent's options but the cgroup fds and --exit-with-parent."""
        agent = ["--socket", meta["socket"], "--cwd", meta.get("sandbox_workdir", meta["workdir"]),
                 "--max-output", str(self.config.max_output), "--token-sha256", meta["token_sha256"]]
        # without a cgroup that enforces them: today's per-process stand-ins
        if spec.memory is not None and not self._enforced_by_cgroup(meta, "memory"):
            agent += ["--limit-memory", str(spec.memory_bytes)]
        if spec.cpu is not None and not self._enforced_by_cgroup(meta, "cpu"):
            agent += ["--limit-cpus", str(spec.cpu)]
        if self.bwrap and self.scoped_sockets:
            agent.append("--scope-abstract-sockets")
        return agent

    def _token(self, meta: dict) -> str:
        if "token" in meta:  # a sandbox made before tokens were derived
            return meta["token"]
        return hmac.new(self._key, f"{meta['sandbox_id']}/{meta['token_nonce']}".encode(), "sha256").hexdigest()

    def _hidden_steps(self) -> list[list[str]]:
        """config.hide's folders that the view would show, covered (the rest are not in it)."""
        shown = [step[-1] for step in self.view if step[0] == "ro"]
        paths = (os.path.realpath(p) for p in self.config.hide)
        return [["cover-dir", p] for p in paths if os.path.isdir(p)
                and any(p == s or p.startswith(s.rstrip("/") + "/") for s in shown)]

    def _argv(self, meta: dict, spec: SandboxSpec, cgroup_fds: list[int] = ()) -> list[str]:
        python = _python()[0]
        agent_py = os.path.realpath(AGENT_DIR)  # a folder, run as python3 DIR (its __main__.py)
        inside = meta.get("sandbox_workdir", meta["workdir"])  # a fork sees its folder at its snapshot's path
        agent = [python, "-I", "-S", agent_py, *self._agent_args(meta, spec)]
        if cgroup_fds:
            job_dir = str(SandboxCgroup.from_meta(meta["cgroup"]).job_dir)
            dirs = [str(d) for d in SandboxCgroup.from_meta(meta["cgroup"]).unique_dirs]
            for fd in cgroup_fds:
                agent += ["--cgroup-fd", str(fd)]
            agent += ["--job-cgroup-fd", str(cgroup_fds[dirs.index(job_dir)])]
        if self.config.die_with_client:
            agent.append("--exit-with-parent")
        if not self.bwrap:
            return agent
        work, run = meta["workdir"], str(Path(meta["socket"]).parent)
        tmp = meta.get("limits", {}).get("tmp_bytes")
        argv = [self.bwrap, *local_view.bwrap_args(self.view, tmp_size=tmp)]
        argv += ["--bind", work, inside, "--bind", run, run, "--remount-ro", "/", "--chdir", inside,
                 "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                 "--hostname", meta["sandbox_id"][:63], "--cap-drop", "ALL", "--new-session"]
        if meta["network"] == "none":
            argv.append("--unshare-net")
        if self.config.die_with_client:
            argv.append("--die-with-parent")
        return argv + ["--"] + agent

    # ------------------------------------------------------------------ query
    def _record(self, meta: dict, status: str | None = None) -> SandboxRecord:
        if status is None:
            status = "running" if procs.alive(meta.get("pid")) else "failed"
        error = None
        if status == "failed":
            error = "the sandbox's agent process is gone" + procs.log_tail(Path(meta["workdir"]).parent / "agent.log", "agent")
        return SandboxRecord(
            sandbox_id=meta["sandbox_id"],
            image=meta["image"],
            status=status,
            backend=self.name,
            block_network=meta["block_network"],
            cpu=meta.get("cpu"),
            memory=meta.get("memory"),
            env=meta.get("env", {}),
            labels=meta.get("labels", {}),
            workdir=meta.get("sandbox_workdir", meta["workdir"]),
            created_at=meta["created_at"],
            error=error,
            endpoint=AgentEndpoint(uds=meta["socket"], token=self._token(meta)),
            details={"isolation": meta["isolation"], "network": meta["network"], "pid": meta.get("pid"),
                     "host_workdir": meta["workdir"], "creator": meta.get("owner"),  # gc: whose process is gone
                     "spawner": meta.get("spawner", "bwrap" if meta["isolation"] == "bwrap" else "process")},
        )

    def _meta(self, sandbox_id: str) -> dict | None:
        if "/" in sandbox_id or sandbox_id in ("", ".", ".."):
            return None
        try:
            return json.loads((self.root / sandbox_id / "meta.json").read_text())
        except (OSError, ValueError):
            return None

    async def get(self, sandbox_id: str) -> SandboxRecord | None:
        meta = self._meta(sandbox_id)
        return self._record(meta) if meta else None

    async def list(self) -> list[SandboxRecord]:
        out = []
        for home in sorted(self.root.iterdir()):
            meta = self._meta(home.name)
            if meta:
                out.append(self._record(meta))
        return out

    async def is_alive(self, sandbox_id: str) -> bool:
        proc = self._procs.get(sandbox_id)
        if proc is not None:  # started here: no need to read its meta.json (the ready-wait asks often)
            return proc.poll() is None
        meta = self._meta(sandbox_id)
        return bool(meta) and procs.alive(meta.get("pid"))

    def resources(self) -> dict:
        homes = [h for h in self.root.iterdir() if (h / "meta.json").exists()]
        return {
            "backend": self.name,
            "isolation": "bwrap" if self.bwrap else "none",
            "spawner": {"zygote": self.zygote.describe()} if self.zygote else
                       f"{'bwrap' if self.bwrap else 'process'} (no zygote: {self.no_zygote_reason})",
            "cgroups": self.cgroups.describe() if self.cgroups else f"off: {self.no_cgroups_reason}",
            "cpus": os.cpu_count(),
            "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
            "sandboxes": len(homes),
            "root": str(self.root),
        }

    async def sandbox_resources(self, sandbox_id: str) -> dict | None:
        """How the sandbox is limited and killed, and what it used so far (cgroup accounting)."""
        meta = self._meta(sandbox_id)
        if meta is None:
            return None
        out = {"sandbox_id": sandbox_id, "backend": self.name, "enforced_by": meta.get("enforced_by", {}),
               "sizes": {k: v for k, v in (meta.get("limits") or {}).items() if k != "memory_bytes"}}
        if meta.get("cgroup"):
            cgroup = SandboxCgroup.from_meta(meta["cgroup"])
            how = "cgroup.kill" if cgroup.version == 2 else "freeze, SIGKILL, thaw"
            out.update(kill=f"cgroup v{cgroup.version} ({how})", cgroup=str(cgroup.job_dir),
                       limits=await asyncio.to_thread(cgroup.limits), usage=await asyncio.to_thread(cgroup.usage))
        else:
            reason = self.no_cgroups_reason or "this sandbox was made without one"
            out.update(kill=f"marker (no writable cgroups: {reason})", cgroup=None,
                       limits={"pids": None, "memory_bytes": parse_memory(meta.get("memory")), "cpu": meta.get("cpu")},
                       usage={"cpu_seconds": None, "memory_peak_bytes": None, "memory_bytes": None, "pids": None,
                              "oom_kills": None})
        return out

    # ------------------------------------------------------------------ delete
    async def delete(self, sandbox_id: str) -> bool:
        meta = self._meta(sandbox_id)
        if meta is None:
            return False
        await run_in_thread(self._destroy, meta)
        return True

    def _destroy(self, meta: dict) -> None:
        """Kill every process of the sandbox, then remove its folder."""
        proc = self._procs.pop(meta["sandbox_id"], None)
        marker = None
        if meta.get("cgroup"):  # every process of the sandbox, however it forked: freeze, kill, thaw
            try:
                SandboxCgroup.from_meta(meta["cgroup"]).kill()
            except (CgroupError, OSError) as e:
                log.warning("sandbox %s: cgroup kill failed (%s); falling back to the marker", meta["sandbox_id"], e)
                marker = f"ORCHARD_SANDBOX={meta['sandbox_id']}"
        elif meta["isolation"] == "none":
            # In a PID namespace killing the tree kills everything; a plain process's
            # escaped descendants are found by the marker in their environment.
            marker = f"ORCHARD_SANDBOX={meta['sandbox_id']}"
        procs.kill_tree(meta.get("pid"), marker=marker)  # bubblewrap's own processes live outside the cgroup
        if proc is not None:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                log.warning("sandbox %s: agent did not exit after SIGKILL", meta["sandbox_id"])
        self._discard(Path(meta["workdir"]).parent)
        self.snapshots.release_sandbox(meta)  # the layers it was forked from, unless others hold them

    def _discard(self, home: Path) -> None:
        """Remove a sandbox's folder, whatever its processes left there (fstree.py). It is
        first renamed into ROOT/.trash, so the sandbox is gone at once; what cannot be removed
        now stays there, logged, and every sweep tries again."""
        doomed = self.root / TRASH_DIR / f"{home.name}.{uuid.uuid4().hex[:8]}"
        try:
            doomed.parent.mkdir(mode=0o700, exist_ok=True)
            os.rename(home, doomed)
        except FileNotFoundError:
            return
        except OSError as e:
            log.warning("cannot move %s to the trash (%s); removing it in place", home, e)
            doomed = home
        try:
            fstree.remove_tree(doomed)
        except OSError as e:
            log.warning("%s; the next sweep tries again", e)

    def sweep_sync(self) -> list[str]:
        """Remove sandboxes whose creating process died (die_with_client) or whose agent died,
        and what earlier deletes could not remove. One folder that fails is logged and left
        for the next sweep: it never stops the others, nor a backend's start."""
        removed = []
        try:
            removed += self.snapshots.sweep()
        except Exception:
            log.exception("the snapshot sweep of %s failed; the next sweep tries again", self.root)
        for home in self._homes():
            try:
                if self._sweep_one(home):
                    removed.append(home.name)
            except Exception:
                log.exception("cannot sweep %s; the next sweep tries again", home)
        for doomed in self._homes(TRASH_DIR):
            try:
                fstree.remove_tree(doomed)
            except Exception as e:
                log.warning("%s; the next sweep tries again", e)
        return removed

    def _homes(self, under: str = "") -> list[Path]:
        try:
            return list((self.root / under).iterdir())
        except FileNotFoundError:
            return []

    def _sweep_one(self, home: Path) -> bool:
        if home.name.startswith("."):  # the snapshot store, the trash, the zygote's log
            return False
        meta = self._meta(home.name)
        if meta is None:
            # a folder without meta.json is a create that crashed midway; give it a minute
            if home.is_dir() and time.time() - home.lstat().st_mtime > 60:
                self._discard(home)
                return True
            return False
        owner_gone = meta.get("die_with_client") and not procs.alive(meta.get("owner"))
        if owner_gone or not procs.alive(meta.get("pid")):
            self._destroy(meta)
            return True
        return False

    async def sweep(self) -> list[str]:
        return await run_in_thread(self.sweep_sync)

    # ------------------------------------------------------------------ snapshots (snapshots_local.py)
    async def snapshot(self, sandbox_id: str, labels: dict[str, str] | None = None) -> SnapshotRecord:
        meta = self._meta(sandbox_id)
        if meta is None:
            raise SandboxNotFound(f"no sandbox {sandbox_id!r}")
        if not procs.alive(meta.get("pid")):
            raise SandboxFailed(f"sandbox {sandbox_id} is not running; cannot snapshot it")
        cgroup = SandboxCgroup.from_meta(meta["cgroup"]) if meta.get("cgroup") else None
        meta["labels"] = {**(meta.get("labels") or {}), **(labels or {})}
        return await asyncio.to_thread(self.snapshots.take, meta, cgroup.frozen if cgroup else None)

    async def delete_snapshot(self, snapshot_id: str) -> bool:
        return await asyncio.to_thread(self.snapshots.delete, snapshot_id)

    @property
    def loads_snapshots(self) -> bool:
        """Whether a running sandbox can take a snapshot's files (snapshot_attach.py): layers,
        and a sandbox whose namespace pid the backend knows (zygote) or none at all."""
        return self.snapshots.layers is not None and (self.zygote is not None or not self.bwrap)

    async def load_snapshot(self, sandbox_id: str, snapshot_id: str) -> SandboxRecord:
        meta = self._meta(sandbox_id)
        if meta is None:
            raise SandboxNotFound(f"no sandbox {sandbox_id!r}")
        if not self.loads_snapshots or meta.get("spawner") == "bwrap" or meta.get("layers"):
            raise InvalidRequest(f"sandbox {sandbox_id} cannot take a snapshot's files (only an untouched one, "
                                 f"with overlay layers and the zygote: {self.snapshots.no_layers_reason or 'ok'})")
        try:
            meta.update(await asyncio.to_thread(snapshot_attach.load_into, self.snapshots, meta, snapshot_id))
        except ValueError as e:
            raise InvalidRequest(f"sandbox {sandbox_id}: {e}") from None
        _write_json(Path(meta["workdir"]).parent / "meta.json", meta)
        return self._record(meta)

    async def list_snapshots(self) -> list[SnapshotRecord]:
        return await asyncio.to_thread(self.snapshots.list)

    async def get_snapshot(self, snapshot_id: str) -> SnapshotRecord | None:
        return self.snapshots.get(snapshot_id)

    def reap(self) -> None:
        """Collect the exit status of agents this process started that died or were deleted
        by another process (an orchestrator replica), so none lingers as a zombie."""
        for sandbox_id, proc in list(self._procs.items()):
            if proc.poll() is not None:
                self._procs.pop(sandbox_id, None)

    async def aclose(self) -> None:
        self._procs.clear()
        if self.zygote is not None:
            await asyncio.to_thread(self.zygote.close)


def _remove_quietly(home: Path) -> None:
    """A create's clean-up: remove what it made, logging (not raising) what stays."""
    try:
        fstree.remove_tree(home)
    except OSError as e:
        log.warning("%s; the next sweep tries again", e)


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def _root_key(path: Path) -> bytes:
    """The backend root's secret (made once, 0600; shared by every process using the root)."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        pass
    tmp = path.with_name(f".key.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(os.urandom(32))
    try:
        os.link(tmp, path)  # never replaces: a concurrent maker's key wins, and both use it
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    return path.read_bytes()


def _lost_mount_race(logfile: Path) -> bool:
    try:
        return bool(_MOUNT_RACE.search(logfile.read_text(errors="replace")))
    except OSError:
        return False
