"""A newer CPython than the host's, for harnesses that need one (OpenHands wants >= 3.12; the
host and the task images run Debian bookworm's 3.11): Debian's own build, taken from a
`debootstrap --variant=minbase` of the suite that ships it (trixie: python3.13), the way the
project builds its bookworm images, and made portable:

    <runtime>/bin/python3.13       a sh launcher: runs the interpreter with its own loader
    <runtime>/libexec/python3.13   Debian's binary
    <runtime>/lib/                 the suite's ld.so, libc and every other shared library of
                                   the minbase (libssl, libffi, libstdc++ for wheels, ...)
    <runtime>/lib/python3.13/      the standard library

The launcher runs `ld-linux-x86-64.so.2 --library-path <runtime>/lib --argv0 "$0" ...`, so
the interpreter and the extension modules it loads use the suite's glibc whatever the host or
the sandbox has (a bookworm image, busybox), while the commands it starts (bash, git, the
task's tests) are the sandbox's own, with the sandbox's libraries. `--argv0` keeps the
name it was started by, so a venv's `bin/python` link still finds its `pyvenv.cfg`.

`ensure_portable_venv` builds a harness's venv on such an interpreter with the runtime
*inside* the venv (`<venv>/runtime`): local sandboxes see it read-only in the cache, and the
venv archive shipped into docker/kubernetes sandboxes carries its interpreter along
(`ShippedVenv` relinks to `<venv>/runtime/bin/pythonX.Y` first).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from .install import HarnessInstallError

# the Debian suite whose python3 is X.Y
SUITES = {"3.13": "trixie"}
MIRROR = os.environ.get("DEBIAN_MIRROR", "http://deb.debian.org/debian")
ARCH_LIBS = "usr/lib/x86_64-linux-gnu"
LOADER = "ld-linux-x86-64.so.2"

LAUNCHER = """#!/bin/sh
# Debian {suite}'s python{python} with its own loader and libraries (see orchard_gym/wrappers/harness/python.py)
d=$(dirname "$(dirname "$(readlink -f "$0")")")
exec "$d/lib/{loader}" --library-path "$d/lib" --argv0 "$0" "$d/libexec/python{python}" "$@"
"""


def _suite(python: str) -> str:
    if python not in SUITES:
        raise HarnessInstallError(f"no Debian suite known to ship python{python} (known: {sorted(SUITES)})")
    return SUITES[python]


def _locked_build(target: Path, build, what: str) -> Path:
    """`build(target)` once, under a lock, in place (a venv is not relocatable), marked ready
    only when complete, so a broken build is redone rather than reused."""
    if (target / ".ready").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent installs wait for one build
        if (target / ".ready").exists():
            return target
        shutil.rmtree(target, ignore_errors=True)
        try:
            build(target)
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            raise
        (target / ".ready").write_text(what)
    return target


def debian_rootfs(python: str, root: Path, timeout: float = 1800.0) -> Path:
    """A minbase rootfs of the suite with pythonX.Y, as a cached tarball (the slow part: ~1-4 min)."""
    suite = _suite(python)
    tarball = root / f"{suite}-minbase-python{python}.tar"
    if tarball.exists():
        return tarball
    debootstrap = shutil.which("debootstrap") or ("/usr/sbin/debootstrap" if os.path.exists("/usr/sbin/debootstrap")
                                                  else None)
    if debootstrap is None:
        raise HarnessInstallError("debootstrap is not installed (Debian: apt-get install debootstrap; "
                                  "scripts/setup_system.sh does it)")
    if os.geteuid() != 0:
        raise HarnessInstallError(f"building python{python} from Debian {suite} runs debootstrap, which needs root "
                                  "(sudo bash scripts/install_harnesses.sh openhands)")
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=f".{suite}-") as work:
        rootfs = Path(work) / "rootfs"
        try:
            r = subprocess.run([debootstrap, "--variant=minbase", f"--include=python{python}", suite, str(rootfs),
                                MIRROR], capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise HarnessInstallError(f"debootstrap {suite} took over {timeout:g}s") from None
        if r.returncode != 0:
            raise HarnessInstallError(f"debootstrap {suite} from {MIRROR} failed: {(r.stdout + r.stderr)[-2000:]}")
        partial = tarball.with_suffix(".partial")
        subprocess.run(["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(partial),
                        f"./usr/bin/python{python}", f"./usr/lib/python{python}", f"./{ARCH_LIBS}"], check=True)
        partial.rename(tarball)
    return tarball


def build_runtime(python: str, rootfs_tar: Path, target: Path) -> None:
    """The portable layout (module docstring) at `target`, from the rootfs tarball."""
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".runtime-") as work:
        subprocess.run(["tar", "-C", work, "-xf", str(rootfs_tar)], check=True)
        (target / "bin").mkdir(parents=True)
        (target / "libexec").mkdir()
        lib = target / "lib"
        shutil.copytree(Path(work) / f"usr/lib/python{python}", lib / f"python{python}", symlinks=True)
        for entry in (Path(work) / ARCH_LIBS).iterdir():  # the shared libraries, not the subfolders
            if ".so" in entry.name and (entry.is_symlink() or entry.is_file()):
                shutil.copy2(entry, lib / entry.name, follow_symlinks=False)
        shutil.copy2(Path(work) / f"usr/bin/python{python}", target / "libexec" / f"python{python}")
    launcher = target / "bin" / f"python{python}"
    launcher.write_text(LAUNCHER.format(suite=_suite(python), python=python, loader=LOADER))
    launcher.chmod(0o755)
    for alias in ("python3", "python"):
        (target / "bin" / alias).symlink_to(launcher.name)
    r = subprocess.run([str(launcher), "-I", "-c", "import sys, ssl, ctypes; print('%d.%d' % sys.version_info[:2])"],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0 or r.stdout.strip() != python:
        raise HarnessInstallError(f"the portable python{python} does not run: {(r.stdout + r.stderr)[-2000:]}")


def ensure_portable_venv(requirements: list[str], python: str, root: Path | None = None,
                         timeout: float = 1800.0) -> Path:
    """A venv with `requirements` on Debian's pythonX.Y, its runtime inside (`<venv>/runtime`),
    built once (cached, under a lock), keyed by the version and the requirements."""
    from orchard_gym.cache import cache_root

    base = cache_root() / "harness"

    def build(venv: Path) -> None:
        venv.mkdir(parents=True)
        build_runtime(python, debian_rootfs(python, base / "python", timeout), venv / "runtime")
        subprocess.run([str(venv / "runtime" / "bin" / f"python{python}"), "-m", "venv", "--without-pip", str(venv)],
                       check=True, capture_output=True)
        if requirements:  # installed by the host's uv (or pip) into the venv's interpreter
            from orchard_gym.pip_install import pip_install

            try:
                r = pip_install(str(venv / "bin" / "python"), requirements, timeout=timeout)
            except subprocess.TimeoutExpired:
                raise HarnessInstallError(f"pip install {' '.join(requirements)} took over {timeout:g}s") from None
            if r.returncode != 0:
                raise HarnessInstallError(f"pip install {' '.join(requirements)} on python{python} failed: "
                                          f"{r.stderr[-2000:]}")

    return _locked_build(venv_path(requirements, python, root), build, "\n".join(requirements))


def venv_path(requirements: list[str], python: str, root: Path | None = None) -> Path:
    """Where `ensure_portable_venv(requirements, python, root)` builds (or has built) its venv."""
    from orchard_gym.cache import cache_root

    root = root or cache_root() / "harness" / "venvs"
    key = hashlib.sha256("\n".join([f"debian-python{python}", *sorted(requirements)]).encode()).hexdigest()[:16]
    return root / key
