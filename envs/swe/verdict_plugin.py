"""pytest plugin of the SWE grader's verdict run: per-test outcomes through a pipe, not the log.

Not imported by orchard-gym: `verdicts.py` uploads this file into the grading sandbox and
`verdict_driver.py` loads it into the task's pytest (`-p`, through PYTEST_ADDOPTS), so it
runs on the task's own Python and pytest (stdlib and pytest only; Python 3.6+, pytest 5+).

It is imported before any code of the submission: pytest loads `-p` plugins before
entry-point plugins, conftest files and test modules. At that moment it keeps what it needs
(the pipe, its token, pytest's exception classes, the identity of the test runner's
machinery), so a submission that later rewrites pytest's reports, the terminal output,
unittest's result objects or the exit status does not change what this plugin sends:

- a test's verdict is read from the raw exception of each phase (`call.excinfo`, after
  pytest's unittest support has put a TestCase's failure there), never from a TestReport;
- only a test whose phases all ended (teardown included) has a verdict: a process that
  exits early (os._exit, sys.exit, a crash) leaves its remaining tests without one;
- the runner's machinery (pytest's runner, reports, terminal, unittest's result and case
  classes, pluggy's hook calls, sys.exit, os._exit, builtins.__import__, the runner modules
  in sys.modules, a trace function appearing) is compared with its state at load time after
  every test and at the end; a change is sent as `tamper`.

What it cannot see: code that targets this plugin itself (finds its pipe and token in the
process and writes verdicts), or that makes a test body pass without touching the runner
(rewriting the test function). The static scan (`tamper_scan.py`) is the tripwire there.
"""

import builtins  # noqa: F401  (imported now: in sys.modules for the machinery snapshot)
import json
import os
import sys
import unittest  # noqa: F401  (the same: its case and result classes are in the snapshot)

import _pytest.outcomes
import _pytest.reports
import _pytest.runner
import pytest

_FD = os.environ.pop("ORCHARD_VERDICT_FD", None)
_TOKEN = os.environ.pop("ORCHARD_VERDICT_TOKEN", "")
_write, _dumps, _isinstance = os.write, json.dumps, isinstance
_SKIPPED = _pytest.outcomes.Skipped
_XFAILED = getattr(_pytest.outcomes, "XFailed", ())
_UNSET = object()


def _send(**msg):
    if _FD is None:
        return
    try:
        _write(int(_FD), (_TOKEN + "\t" + _dumps(msg) + "\n").encode("utf-8", "replace"))
    except (OSError, ValueError):
        pass  # a closed pipe: the driver sees the verdicts missing


def _static(owner, name):
    """The attribute as stored (no descriptor call: a classmethod stays the same object)."""
    for klass in getattr(owner, "__mro__", (owner,)):
        found = vars(klass).get(name, _UNSET) if hasattr(klass, "__dict__") else _UNSET
        if found is not _UNSET:
            return found
    return _UNSET


