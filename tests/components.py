"""What the tests need from the machine, and what happens when it is missing.

A test that needs a component (Podman, Redis, bubblewrap, TRL, ...) says so through
`require()` / `needs()` / `require_module()`. Where the component is missing the test is
skipped, unless $ORCHARD_REQUIRE names the component (a comma list, or `all`): then it
FAILS with the reason, so CI, which installs everything, cannot stay green by skipping.

With ORCHARD_REQUIRE=all, a skip that did not come from here (a bare pytest.skip, a
skipif mark, an importorskip) fails too, except `variant_limit()`: a real limit of one
variant (listed, with its reason, in docs/testing.md).

The hooks at the bottom are imported into tests/conftest.py; `-p components` loads them
into a pytest run outside tests/ (tests/test_require.py does that).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import NoReturn

import pytest

ENV = "ORCHARD_REQUIRE"
VARIANT_LIMIT = "variant limit: "

# name -> what it is and how CI gets it
COMPONENTS = {
    "chromium": "Chromium (scripts/setup_system.sh): the GUI env, the trajectory viewer's page test",
    "bwrap": "bubblewrap, the local backend's namespaces (scripts/setup_system.sh)",
    "docker": "Podman's Docker API and the test images (scripts/podman_service.sh, build_test_images.sh, "
              "build_injector_image.sh)",
    "harnesses": "node/npm (Debian nodejs, npm) and the harnesses' pinned packages (scripts/install_harnesses.sh)",
    "gui": "Xvfb, Chromium, xdotool, openbox, stterm, mousepad (scripts/setup_system.sh) and the miniwob package "
           "(extra [gui])",
    "kubernetes": "the kubernetes client (extra [k8s]) and the fake cluster's Podman kubelet",
    "kubernetes-validate": "offline Kubernetes schemas (extra [dev])",
    "redis": "redis-py (extra [server]) and redis-server (scripts/setup_system.sh)",
    "server": "FastAPI and uvicorn (extra [server]): the orchestrator, the recording proxy",
    "openai": "the official openai client (extra [dev])",
    "anthropic": "the official anthropic client (extra [dev])",
    "claude-code": "Claude Code from npm (scripts/install_harnesses.sh)",
    "openssl": "the openssl CLI (scripts/setup_system.sh): test TLS certificates",
    "schemathesis": "schemathesis (extra [dev]): the API fuzz test",
    "swe-images": "one image per built-in SWE task (scripts/build_swe_images.py)",
    "swe-datasets": "datasets and pyarrow (extra [swe], also in [train]): dataset folders, Parquet, swebench's eval scripts",
    "train": "torch, transformers and TRL (extra [train])",
    "integrations": "OpenEnv and SkyRL-Gym (extra [integrations]): the trainer adapters",
    "harbor": "harbor==0.25.0 in a Python 3.13 venv (scripts/install_harbor.sh): Harbor's own runner and models",
    "verifiers": "verifiers 0.4 in .venv-verifiers (extra [verifiers], scripts/install_verifiers.sh; it pins "
                 "mcp==2.0.0, which OpenEnv cannot share)",
}


def required() -> frozenset[str]:
    """The components $ORCHARD_REQUIRE names (`all`: every one). Unknown names are an error."""
    names = {n.strip() for n in os.environ.get(ENV, "").split(",") if n.strip()}
    if "all" in names:
        return frozenset(COMPONENTS)
    unknown = sorted(names - set(COMPONENTS))
    if unknown:
        raise pytest.UsageError(f"{ENV}: unknown component(s) {', '.join(unknown)}; "
                                f"known: all, {', '.join(sorted(COMPONENTS))}")
    return frozenset(names)


def strict() -> bool:
    """ORCHARD_REQUIRE=all: only variant limits may skip."""
    return "all" in {n.strip() for n in os.environ.get(ENV, "").split(",")}


def require(component: str, why_not: str | None) -> None:
    """Go on if `why_not` is empty (the component is there); else skip the calling test (or
    module), or fail it when $ORCHARD_REQUIRE names the component."""
    __tracebackhide__ = True  # reports name the test, not this helper
    if component not in COMPONENTS:
        raise ValueError(f"unknown component {component!r}; add it to tests/components.py COMPONENTS")
    if not why_not:
        return
    if component in required():
        pytest.fail(f"{ENV} requires {component} ({COMPONENTS[component]}), which is missing: {why_not}",
                    pytrace=False)
    pytest.skip(f"needs {component}: {why_not}", allow_module_level=True)


def needs(component: str, why_not: str | None) -> pytest.MarkDecorator:
    """A mark: `require(component, why_not)` before the test's fixtures are set up."""
    if component not in COMPONENTS:
        raise ValueError(f"unknown component {component!r}; add it to tests/components.py COMPONENTS")
    return pytest.mark.needs(component, why_not or "")


def require_module(component: str, module: str) -> ModuleType:
    """`pytest.importorskip` through `require`."""
    __tracebackhide__ = True  # reports name the test, not this helper
    try:
        return importlib.import_module(module)
    except ImportError as e:
        require(component, f"cannot import {module} ({e})")
        raise  # not reached: require skipped or failed


def variant_limit(reason: str) -> NoReturn:
    """Skip: what the test checks cannot exist on this variant (no component would change it)."""
    __tracebackhide__ = True  # reports name the test, not this helper
    pytest.skip(VARIANT_LIMIT + reason)


# --------------------------------------------------------------------------- hooks
def pytest_configure(config):
    config.addinivalue_line("markers", "needs(component, why_not): see tests/components.py")
    required()  # a garbage ORCHARD_REQUIRE stops the run before anything is collected


def pytest_report_header(config):
    names = sorted(required())
    return f"{ENV}: {', '.join(names) if names else '(none: missing components skip)'}" + \
        (" [strict: only variant limits may skip]" if strict() else "")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    for mark in item.iter_markers("needs"):
        require(*mark.args)


def _foreign_skip(reason: str) -> str:
    return (f"{ENV}=all: a skip that is neither a component check (tests/components.py) nor a "
            f"variant limit: {reason}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if strict() and rep.skipped and not hasattr(rep, "wasxfail") and isinstance(rep.longrepr, tuple):
        reason = rep.longrepr[2]
        if VARIANT_LIMIT not in reason:
            rep.outcome, rep.longrepr = "failed", _foreign_skip(reason)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    rep = outcome.get_result()
    if strict() and rep.skipped:
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        rep.outcome, rep.longrepr = "failed", _foreign_skip(reason)
