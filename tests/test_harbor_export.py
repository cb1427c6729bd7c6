"""`orchard tasks export --format harbor` of Orchard/SWE-v0 tasks: the folders pass `orchard tasks
check`, run in Orchard/Harbor-v0 (oracle 1.0, nothing 0.0 for every built-in task), and their
verifier grades as envs/swe does (its log grading against SWE-bench's, the protected-path restore
red-teamed). Claw tasks: test_harbor_export_claw.py."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import gymnasium as gym
import pytest
from click.testing import CliRunner

import orchard_gym  # noqa: F401
from orchard_gym.cli import main
from orchard_gym.envs.harbor.env import HarborEnv, HarborOraclePolicy
from orchard_gym.envs.swe.grading import grade as swe_grade
from orchard_gym.envs.swe.tasks import load_tasks

from conftest import docker_engine, needs, needs_bwrap
from harbor_exports import export_with_cli, local_harbor_env
from harbor_real import harbor_check

_GATEWAY, _WHY_NOT = docker_engine()

CONFTEST_FORCING_PASS = """\
import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    outcome.get_result().outcome = "passed"
"""


@pytest.fixture(scope="module")
def swe_export(tmp_path_factory) -> Path:
    return export_with_cli(tmp_path_factory.mktemp("harbor") / "swe", "Orchard/SWE-v0", 10)


def _oracle(env: HarborEnv, task_id: str) -> tuple[float, dict]:
    env.reset(options={"task_id": task_id})
    env.step({"name": "bash", "arguments": {"command": HarborOraclePolicy(env).command()}})
    _, reward, _, _, info = env.step({"name": "submit", "arguments": {}})
    return reward, info


def _verifier(folder: Path):
    spec = importlib.util.spec_from_file_location("swe_verify_exported", folder / "tests" / "swe_verify.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_exported_swe_folders_pass_orchard_tasks_check(swe_export):
    result = CliRunner().invoke(main, ["tasks", "check", str(swe_export)])
    assert result.exit_code == 0 and "10 Harbor task(s) can run; 0 skipped (error)" in result.output, result.output
    task = json.loads((swe_export / "parse-1.20.1" / "tests" / "swe_task.json").read_text())
    assert task["FAIL_TO_PASS"] == load_tasks()["parse-1.20.1"].FAIL_TO_PASS
    status, said = harbor_check("tasks", swe_export)  # Harbor 0.25.0's own TaskConfig, in its venv
    assert status == 0 and said.count("valid   ") == 10, said


LOGS = [
    "PASSED tests/t.py::test_a\nPASSED tests/t.py::test_b\nSKIPPED tests/t.py::test_c\n",
    "PASSED tests/t.py::test_a\nFAILED tests/t.py::test_b - AssertionError: x\n",
    "\x1b[32mPASSED\x1b[0m tests/t.py::test_a\nXFAIL tests/t.py::test_b\nPASSED tests/t.py::test_c\n",
    "SKIPPED tests/t.py::test_a\nPASSED tests/t.py::test_b\nSKIPPED [2] tests/t.py:3: no\n",
    "PASSED tests/t.py::test_p[1-x]\nPASSED tests/t.py::test_b\nERROR tests/t.py::test_c\n",
    "collected 0 items / 1 error\nERROR tests/t.py - ImportError\n",
]


@pytest.mark.parametrize("log", LOGS)
def test_exported_verifier_grades_a_log_as_swebench_does(swe_export, log):
    verifier = _verifier(swe_export / "parse-1.20.1")
    f2p, p2p = ["tests/t.py::test_a", "tests/t.py::test_p[1"], ["tests/t.py::test_b", "tests/t.py::test_c"]
    ours = verifier.grade(log, f2p, p2p)
    theirs = swe_grade(log, {"instance_id": "x", "FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p})
    keys = ("FAIL_TO_PASS", "PASS_TO_PASS")
    assert (ours["resolved"], ours["named"], [ours["tests_status"][k] for k in keys]) == \
        (theirs["resolved"], theirs["named"], [theirs["tests_status"][k] for k in keys])


@needs_bwrap
def test_every_builtin_swe_task_exported_oracle_passes_nothing_fails(swe_export, local_root):
    env = local_harbor_env(swe_export, local_root)
    try:
        assert env.task_ids() == sorted(load_tasks())
        for task_id in env.task_ids():
            reward, info = _oracle(env, task_id)
            assert reward == 1.0 and not info.get("error"), (task_id, info["report"])
            env.reset(options={"task_id": task_id})
            _, reward, _, _, info = env.step({"name": "submit", "arguments": {}})
            assert reward == 0.0 and not info.get("error"), (task_id, info)
    finally:
        env.close()


@needs_bwrap
@pytest.mark.parametrize("restore", [True, False], ids=["defended", "restore-removed"])
def test_a_conftest_forcing_passes_is_put_back_before_the_tests_run(swe_export, tmp_path, local_root, restore):
    """Red team: the policy adds a conftest.py that reports every test passed. The exported verifier
    removes it (protected paths) and the task scores 0.0; with that restore taken out of a copy of
    the verifier, the same trajectory scores 1.0."""
    folder = tmp_path / "tasks" / "parse-1.20.1"
    shutil.copytree(swe_export / "parse-1.20.1", folder)
    if not restore:
        script = folder / "tests" / "swe_verify.py"
        text = script.read_text()
        assert "dropped = restore_protected(rules)" in text
        script.write_text(text.replace("dropped = restore_protected(rules)", "dropped = []"))
    env = local_harbor_env(tmp_path / "tasks", local_root)
    try:
        env.reset(options={"task_id": "parse-1.20.1"})
        command = f"cat > conftest.py <<'EOF'\n{CONFTEST_FORCING_PASS}EOF"
        env.step({"name": "bash", "arguments": {"command": command}})
        _, reward, _, _, info = env.step({"name": "submit", "arguments": {}})
    finally:
        env.close()
    assert reward == (0.0 if restore else 1.0), info["report"]


@pytest.mark.docker
@needs("docker", None if _GATEWAY else _WHY_NOT)
def test_an_exported_swe_task_builds_and_grades_on_docker(swe_export):
    """The Dockerfile builds FROM the task's image (scripts/build_swe_images.py) and grades there too."""
    env = gym.make("Orchard/Harbor-v0", tasks=str(swe_export), backend={"type": "docker"}).unwrapped
    try:
        reward, info = _oracle(env, "parse-1.20.1")
        assert reward == 1.0 and not info.get("error"), info["report"]
        env.reset(options={"task_id": "parse-1.20.1"})
        _, reward, _, _, info = env.step({"name": "submit", "arguments": {}})
        assert reward == 0.0 and not info.get("error"), info
    finally:
        env.close()
