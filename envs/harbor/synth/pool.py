"""The assets and reference pool: a folder of skills, example tasks, documents and data the
proposers ground their instructions in (and the builders copy mock data from)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

FILE_CHARS, TOTAL_CHARS = 4_000, 40_000  # what of the pool a proposer's prompt shows
MAX_POOL_BYTES = 50 * 2**20


@dataclass
class Pool:
    root: Path
    files: list[Path]

    def digest(self) -> str:
        """The pool as a proposer reads it: each text file (clipped), each other file by name."""
        parts, used = [], 0
        for path in self.files:
            rel = path.relative_to(self.root)
            try:
                text = path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                parts.append(f"--- {rel} (binary, {path.stat().st_size} bytes)")
                continue
            room = min(FILE_CHARS, TOTAL_CHARS - used)
            if room <= 0:
                parts.append(f"--- {rel} ({len(text)} characters, not shown)")
                continue
            shown = text[:room] + ("\n[... cut ...]" if len(text) > room else "")
            used += len(shown)
            parts.append(f"--- {rel}\n{shown}")
        return "\n".join(parts)


def load_pool(path: str | Path) -> Pool:
    """The pool at `path`, or a ValueError that says what is wrong with it."""
    root = Path(path)
    if not root.exists():
        raise ValueError(f"the assets pool {str(path)!r} does not exist")
    if not root.is_dir():
        raise ValueError(f"the assets pool {str(path)!r} is not a folder (a folder of skills, example tasks, "
                         f"documents, data)")
    files = sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())
    if not files:
        raise ValueError(f"the assets pool {str(path)!r} holds no files")
    size = sum(p.stat().st_size for p in files)
    if size > MAX_POOL_BYTES:
        raise ValueError(f"the assets pool {str(path)!r} is {size} bytes (at most {MAX_POOL_BYTES}: it is copied "
                         f"into every builder's sandbox)")
    return Pool(root=root, files=files)
