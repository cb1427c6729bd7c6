"""Harbor task folders through Orchard/Harbor-v0 (envs/harbor/), end to end with the tasks' own
verifiers: local (bwrap, the Dockerfile's steps as set-up) and docker (an image built from the
task's Dockerfile)."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import gymnasium as gym
import pytest

import orchard_gym  # noqa: F401
from orchard_gym.envs.harbor.dockerfile import pip_packages
from orchard_gym.envs.harbor.env import HarborEnv, HarborOraclePolicy, load_harbor

from conftest import docker_engine, needs, needs_bwrap
from harbor_real import harbor_check

DATA = Path(__file__).parent / "data" / "harbor"
_GATEWAY, _WHY_NOT = docker_engine()


def backends():
    return [
        pytest.param("local", "sum-numbers", id="local-bwrap",
                     marks=needs_bwrap),
        pytest.param("docker", "sum-numbers", id="docker",
                     marks=[pytest.mark.docker, needs("docker", None if _GATEWAY else _WHY_NOT)]),
    ]


def _config(kind: str, root: Path) -> dict:
    return {"type": "local", "isolation": "bwrap", "root": str(root)} if kind == "local" else {"type": "docker"}


def make(kind: str, root: Path, tasks: Path | str = DATA) -> HarborEnv:
    env = gym.make("Orchard/Harbor-v0", tasks=str(tasks), backend=_config(kind, root)).unwrapped
    assert isinstance(env, HarborEnv)
    return env


def play_oracle(env: HarborEnv):
    action = asyncio.run(HarborOraclePolicy().bind(env)([], []))
    obs, reward, term, trunc, info = env.step(action)
    assert info["exit_code"] == 0, obs
    return env.step({"name": "submit", "arguments": {}})


def bash(env: HarborEnv, command: str) -> str:
    obs, _, _, _, info = env.step({"name": "bash", "arguments": {"command": command}})
    assert info["exit_code"] == 0, obs
    return obs


@pytest.mark.parametrize("kind,task_id", backends())
def test_oracle_passes_and_doing_nothing_fails(kind, task_id, local_root):
    env = make(kind, local_root)
    try:
        obs, info = env.reset(options={"task_id": task_id})
        instruction = (DATA / task_id / "instruction.md").read_text()
        # on local, /app is the sandbox's working directory: the instruction says so relatively
        assert obs == (instruction.replace("/app/", "") if kind == "local" else instruction)
        assert [t["function"]["name"] for t in info["tools"]] == ["bash", "submit"]
        assert env.max_seconds == load_harbor(str(DATA / task_id))[task_id].agent_timeout  # task.toml [agent]
        _, reward, term, _, info = play_oracle(env)
        assert (reward, term, info["report"]["reward"]) == (1.0, True, 1.0)
        assert env.trajectory.ok

        env.reset(options={"task_id": task_id})
        _, reward, term, _, info = env.step({"name": "submit", "arguments": {}})
        assert (reward, term) == (0.0, True) and env.trajectory.ok
    finally:
        env.close()


# the red-team tests of the verifier (planted files, a background forger, stdlib shadowing, the
# task folder read from inside) are in test_security_harbor.py


def _with_verifier(tmp_path: Path, task_id: str, test_sh: str) -> Path:
    folder = tmp_path / "tasks" / task_id
    shutil.copytree(DATA / task_id, folder)
    (folder / "tests" / "test.sh").write_text(test_sh)
    return folder.parent


@pytest.mark.parametrize("kind,task_id", backends())
@pytest.mark.parametrize("verifier", ["mkdir -p /logs/verifier; echo banana > /logs/verifier/reward.txt",
                                      "mkdir -p /logs/verifier; echo nan > /logs/verifier/reward.txt",
                                      "echo the verifier forgot the reward file"])
def test_a_garbage_or_missing_reward_errors_the_trajectory(kind, task_id, verifier, tmp_path, local_root):
    env = make(kind, local_root, _with_verifier(tmp_path, task_id, verifier + "\n"))
    try:
        env.reset(options={"task_id": task_id})
        _, reward, term, trunc, info = play_oracle(env)
        assert (reward, term, trunc) == (0.0, True, False)
        assert info["report"]["error_kind"] == "grading" and "reward" in info["report"]["error"]
        assert info["error"] == env.trajectory.error == f"grading: {info['report']['error']}"
        assert not env.trajectory.ok
        assert env.trajectory.error_kind == "grading"
    finally:
        env.close()


def test_local_needs_bwrap_and_claw_v0_still_makes_harbor_envs(local_root):
    with pytest.warns(DeprecationWarning):
        import importlib

        import orchard_gym.envs.claw.harbor as old
        importlib.reload(old)  # the old import path still works, with a warning
    assert old.HarborEnv is HarborEnv
    plain = gym.make("Orchard/Claw-v0", tasks=f"harbor:{DATA}",
                     backend={"type": "local", "isolation": "none", "root": str(local_root)}).unwrapped
    assert isinstance(plain, HarborEnv)
    try:
        with pytest.raises(gym.error.Error, match="isolation='bwrap'"):
            plain.reset(options={"task_id": "six-version"})
    finally:
        plain.close()


def test_other_backends_are_refused_clearly():
    env = gym.make("Orchard/Claw-v0", tasks=f"harbor:{DATA}", base_url="http://127.0.0.1:9", api_key="k").unwrapped
    try:
        with pytest.raises(gym.error.Error, match="the local, docker or kubernetes backend in-process, not an orchestrator"):
            env.reset(options={"task_id": "sum-numbers"})
    finally:
        env.close()


def test_pip_only_run_lines():
    assert pip_packages("pip install six 'attrs==23.1'") == ["six", "attrs==23.1"]
    assert pip_packages("python3 -m pip install --no-cache-dir six") == ["six"]
    for command in ("apt-get install -y jq", "pip install -r req.txt", "pip install six && rm -rf /"):
        assert pip_packages(command) is None, command


def test_bad_task_folders_get_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="no Harbor tasks at"):
        load_harbor(f"harbor:{tmp_path}/nowhere")
    with pytest.raises(ValueError, match="no Harbor task folders"):
        load_harbor(f"harbor:{tmp_path}")
    assert load_harbor(f"harbor:{DATA}/sum-numbers")["sum-numbers"].agent_timeout == 300.0
    task = tmp_path / "t"
    shutil.copytree(DATA / "sum-numbers", task)
    (task / "tests" / "test.sh").unlink()
    with pytest.raises(ValueError, match="tests/test.sh is missing"):
        load_harbor(f"harbor:{task}")
    shutil.copy(DATA / "sum-numbers" / "tests" / "test.sh", task / "tests" / "test.sh")
    (task / "task.toml").write_text("[verifier\ntimeout_sec = ")
    with pytest.raises(ValueError, match="not valid TOML"):
        load_harbor(f"harbor:{task}")
    (task / "task.toml").write_text("[verifier]\ntimeout_sec = -3\n")
    with pytest.raises(ValueError, match="positive number"):
        load_harbor(f"harbor:{task}")
    (task / "task.toml").write_bytes(b"\xff\xfe")
    with pytest.raises(ValueError, match="not valid TOML"):
        gym.make("Orchard/Harbor-v0", tasks=str(task))


@pytest.mark.docker
@needs("docker", None if _GATEWAY else _WHY_NOT)
def test_the_image_is_cached_by_the_environment_folders_content(tmp_path):
    import docker

    from orchard_gym.backends.docker import default_base_url
    from orchard_gym.envs.harbor.env import ensure_image

    shutil.copytree(DATA / "sum-numbers", tmp_path / "sum-numbers")
    task = load_harbor(f"harbor:{tmp_path / 'sum-numbers'}")["sum-numbers"]
    client = docker.DockerClient(base_url=default_base_url())
    try:
        tag = ensure_image(task, default_base_url())
        assert tag.startswith("localhost/orchard/harbor-sum-numbers:") and len(tag.rsplit(":", 1)[1]) == 12
        first = client.images.get(tag).id
        assert ensure_image(task, default_base_url()) == tag and client.images.get(tag).id == first
        dockerfile = tmp_path / "sum-numbers" / "environment" / "Dockerfile"
        dockerfile.write_text(dockerfile.read_text() + "RUN echo changed > /app/changed.txt\n")
        changed = load_harbor(f"harbor:{tmp_path / 'sum-numbers'}")["sum-numbers"]
        new_tag = ensure_image(changed, default_base_url())
        assert new_tag != tag and client.images.get(new_tag).id != first
        client.images.remove(new_tag)
        (tmp_path / "sum-numbers" / "environment" / "Dockerfile").write_text("FROM localhost/orchard/no-such:1\n")
        with pytest.raises(Exception, match="nothing is pulled"):
            ensure_image(load_harbor(f"harbor:{tmp_path / 'sum-numbers'}")["sum-numbers"], default_base_url())
    finally:
        client.close()


@needs_bwrap
def test_orchard_eval_plays_the_oracle_of_harbor_tasks(tmp_path, local_root):
    import json

    from click.testing import CliRunner

    from orchard_gym.cli import main

    out = tmp_path / "eval.jsonl"
    args = ["eval", "--env", "Orchard/Harbor-v0", "--tasks", str(DATA), "--task-id", "sum-numbers",
            "--policy", "oracle", "-k", "2", "--out", str(out)]
    result = CliRunner().invoke(main, args, env={"ORCHARD_LOCAL_ROOT": str(local_root)})
    assert result.exit_code == 0, result.output
    assert "pass@2 100.0%; pass^2 100.0% over 1 tasks; mean task score 1.000" in result.output
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [t["reward"] for t in lines] == [1.0, 1.0] and all(t["error"] is None for t in lines)


@needs_bwrap
def test_check_env_passes(local_root):
    from gymnasium.utils.env_checker import check_env

    env = make("local", local_root, DATA / "sum-numbers")
    try:
        check_env(env, skip_render_check=True)
    finally:
        env.close()


@needs_bwrap
def test_the_agent_time_limit_kills_a_running_command_at_the_limit(tmp_path, local_root):
    folder = tmp_path / "tasks" / "slow"
    shutil.copytree(DATA / "sum-numbers", folder)
    (folder / "task.toml").write_text('version = "1.0"\n[agent]\ntimeout_sec = 5.0\n[verifier]\ntimeout_sec = 60.0\n')
    env = make("local", local_root, folder)
    try:
        env.reset()
        started = time.monotonic()
        obs, reward, term, trunc, info = env.step(
            {"name": "bash", "arguments": {"command": "sleep 20; echo late > late.txt", "timeout": 600}})
        elapsed = time.monotonic() - started
        assert elapsed < 12, elapsed  # killed at ~5 s (plus the verifier), not after 20 s
        assert "timed out after 5s and was killed" in obs
        assert (term, trunc) == (False, True) and "wall-clock budget of 5s used up" in info["truncation"]
        assert env.trajectory.truncated and env.trajectory.ok  # graded (0.0: no answer), as Harbor does
        assert reward == 0.0 and info["report"]["reward"] == 0.0
    finally:
        env.close()



@needs_bwrap
def test_orchard_eval_nothing_policy_and_tasks_check(tmp_path, local_root):
    import json

    from click.testing import CliRunner

    from orchard_gym.cli import main

    corpus = DATA / "corpus"
    out = tmp_path / "nothing.jsonl"
    args = ["eval", "--env", "Orchard/Harbor-v0", "--tasks", str(corpus), "--task-id", "setup/env-vars",
            "--policy", "nothing", "--out", str(out)]
    result = CliRunner().invoke(main, args, env={"ORCHARD_LOCAL_ROOT": str(local_root)})
    assert result.exit_code == 0, result.output
    assert "resolved 0/1" in result.output and "mean episode time -" not in result.output
    [line] = [json.loads(line) for line in out.read_text().splitlines()]
    assert (line["reward"], line["error"], line["steps"] if "steps" in line else 1) == (0.0, None, 1)

    result = CliRunner().invoke(main, ["tasks", "check", str(corpus)])
    assert result.exit_code == 1  # malformed tasks are errors
    assert "26 Harbor task(s) can run; 10 skipped (error)" in result.output
    assert "compose/http-sidecar: warning: local backend cannot run environment/docker-compose.yaml" in result.output
    assert f"{corpus / 'malformed' / 'gpus'}: error: [environment] gpus" in result.output
    index = tmp_path / "index.jsonl"
    index.write_text(json.dumps({"path": str(corpus / "setup" / "env-vars")}) + "\n"
                     + json.dumps({"path": "nowhere", "task_id": "gone"}) + "\n")
    result = CliRunner().invoke(main, ["tasks", "check", str(index)])
    assert "1 Harbor task(s) can run; 1 skipped (error)" in result.output, result.output


@needs_bwrap
def test_toy_tasks_exported_as_harbor_folders_grade_the_same(tmp_path, local_root):
    from click.testing import CliRunner

    from orchard_gym.cli import main

    out = tmp_path / "toy-harbor"
    result = CliRunner().invoke(main, ["tasks", "export", "--format", "harbor", "--env", "Orchard/Toy-v0",
                                       "--env-kwargs", '{"num_tasks": 1}', "--out", str(out)])
    assert result.exit_code == 0 and "3 Harbor task folders" in result.output, result.output
    status, said = harbor_check("tasks", out)  # Harbor 0.25.0's own TaskConfig, in its venv
    assert status == 0 and said.count("valid   ") == 3, said
    env = make("local", local_root, out)
    toy = gym.make("Orchard/Toy-v0", num_tasks=1, backend=_config("local", local_root)).unwrapped
    try:
        assert env.task_ids() == toy.task_ids() == ["count-000", "secret-000", "write-000"]
        for task_id in env.task_ids():
            env.reset(options={"task_id": task_id})
            assert play_oracle(env)[1] == 1.0, task_id
            env.reset(options={"task_id": task_id})
            assert env.step({"name": "submit", "arguments": {}})[1] == 0.0
            toy.reset(options={"task_id": task_id})  # the same task in its own env: the same rewards
            toy.step({"name": "bash", "arguments": {"command": toy.task.solution}})
            assert toy.step({"name": "submit", "arguments": {}})[1] == 1.0
    finally:
        env.close()
        toy.close()
    # SWE tasks: tests/test_harbor_export.py
