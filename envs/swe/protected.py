"""Which paths of a submitted patch are put back to base before the tests run.

A policy is asked to change *source* files. Anything else it changes could change how
the tests run rather than what they test, so the grader drops it from the submission
(new files are removed, changed or deleted ones restored from the base commit):

- test files: the task's `test_files`, anything under a `test`/`tests`/`testing`/`e2e`
  folder, `test_*.py`, `*_test.py`, `tests.py` (SWE-bench itself routes such paths to
  the test patch, so a gold patch never touches them);
- `conftest.py` anywhere (pytest loads it as a plugin);
- `sitecustomize.py`, `usercustomize.py`, `*.pth` (run at interpreter start-up);
- runner configuration: `pytest.ini`, `.pytest.ini`, `pytest.toml`, `.pytest.toml`,
  `tox.ini`, `setup.cfg`, `pyproject.toml`, `noxfile.py`, `.pytest_cache/`;
- bytecode: `*.pyc`, `*.pyo`, `__pycache__/` (a stale or unchecked .pyc replaces its source);
- git attributes (`.gitattributes`: checkout filters and encodings of restored files);
- a new top-level module or package in the repository root or a `PYTHONPATH` folder of
  the task (`pytest.py`, `_pytest/`, `pluggy.py` ...): `python -m pytest` imports from
  there first, so it would shadow the test runner or its dependencies.
"""

from __future__ import annotations

import fnmatch
import functools
import tarfile
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

TEST_DIRS = {"test", "tests", "testing", "e2e"}
TEST_FILE_GLOBS = ("test_*.py", "*_test.py", "tests.py")
STARTUP_FILES = {"sitecustomize.py", "usercustomize.py"}
RUNNER_CONFIGS = {"pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", "tox.ini", "setup.cfg",
                  "pyproject.toml", "noxfile.py"}
CACHE_DIRS = {"__pycache__", ".pytest_cache"}
BYTECODE_GLOBS = ("*.pyc", "*.pyo")
IMPORTABLE_SUFFIXES = (".py", ".pyc", ".pyo", ".so", ".pyd")


def import_roots(env: dict[str, str]) -> list[str]:
    """Folders (relative to the repository root, "" for the root itself) that Python
    searches for top-level modules when the task's tests run."""
    roots = [""]
    for entry in env.get("PYTHONPATH", "").split(":"):
        entry = entry.strip().strip("/")
        if entry in ("", "."):
            continue
        if not entry.startswith("..") and not PurePosixPath(entry).is_absolute():
            roots.append(entry)
    return roots


@functools.lru_cache(maxsize=64)
def _archive_names(archive: str, mtime: float) -> frozenset[str]:
    with tarfile.open(archive) as tar:
        return frozenset(PurePosixPath(m.name).as_posix().removeprefix("./") for m in tar.getmembers())


def base_names(archive: Path | None) -> frozenset[str]:
    """Every path (files and folders) in the task's base tree, read on the host from its archive."""
    if archive is None:
        return frozenset()
    names = _archive_names(str(archive), archive.stat().st_mtime)
    folders = {str(p) for name in names for p in PurePosixPath(name).parents if str(p) != "."}
    return names | folders


class ProtectedPaths:
    """The rules above for one task."""

    def __init__(self, test_files: Iterable[str], env: dict[str, str], base: frozenset[str]):
        self.test_files = {PurePosixPath(f).as_posix() for f in test_files}
        self.roots = import_roots(env)
        self.base = base

    def reason(self, path: str) -> str | None:
        """Why `path` (relative to the repository root) must not come from the submission, or None."""
        p = PurePosixPath(path)
        parts, name = p.parts, p.name
        if p.as_posix() in self.test_files:
            return "test file of the task"
        if name == "conftest.py":
            return "conftest.py"
        if any(part in CACHE_DIRS for part in parts) or any(fnmatch.fnmatch(name, g) for g in BYTECODE_GLOBS):
            return "bytecode or cache"
        if name in STARTUP_FILES or name.endswith(".pth"):
            return "runs at interpreter start-up"
        if name in RUNNER_CONFIGS:
            return "test runner configuration"
        if name == ".gitattributes":
            return "git attributes"
        if any(part in TEST_DIRS for part in parts[:-1]) or name in TEST_DIRS \
                or any(fnmatch.fnmatch(name, g) for g in TEST_FILE_GLOBS):
            return "test file"
        top = self._new_top_level(p)
        if top is not None:
            return f"new top-level module {top!r} would shadow an import"
        return None

    def _new_top_level(self, p: PurePosixPath) -> str | None:
        for root in self.roots:
            rel = p.relative_to(root) if root and p.is_relative_to(root) else (p if not root else None)
            if rel is None or not rel.parts:
                continue
            top = rel.parts[0]
            importable = rel.name.endswith(IMPORTABLE_SUFFIXES)
            top_path = f"{root}/{top}" if root else top
            if importable and top_path not in self.base:
                return top_path
        return None
