"""Cgroups for local sandboxes: one per sandbox, limits, freeze-then-kill, accounting.

Two drivers, for the two kernel interfaces:

- v1: one hierarchy per controller (`/sys/fs/cgroup/<controller>/`). A sandbox gets a
  directory in each of `pids`, `memory`, `cpuacct` and `freezer` that exists, and in
  `cpu` when it asks for a CPU limit; the freezer is what makes a kill complete
  (nothing forks while frozen). A command joins its job cgroup (freezer only) by the
  agent's spawning thread moving there alone for the fork.
- v2: one hierarchy (`/sys/fs/cgroup` on most hosts, `/sys/fs/cgroup/unified` on hybrid
  ones). Kill and freeze are core files (`cgroup.kill`, `cgroup.freeze`) and work
  without controllers; limits need `pids`/`memory`/`cpu` enabled in the parent's
  `cgroup.subtree_control`, which a hybrid host (controllers bound to v1) cannot do.

Sandbox cgroups live under `<own cgroup>/<parent>/<sandbox id>` in each hierarchy, so
whatever limits the creating process lives under also bind its sandboxes. The agent
puts each command in a child cgroup `job-<marker>` of the sandbox's freezer (v1) or
unified (v2) directory, which it reaches through an inherited directory fd (see
orchard_gym/agent/jobs.py, JobCgroups).

`detect()` answers a driver, or the reason there is none (then the backend falls back to
the environment-marker kill and says so in `resources()`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import signal
import time
from pathlib import Path

V1_CONTROLLERS = ("pids", "memory", "cpu", "cpuacct", "freezer")
LIMITS = ("pids", "memory", "cpu")
CPU_PERIOD_US = 100_000


class CgroupError(Exception):
    """A cgroup could not be made, limited or removed."""


# --------------------------------------------------------------------------- discovery


def _mounts(mountinfo: str = "/proc/self/mountinfo") -> list[tuple[str, str, str, set[str]]]:
    """(fstype, mount point, mount root, super options) of every cgroup mount."""
    out = []
    with open(mountinfo) as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            if len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
                continue
            out.append((tail[0], fields[4].replace("\\040", " "), fields[3], set(tail[2].split(","))))
    return out


def _own_paths(path: str = "/proc/self/cgroup") -> dict[str, str]:
    """controller (or '' for v2) -> this process's cgroup path in that hierarchy."""
    own = {}
    with open(path) as f:
        for line in f:
            _, controllers, where = line.rstrip("\n").split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                own[name] = where
    return own


def _under_mount(mount: str, mount_root: str, own: str, parent: str) -> Path:
    """The sandboxes' parent directory: `parent` below this process's own cgroup (relative
    `parent`) or below the hierarchy's root (absolute `parent`)."""
    if parent.startswith("/"):
        return Path(mount) / parent.lstrip("/")
    if mount_root != "/" and own.startswith(mount_root):
        own = own[len(mount_root):]  # a container's view: the mount starts below the root
    elif mount_root != "/":
        own = "/"
    return Path(mount) / own.lstrip("/") / parent


def detect(mode: str = "auto", parent: str = "orchard-gym") -> tuple[CgroupDriver | None, str]:
    """(driver, "") or (None, why there is none). mode: auto, v1, v2 or off."""
    if mode == "off":
        return None, "cgroups='off' in the backend config"
    try:
        mounts, own = _mounts(), _own_paths()
    except (OSError, ValueError) as e:
        return None, f"cannot read /proc/self/mountinfo or /proc/self/cgroup: {e}"
    reasons = []
    v2 = next(((m, r) for t, m, r, _ in mounts if t == "cgroup2"), None)
    v1 = {c: (m, r) for t, m, r, opts in mounts if t == "cgroup" for c in opts & set(V1_CONTROLLERS)}
    candidates = []
    if mode in ("auto", "v2") and v2:
        candidates.append(lambda: V2Driver(_under_mount(*v2, own.get("", "/"), parent)))
    elif mode == "v2":
        reasons.append("no cgroup2 mount")
    if mode in ("auto", "v1") and "freezer" in v1:
        candidates.append(lambda: V1Driver({c: _under_mount(m, r, own.get(c, "/"), parent) for c, (m, r) in v1.items()}))
    elif mode == "v1":
        reasons.append("no v1 freezer hierarchy")
    drivers = []
    for make in candidates:
        try:
            drivers.append(make())
        except (OSError, CgroupError) as e:
            reasons.append(str(e))
    if mode == "auto" and len(drivers) == 2:
        # hybrid host: v2 only where it can limit as much as v1 can
        drivers.sort(key=lambda d: -len(d.limits))
    if drivers:
        return drivers[0], ""
    return None, "; ".join(reasons) or "no cgroup hierarchy mounted"


