"""The verifier of an Orchard/SWE-v0 task exported as a Harbor task folder (`export_swe.py`).

Copied verbatim into the task's `tests/` with `envs/swe/protected.py` (stdlib only: it runs
with whatever Python the task's image has) and run by `tests/test.sh` in the repository, after
the agent. It grades as `envs/swe/env.py` does, in the agent's sandbox instead of a fresh one:

1. the submission is the repository's `git diff --binary` against the base commit (new files
   included, ignored ones not); the tree is reset to base (`git clean -ffdx` too) and the
   submission applied again (a patch that does not apply: 0.0);
2. protected paths (test files, conftest.py, start-up hooks, runner configs, bytecode,
   import-shadowing modules: `protected.py`) are put back to base;
3. the test patch is applied (it does not apply: no reward file, the trial is errored) and the
   task's test command runs with the task's environment;
4. the log is graded with SWE-bench's pytest rules (`parse_log_pytest`, `test_passed`,
   `test_maintained`): 1.0 when every FAIL_TO_PASS test passes and every PASS_TO_PASS test
   passes or is skipped. A log that names none of the task's tests scores 0.0 (the export is
   only valid when the gold patch's run names them; its oracle run checks that).

Usage: python3 swe_verify.py LOGS_DIR (reward.txt and report.json go there).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from protected import ProtectedPaths  # noqa: E402  (copied next to this file by the export)

GIT = ["git", "-c", "user.name=orchard", "-c", "user.email=orchard@localhost", "-c", "core.quotepath=off"]
STATUSES = ("FAILED", "PASSED", "SKIPPED", "ERROR", "XFAIL")  # swebench.harness.constants.TestStatus
ANSI = re.compile(r"\x1b\[[0-9;]*[a-zA-Z]")  # swebench.utils.ansi_escape
SKIP_SUMMARY = re.compile(r"^\[\d+\]$")
KEEP = ".harbor"  # the local backend's /solution, /tests, /logs inside the working directory


class GradingError(Exception):
    """The task cannot be graded: no reward file is written (the trial is errored, never 0.0)."""


def git(*args: str, data: bytes | None = None, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([*GIT, *args], input=data, capture_output=True)
    if check and r.returncode != 0:
        raise GradingError(f"git {' '.join(args[:2])} failed: {r.stderr.decode('utf-8', 'replace')[-1000:]}")
    return r


def submission() -> bytes:
    git("add", "-A")
    return git("diff", "--cached", "--binary", "--no-ext-diff", "--no-textconv", "--no-color", "HEAD").stdout


def reset_to_base() -> None:
    git("reset", "-q", "--hard", "HEAD")
    git("clean", "-ffdxq", "-e", KEEP)


def restore_protected(rules: ProtectedPaths) -> list[dict]:
    git("add", "-A", "-f")
    fields = git("diff", "--cached", "--name-status", "--no-renames", "-z", "HEAD").stdout.decode(
        "utf-8", "surrogateescape").split("\0")
    changes = [(fields[i][:1], fields[i + 1]) for i in range(0, len(fields) - 1, 2) if fields[i]]
    dropped = [(status, path, rules.reason(path)) for status, path in changes if rules.reason(path)]
    new = [path for status, path, _ in dropped if status == "A"]
    old = sorted((path for status, path, _ in dropped if status != "A"), key=lambda p: not p.endswith(".gitattributes"))
    if new:
        subprocess.run(["rm", "-rf", "--", *new], check=True)
    if old:
        git("--literal-pathspecs", "checkout", "HEAD", "--pathspec-from-file=-", "--pathspec-file-nul",
            data="\0".join(old).encode("utf-8", "surrogateescape"))
    git("reset", "-q")
    return [{"path": path, "reason": why} for _, path, why in dropped]


def parse_log_pytest(log: str) -> dict[str, str]:
    """swebench.harness.log_parsers.python.parse_log_pytest (SWE-bench 5.0.2)."""
    status_map = {}
    for line in log.split("\n"):
        if line.startswith(STATUSES):
            if line.startswith("FAILED"):
                line = line.replace(" - ", " ")
            case = line.split()
            if len(case) <= 1 or (case[0] == "SKIPPED" and SKIP_SUMMARY.match(case[1])):
                continue
            status_map[case[1]] = case[0]
    return status_map


def resolve_case(case: str, sm: dict[str, str]) -> str | None:
    """swebench.harness.grading._resolve_case: truncated parametrized ids match by prefix."""
    if case in sm:
        return case
    if case.count("[") > case.count("]"):
        matches = [k for k in sm if k.startswith(case)]
        if matches and len({sm[k] in ("PASSED", "XFAIL") for k in matches}) == 1:
            return matches[0]
    return None


def grade(log: str, fail_to_pass: list[str], pass_to_pass: list[str]) -> dict:
    sm = parse_log_pytest(ANSI.sub("", log))
    passed = lambda t: (k := resolve_case(t, sm)) is not None and sm[k] in ("PASSED", "XFAIL")
    maintained = lambda t: passed(t) or ((k := resolve_case(t, sm)) is not None and sm[k] == "SKIPPED")
    report = {"FAIL_TO_PASS": {"success": [t for t in fail_to_pass if passed(t)],
                               "failure": [t for t in fail_to_pass if not passed(t)]},
              "PASS_TO_PASS": {"success": [t for t in pass_to_pass if maintained(t)],
                               "failure": [t for t in pass_to_pass if not maintained(t)]}}
    named = sum(resolve_case(t, sm) is not None for t in {*fail_to_pass, *pass_to_pass})
    resolved = bool(sm) and not report["FAIL_TO_PASS"]["failure"] and not report["PASS_TO_PASS"]["failure"]
    return {"resolved": resolved, "reward": 1.0 if resolved else 0.0, "named": named, "tests_status": report}


def verify(task: dict) -> dict:
    rules = ProtectedPaths(task["test_files"], task["env"], frozenset(task["base"]))
    patch = submission()
    reset_to_base()
    if patch:
        r = git("apply", "--binary", "--whitespace=nowarn", "-", data=patch, check=False)
        if r.returncode != 0:
            return {"resolved": False, "reward": 0.0, "patch_error": "the submitted patch did not apply",
                    "apply_output": r.stderr.decode("utf-8", "replace")[-4096:]}
    dropped = restore_protected(rules)
    r = git("apply", "--binary", "--whitespace=nowarn", str(HERE / "test.patch"), check=False)
    if r.returncode != 0:
        raise GradingError(f"the test patch did not apply: {r.stderr.decode('utf-8', 'replace')[-1000:]}")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONSAFEPATH", "PYTHONPATH")}
    env.update(task["env"], PYTHONDONTWRITEBYTECODE="1", GIT_PAGER="cat", PAGER="cat")
    run = subprocess.run(["bash", "-c", task["test_cmd"]], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT)
    log = run.stdout.decode("utf-8", "replace")
    report = grade(log, task["FAIL_TO_PASS"], task["PASS_TO_PASS"])
    report.update(dropped=dropped, test_exit_code=run.returncode, test_output_tail=log[-4096:])
    if not report["named"]:
        report["note"] = "the test output names none of the task's tests: the submission broke the test run"
    return report


def main() -> int:
    logs = Path(sys.argv[1])
    task = json.loads((HERE / "swe_task.json").read_text())
    try:
        report = verify(task)
    except GradingError as e:
        print(f"cannot grade: {e}", file=sys.stderr)
        return 2
    logs.mkdir(parents=True, exist_ok=True)
    (logs / "report.json").write_text(json.dumps(report, indent=1))
    (logs / "reward.txt").write_text(f"{report['reward']}\n")
    print(json.dumps({k: v for k, v in report.items() if k != "test_output_tail"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
