"""The verdict run: the task's tests once more, with per-test outcomes from a channel beside the log.

The log of the graded run (SWE-bench's `-rA` lines, the exit status) is written by the test
process, and a submission's code runs in that process: it can rewrite pytest's reports,
print PASSED lines, or leave with status 0. So a submission the log calls RESOLVED_FULL
runs again, in another fresh sandbox, under `verdict_driver.py`: a parent process that
passes a pipe (and a token) to the task's pytest, where `verdict_plugin.py`, loaded before
any of the submission's code, sends one verdict per test, read from the raw exceptions of
its phases, plus any change it sees in the runner's machinery. The tests' own output never
reaches the driver's stdout; the driver's one result line carries a nonce the grader gave it
on stdin. `compare` turns that into tampering findings:

- a FAIL_TO_PASS / PASS_TO_PASS test the log calls passed and the verdicts do not
  (no verdict counts as not passed: a process that ended early leaves none);
- the plugin saw the runner's machinery replaced, or lines without its token on its pipe;
- the driver started but its result never came (it was killed from inside).

A verdict run that could not be made (no driver line at all; pytest never loaded the
plugin, which happens before the submission's code can run; a timeout; pytest-xdist
workers, which get no pipe) is a grading error, never paid and not a finding. Tasks whose
log parser is not pytest's are checked by the static scan only.
"""

from __future__ import annotations

import json
import secrets
import shlex
from pathlib import Path

MARK = "ORCHARD-VERDICTS"
START_MARKER = ": '>>>>> Start Test Output'"  # SWE-bench's eval scripts: the test command follows
START_MARK = "ORCHARD-VERDICT-DRIVER"
_HERE = Path(__file__).parent
MAX_LISTED = 10  # tests named per finding


class VerdictRunError(RuntimeError):
    """The verdict run could not be made (not the submission's doing): grading is errored."""


def with_plugin_path(script: str, folder: str) -> str:
    """An eval script that sets its own PYTHONPATH (`PYTHONPATH=src; export PYTHONPATH`) would hide
    the plugin: put its folder back in front right after the start marker, before the tests run."""
    line = f'export PYTHONPATH={shlex.quote(folder)}"${{PYTHONPATH:+:$PYTHONPATH}}"'
    lines = script.split("\n")
    at = next((i for i, text in enumerate(lines) if text.strip() == START_MARKER), None)
    return script if at is None else "\n".join([*lines[:at + 1], line, *lines[at + 1:]])


async def verdict_exec(ctx, command: str | None, folder: str, timeout: float, env: dict | None = None,
                       script: str | None = None) -> dict:
    """Run the shell `command` (or the bash `script`) under the driver in `folder` (a fresh path
    outside the repository), in `ctx.cwd`; the driver's result, or `{"killed": reason}` when it
    started but never reported."""
    nonce = secrets.token_hex(16)
    module = f"orchard_verdict_{secrets.token_hex(6)}"
    driver = f"{folder}/driver.py"
    await ctx.sandbox.upload_content((_HERE / "verdict_driver.py").read_bytes(), driver)
    await ctx.sandbox.upload_content((_HERE / "verdict_plugin.py").read_bytes(), f"{folder}/{module}.py")
    if script is not None:
        await ctx.sandbox.upload_content(with_plugin_path(script, folder).encode(), f"{folder}/eval.sh")
        command = f"/bin/bash {shlex.quote(folder)}/eval.sh"
    argv = ["python3", driver, folder, module, f"{folder}/tests.log", str(timeout), "--", "/bin/bash", "-c", command]
    # the driver says it runs before the tests start (so "no line" cannot be a killed driver)
    script = f"echo {START_MARK} && exec {shlex.join(argv)}"
    try:
        r = await ctx.sandbox.exec(script, cwd=ctx.cwd, env=env if env is not None else ctx.env,
                                   stdin=nonce + "\n", timeout=timeout + 60)
    finally:
        await ctx.sandbox.exec(f"rm -rf {shlex.quote(folder)}", timeout=60)
    if r.timed_out:
        raise VerdictRunError(f"the verdict run timed out after {timeout + 60:.0f}s")
    out = r.stdout.splitlines()
    if START_MARK not in out:
        raise VerdictRunError(f"the verdict driver did not start ({r.exit_code}): {(r.stdout + r.stderr)[-1000:]}")
    lines = [line for line in out if line.startswith(f"{MARK} {nonce} ")]
    if not lines and "Traceback (most recent call last)" in r.stderr:  # its own crash: its stderr is its own
        raise VerdictRunError(f"the verdict driver failed: {r.stderr[-1000:]}")
    if len(lines) != 1:
        return {"killed": f"the verdict driver ended without its result (exit {r.exit_code}, {len(lines)} "
                          f"result lines): {(r.stdout + r.stderr)[-500:]}"}
    result = json.loads(lines[0][len(MARK) + len(nonce) + 2:])
    return result


def render(tests: dict[str, str]) -> str:
    """The verdicts as the `-rA` summary lines a pytest log parser reads."""
    return "".join(f"{status} {nodeid}\n" for nodeid, status in tests.items())


def compare(graded: dict, result: dict, task: dict) -> tuple[list[dict], dict]:
    """(findings, summary for the report) for a verdict run of a submission the log resolved."""
    from .grading import grade

    summary = {k: result.get(k) for k in ("exit_code", "timed_out", "started", "ended", "foreign_lines",
                                          "undumpable")}
    summary["tests"] = len(result.get("tests") or {})
    if "killed" in result:
        return [{"source": "verdicts", "what": result["killed"]}], summary
    if result.get("timed_out"):  # slow or made to hang: either way not paid, and not called tampering
        raise VerdictRunError(f"the verdict run's tests timed out: {result.get('log_tail', '')[-500:]}")
    if not result.get("started"):
        raise VerdictRunError("the verdict run's pytest never loaded the verdict plugin (does the test command run "
                              "pytest, and keep PYTHONPATH and PYTEST_ADDOPTS?): " + result.get("log_tail", "")[-1000:])
    if result.get("unsupported"):
        raise VerdictRunError("the verdict run cannot see this test run: " + "; ".join(result["unsupported"]))
    findings = [{"source": "verdicts", "what": what} for what in result.get("tamper") or []]
    if result.get("foreign_lines"):
        findings.append({"source": "verdicts", "what": f"{result['foreign_lines']} lines on the verdict pipe "
                                                       "without its token (something else wrote there)"})
    verdict = grade(render(result.get("tests") or {}), task)
    summary["status"] = verdict["status"]
    if verdict["resolved"] != graded["resolved"]:
        passed_in_log = {t for key in ("FAIL_TO_PASS", "PASS_TO_PASS")
                         for t in graded["tests_status"][key]["success"]}
        failed_here = [t for key in ("FAIL_TO_PASS", "PASS_TO_PASS")
                       for t in verdict["tests_status"][key]["failure"] if t in passed_in_log]
        findings.append({"source": "verdicts", "what": f"the log says {graded['status']}, the verdicts "
                         f"{verdict['status']}: {len(failed_here)} tests passed in the log and not in the verdict "
                         "run", "tests": failed_here[:MAX_LISTED]})
        summary["log_tail"] = result.get("log_tail", "")[-1000:]
    return findings, summary