# --------------------------------------------------------------------------- small file helpers


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _write(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _keyed(text: str | None, key: str) -> int | None:
    """`key N` out of a flat-keyed file (cpu.stat, memory.events, memory.oom_control)."""
    for line in (text or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return None


def _int(text: str | None) -> int | None:
    text = (text or "").strip()
    return int(text) if text.isdigit() else None


def _pids(directory: Path) -> list[int]:
    return [int(p) for p in (_read(directory / "cgroup.procs") or "").split()]


def _tree(top: Path) -> list[Path]:
    """`top` and every cgroup below it, deepest first (the order rmdir needs)."""
    out = []
    for dirpath, dirnames, _ in os.walk(top):
        out.extend(Path(dirpath) / d for d in dirnames)
    out.sort(key=lambda p: len(p.parts), reverse=True)
    return out + [top]


def _kill_pids(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _wait_exited(pids: list[int], deadline: float) -> None:
    """Sleep until every one of `pids` has exited, or the deadline (pidfds; Linux 5.3+)."""
    fds = []
    try:
        for pid in pids:
            try:
                fds.append(os.pidfd_open(pid))
            except ProcessLookupError:  # gone already
                pass
            except (AttributeError, OSError):  # no pidfds here: poll
                time.sleep(0.001)
                return
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        waiting = len(fds)
        while waiting and (left := deadline - time.monotonic()) > 0:
            for fd, _ in poller.poll(left * 1000):
                poller.unregister(fd)
                waiting -= 1
    finally:
        for fd in fds:
            os.close(fd)


def _rmdir_tree(top: Path, deadline: float) -> None:
    """Remove a cgroup and its children; a cgroup whose killed tasks are still exiting
    answers EBUSY for a moment, so retry until the deadline."""
    for directory in _tree(top):
        while True:
            try:
                os.rmdir(directory)
                break
            except FileNotFoundError:
                break
            except OSError as e:
                if e.errno != errno.EBUSY or time.monotonic() > deadline:
                    raise CgroupError(f"cannot remove {directory}: {e}") from None
                _kill_pids(_pids(directory))
                time.sleep(0.001)


def _probe(parents: list[Path]) -> None:
    """Move a throwaway child into a fresh cgroup under each parent: mkdir can be allowed
    where moving processes is not (a delegated subtree, a foreign cgroup namespace)."""
    import subprocess

    probes = [p / f"probe-{os.getpid()}-{time.monotonic_ns()}" for p in parents]
    try:
        for probe in probes:
            probe.mkdir()
        join = subprocess.run(["/bin/sh", "-c", 'for d; do echo 0 > "$d/cgroup.procs" || exit 1; done', "sh",
                               *map(str, probes)], capture_output=True, text=True, timeout=30)
        if join.returncode != 0:
            raise CgroupError(f"cannot move a process into {parents[0]}: {join.stderr.strip()[-200:]}")
    except OSError as e:
        raise CgroupError(f"cannot make a cgroup in {parents[0]}: {e.strerror}") from None
    finally:
        for probe in probes:
            for _ in range(1000):  # the child's exit releases the cgroup a moment later
                try:
                    probe.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.001)


# --------------------------------------------------------------------------- drivers


class CgroupDriver:
    """Makes sandbox cgroups in one kind of hierarchy."""

    version = 0
    limits: frozenset[str] = frozenset()

    def create(self, name: str, pids: int | None, memory: int | None, cpu: float | None) -> SandboxCgroup:
        raise NotImplementedError

    def describe(self) -> str:
        return f"cgroup v{self.version}"


class V1Driver(CgroupDriver):
    version = 1

    def __init__(self, parents: dict[str, Path]):
        self.parents = parents
        for controller, parent in parents.items():
            try:
                parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise CgroupError(f"v1 {controller} hierarchy not writable ({parent}: {e.strerror})") from None
        _probe(list(dict.fromkeys(parents.values())))
        self.limits = frozenset(c for c in LIMITS if c in parents)

    def create(self, name, pids=None, memory=None, cpu=None) -> SandboxCgroup:
        # a cpu cgroup only to hold a quota: without one, CFS schedules the sandbox's
        # processes as one group entity, and under load (others' processes beside it) a
        # sandbox waited for the CPU as one task (exec p50 x2.3 at load ~17, same run)
        dirs = {c: p / name for c, p in self.parents.items() if c != "cpu" or cpu is not None}
        cg = SandboxCgroup(1, dirs)
        try:
            for directory in dict.fromkeys(dirs.values()):  # co-mounted controllers share one
                directory.mkdir()
            if pids is not None and "pids" in dirs:
                _write(dirs["pids"] / "pids.max", str(pids))
            if memory is not None and "memory" in dirs:
                _write(dirs["memory"] / "memory.limit_in_bytes", str(memory))
                if (dirs["memory"] / "memory.memsw.limit_in_bytes").exists():  # no swap beyond the limit
                    _write(dirs["memory"] / "memory.memsw.limit_in_bytes", str(memory))
            if cpu is not None and "cpu" in dirs:
                _write(dirs["cpu"] / "cpu.cfs_period_us", str(CPU_PERIOD_US))
                _write(dirs["cpu"] / "cpu.cfs_quota_us", str(max(1000, int(cpu * CPU_PERIOD_US))))
        except OSError as e:
            cg.remove()
            raise CgroupError(f"cannot set up the sandbox's v1 cgroups: {e}") from None
        return cg


class V2Driver(CgroupDriver):
    version = 2

    def __init__(self, parent: Path):
        self.parent = parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
            if not (parent / "cgroup.freeze").exists():
                raise CgroupError(f"v2 at {parent} has no cgroup.freeze (kernel before 5.2)")
        except OSError as e:
            raise CgroupError(f"v2 hierarchy not writable ({parent}: {e.strerror})") from None
        _probe([parent])
        self.limits, self.why_no_limits = self._enable_controllers()

    def _enable_controllers(self) -> tuple[frozenset[str], str]:
        """Turn on pids/memory/cpu for the sandboxes (in the parent's subtree_control, and in
        its parent's, when the parent is ours to make); what is left off says why."""
        available = set((_read(self.parent / "cgroup.controllers") or "").split())
        enabled = set((_read(self.parent / "cgroup.subtree_control") or "").split())
        up = self.parent.parent
        for c in LIMITS:
            if c in enabled:
                continue
            try:
                if c not in available:  # try to pass it down from the grandparent
                    _write(up / "cgroup.subtree_control", f"+{c}")
                _write(self.parent / "cgroup.subtree_control", f"+{c}")
                enabled.add(c)
            except OSError:
                pass
        have = frozenset(c for c in LIMITS if c in enabled)
        missing = [c for c in LIMITS if c not in have]
        why = ""
        if missing:
            why = (f"controllers {', '.join(missing)} not available in {self.parent} "
                   f"(bound to v1, or its parent holds processes)")
        return have, why

    def create(self, name, pids=None, memory=None, cpu=None) -> SandboxCgroup:
        directory = self.parent / name
        cg = SandboxCgroup(2, {"unified": directory})
        try:
            directory.mkdir()
            if pids is not None and "pids" in self.limits:
                _write(directory / "pids.max", str(pids))
            if memory is not None and "memory" in self.limits:
                _write(directory / "memory.max", str(memory))
                if (directory / "memory.swap.max").exists():
                    _write(directory / "memory.swap.max", "0")
            if cpu is not None and "cpu" in self.limits:
                _write(directory / "cpu.max", f"{max(1000, int(cpu * CPU_PERIOD_US))} {CPU_PERIOD_US}")
        except OSError as e:
            cg.remove()
            raise CgroupError(f"cannot set up the sandbox's v2 cgroup: {e}") from None
        return cg


# --------------------------------------------------------------------------- one sandbox's cgroups


class SandboxCgroup:
    """The cgroup directories of one sandbox (one per v1 hierarchy, or the v2 one)."""

    def __init__(self, version: int, dirs: dict[str, Path]):
        self.version = version
        self.dirs = {k: Path(v) for k, v in dirs.items()}

    @property
    def job_dir(self) -> Path:
        """Where the agent makes per-command cgroups: freezer (v1) or the v2 directory."""
        return self.dirs["freezer" if self.version == 1 else "unified"]

    @property
    def unique_dirs(self) -> list[Path]:
        return list(dict.fromkeys(self.dirs.values()))

    def to_meta(self) -> dict:
        return {"version": self.version, "dirs": {k: str(v) for k, v in self.dirs.items()}}

    @classmethod
    def from_meta(cls, meta: dict) -> SandboxCgroup:
        return cls(int(meta["version"]), meta["dirs"])

    def open_dirs(self) -> list[int]:
        """Directory fds for the agent: it joins each, and makes job cgroups in job_dir's.
        They reach the host's (writable) cgroupfs mount even from inside bubblewrap."""
        return [os.open(d, os.O_RDONLY | os.O_DIRECTORY) for d in self.unique_dirs]

    # -- kill
    def kill(self, timeout: float = 10.0) -> None:
        """SIGKILL every process of the sandbox, forks in flight included, and remove its
        cgroups. v2: cgroup.kill; v1: freeze, kill, then thaw every frozen cgroup below
        (a killed task in a frozen v1 cgroup stays in D state until thawed)."""
        deadline = time.monotonic() + timeout
        top = self.job_dir
        if not top.exists():
            self.remove()
            return
        if self.version == 2 and (top / "cgroup.kill").exists():
            _write(top / "cgroup.kill", "1")
        else:
            self._freeze(top, deadline)
            for directory in _tree(top):
                _kill_pids(_pids(directory))
        self._thaw_all(top)
        try:
            self._wait_empty(top, deadline)
        finally:
            self.remove(deadline)

    @contextlib.contextmanager
    def frozen(self, timeout: float = 5.0):
        """Hold every process of the sandbox still (a snapshot copies one moment's files)."""
        top = self.job_dir
        try:
            self._freeze(top, time.monotonic() + timeout)
            yield
        finally:
            self._thaw_all(top)

    def _freeze(self, top: Path, deadline: float) -> None:
        # no event says "frozen": poll, backing off (a tight 0.5 ms poll was ~2 CPU-ms a kill)
        if self.version == 1:
            _write(top / "freezer.state", "FROZEN")
            done = lambda: (_read(top / "freezer.state") or "").strip() != "FREEZING"
        else:
            _write(top / "cgroup.freeze", "1")
            done = lambda: _keyed(_read(top / "cgroup.events"), "frozen") != 0
        pause = 0.0002
        while not done() and time.monotonic() < deadline:
            time.sleep(pause)
            pause = min(pause * 2, 0.005)

    def _thaw_all(self, top: Path) -> None:
        name, value = ("freezer.state", "THAWED") if self.version == 1 else ("cgroup.freeze", "0")
        for directory in reversed(_tree(top)):  # top first, then the children it froze
            try:
                _write(directory / name, value)
            except OSError:
                pass

    def _wait_empty(self, top: Path, deadline: float) -> None:
        """Until no process is left below `top`: SIGKILL what is there and sleep on the
        processes' pidfds until they exited (a 1 ms poll of the tree was ~4 CPU-ms a kill:
        a killed interpreter takes a few ms to release its memory)."""
        while True:
            left = [p for d in _tree(top) for p in _pids(d)]
            if not left:
                return
            if time.monotonic() > deadline:
                raise CgroupError(f"processes {left[:10]} of {top} survived SIGKILL")
            _kill_pids(left)
            _wait_exited(left, min(deadline, time.monotonic() + 0.5))

    def remove(self, deadline: float | None = None) -> None:
        deadline = deadline if deadline is not None else time.monotonic() + 5
        errors = []
        for directory in self.unique_dirs:
            try:
                _rmdir_tree(directory, deadline)
            except CgroupError as e:
                errors.append(str(e))
        if errors:
            raise CgroupError("; ".join(errors))

    # -- accounting
    def usage(self) -> dict:
        """CPU seconds and memory of the whole sandbox so far (None: not accounted here)."""
        d = self.dirs
        cpu = peak = current = pids = ooms = None
        if self.version == 1:
            if "cpuacct" in d:
                ns = _int(_read(d["cpuacct"] / "cpuacct.usage"))
                cpu = ns / 1e9 if ns is not None else None
            if "memory" in d:
                peak = _int(_read(d["memory"] / "memory.max_usage_in_bytes"))
                current = _int(_read(d["memory"] / "memory.usage_in_bytes"))
                ooms = _keyed(_read(d["memory"] / "memory.oom_control"), "oom_kill")
            if "pids" in d:
                pids = _int(_read(d["pids"] / "pids.current"))
        else:
            u = d["unified"]
            usec = _keyed(_read(u / "cpu.stat"), "usage_usec")
            cpu = usec / 1e6 if usec is not None else None
            peak = _int(_read(u / "memory.peak"))
            current = _int(_read(u / "memory.current"))
            ooms = _keyed(_read(u / "memory.events"), "oom_kill")
            pids = _int(_read(u / "pids.current"))
        return {"cpu_seconds": cpu, "memory_peak_bytes": peak, "memory_bytes": current, "pids": pids,
                "oom_kills": ooms}

    def limits(self) -> dict:
        """The limits as the kernel holds them (None: unlimited or not available)."""
        d = self.dirs
        if self.version == 1:
            pids = _int(_read(d["pids"] / "pids.max")) if "pids" in d else None
            memory = _int(_read(d["memory"] / "memory.limit_in_bytes")) if "memory" in d else None
            if memory is not None and memory >= 2**62:
                memory = None  # v1 writes "unlimited" as a huge page-aligned number
            cpu = None
            if "cpu" in d:
                quota = _read(d["cpu"] / "cpu.cfs_quota_us")
                period = _int(_read(d["cpu"] / "cpu.cfs_period_us"))
                if quota and quota.strip() != "-1" and period:
                    cpu = int(quota) / period
        else:
            u = d["unified"]
            pids = _int(_read(u / "pids.max"))
            memory = _int(_read(u / "memory.max"))
            cpu = None
            quota, _, period = (_read(u / "cpu.max") or "max").strip().partition(" ")
            if quota != "max" and period.isdigit():
                cpu = int(quota) / int(period)
        return {"pids": pids, "memory_bytes": memory, "cpu": cpu}


# --------------------------------------------------------------------------- a process's cgroup, read on the host


def process_memory_peak(pid: int | None, within: str) -> int | None:
    """Peak memory of the cgroup process `pid` is in, read on this host (a container's init process:
    engine_stats.py), when that cgroup's path holds `within` (the container id: never a guess at
    another cgroup); None where it cannot be read (another pid namespace, no such file)."""
    if not pid:
        return None
    try:
        own, mounts = _own_paths(f"/proc/{pid}/cgroup"), _mounts()
    except (OSError, ValueError):
        return None
    for fstype, mount, root, opts in mounts:
        if root != "/":  # a mount of part of a hierarchy: the process's path is not below it
            continue
        if fstype == "cgroup" and "memory" in opts:
            where, name = own.get("memory"), "memory.max_usage_in_bytes"
        elif fstype == "cgroup2":
            where, name = own.get(""), "memory.peak"
        else:
            continue
        if not where or within not in where:  # not this container's own cgroup: do not guess
            continue
        peak = _int(_read(Path(mount) / where.lstrip("/") / name))
        if peak:
            return peak
    return None
