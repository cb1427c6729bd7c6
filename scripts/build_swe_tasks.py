#!/usr/bin/env python3
"""Build the built-in SWE task set from real bug fixes in released PyPI sdists.

Each spec (scripts/swe_task_specs.json) names a small pure-Python library and two
consecutive releases whose sdists carry their tests, where the second release fixed
a bug and added a regression test. For each spec this script:

1. downloads both sdists with pip (cached) and unpacks them;
2. computes the gold patch (the chosen source files) and the test patch (the chosen
   test files) as git-style diffs applicable with ``git apply`` in the old tree;
   per-file filters cut unrelated churn (version bumps, docstrings, other fixes);
3. packs the old release's tree (docs and build debris dropped) as
   ``<instance_id>.tar.gz``, files at the archive root (``tar xzf X -C repo``);
4. verifies from that archive, in a venv holding the task's pinned ``install``
   requirements: (c) old tree alone, (a) old + test patch, (b) old + test patch +
   gold patch (run twice). FAIL_TO_PASS = tests passing in (b) but not in (a);
   PASS_TO_PASS = tests passing in both. It refuses the task unless FAIL_TO_PASS is
   non-empty, no test passing in (a) fails in (b), both (b) runs grade as resolved
   and (a) as not, and no FAIL_TO_PASS test passes in (c) unless the test patch
   rewrites that test (a regression assertion added to an existing test). Grading
   is envs/swe/grading.py, the same function the env uses;
5. writes ``<out>/<set>/tasks.jsonl`` (one SWE-bench-style instance per line) and
   the archives next to it.

Usage:
    python scripts/build_swe_tasks.py                       # all specs
    python scripts/build_swe_tasks.py --only parse-1.20.1   # one (others kept)

Spec fields: instance_id, pypi, repo, old, new, created_at, problem_statement,
source / tests ({path: filter}), install, optional env, test_cmd, exclude.
A filter is {} (whole file diff) or has any of:
    "keep": [regex]   keep only change blocks (runs of consecutive changed lines)
                      whose old or new text matches one of these
    "drop": [regex]   drop change blocks matching one of these
    "drop_ranges": [[start, end]]  drop added lines from the first line matching
                      `start` to the next matching `end` (inclusive), plus the blank
                      lines right after: cuts one test out of a block of new tests.
Every regex must match something, so a stale filter fails loudly.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import fnmatch
import gzip
import hashlib
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("ORCHARD_SWE_BUILD_CACHE", "~/.cache/orchard-gym/swe-build")).expanduser()
# Dropped from the archived old tree: not needed to edit or test the code, and the
# task set ships inside the wheel, so every kilobyte counts.
DEFAULT_EXCLUDE = [
    "docs", "doc", "changelog.d", ".idea", ".github", ".git", "__pycache__", "*.pyc",
    "*.egg-info", "artwork", "fuzz", "*.inv", "*.png", "*.jpg", "*.gif",
]
TEST_TIMEOUT_S = 900


def log(msg: str) -> None:
    print(msg, flush=True)


def load_grading():
    """envs/swe/grading.py by path: the env's own grading, without installing the package."""
    spec = importlib.util.spec_from_file_location("orchard_swe_grading", ROOT / "envs/swe/grading.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class BuildError(Exception):
    pass


# --------------------------------------------------------------------------- sdists


def fetch_sdist(name: str, version: str) -> Path:
    dest = CACHE / "sdists" / f"{name}-{version}"
    found = [p for p in dest.glob("*") if p.suffix in (".gz", ".zip", ".bz2")] if dest.exists() else []
    if not found:
        dest.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
               "--no-binary", ":all:", "--disable-pip-version-check", "-d", str(dest), f"{name}=={version}"]
        res = subprocess.run(cmd, capture_output=True, text=True)
        found = [p for p in dest.glob("*") if p.suffix in (".gz", ".zip", ".bz2")]
        if res.returncode != 0 or len(found) != 1:
            raise BuildError(f"pip download {name}=={version} failed:\n{res.stderr[-2000:]}")
    return found[0]


