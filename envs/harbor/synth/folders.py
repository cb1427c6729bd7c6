"""Task folders as the store keeps them (gzip tars), unpacked and checked as `orchard tasks check` does."""

from __future__ import annotations

import io
import re
import shutil
import tarfile
import tempfile
from pathlib import Path

from ..tasks import load_tasks
from ..verifier import tar_folder

MAX_FOLDER_BYTES = 4 * 2**20  # a synthesized task is scripts and mock data: anything bigger is a runaway build


def pack(folder: Path) -> bytes:
    return tar_folder(folder)


def unpack(blob: bytes, dest: Path) -> Path:
    """The folder `blob` holds, written to `dest` (emptied first); members that leave it are refused."""
    if len(blob) > MAX_FOLDER_BYTES:
        raise ValueError(f"the task folder is {len(blob)} bytes packed (at most {MAX_FOLDER_BYTES})")
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    try:
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
            tar.extractall(dest, filter="data")  # no links out, no absolute paths, no devices
    except (tarfile.TarError, OSError, EOFError) as e:
        raise ValueError(f"the task folder's archive cannot be unpacked: {e}") from None
    return dest


def check(blob: bytes) -> list[str]:
    """What stops the folder from running (as `orchard tasks check` reports it); [] when it runs."""
    with tempfile.TemporaryDirectory(prefix="og-synth-check-") as tmp:
        try:
            folder = unpack(blob, Path(tmp) / "task")
        except ValueError as e:
            return [str(e)]
        if not (folder / "task.toml").is_file():
            return ["there is no task.toml at the top of the folder"]
        missing = [p for p in ("environment/Dockerfile", "solution/solve.sh") if not (folder / p).is_file()]
        tasks, problems = load_tasks(str(folder))
        errors = [p.message for p in problems if p.severity == "error"]
        return [f"{p} is missing" for p in missing] + errors + ([] if tasks or errors else ["it does not load"])


def slug(instruction: str, task_id: int) -> str:
    """A folder name: the id, then the instruction's first words."""
    words = re.findall(r"[a-z0-9]+", instruction.lower())[:6]
    return f"t{task_id:04d}-" + "-".join(words or ["task"])
