"""Grade an SWE task from its test output, exactly as the SWE-bench harness does.

The parsing (``parse_log_pytest``), the log checks (``get_logs_eval``) and the
FAIL_TO_PASS / PASS_TO_PASS resolution (``get_eval_tests_report``,
``get_resolution_status``, ``ResolvedStatus``) are SWE-bench's own code, imported
from the ``swebench`` package, so a reward here means what it means there.

How swebench is imported
------------------------
Grading needs only a few pure modules of swebench (``harness.grading``,
``harness.log_parsers``, ``harness.constants``, ``types``, ``utils``) plus
``unidiff``. But ``swebench/harness/__init__.py`` eagerly imports
``docker_utils`` (docker), ``modal_eval`` (modal) and ``utils`` (datasets), so a
plain ``import swebench.harness.grading`` fails without those heavy packages.

We therefore register ``swebench.harness`` in ``sys.modules`` as a bare package
(its real ``__path__``, none of its ``__init__``) before importing the submodules:
Python's import system then loads ``swebench.harness.grading`` and friends from
the installed files as usual, and nothing docker/modal-related is executed. If the
real ``swebench.harness`` was already imported (full install), it is used as is.
Later imports of other submodules (``swebench.harness.docker_utils``...) still
work; only the attributes that the skipped ``__init__`` would have set eagerly are
missing until those submodules are imported.

So the minimal install is::

    pip install --no-deps swebench==5.0.2 && pip install unidiff

and a full ``pip install swebench==5.0.2`` works too.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import sys
import tempfile
import types
from typing import Any

SWEBENCH_VERSION = "5.0.2"  # the version whose grading semantics we follow
LOG_PARSER = "parse_log_pytest"
EVAL_TYPE = "pass_and_fail"


def _import_harness() -> tuple[types.ModuleType, types.ModuleType]:
    """Return (swebench.harness.grading, swebench.harness.constants) without docker/modal."""
    try:
        import swebench  # its __init__ is lazy (5.x): imports nothing heavy
    except ImportError as e:
        raise ImportError(
            "SWE grading needs the swebench package: "
            f"pip install --no-deps swebench=={SWEBENCH_VERSION} unidiff"
        ) from e
    if "swebench.harness" not in sys.modules:
        pkg_spec = importlib.machinery.ModuleSpec("swebench.harness", None, is_package=True)
        pkg_spec.submodule_search_locations = [os.path.join(swebench.__path__[0], "harness")]
        pkg = importlib.util.module_from_spec(pkg_spec)
        sys.modules["swebench.harness"] = pkg
        swebench.harness = pkg
    from swebench.harness import constants, grading

    return grading, constants


_grading, _constants = _import_harness()
from swebench.harness.log_parsers import PARSER_REGISTRY  # noqa: E402  (after the shim)
from swebench.types import TestSpec  # noqa: E402
from swebench.utils import ansi_escape  # noqa: E402

ResolvedStatus = _constants.ResolvedStatus
FAIL_TO_PASS = _constants.FAIL_TO_PASS
PASS_TO_PASS = _constants.PASS_TO_PASS


def _tests(task: dict, key: str) -> list[str]:
    # SWE-bench datasets store the lists as JSON strings; our JSONL stores lists.
    value = task.get(key) or []
    return json.loads(value) if isinstance(value, str) else list(value)


def _test_spec(task: dict) -> TestSpec:
    return TestSpec(
        instance_id=task.get("instance_id", ""),
        image=task.get("image", ""),
        eval_script_list=[],
        repo=task.get("repo", ""),
        version=task.get("version", ""),
        FAIL_TO_PASS=_tests(task, FAIL_TO_PASS),
        PASS_TO_PASS=_tests(task, PASS_TO_PASS),
        log_parser=task.get("log_parser", LOG_PARSER),
        eval_type=task.get("eval_type", EVAL_TYPE),
    )


def parse_test_output(test_output: str, task: dict | None = None) -> dict[str, str]:
    """Test id -> status (PASSED/FAILED/ERROR/SKIPPED/XFAIL), as the task's log parser reports it."""
    spec = _test_spec(task or {})
    return PARSER_REGISTRY[spec.log_parser](ansi_escape(test_output), spec)


def pytest_parser(log_parser: str) -> bool:
    """Is `log_parser` (a PARSER_REGISTRY name) one of SWE-bench's pytest parsers (repository aliases included)?"""
    pytest_family = {PARSER_REGISTRY.get(n) for n in ("parse_log_pytest", "parse_log_pytest_options",
                                                       "parse_log_pytest_v2")}
    return PARSER_REGISTRY.get(log_parser) in pytest_family - {None}


def _logs_eval(test_output: str, spec: TestSpec, exit_code: int | None) -> tuple[dict[str, str], bool]:
    """Run SWE-bench's get_logs_eval on our output.

    It reads a log file bracketed by the harness markers; an env captures the test
    command's output directly, so we add the markers (and the exit code line the
    harness records, which lets swebench reject a log that claims success while the
    command failed) when they are not already there.
    """
    log = ansi_escape(test_output)
    if _constants.START_TEST_OUTPUT not in log:
        log = f"{_constants.START_TEST_OUTPUT}\n{log}\n{_constants.END_TEST_OUTPUT}\n"
    if exit_code is not None and _constants.TEST_EXIT_CODE not in log:
        log += f"{_constants.TEST_EXIT_CODE}: {exit_code}\n"
    fd, path = tempfile.mkstemp(prefix="orchard-swe-", suffix=".log")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as f:
            f.write(log)
        return _grading.get_logs_eval(spec, path)
    finally:
        os.unlink(path)


def grade(test_output: str, task: dict, exit_code: int | None = None) -> dict[str, Any]:
    """Grade the output of ``task["test_cmd"]`` run after the agent's changes and the test patch.

    Returns ``{"instance_id", "resolved", "reward", "status", "tests_status",
    "parsed"}``: ``status`` is a ``ResolvedStatus`` value (RESOLVED_FULL /
    RESOLVED_PARTIAL / RESOLVED_NO), ``tests_status`` is SWE-bench's report
    (``{"FAIL_TO_PASS": {"success": [...], "failure": [...]}, "PASS_TO_PASS": ...}``),
    ``parsed`` is False when the output held no usable test results (then nothing
    is resolved), ``named`` counts the task's FAIL_TO_PASS / PASS_TO_PASS tests that
    the output reports at all (0: the run tells nothing about this task).
    ``reward`` is 1.0 only for RESOLVED_FULL.
    """
    spec = _test_spec(task)
    status_map, parsed = _logs_eval(test_output, spec, exit_code)
    gold = {FAIL_TO_PASS: spec.FAIL_TO_PASS, PASS_TO_PASS: spec.PASS_TO_PASS}
    report = _grading.get_eval_tests_report(
        status_map, gold, eval_type=_constants.EvalType(spec.eval_type)
    )
    status = _grading.get_resolution_status(report) if parsed else ResolvedStatus.NO.value
    resolved = status == ResolvedStatus.FULL.value
    resolve = getattr(_grading, "_resolve_case", None) or (lambda case, sm: case if case in sm else None)
    named = sum(1 for t in {*spec.FAIL_TO_PASS, *spec.PASS_TO_PASS} if resolve(t, status_map) is not None) \
        if parsed else 0
    return {
        "instance_id": spec.instance_id,
        "resolved": resolved,
        "reward": 1.0 if resolved else 0.0,
        "status": status,
        "tests_status": report,
        "parsed": parsed,
        "named": named,
    }