def unpack(archive: Path, into: Path) -> Path:
    """Unpack an sdist; return its single top-level folder."""
    into.mkdir(parents=True)
    if archive.suffix == ".zip":
        with zipfile.ZipFile(archive) as z:
            z.extractall(into)
    else:
        with tarfile.open(archive) as t:
            t.extractall(into, filter="data")
    (top,) = [p for p in into.iterdir()]
    return top


# --------------------------------------------------------------------------- patches


def _matches(regexes, text):
    return [r for r in regexes if re.search(r, text, re.M)]


def filter_changes(rel: str, old: str, new: str, filt: dict) -> str:
    """Return `new` with the filtered-out changes reverted to `old`."""
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    keep, drop = filt.get("keep", []), filt.get("drop", [])
    used: set[str] = set()
    dropped_new: set[int] = set()
    for start, end in filt.get("drop_ranges", []):
        s = next((j for j, line in enumerate(b) if re.search(start, line)), None)
        e = next((j for j in range(s, len(b)) if re.search(end, b[j])), None) if s is not None else None
        if e is None:
            raise BuildError(f"{rel}: drop_ranges {start!r}..{end!r} not found")
        e += 1
        while e < len(b) and not b[e].strip():
            e += 1
        dropped_new.update(range(s, e))
        used.update((start, end))
    out: list[str] = []
    # autojunk off: its popularity heuristic can shred diffs of long files.
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            out += a[i1:i2]
            continue
        text = "".join(a[i1:i2] + b[j1:j2])
        hit_keep, hit_drop = _matches(keep, text), _matches(drop, text)
        used.update(hit_keep, hit_drop)
        if (keep and not hit_keep) or hit_drop:
            out += a[i1:i2]
        else:
            out += [b[j] for j in range(j1, j2) if j not in dropped_new]
    unused = [r for r in keep + drop if r not in used]
    if unused:
        raise BuildError(f"{rel}: filter regexes matched no change: {unused}")
    return "".join(out)


def _read(path: Path) -> str | None:
    return path.read_bytes().decode("utf-8") if path.exists() else None


def file_patch(rel: str, old_root: Path, new_root: Path, filt: dict) -> str:
    old, new = _read(old_root / rel), _read(new_root / rel)
    if old is None and new is None:
        raise BuildError(f"{rel}: in neither release")
    if filt and new is not None:
        new = filter_changes(rel, old or "", new, filt)
    if old == new:
        raise BuildError(f"{rel}: no change between the releases (after filters)")
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for side, text in (("a", old), ("b", new)):
            if text is None:
                paths.append("/dev/null")
                continue
            p = Path(tmp, side, rel)
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(text.encode("utf-8"))
            paths.append(f"{side}/{rel}")
        res = subprocess.run(["git", "diff", "--no-index", "--no-color", "--no-prefix", "-U3", "--", *paths],
                             cwd=tmp, capture_output=True, text=True)
    if res.returncode not in (0, 1) or "Binary files" in res.stdout:
        raise BuildError(f"{rel}: git diff failed: {res.stderr or res.stdout[:500]}")
    lines = res.stdout.splitlines(keepends=True)
    # git names a one-sided diff after the side that exists; put the repo path on both.
    lines[0] = f"diff --git a/{rel} b/{rel}\n"
    return "".join(line for line in lines if not line.startswith("index "))


def make_patch(files: dict, old_root: Path, new_root: Path) -> str:
    return "".join(file_patch(rel, old_root, new_root, filt or {}) for rel, filt in files.items())


# --------------------------------------------------------------------------- archive


def pack_tree(root: Path, exclude: list[str]) -> bytes:
    """Reproducible tar.gz of `root`'s contents (paths relative to root, no top folder)."""
    def skipped(rel: Path) -> bool:
        return any(fnmatch.fnmatch(part, pat) for part in rel.parts for pat in exclude)

    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=9, mtime=0) as gz:
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for path in sorted(root.rglob("*")):
                rel = path.relative_to(root)
                if skipped(rel) or path.is_dir() or path.is_symlink():
                    continue
                info = tar.gettarinfo(str(path), arcname=rel.as_posix())
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mode = 0o755 if path.stat().st_mode & 0o111 else 0o644
                with open(path, "rb") as f:
                    tar.addfile(info, f)
    return buf.getvalue()


