"""ORCHARD_REQUIRE (tests/components.py) seen from outside: child pytest runs with a component
made unavailable (Podman's Docker API pointed at a socket that does not exist) skip without
it and fail with it, on a small test file and on the real docker backend suite."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from components import COMPONENTS

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
NO_ENGINE = "unix:///nonexistent/podman.sock"


def child(*args: str, require: str | None, cwd: Path, autoload: bool = False,
          **env: str) -> tuple[int, str, dict[str, int]]:
    """Run pytest in a subprocess; (exit code, output, counts from its summary line). Without
    `autoload` the child loads no installed plugins (the small files need none: faster)."""
    child_env = {k: v for k, v in os.environ.items() if k not in ("ORCHARD_REQUIRE", "PYTEST_DISABLE_PLUGIN_AUTOLOAD")}
    child_env.update(env, PYTHONPATH=str(TESTS))
    if not autoload:
        child_env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    if require is not None:
        child_env["ORCHARD_REQUIRE"] = require
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA", *args],
                          cwd=cwd, env=child_env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    counts = {word.rstrip("s"): int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?)", summary)}
    return proc.returncode, out, counts


def write(tmp_path: Path, name: str, source: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


# A real test of a real component: the engine answers a ping. `-p conftest` loads
# tests/conftest.py (its probes and hooks) into a run outside tests/.
ENGINE_TEST = """
    import docker
    from conftest import docker_engine, needs
    from orchard_gym.backends.docker import default_base_url

    gateway, why_not = docker_engine()

    @needs("docker", why_not)
    def test_engine_answers():
        assert docker.DockerClient(base_url=default_base_url(), timeout=10).ping()
"""


@pytest.mark.parametrize("require, rc, outcome", [
    (None, 0, "skipped"),            # nothing required: a missing engine skips
    ("redis,train", 0, "skipped"),   # other components required: still a skip
    ("docker", 1, "error"),          # named: the test fails, with the reason
    ("all", 1, "error"),
    (" bwrap , docker ", 1, "error"),
])
def test_a_missing_engine_skips_unless_required(tmp_path, require, rc, outcome):
    path = write(tmp_path, "test_engine.py", ENGINE_TEST)
    code, out, counts = child("-p", "conftest", str(path), require=require, cwd=tmp_path, DOCKER_HOST=NO_ENGINE)
    assert (code, counts) == (rc, {outcome: 1}), out
    assert NO_ENGINE in out  # the reason names what is missing
    if outcome == "error":
        assert "ORCHARD_REQUIRE requires docker" in out and "test_engine_answers" in out
    else:
        assert "SKIPPED" in out and "needs docker" in out


def test_a_missing_module_fails_collection_when_required(tmp_path):
    path = write(tmp_path, "test_needs_module.py", """
        from components import require_module

        require_module("train", "orchard_no_such_module")

        def test_never_runs():
            assert False
    """)
    code, out, counts = child("-p", "components", str(path), require=None, cwd=tmp_path)
    assert (code, counts) == (5, {"skipped": 1}), out  # 5: pytest collected no test to run
    assert "needs train: cannot import orchard_no_such_module" in out
    code, out, counts = child("-p", "components", str(path), require="train", cwd=tmp_path)
    assert code == 2 and counts == {"error": 1}, out  # a collection error: nothing in the module runs
    assert "ORCHARD_REQUIRE requires train" in out and "orchard_no_such_module" in out


SKIPS = """
    import pytest
    from components import variant_limit

    def test_bare_skip():
        pytest.skip("someone forgot the helper")

    @pytest.mark.skipif(True, reason="a raw skipif")
    def test_raw_skipif():
        pass

    def test_variant_limit():
        variant_limit("this variant has no such thing")

    def test_passes():
        assert 1 + 1 == 2
"""


def test_require_all_fails_every_skip_but_variant_limits(tmp_path):
    path = write(tmp_path, "test_skips.py", SKIPS)
    code, out, counts = child("-p", "components", str(path), require="all", cwd=tmp_path)
    # the bare skip fails in its call, the skipif in its setup (an error)
    assert (code, counts) == (1, {"failed": 1, "error": 1, "passed": 1, "skipped": 1}), out
    assert "FAILED" in out and "someone forgot the helper" in out and "a raw skipif" in out
    assert re.search(r"SKIPPED .*variant limit: this variant has no such thing", out), out
    # a component list is not `all`: foreign skips stay skips
    code, out, counts = child("-p", "components", str(path), require="docker", cwd=tmp_path)
    assert (code, counts) == (0, {"passed": 1, "skipped": 3}), out


def test_require_all_fails_a_module_level_importorskip(tmp_path):
    path = write(tmp_path, "test_importorskip.py", """
        import pytest

        pytest.importorskip("orchard_no_such_module")

        def test_never_runs():
            pass
    """)
    code, out, counts = child("-p", "components", str(path), require="all", cwd=tmp_path)
    assert code == 2 and counts == {"error": 1} and "orchard_no_such_module" in out, out


@pytest.mark.parametrize("garbage", ["dokker", "docker,,nope", "ALL", "docker;redis"])
def test_garbage_orchard_require_stops_the_run(tmp_path, garbage):
    path = write(tmp_path, "test_ok.py", "def test_ok():\n    pass\n")
    code, out, counts = child("-p", "components", str(path), require=garbage, cwd=tmp_path)
    assert code == 4 and counts == {}, out  # pytest's usage error: nothing ran
    assert "ORCHARD_REQUIRE: unknown component" in out
    assert f"known: all, {', '.join(sorted(COMPONENTS))}" in out  # every name, sorted


def test_helpers_refuse_unknown_component_names():
    from components import needs, require

    with pytest.raises(ValueError, match="unknown component 'podman'"):
        needs("podman", "")
    with pytest.raises(ValueError, match="unknown component 'podman'"):
        require("podman", "")


def test_the_docker_backend_suite_fails_without_its_engine_only_when_required(tmp_path):
    """The real slice: tests/test_docker_backend.py with Podman's API unreachable."""
    suite = str(REPO / "tests" / "test_docker_backend.py")
    code, out, counts = child(suite, require=None, cwd=REPO, autoload=True, DOCKER_HOST=NO_ENGINE)
    assert code == 0 and counts.get("skipped", 0) > 0 and not counts.get("failed") and not counts.get("error"), out
    code, out, counts = child(suite, require="docker", cwd=REPO, autoload=True, DOCKER_HOST=NO_ENGINE)
    assert code == 1 and counts.get("error", 0) > 0 and not counts.get("passed"), out
    assert "ORCHARD_REQUIRE requires docker" in out and NO_ENGINE in out


@pytest.mark.parametrize("pytest_rc, rc", [(0, 0), (1, 1), (2, 2), (5, 1)])
def test_ci_run_treats_no_tests_collected_as_a_failure(tmp_path, pytest_rc, rc):
    """.ci/run as CI runs it, over a scripts/test.sh that ends the way pytest would."""
    (tmp_path / ".ci").mkdir()
    (tmp_path / "scripts").mkdir()
    (tmp_path / ".ci" / "run").write_text((REPO / ".ci" / "run").read_text())
    (tmp_path / "scripts" / "test.sh").write_text(f"exit {pytest_rc}\n")
    proc = subprocess.run(["bash", str(tmp_path / ".ci" / "run")], capture_output=True, text=True, timeout=30)
    assert proc.returncode == rc, proc.stderr
    assert ("collected no tests" in proc.stderr) is (pytest_rc == 5)
