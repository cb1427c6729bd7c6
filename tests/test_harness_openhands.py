"""OpenHands (PyPI `openhands-sdk`/`openhands-tools`, pinned; its default coding agent through
the harness's driver) as a harness: run on Debian trixie's python3.13 bundled in its venv
(wrappers/harness/python.py), in a local sandbox with no network, its model calls going
through the relay to the proxy's chat-completions door, a scripted policy as its model, on a
real built-in SWE task graded with SWE-bench's grading. Its failure modes end the episode
with a typed error. (Docker: tests/test_harness_docker.py.)"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import gymnasium as gym
import pytest

from conftest import HAS_BWRAP, WHY_NO_BWRAP, needs_bwrap, require, require_module

require_module("server", "fastapi")

import orchard_gym  # noqa: E402,F401 - registers the env ids
from orchard_gym.envs.swe.tasks import load_tasks  # noqa: E402
from orchard_gym.wrappers.proxy.openai_format import text_messages  # noqa: E402
from orchard_gym.wrappers.harness.env import HarnessError  # noqa: E402
from orchard_gym.wrappers.harness.plugins.openhands import HARNESS as OPENHANDS, VERSION  # noqa: E402

TASK = "semver-3.0.2"
GOLD = load_tasks("builtin")[TASK].patch
HARBOR = Path(__file__).parent / "data" / "harbor"


def _installed() -> str | None:
    try:
        venv = OPENHANDS.install()
    except Exception as e:  # the reason is the skip/fail message
        return f"{type(e).__name__}: {e}"
    return None if venv and (venv / "runtime" / "bin" / "python3.13").exists() else f"no python3.13 in {venv}"


require("harnesses", _installed())


def make(local_root, **kw) -> gym.Env:
    return gym.make("Orchard/SWE-v0", harness="openhands", backend={"type": "local", "root": str(local_root)},
                    **{"max_seconds": 600, **kw})


def tool_names(obs: str) -> list[str]:
    return [t["function"]["name"] for t in json.loads(obs)["tools"]]


@pytest.mark.timeout(900)
def test_openhands_solves_the_task_with_a_scripted_policy(local_root):
    env = make(local_root, max_steps=7)
    try:
        obs, info = env.reset(options={"task_id": TASK})
        assert info["endpoint"] == "chat.completions" and info["request"]["model"] == "orchard-policy"
        assert {"terminal", "file_editor", "finish"} <= set(tool_names(obs)), tool_names(obs)
        assert any("Version.replace()" in json.dumps(m["content"]) for m in json.loads(obs)["messages"])
        probe = ("python3 -c \"import urllib.request as u; u.urlopen('http://1.1.1.1', timeout=3)\" 2>/dev/null "
                 "&& echo NET-REACHED || echo NET-UNREACHABLE")
        patch = f"git apply <<'ORCHARD_EOF'\n{GOLD}\nORCHARD_EOF\necho applied-$?; {probe}"
        obs, reward, terminated, truncated, info = env.step(OPENHANDS.shell(patch))
        assert not (terminated or truncated), info
        result = json.loads(obs)["messages"][-1]
        assert result["role"] == "tool" and "applied-0" in json.dumps(result["content"]), result  # it ran there
        if HAS_BWRAP:
            assert "NET-UNREACHABLE" in json.dumps(result["content"])
        obs, reward, terminated, truncated, info = env.step(OPENHANDS.finish)
        assert (reward, terminated, truncated) == (1.0, True, False), info
        assert info["report"]["status"] == "RESOLVED_FULL" and info["harness_exit_code"] == 0
        record = env.unwrapped.record
        assert record.status == "finished" and len(record.calls) == 2 and all(c.ok for c in record.calls)
        assert record.rejected == []  # nothing it called at start-up went unanswered
        for call in record.calls:  # each with its request as sent and the answer it got
            assert call.endpoint == "chat.completions" and call.request["messages"] and call.response["choices"]
        first_id = record.calls[0].message["tool_calls"][0]["id"]
        assert record.calls[1].request["messages"][-1]["tool_call_id"] == first_id
        # the recorded calls rebuild the episode: (H(s_t), a_t, r_t) with r_t = γ^(T−t)·r_T
        samples = env.unwrapped.samples(gamma=0.5)
        assert [s.reward for s in samples] == [0.5, 1.0]
        # as the chat door's normal form has them: OpenHands' text-part lists joined into strings
        assert [s.messages for s in samples] == [text_messages(c.request["messages"]) for c in record.calls]
        assert any(isinstance(m.get("content"), list) for m in record.calls[0].request["messages"])
        assert samples[0].response == record.calls[0].message and samples[1].tools == record.calls[1].tools
    finally:
        env.close()
    require("bwrap", WHY_NO_BWRAP)


@pytest.mark.timeout(900)
def test_openhands_with_a_do_nothing_policy_scores_zero(local_root):
    env = make(local_root)
    try:
        env.reset(options={"task_id": TASK})
        obs, reward, terminated, truncated, info = env.step(OPENHANDS.finish)
        assert (reward, terminated, truncated) == (0.0, True, False), info
        assert "error" not in info and info["harness_exit_code"] == 0
        record = env.unwrapped.record
        assert record.status == "finished" and record.reward == 0.0 and len(record.calls) == 1
    finally:
        env.close()


@pytest.mark.timeout(900)
@needs_bwrap
def test_openhands_on_a_harbor_task(local_root):
    """Orchard/Harbor-v0 (a Harbor task folder, graded by its own verifier) through OpenHands:
    the sum written by its terminal -> 1.0; finishing at once -> 0.0."""
    env = gym.make("Orchard/Harbor-v0", tasks=str(HARBOR), harness="openhands", max_seconds=600,
                   backend={"type": "local", "isolation": "bwrap", "root": str(local_root)})
    try:
        obs, info = env.reset(options={"task_id": "sum-numbers"})
        assert any("Write their sum" in json.dumps(m["content"]) for m in json.loads(obs)["messages"])
        obs, reward, terminated, truncated, info = env.step(OPENHANDS.shell(
            "awk '{s += $1} END {print s}' data.txt > answer.txt && echo wrote-$(cat answer.txt)"))
        assert not (terminated or truncated) and "wrote-" in json.dumps(json.loads(obs)["messages"][-1]), info
        obs, reward, terminated, truncated, info = env.step(OPENHANDS.finish)
        assert (reward, terminated, truncated) == (1.0, True, False), info
        env.reset(options={"task_id": "sum-numbers"})
        obs, reward, terminated, truncated, info = env.step(OPENHANDS.finish)
        assert (reward, terminated, truncated) == (0.0, True, False) and "error" not in info, info
    finally:
        env.close()


@pytest.mark.timeout(900)
def test_openhands_crash_and_timeouts_are_typed_errors(local_root):
    env = make(local_root)
    try:
        env.reset(options={"task_id": TASK})
        # the harness dies under the agent (its terminal's parent is the driver): a crash, no reward
        obs, reward, terminated, truncated, info = env.step(OPENHANDS.shell("kill -9 $PPID"))
        assert truncated and not terminated and "the harness crashed: exit code" in info["error"], info
        assert env.unwrapped.trajectory.error and env.unwrapped.record.status != "finished"
        with pytest.raises(gym.error.ResetNeeded):
            env.step(OPENHANDS.finish)
    finally:
        env.close()
    # a wall-clock budget it cannot start in: reset fails with a typed error, never hangs
    env = make(local_root, max_seconds=0.5)
    try:
        with pytest.raises(HarnessError, match="timeout: no model call within"):
            env.reset(options={"task_id": TASK})
    finally:
        env.close()


@pytest.mark.timeout(600)
def test_openhands_without_its_interpreter_is_a_typed_error(local_root):
    """The venv's interpreter missing (a harness pointing at a venv without one): the harness
    exits before its first model call, and reset says so with the log's last lines."""
    broken = OPENHANDS.model_copy(update={"command": '"$ORCHARD_HARNESS_VENV/no-such/python" driver.py'})
    env = gym.make("Orchard/SWE-v0", harness=broken, backend={"type": "local", "root": str(local_root)},
                   max_seconds=300)
    try:
        with pytest.raises(HarnessError, match=r"exited \(code 127\) before asking the model anything"):
            env.reset(options={"task_id": TASK})
    finally:
        env.close()


def test_the_bundled_interpreter_runs_anywhere_and_is_pinned():
    assert OPENHANDS.requirements == [f"openhands-sdk=={VERSION}", f"openhands-tools=={VERSION}"]
    assert OPENHANDS.python == "3.13"
    venv = OPENHANDS.install()
    cfg = (venv / "pyvenv.cfg").read_text()
    assert f"home = {venv}/runtime/bin" in cfg  # the venv's base is its own bundled runtime
    # on a host with an older glibc: its own loader and libc, and the host's bash for what it runs
    code = ("import sys, ssl, subprocess, openhands.sdk, openhands.tools.terminal; "
            "print(sys.version_info[:2] >= (3, 12), sys.prefix, subprocess.run(['bash', '-c', 'echo $BASH_VERSION'], "
            "capture_output=True, text=True).stdout.strip())")
    r = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    assert r.returncode == 0, r.stderr[-2000:]
    ok, prefix, bash = r.stdout.split()
    assert ok == "True" and prefix == str(venv) and bash