def extract(archive: bytes, into: Path) -> Path:
    into.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as t:
        t.extractall(into, filter="data")
    return into


# --------------------------------------------------------------------------- running tests


def ensure_venv(task: dict) -> Path:
    """A venv with the task's pinned requirements, cached per library+version+requirements."""
    want = task["python"]
    have = f"{sys.version_info.major}.{sys.version_info.minor}"
    if have != want:
        raise BuildError(f"task wants Python {want}; run this script with Python {want} (have {have})")
    digest = hashlib.sha256(json.dumps(task["install"]).encode()).hexdigest()[:8]
    venv = CACHE / "venvs" / f"{task['pypi']['name']}-{task['version']}-py{want}-{digest}"
    if not (venv / ".ok").exists():
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        res = subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "--quiet",
                              "--disable-pip-version-check", *task["install"]], capture_output=True, text=True)
        if res.returncode != 0:
            raise BuildError(f"installing {task['install']} failed:\n{res.stderr[-2000:]}")
        (venv / ".ok").touch()
    return venv


def git_apply(repo: Path, patch: str, what: str) -> None:
    # Ceiling: never let git discover an enclosing repository and patch relative to it.
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(repo.parent)}
    res = subprocess.run(["git", "apply", "-v", "-"], cwd=repo, input=patch, text=True,
                         capture_output=True, env=env)
    if res.returncode != 0:
        raise BuildError(f"{what} does not apply: {res.stderr.strip()}")


def run_tests(repo: Path, task: dict, venv: Path) -> tuple[str, int]:
    env = {
        "PATH": f"{venv / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "VIRTUAL_ENV": str(venv),
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        **task["env"],
    }
    res = subprocess.run(["bash", "-c", task["test_cmd"]], cwd=repo, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, errors="replace", timeout=TEST_TIMEOUT_S)
    return res.stdout, res.returncode


def ambiguous_ids(output: str, grading, task: dict) -> set[str]:
    """Test ids the log parser reports on more than one line of `output`."""
    counts = Counter(k for line in output.splitlines() for k in grading.parse_test_output(line, task))
    return {k for k, n in counts.items() if n > 1}


def touched_lines(patch: str) -> dict[str, set[int]]:
    """File -> line numbers (in the patched file) that the patch adds or deletes at."""
    from unidiff import PatchSet  # grading's dependency too (swebench needs it)

    touched: dict[str, set[int]] = {}
    for pf in PatchSet(patch):
        lines = touched.setdefault(pf.path, set())
        for hunk in pf:
            nxt = hunk.target_start  # a deletion marks the line that now follows it
            for line in hunk:
                if line.is_removed:
                    lines.add(nxt)
                elif line.target_line_no:
                    if line.is_added:
                        lines.add(line.target_line_no)
                    nxt = line.target_line_no + 1
    return touched


def rewritten_by(test_id: str, test_patch: str, repo: Path) -> bool:
    """Does the test patch change the body or decorators of this pytest node id?"""
    path, *names = test_id.split("::")
    names[-1:] = [re.sub(r"\[.*$", "", names[-1])] if names else []
    try:
        body = ast.parse((repo / path).read_text()).body
    except (OSError, SyntaxError):
        return False
    node = None
    for name in names:
        node = next((n for n in body if getattr(n, "name", None) == name), None)
        if node is None:
            return False
        body = getattr(node, "body", [])
    if node is None:
        return False
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return bool(touched_lines(test_patch).get(path, set()) & set(range(start, node.end_lineno + 1)))


# --------------------------------------------------------------------------- one task


REQUIRED = ("instance_id", "pypi", "repo", "old", "new", "created_at", "source", "tests",
            "install", "problem_statement")


