"""Claude Code (the real `@anthropic-ai/claude-code` from npm, pinned, run unchanged and
headless) as a harness: in a local sandbox with no network, its model calls going through
the relay to the proxy's Anthropic Messages door, a scripted policy as its model, on a
real built-in SWE task graded with SWE-bench's grading."""

from __future__ import annotations

import json
import os

import gymnasium as gym
import pytest

from conftest import HAS_BWRAP, WHY_NO_BWRAP, require, require_module

require_module("server", "fastapi")

import orchard_gym  # noqa: E402,F401 - registers the env ids
from orchard_gym.envs.swe.tasks import load_tasks  # noqa: E402
from orchard_gym.wrappers.harness.plugins.claude_code import HARNESS as CLAUDE_CODE, VERSION  # noqa: E402
from orchard_gym.wrappers.proxy.reconstruct import reconstruct  # noqa: E402

TASK = "semver-3.0.2"
GOLD = load_tasks("builtin")[TASK].patch


def _installed() -> str | None:
    try:
        prefix = CLAUDE_CODE.install_npm()
    except Exception as e:  # the reason is the skip/fail message
        return f"{type(e).__name__}: {e}"
    return None if os.access(prefix / "node_modules" / ".bin" / "claude", os.X_OK) else f"no claude under {prefix}"


require("claude-code", _installed())


def make(local_root) -> gym.Env:
    return gym.make("Orchard/SWE-v0", harness="claude-code", backend={"type": "local", "root": str(local_root)},
                    max_seconds=600)


def tool_names(obs: str) -> list[str]:
    return [t["function"]["name"] for t in json.loads(obs)["tools"]]


@pytest.mark.timeout(900)
def test_claude_code_solves_the_task_with_a_scripted_policy(local_root):
    env = make(local_root)
    try:
        obs, info = env.reset(options={"task_id": TASK})
        assert info["endpoint"] == "messages" and info["request"]["stream"] is True
        assert info["request"]["model"] == "orchard-policy" and "Bash" in tool_names(obs)
        assert any("Version.replace()" in json.dumps(m["content"]) for m in json.loads(obs)["messages"])
        probe = ("python3 -c \"import urllib.request as u; u.urlopen('http://1.1.1.1', timeout=3)\" 2>/dev/null "
                 "&& echo NET-REACHED || echo NET-UNREACHABLE")
        patch = f"git apply <<'ORCHARD_EOF'\n{GOLD}\nORCHARD_EOF\necho applied; {probe}"
        obs, reward, terminated, truncated, info = env.step(
            {"role": "assistant", "content": "Applying the fix.",
             "tool_calls": [{"name": "Bash", "arguments": {"command": patch, "description": "apply the fix"}}]})
        assert not (terminated or truncated), info
        result = json.loads(obs)["messages"][-1]
        assert result["role"] == "tool" and "applied" in result["content"], result  # Claude Code ran it in the sandbox
        if HAS_BWRAP:
            assert "NET-UNREACHABLE" in result["content"]
        obs, reward, terminated, truncated, info = env.step("The fix is applied.")
        assert (reward, terminated, truncated) == (1.0, True, False), info
        assert info["report"]["status"] == "RESOLVED_FULL" and info["harness_exit_code"] == 0
        record = env.unwrapped.record
        assert record.status == "finished" and len(record.calls) == 2 and all(c.ok for c in record.calls)
        assert record.rejected == []  # nothing it called at start-up went unanswered
        for call in record.calls:  # each with its request as sent and the Messages answer it got
            assert call.endpoint == "messages" and call.request["messages"] and call.response["type"] == "message"
        assert [b["type"] for b in record.calls[0].response["content"]] == ["text", "tool_use"]
        assert record.calls[0].response["stop_reason"] == "tool_use"
        assert record.calls[1].response["content"] == [{"type": "text", "text": "The fix is applied."}]
        tool_result = record.calls[1].request["messages"][-1]["content"][0]
        assert tool_result["type"] == "tool_result" and tool_result["tool_use_id"] == record.calls[0].message[
            "tool_calls"][0]["id"]
        assert [s.reward for s in reconstruct(record)] == [1.0, 1.0]
    finally:
        env.close()
    require("bwrap", WHY_NO_BWRAP)


@pytest.mark.timeout(900)
def test_claude_code_with_a_do_nothing_policy_scores_zero(local_root):
    env = make(local_root)
    try:
        env.reset(options={"task_id": TASK})
        obs, reward, terminated, truncated, info = env.step("Nothing to do.")
        assert (reward, terminated, truncated) == (0.0, True, False), info
        assert "error" not in info and info["harness_exit_code"] == 0
        record = env.unwrapped.record
        assert record.status == "finished" and record.reward == 0.0 and len(record.calls) == 1
        assert record.calls[0].response["stop_reason"] == "end_turn"
    finally:
        env.close()


def test_claude_code_is_pinned_and_registered():
    assert CLAUDE_CODE.npm == [f"@anthropic-ai/claude-code@{VERSION}"]
    from orchard_gym.wrappers.harness import get_harness

    assert get_harness("claude-code") == CLAUDE_CODE
    with pytest.raises(ValueError, match="unknown harness"):
        get_harness("claude-codex")


def test_claude_code_against_an_openai_compatible_upstream(tmp_path):
    """Upstream mode: Claude Code's streamed Messages calls translated to the stub's chat
    completions and its SSE chunks back into Messages events, as they come."""
    import subprocess

    from orchard_gym.wrappers.proxy import ProxyConfig, RecordingProxy
    from orchard_gym.wrappers.proxy.stub import StubUpstream

    with StubUpstream() as stub:
        proxy = RecordingProxy(ProxyConfig(upstream=stub.url)).start_in_thread()
        try:
            rollout = proxy.store.open("upstream")
            (tmp_path / "task.txt").write_text("say hello")
            npm = str(CLAUDE_CODE.install_npm())
            env = {**os.environ, **CLAUDE_CODE.environment(str(tmp_path / "h"), None, npm, "stub"),
                   "ORCHARD_TASK_FILE": str(tmp_path / "task.txt"),
                   "ORCHARD_MODEL": "stub", "OPENAI_BASE_URL": proxy.rollout_url(rollout.id),
                   "OPENAI_API_KEY": rollout.token}
            run = subprocess.run(["bash", "-c", CLAUDE_CODE.launch_script(str(tmp_path / "h"), npm)], env=env, cwd=tmp_path, capture_output=True,
                                 text=True, timeout=300)
            assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
            result = json.loads(run.stdout.strip().splitlines()[-1])
            assert result["type"] == "result" and result["is_error"] is False
            assert result["result"].startswith("echo: ")  # the stub's answer, as Claude Code printed it
            (call,) = rollout.record.calls
            assert call.ok and call.stream and call.endpoint == "messages" and call.source == "upstream"
            assert call.message["content"] == result["result"] and call.response["stop_reason"] == "end_turn"
            assert call.usage["completion_tokens"] > 0 and call.time_to_first_byte > 0
        finally:
            proxy.stop_in_thread()
