"""File routes' work: listing a folder, writing and opening regular files, applying a patch."""

from __future__ import annotations

import os
import shutil
import stat

from common import BadRequest
from jobs import Runner

def list_dir(path: str) -> dict:
    if not os.path.isdir(path):
        raise BadRequest(f"not a directory: {path}", 404)
    files = []
    with os.scandir(path) as it:
        for entry in sorted(it, key=lambda e: e.name):
            try:
                st = entry.stat(follow_symlinks=False)
                is_dir = entry.is_dir(follow_symlinks=True)
            except OSError:
                continue
            files.append(
                {
                    "name": entry.name,
                    "type": "directory" if is_dir else ("symlink" if entry.is_symlink() else "file"),
                    "size": st.st_size,
                    "modified": st.st_mtime,
                }
            )
    return {"path": path, "files": files}


def write_file(path: str, data, mode: int | None) -> dict:
    """Write bytes, or the chunks an iterable yields, to a temp file renamed over `path` at
    the end (atomic: a reader never sees half a file). Any failure, including a client
    that hangs up mid-body, removes the temp file."""
    if os.path.isdir(path):
        raise BadRequest(f"is a directory: {path}", 409)
    parent = os.path.dirname(path) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = f"{path}.orchard-{os.urandom(4).hex()}"
    size = 0
    try:
        with open(tmp, "wb") as f:
            for chunk in [data] if isinstance(data, (bytes, bytearray)) else data:
                f.write(chunk)
                size += len(chunk)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return {"success": True, "path": path, "size": size}


def open_regular(path: str, max_size: int) -> tuple[int, int]:
    """Open a regular file for reading: (fd, size). FIFOs, devices, sockets and directories
    are refused before anything is opened (opening a FIFO would block, /dev/zero never ends)."""
    st = os.stat(path)
    if stat.S_ISDIR(st.st_mode):
        raise BadRequest(f"is a directory: {path}", 409)
    if not stat.S_ISREG(st.st_mode):
        raise BadRequest(f"not a regular file ({_file_kind(st.st_mode)}): {path}; use exec to read it", 422)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # NONBLOCK: swapped for a FIFO meanwhile
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BadRequest(f"not a regular file ({_file_kind(st.st_mode)}): {path}", 422)
        if st.st_size > max_size:
            raise BadRequest(f"file too large: {path} has {st.st_size} bytes, the limit is {max_size} "
                             f"(agent --max-file-size); read it in parts with exec", 413)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


def _file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def apply_patch(runner: Runner, patch: str, cwd: str | None, timeout: float) -> dict:
    cwd = cwd or runner.default_cwd
    if not patch.strip():
        raise BadRequest("patch is empty", 422)
    if shutil.which("git"):
        argv = ["git", "apply", "--verbose", "--whitespace=nowarn", "-"]
        if not os.path.isdir(os.path.join(cwd, ".git")):
            argv.insert(2, "--unsafe-paths")
    elif shutil.which("patch"):
        argv = ["patch", "-p1", "--forward", "--batch"]
        if os.path.basename(os.path.realpath(shutil.which("patch"))) == "busybox":
            argv = ["patch", "-p1", "-N"]  # BusyBox knows no --batch (and never prompts)
    else:
        raise BadRequest("neither git nor patch is available in this sandbox", 501)
    res = runner.run({"command": argv, "cwd": cwd, "timeout": timeout, "stdin": patch})
    return {
        "success": res["exit_code"] == 0,
        "stdout": res["stdout"],
        "stderr": res["stderr"],
        "exit_code": res["exit_code"],
    }


# --------------------------------------------------------------------------- http