def make_task(spec: dict) -> dict:
    missing = [k for k in REQUIRED if not spec.get(k)]
    if missing:
        raise BuildError(f"spec {spec.get('instance_id', '?')} lacks {missing}")
    tests = list(spec["tests"])
    py_tests = [t for t in tests if t.endswith(".py")]
    return {
        "instance_id": spec["instance_id"],
        "repo": spec["repo"],
        "version": spec["old"],
        "base_commit": None,
        "source_archive": f"{spec['instance_id']}.tar.gz",
        "problem_statement": spec["problem_statement"].strip() + "\n",
        "hints_text": "",
        "patch": "",
        "test_patch": "",
        "FAIL_TO_PASS": [],
        "PASS_TO_PASS": [],
        "image": f"localhost/orchard/swe-{spec['pypi'].lower()}:{spec['old']}",
        "test_cmd": spec.get("test_cmd") or "python -m pytest -rA -p no:cacheprovider " + " ".join(py_tests),
        "test_files": tests,
        "env": spec.get("env", {}),
        "install": spec["install"],
        "python": spec.get("python", "3.11"),
        "created_at": spec["created_at"],
        "log_parser": "parse_log_pytest",
        "eval_type": "pass_and_fail",
        "pypi": {"name": spec["pypi"], "old": spec["old"], "new": spec["new"]},
    }