def _machinery():
    """label -> (owner, attribute) for everything a submission could rewrite to change outcomes."""
    import importlib

    spec = {
        "unittest.case.TestCase": ("run", "__call__", "_callTestMethod", "_callSetUp", "_callTearDown"),
        "unittest.result.TestResult": ("addFailure", "addError", "addSuccess", "addSkip", "addSubTest",
                                       "addExpectedFailure", "addUnexpectedSuccess", "wasSuccessful"),
        "unittest.case._Outcome": ("testPartExecutor",),
        "_pytest.runner": ("call_and_report", "call_runtest_hook", "runtestprotocol", "pytest_runtest_protocol",
                           "pytest_runtest_makereport", "check_interactive_exception"),
        "_pytest.runner.CallInfo": ("from_call", "__init__"),
        "_pytest.reports.BaseReport": ("passed", "failed", "skipped"),
        "_pytest.reports.TestReport": ("from_item_and_call", "__init__"),
        "_pytest.python": ("pytest_pyfunc_call",),
        "_pytest.python.Function": ("runtest",),
        "_pytest.unittest": ("pytest_runtest_makereport",),
        "_pytest.unittest.TestCaseFunction": ("runtest", "addFailure", "addError", "addSkip", "addSuccess",
                                              "addExpectedFailure", "addUnexpectedSuccess", "_addexcinfo"),
        "_pytest.skipping": ("pytest_runtest_makereport", "evaluate_xfail_marks"),
        "_pytest.terminal": ("_get_line_with_reprcrash_message", "build_summary_stats_line"),
        "_pytest.terminal.TerminalReporter": ("pytest_runtest_logreport", "short_test_summary", "summary_stats",
                                              "summary_failures", "summary_errors", "write_line"),
        "_pytest.main": ("pytest_runtestloop", "wrap_session"),
        "pluggy._hooks.HookCaller": ("__call__", "call_historic"),
        "pluggy._hooks._HookCaller": ("__call__",),
        "pluggy._callers": ("_multicall",),
        "pluggy._manager.PluginManager": ("_hookexec", "register", "unregister"),
        "sys": ("exit",),
        "os": ("_exit", "kill", "write"),
        "builtins": ("__import__", "print", "AssertionError", "isinstance"),
    }
    out = {}
    for path, names in spec.items():
        owner = None
        parts = path.split(".")
        for i in range(len(parts), 0, -1):  # the longest importable module prefix, then attributes
            try:
                owner = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            for attr in parts[i:]:
                owner = getattr(owner, attr, None)
            break
        if owner is None:
            continue
        for name in names:
            value = _static(owner, name) if _isinstance(owner, type) else getattr(owner, name, _UNSET)
            if value is not _UNSET:
                out[path + "." + name] = (owner, name, value)
    for name in ("_pytest.runner", "_pytest.reports", "_pytest.python", "_pytest.terminal", "_pytest.unittest",
                 "_pytest.main", "pytest", "pluggy", "unittest", "unittest.case", "unittest.result", "builtins",
                 "sys", "os"):
        if name in sys.modules:
            out[f"sys.modules[{name!r}]"] = (sys.modules, name, sys.modules[name])
    return out


_MACHINERY = _machinery()
_send(k="start", pytest=getattr(pytest, "__version__", "?"))  # now: conftest files may import the submission
_reported = set()
_trace_at_start = _UNSET


def _current(owner, name):
    if owner is sys.modules:
        return sys.modules.get(name, _UNSET)
    return _static(owner, name) if _isinstance(owner, type) else getattr(owner, name, _UNSET)


def _check_machinery():
    for label, (owner, name, value) in _MACHINERY.items():
        if label not in _reported and _current(owner, name) is not value:
            _reported.add(label)
            _send(k="tamper", what=f"{label} was replaced while the tests ran")
    if _trace_at_start is None and "settrace" not in _reported:
        import threading

        gettrace = getattr(threading, "gettrace", lambda: None)
        if sys.gettrace() is not None or gettrace() is not None:
            _reported.add("settrace")
            _send(k="tamper", what="a trace function was installed while the tests ran")


def _phase(excinfo, when, item):
    if excinfo is None:
        return "ok"
    exc = excinfo.value
    if _isinstance(exc, _SKIPPED):
        return "skipped"
    if _XFAILED and _isinstance(exc, _XFAILED):
        return "xfail"
    if when == "call" and item.get_closest_marker("xfail") is not None:
        return "xfail"  # lenient on purpose: this run may only be stricter than pytest where tampered
    return "error"


def _status(phases):
    setup, call, teardown = phases.get("setup"), phases.get("call"), phases.get("teardown")
    if setup == "skipped":
        return "SKIPPED"
    if setup == "xfail":
        return "XFAIL"
    if setup not in (None, "ok") or call is None:
        return "ERROR"
    status = {"ok": "PASSED", "skipped": "SKIPPED", "xfail": "XFAIL"}.get(call, "FAILED")
    return "ERROR" if teardown == "error" and status == "PASSED" else status


_phases = {}


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session):
    global _trace_at_start
    if _trace_at_start is _UNSET:
        _trace_at_start = sys.gettrace()
    if getattr(session.config.option, "numprocesses", None):  # pytest-xdist: the tests run in workers
        _send(k="unsupported", what="pytest-xdist runs the tests in worker processes, which get no verdict pipe")


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    yield  # after pytest's own makereport hooks (unittest's moves a TestCase failure into call.excinfo)
    phases = _phases.setdefault(item.nodeid, {})
    phases[call.when] = _phase(call.excinfo, call.when, item)
    if call.when == "teardown":
        try:
            nodeid = item.config.cwd_relative_nodeid(item.nodeid)
        except Exception:
            nodeid = item.nodeid
        _send(k="test", id=nodeid, s=_status(_phases.pop(item.nodeid)))
        _check_machinery()


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    _check_machinery()
    _send(k="end")
    yield
