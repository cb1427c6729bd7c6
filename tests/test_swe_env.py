"""Orchard/SWE-v0 and the env core, on real local sandboxes with real task repositories."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import subprocess
import sys

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import orchard_gym  # noqa: F401 - registers the env ids
from conftest import REPO, needs, zygote_agent_pid
from orchard_gym import AsyncSandboxClient
from orchard_gym.envs.rollout import run_episodes
from orchard_gym.envs.swe.env import SWEEnv
from orchard_gym.envs.swe.tasks import load_tasks
from orchard_gym.policies import OraclePolicy

TASKS = load_tasks("builtin")
FAST = ["semver-3.0.2", "parse-1.20.1", "h11-0.16.0", "pathspec-0.12.1"]


@pytest.fixture
def env(local_root):
    e = gym.make("Orchard/SWE-v0", backend={"type": "local", "root": str(local_root)}, max_steps=20)
    yield e
    e.close()


def bash(command: str) -> dict:
    return {"name": "bash", "arguments": {"command": command}}


def edit(**arguments) -> dict:
    return {"name": "str_replace_editor", "arguments": arguments}


def test_builtin_tasks_are_real_and_complete():
    assert len(TASKS) >= 8
    for task in TASKS.values():
        assert task.source_archive.exists() and task.patch.startswith("diff --git")
        assert task.test_patch.startswith("diff --git") and task.FAIL_TO_PASS and task.test_cmd
        assert "\n" in task.problem_statement.strip()


def test_check_env_passes(env):
    check_env(env.unwrapped, skip_render_check=True)


def test_reset_returns_task_text_tools_and_ids(env):
    obs, info = env.reset(seed=1, options={"task_id": "semver-3.0.2"})
    assert env.observation_space.contains(obs) and "<issue>" in obs
    assert TASKS["semver-3.0.2"].problem_statement.strip()[:60] in obs
    assert info["task_id"] == "semver-3.0.2" and info["sandbox_id"]
    assert {t["function"]["name"] for t in info["tools"]} == {"bash", "str_replace_editor", "submit"}
    assert info["tools"][0]["function"]["parameters"]["required"] == ["command"]
    with pytest.raises(gym.error.Error, match="unknown task_id"):
        env.reset(options={"task_id": "no-such-task"})


@functools.cache
def swe_images_missing() -> str | None:
    """Why the docker variant cannot run here, or None when it can."""
    from conftest import docker_engine

    gateway, why_not = docker_engine()
    if gateway is None:
        return why_not
    missing = [t.image for t in TASKS.values()
               if subprocess.run(["podman", "image", "exists", t.image], capture_output=True).returncode != 0]
    return f"SWE images missing (python scripts/build_swe_images.py): {missing}" if missing else None


BACKENDS = [
    pytest.param("local", id="local"),
    pytest.param("docker", id="docker", marks=[pytest.mark.docker, needs(
        "swe-images", swe_images_missing())]),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("task_id", sorted(TASKS))
def test_gold_resolves_and_nothing_else_does(local_root, task_id, backend):
    """Every built-in task: gold patch -> 1.0, no change -> 0.0, test patch alone -> 0.0 (the
    last on the local backend only: grading is the same code on both, the image is what the
    docker variant checks, and a third docker episode per task costs CI about a minute)."""
    task = TASKS[task_id]
    config = {"type": "local", "root": str(local_root)} if backend == "local" else {"type": "docker"}

    async def episode(actions):
        async with AsyncSandboxClient(config) as client:
            env = SWEEnv(client=client)
            await env.areset(options={"task_id": task_id})
            for action in actions:
                obs, reward, terminated, truncated, info = await env.astep(action)
            await env.aclose()
            assert terminated and not truncated
            return reward, info["report"]

    def apply(patch):
        return bash(f"git apply <<'EOF_PATCH'\n{patch}\nEOF_PATCH")

    async def all_episodes():
        runs = [episode([apply(task.patch), {"name": "submit"}]), episode([{"name": "submit"}])]
        if backend == "local":
            runs.append(episode([apply(task.test_patch), {"name": "submit"}]))
        return await asyncio.gather(*runs)

    (gold, gold_report), (none, _), *tests_only = asyncio.run(all_episodes())
    assert gold == 1.0 and gold_report["resolved"], gold_report
    assert sorted(gold_report["tests_status"]["FAIL_TO_PASS"]["success"]) == sorted(task.FAIL_TO_PASS)
    # no false positive of the tamper defence: nothing in the scan, and the verdict run agreed
    assert gold_report["tampering"] == [] and gold_report["verdicts"]["status"] == "RESOLVED_FULL", gold_report
    assert none == 0.0
    assert len(tests_only) == (backend == "local")
    for reward, report in tests_only:
        assert reward == 0.0 and report["tests_status"]["FAIL_TO_PASS"]["failure"]


@pytest.mark.parametrize(
    "action,expect",
    [
        ("just some words", "no action found"),
        ("{not json", "does not parse"),
        ('{"name": "bash", "arguments": "{bad"}', "not valid JSON"),
        ({"name": "rm_rf"}, "unknown tool"),
        ({"name": "bash", "arguments": {}}, "command"),
        ({"name": "bash", "arguments": {"command": 5}}, "command"),
        ({"name": "bash", "arguments": {"command": "ls", "extra": 1}}, "extra"),
        ({"name": "bash", "arguments": []}, "JSON object"),
        ({"arguments": {"command": "ls"}}, '"name"'),
        ("```bash\nls\n```\n```bash\npwd\n```", "exactly one"),
        ("```bash\n\n```", "empty"),
        (None, "unsupported action"),
        (b"bytes", "unsupported action"),
        (edit(command="explode", path="x"), "command"),
        (edit(command="view", path="missing.py"), "does not exist"),
        (edit(command="str_replace", path="README.rst", old_str="no such text anywhere"), "did not appear"),
        (edit(command="insert", path="README.rst", insert_line=10**6, new_str="x"), "insert_line"),
        (edit(command="undo_edit", path="README.rst"), "No edit history"),
        (edit(command="create", path="README.rst", file_text="x"), "already exists"),
    ],
)
def test_malformed_actions_become_observations(env, action, expect):
    env.reset(options={"task_id": "semver-3.0.2"})
    obs, reward, terminated, truncated, info = env.step(action)
    assert obs.startswith("Error:") and expect in obs, obs
    assert (reward, terminated, truncated) == (0.0, False, False) and info["action_error"]
    obs, *_ = env.step(bash("echo still alive"))
    assert obs == "still alive\n"


def test_random_actions_from_the_space_never_raise(env):
    env.reset(seed=3, options={"task_id": "parse-1.20.1"})
    env.action_space.seed(3)
    for _ in range(15):
        action = env.action_space.sample()
        assert env.action_space.contains(action)
        obs, reward, terminated, truncated, info = env.step(action)
        assert env.observation_space.contains(obs)
        if terminated or truncated:
            break
    assert env.unwrapped.sandbox.record.status == "running"


def test_action_forms_harnesses_emit(env):
    env.reset(options={"task_id": "semver-3.0.2"})
    forms = [
        bash("echo dict"),
        json.dumps(bash("echo json-string")),
        {"type": "function", "id": "call_1", "function": {"name": "bash", "arguments": '{"command": "echo openai"}'}},
        'Let me look.\n<tool_call>{"name": "bash", "arguments": {"command": "echo hermes"}}</tool_call>',
        "THOUGHT: list files\n\n```bash\necho mini-swe\n```",
    ]
    outputs = [env.step(a)[0] for a in forms]
    assert outputs == ["dict\n", "json-string\n", "openai\n", "hermes\n", "mini-swe\n"]


def test_editor_semantics(env):
    env.reset(options={"task_id": "semver-3.0.2"})
    obs = env.step(edit(command="create", path="notes/a.py", file_text="one\ntwo\ntwo\nthree"))[0]
    assert "created" in obs
    view = env.step(edit(command="view", path="notes/a.py", view_range=[2, 3]))[0]
    assert "     2\ttwo\n     3\ttwo" in view and "one" not in view
    assert "Multiple occurrences" in env.step(edit(command="str_replace", path="notes/a.py", old_str="two",
                                                   new_str="2"))[0]
    obs = env.step(edit(command="str_replace", path="notes/a.py", old_str="one\ntwo", new_str="1\n2"))[0]
    assert "has been edited" in obs and "     1\t1" in obs
    env.step(edit(command="insert", path="notes/a.py", insert_line=0, new_str="zero"))
    assert env.step(bash("cat notes/a.py"))[0] == "zero\n1\n2\ntwo\nthree"
    env.step(edit(command="undo_edit", path="notes/a.py"))
    env.step(edit(command="undo_edit", path="notes/a.py"))
    assert env.step(bash("cat notes/a.py"))[0] == "one\ntwo\ntwo\nthree"
    env.step(edit(command="undo_edit", path="notes/a.py"))  # undoes the create
    assert "No such file" in env.step(bash("cat notes/a.py"))[0]
    listing = env.step(edit(command="view", path="."))[0]
    assert "src" in listing and ".git" not in listing


def test_trajectory_joins_both_sides_with_fingerprints(env):
    env.reset(options={"task_id": "semver-3.0.2"})
    env.step(bash("ls"))
    env.step(bash("echo change >> README.rst"))
    env.step(bash("exit 3"))
    obs, reward, terminated, truncated, info = env.step({"name": "submit"})
    t = env.unwrapped.trajectory
    assert [turn.tool for turn in t.turns] == ["bash", "bash", "bash", "submit"]
    assert t.turns[0].command == "ls" and t.turns[2].exit_code == 3 and "[exit code 3]" in t.turns[2].observation
    assert t.turns[0].fingerprint and t.turns[0].fingerprint != t.turns[1].fingerprint
    assert t.turns[1].fingerprint == t.turns[2].fingerprint  # a failing command changed nothing
    assert terminated and t.terminated and t.reward == reward == 0.0 and t.ok
    assert "README.rst" in info["report"]["patch"]


def test_step_and_time_budgets_truncate_and_grade(local_root):
    env = gym.make("Orchard/SWE-v0", backend={"type": "local", "root": str(local_root)}, max_steps=2)
    env.reset(options={"task_id": "semver-3.0.2"})
    assert env.step(bash("true"))[3] is False
    obs, reward, terminated, truncated, info = env.step(bash("true"))
    assert truncated and not terminated and "step budget" in info["truncation"] and "report" in info
    with pytest.raises(gym.error.ResetNeeded):
        env.step(bash("true"))
    env.close()
    timed = gym.make("Orchard/SWE-v0", backend={"type": "local", "root": str(local_root)}, max_seconds=0.5)
    timed.reset(options={"task_id": "semver-3.0.2"})
    obs, reward, terminated, truncated, info = timed.step(bash("sleep 1"))
    assert truncated and "wall-clock" in info["truncation"]
    timed.close()


def test_dead_sandbox_ends_episode_with_error(env, local_root):
    env.reset(options={"task_id": "semver-3.0.2"})
    action = bash("kill -9 $PPID")  # the agent dies under the policy's own command ...
    pid = zygote_agent_pid(local_root, env.unwrapped.sandbox.sandbox_id)
    if pid is not None:  # ... unless it is its namespace's init (the zygote's): then from the host
        os.kill(pid, signal.SIGKILL)
        action = bash("echo after")
    obs, reward, terminated, truncated, info = env.step(action)
    assert truncated and not terminated and info["error"]
    assert env.unwrapped.trajectory.error and not env.unwrapped.trajectory.ok
    env.reset(options={"task_id": "semver-3.0.2"})  # and the env recovers on reset
    assert env.step(bash("echo back"))[0] == "back\n"


def test_make_vec_async_with_four_envs(local_root):
    envs = gym.make_vec("Orchard/SWE-v0", num_envs=4, vectorization_mode="async",
                        backend={"type": "local", "root": str(local_root)})
    try:
        obs, info = envs.reset(seed=0, options={"task_id": "semver-3.0.2"})
        assert len(obs) == 4 and all("<issue>" in o for o in obs)
        assert len(set(info["sandbox_id"])) == 4
        obs, rewards, terminated, truncated, info = envs.step(tuple(bash(f"echo env-{i}") for i in range(4)))
        assert list(obs) == [f"env-{i}\n" for i in range(4)]
        assert not any(terminated) and not any(truncated)
    finally:
        envs.close()


def test_async_runner_sixteen_concurrent_episodes(local_root):
    async def main():
        async with AsyncSandboxClient({"type": "local", "root": str(local_root)}) as client:
            schedule = [FAST[i % len(FAST)] for i in range(16)]
            return await run_episodes(lambda c: SWEEnv(client=c), OraclePolicy(), schedule, concurrency=16,
                                      client=client, progress=False, record_messages=True)

    results = asyncio.run(main())
    assert [t.task_id for t in results] == [FAST[i % len(FAST)] for i in range(16)]
    assert all(t.ok and t.reward == 1.0 and t.steps == 2 for t in results), [t.error for t in results]
    assert len({t.sandbox_id for t in results}) == 16
    first = results[0].turns[0]
    assert first.command.startswith("git apply") and first.exit_code == 0 and first.fingerprint
    assert first.messages[0]["role"] == "system" and "<issue>" in first.messages[1]["content"]
    assert results[0].turns[1].messages[-1]["role"] == "tool"  # the tool reply joined the conversation


def test_orchard_eval_cli(tmp_path, local_root):
    out = tmp_path / "traj.jsonl"
    r = subprocess.run([sys.executable, "-m", "orchard_gym.cli", "eval", "--policy", "oracle", "--task-id",
                        "semver-3.0.2", "--task-id", "parse-1.20.1", "-n", "3", "--concurrency", "3", "--out",
                        str(out)], capture_output=True, text=True, cwd=REPO, timeout=300,
                       env={**__import__("os").environ, "ORCHARD_LOCAL_ROOT": str(local_root)})
    assert r.returncode == 0, r.stderr
    assert "resolved 3/3 (100.0%)" in r.stdout
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 3 and all(row["reward"] == 1.0 for row in lines)
    bad = subprocess.run([sys.executable, "-m", "orchard_gym.cli", "eval", "--policy", "telepathy"],
                         capture_output=True, text=True, cwd=REPO)
    assert bad.returncode != 0 and "--policy" in bad.stderr and "Traceback" not in bad.stderr


def test_orchard_eval_drives_an_openai_compatible_endpoint(tmp_path, local_root):
    """The openai: policy against a real HTTP server speaking the API (the proxy's test stub,
    whose `stub-tool` model calls the first tool with made-up arguments)."""
    import os

    from orchard_gym.wrappers.proxy.stub import StubUpstream

    stub = StubUpstream().start()
    try:
        out = tmp_path / "openai.jsonl"
        r = subprocess.run([sys.executable, "-m", "orchard_gym.cli", "eval", "--policy", f"openai:{stub.url}#stub-tool",
                            "--task-id", "semver-3.0.2", "--max-steps", "2", "--out", str(out)],
                           capture_output=True, text=True, cwd=REPO, timeout=300,
                           env={**os.environ, "ORCHARD_LOCAL_ROOT": str(local_root)})
    finally:
        stub.stop()
    assert r.returncode == 0, r.stderr
    assert "resolved 0/1" in r.stdout and "infrastructure errors 0" in r.stdout
    trajectory = json.loads(out.read_text())
    assert trajectory["truncated"] and len(trajectory["turns"]) == 2
    first = trajectory["turns"][0]
    assert first["tool"] == "bash" and "bad arguments for bash" in first["error"]  # the model's call, refused
    assert first["action"]["id"]  # the tool call id travelled from the model's answer
