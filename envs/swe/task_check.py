"""Check a task file before training on it: what makes it unloadable (errors) and what
silently breaks grading (warnings). Used by `orchard tasks check FILE`.

Warnings, each a way a task grades every submission 0.0 (or 1.0) without saying so:
- a pytest command without `-rA`: pytest prints no PASSED lines, so SWE-bench's parser
  sees no passing test and nothing ever resolves;
- test ids with spaces: SWE-bench's pytest parser cuts an id at its first space, so such
  a test is never found in the log;
- `/tmp` in a test command, set-up command or env value: every sandbox has its own
  private /tmp, so a cache there is not shared and is gone in the grading sandbox;
- a source archive with one top-level folder: it is extracted into the repository root,
  so the patches' paths (a/pkg/...) do not match;
- a gold patch touching a protected path (grading puts it back, so gold cannot pass);
- no FAIL_TO_PASS; no way to run the tests (no test_cmd, no eval_script).
"""

from __future__ import annotations

import re
import shlex
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from .datasets import TaskFormatError, diff_paths, kind_for_source, read_records
from .protected import ProtectedPaths, base_names
from .tasks import SWETask, parse_task

PYTEST_PARSERS = {"parse_log_pytest", "parse_log_pytest_options", "parse_log_pytest_v2"}


@dataclass
class Problem:
    severity: str  # "error" or "warning"
    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.severity}: {self.where}: {self.message}"


def check_tasks(source: str | Path, split: str | None = None, dataset: str | None = None) -> tuple[int, list[Problem]]:
    """(number of records read, problems). Every record is checked, not only the first bad one."""
    problems: list[Problem] = []
    seen: dict[str, str] = {}
    count = 0
    try:
        records = list(read_records(source, split))
    except (TaskFormatError, FileNotFoundError, ImportError, OSError, UnicodeDecodeError) as e:
        return 0, [Problem("error", str(source), str(e))]
    base = Path(source).parent if Path(source).is_file() else Path(source)
    for where, row in records:
        count += 1
        try:
            task = parse_task(row, where, kind=dataset or kind_for_source(source))
        except TaskFormatError as e:
            problems.append(Problem("error", where, str(e).removeprefix(f"{where}: ")))
            continue
        if task.source_archive is not None and not task.source_archive.is_absolute():
            task.source_archive = (base / task.source_archive).resolve()
        label = f"{where}: task {task.instance_id!r}"
        if task.instance_id in seen:
            problems.append(Problem("error", label, f"duplicate instance_id (first at {seen[task.instance_id]})"))
        seen.setdefault(task.instance_id, where)
        problems += [Problem(sev, label, msg) for sev, msg in check_task(task)]
    return count, problems


def check_task(task: SWETask) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    script = task.eval_script or ""
    if not task.test_cmd and not script:
        out.append(("error" if not task.in_image else "warning",
                    "no test_cmd and no eval_script: nothing says how to run the tests, so it cannot be graded"))
    if not task.FAIL_TO_PASS:
        out.append(("warning", "FAIL_TO_PASS is empty: nothing tells a fix from no change"))
    if task.log_parser in PYTEST_PARSERS:
        for text, what in ((task.test_cmd, "test_cmd"), (script, "eval_script")):
            if _pytest_without_ra(text):
                out.append(("warning", f"{what} runs pytest without -rA: pytest then prints no PASSED lines and "
                                       "SWE-bench's parser finds no passing test, so nothing resolves"))
        spaced = [t for t in [*task.FAIL_TO_PASS, *task.PASS_TO_PASS] if " " in t]
        if spaced:
            out.append(("warning", f"{len(spaced)} test id(s) with spaces (e.g. {spaced[0]!r}): SWE-bench's pytest "
                                   "parser cuts ids at the first space, so these never match the log"))
    tmp_uses = [what for what, text in (("test_cmd", task.test_cmd), *(("setup_commands", c) for c in task.setup_commands),
                                        *((f"env {k}", v) for k, v in task.env.items()))
                if re.search(r"(^|[\s=:'\"])/tmp(/|\b)", text or "")]
    if tmp_uses:
        out.append(("warning", f"/tmp in {', '.join(sorted(set(tmp_uses)))}: each sandbox has a private /tmp, so a "
                               "cache or file there is not shared and is gone in the grading sandbox"))
    if task.source_archive is not None:
        out += _check_archive(task)
    if task.patch:
        rules = ProtectedPaths(task.test_files, task.env, base_names(task.source_archive)
                               if task.source_archive is not None and task.source_archive.exists() else frozenset())
        hit = [(p, why) for p in diff_paths(task.patch) if (why := rules.reason(p))
               and (task.source_archive is not None or not why.startswith("new top-level"))]
        if hit:
            out.append(("warning", f"the gold patch changes protected path {hit[0][0]!r} ({hit[0][1]}): grading puts "
                                   "it back, so even the gold patch cannot resolve the task"))
    return out


def _pytest_without_ra(text: str) -> bool:
    for line in (text or "").splitlines():
        try:
            words = shlex.split(line)
        except ValueError:
            words = line.split()
        if any(w == "pytest" or w.endswith("/pytest") or w == "py.test" for w in words) or "-m pytest" in line:
            if not any(re.fullmatch(r"-r\w*[aA]\w*", w) for w in words):
                return True
    return False


def _check_archive(task: SWETask) -> list[tuple[str, str]]:
    archive = task.source_archive
    if not archive.exists():
        return [("error", f"source_archive {archive} does not exist")]
    try:
        with tarfile.open(archive) as tar:
            names = [PurePosixPath(m.name.removeprefix("./")) for m in tar.getmembers() if m.name not in (".", "./")]
    except (tarfile.TarError, OSError) as e:
        return [("error", f"source_archive {archive} is not a readable tar archive: {e}")]
    tops = {n.parts[0] for n in names if n.parts}
    if len(tops) == 1 and any(len(n.parts) > 1 for n in names):
        top = tops.pop()
        return [("warning", f"source_archive has one top-level folder {top}/: it is extracted into the repository "
                            f"root, so the patches' paths do not match; pack the folder's contents (tar -C {top} .)")]
    return []