def build_one(spec: dict, grading, work: Path) -> tuple[dict, bytes]:
    task = make_task(spec)
    iid = task["instance_id"]
    old_root = unpack(fetch_sdist(spec["pypi"], spec["old"]), work / "old")
    new_root = unpack(fetch_sdist(spec["pypi"], spec["new"]), work / "new")
    task["patch"] = make_patch(spec["source"], old_root, new_root)
    task["test_patch"] = make_patch(spec["tests"], old_root, new_root)
    archive = pack_tree(old_root, DEFAULT_EXCLUDE + spec.get("exclude", []))
    log(f"  patch {len(task['patch'].splitlines())} lines, test patch {len(task['test_patch'].splitlines())} "
        f"lines, archive {len(archive) / 1024:.0f} KiB")
    venv = ensure_venv(task)

    def run(name: str, patches: list[tuple[str, str]]) -> tuple[str, dict[str, str]]:
        repo = extract(archive, work / name / "repo")
        for what, patch in patches:
            git_apply(repo, patch, what)
        out, rc = run_tests(repo, task, venv)
        (work / f"{name}.log").write_text(out)
        status = grading.parse_test_output(out, task)
        log(f"  [{name}] exit {rc}, {sum(s == 'PASSED' for s in status.values())} passed / "
            f"{len(status)} reported")
        return out, status

    test_p, gold_p = ("test patch", task["test_patch"]), ("gold patch", task["patch"])
    _, plain = run("old", [])
    out_before, before = run("old+tests", [test_p])
    out_after, after = run("old+tests+gold", [test_p, gold_p])
    out_again, _ = run("old+tests+gold-again", [test_p, gold_p])

    def ok(status: str | None) -> bool:
        return status in ("PASSED", "XFAIL")

    # parse_log_pytest cuts ids at the first space, so parametrized tests whose ids
    # hold spaces can share one key whose status is whichever came last: leave those
    # out rather than grade on an arbitrary one of them.
    ambiguous = ambiguous_ids(out_before, grading, task) | ambiguous_ids(out_after, grading, task)
    task["FAIL_TO_PASS"] = sorted(t for t, s in after.items() if ok(s) and not ok(before.get(t)))
    task["PASS_TO_PASS"] = sorted(t for t, s in after.items()
                                  if ok(s) and ok(before.get(t)) and t not in ambiguous)
    if ambiguous:
        log(f"  {len(ambiguous)} ambiguous test id(s) left out: {sorted(ambiguous)}")
    broken = sorted(t for t, s in before.items() if ok(s) and not ok(after.get(t)))
    failing = sorted(t for t, s in after.items() if s in ("FAILED", "ERROR"))
    problems = []
    if ambiguous & set(task["FAIL_TO_PASS"]):
        problems.append(f"ambiguous FAIL_TO_PASS ids: {sorted(ambiguous & set(task['FAIL_TO_PASS']))}")
    if not task["FAIL_TO_PASS"]:
        problems.append("no FAIL_TO_PASS test: the test patch does not catch the bug")
    if broken:
        problems.append(f"gold patch breaks tests that passed before: {broken}")
    if failing:
        problems.append(f"tests fail even with the gold patch: {failing}")
    for name, out in (("old+tests+gold", out_after), ("old+tests+gold-again", out_again)):
        if not grading.grade(out, task)["resolved"]:
            problems.append(f"{name} does not grade as resolved (flaky?)")
    report = grading.grade(out_before, task)
    if task["FAIL_TO_PASS"] and (report["resolved"] or report["tests_status"]["FAIL_TO_PASS"]["success"]):
        problems.append("without the gold patch these FAIL_TO_PASS tests pass: "
                        f"{report['tests_status']['FAIL_TO_PASS']['success']}")
    # (c) An F2P test may pass in the untouched tree only as its old version, which
    # the test patch rewrites (a regression assertion added to an existing test).
    passing_old = [t for t in task["FAIL_TO_PASS"] if ok(plain.get(t))]
    not_rewritten = [t for t in passing_old if not rewritten_by(t, task["test_patch"], work / "old+tests/repo")]
    if not_rewritten:
        problems.append(f"FAIL_TO_PASS tests pass in the untouched old tree: {not_rewritten}")
    elif passing_old:
        log(f"  {len(passing_old)} FAIL_TO_PASS test(s) exist in the old tree and are rewritten by the test patch")
    if problems:
        raise BuildError(f"{iid} does not verify (logs in {work}):\n  - " + "\n  - ".join(problems))
    return task, archive


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", type=Path, default=ROOT / "scripts/swe_task_specs.json")
    ap.add_argument("--out", type=Path, default=ROOT / "envs/swe/tasks", help="folder holding task sets")
    ap.add_argument("--set", default="builtin", help="task set name: writes OUT/SET/tasks.jsonl")
    ap.add_argument("--only", action="append", metavar="ID", help="build only these instance ids (repeatable)")
    ap.add_argument("--keep-work", action="store_true", help="keep the unpacked trees and test logs")
    args = ap.parse_args(argv)

    specs = json.loads(args.spec.read_text())
    ids = [s["instance_id"] for s in specs]
    unknown = set(args.only or []) - set(ids)
    if unknown:
        ap.error(f"unknown instance ids: {sorted(unknown)}")
    wanted = [s for s in specs if not args.only or s["instance_id"] in args.only]

    out_dir = args.out / args.set
    out_dir.mkdir(parents=True, exist_ok=True)
    jsonl = out_dir / "tasks.jsonl"
    existing = {}
    if jsonl.exists():
        existing = {t["instance_id"]: t for t in map(json.loads, jsonl.read_text().splitlines()) if t}
    grading = load_grading()

    built, failed = {}, []
    t_all = time.monotonic()
    for i, spec in enumerate(wanted, 1):
        iid = spec["instance_id"]
        log(f"[{i}/{len(wanted)}] {iid}: {spec['pypi']} {spec['old']} -> {spec['new']}")
        t0 = time.monotonic()
        work = Path(tempfile.mkdtemp(prefix=f"swe-build-{iid}-"))
        try:
            task, archive = build_one(spec, grading, work)
        except (BuildError, subprocess.TimeoutExpired) as e:
            log(f"  FAILED: {e}")
            failed.append(iid)
            continue  # keep the work folder: its logs say why
        (out_dir / task["source_archive"]).write_bytes(archive)
        built[iid] = task
        log(f"  ok in {time.monotonic() - t0:.0f}s: {len(task['FAIL_TO_PASS'])} FAIL_TO_PASS, "
            f"{len(task['PASS_TO_PASS'])} PASS_TO_PASS")
        if not args.keep_work:
            shutil.rmtree(work, ignore_errors=True)

    # Spec order; tasks not rebuilt this time keep their previous record.
    tasks = [built.get(i) or existing.get(i) for i in ids]
    tasks = [t for t in tasks if t]
    jsonl.write_text("".join(json.dumps(t, ensure_ascii=False) + "\n" for t in tasks))
    if not args.only:  # a full build owns the folder: drop archives of removed specs
        keep = {t["source_archive"] for t in tasks}
        for stale in out_dir.glob("*.tar.gz"):
            if stale.name not in keep:
                stale.unlink()
    size = sum(p.stat().st_size for p in out_dir.iterdir() if p.is_file())
    log(f"{len(built)} built, {len(failed)} failed {failed or ''} in {time.monotonic() - t_all:.0f}s; "
        f"{jsonl} holds {len(tasks)} tasks; {out_dir} is {size / 1024:.0f} KiB")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
