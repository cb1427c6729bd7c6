"""HarnessEnv: real harnesses in real local sandboxes, reaching the recording proxy through
its unix socket only, on a real built-in SWE task graded with SWE-bench's grading."""

from __future__ import annotations

import asyncio
import json

import gymnasium as gym
import pytest

from conftest import HAS_BWRAP, WHY_NO_BWRAP, marked_pids, require, require_module, wait_until

require_module("server", "fastapi")

from harness_scripts import react  # noqa: E402
from orchard_gym.envs.swe.env import SWEEnv  # noqa: E402
from orchard_gym.envs.swe.tasks import load_tasks  # noqa: E402
from orchard_gym.wrappers import ErrorFilter, WallClockTimeout  # noqa: E402
from orchard_gym.wrappers.harness.env import HarnessEnv, HarnessError  # noqa: E402
from orchard_gym.wrappers.proxy import ProxyConfig, RecordingProxy, default_socket_dir  # noqa: E402

import orchard_gym  # noqa: E402,F401 - registers the env ids
from orchard_gym import AsyncSandboxClient  # noqa: E402

TASK = "semver-3.0.2"
GOLD = load_tasks("builtin")[TASK].patch


def apply_gold(extra: str = "") -> dict:
    return {"name": "bash", "arguments": {"command": f"git apply <<'ORCHARD_EOF'\n{GOLD}\nORCHARD_EOF\n{extra}"}}


def make(local_root, harness, **kw) -> gym.Env:
    return gym.make("Orchard/SWE-v0", harness=harness, backend={"type": "local", "root": str(local_root)}, **kw)


def last_message(obs: str) -> dict:
    return json.loads(obs)["messages"][-1]


@pytest.mark.parametrize("mode", ["normal", "stream"])
def test_harness_solves_the_task_through_the_proxy_with_no_network(local_root, mode):
    env = make(local_root, react(mode), max_seconds=300)
    try:
        obs, info = env.reset(options={"task_id": TASK})
        request = json.loads(obs)
        assert request["messages"][0]["role"] == "system" and "Version.replace()" in request["messages"][1]["content"]
        assert request["tools"][0]["function"]["name"] == "bash"
        assert info["request"]["stream"] is (mode == "stream") and info["endpoint"] == "chat.completions"
        proxy = env.unwrapped.proxy
        # the sandbox reaches the proxy through the relay, and nothing else: not even the proxy's TCP port
        probe = (f"python3 -c \"import urllib.request as u; u.urlopen('{proxy.url}/health', timeout=3)\" "
                 f"2>/dev/null && echo TCP-REACHED || echo TCP-UNREACHABLE; "
                 f"python3 -c \"import urllib.request as u, os; print(u.urlopen(os.environ['OPENAI_BASE_URL']"
                 f".split('/r/')[0] + '/health', timeout=3).status)\"")
        obs, reward, terminated, truncated, info = env.step(apply_gold(probe))
        out = last_message(obs)["content"]
        assert not (terminated or truncated) and "200" in out
        if HAS_BWRAP:
            assert "TCP-UNREACHABLE" in out
        obs, reward, terminated, truncated, info = env.step("DONE")
        assert (reward, terminated, truncated) == (1.0, True, False), info
        assert info["report"]["status"] == "RESOLVED_FULL" and "error" not in info
        u = env.unwrapped
        assert u.record.status == "finished" and u.record.reward == 1.0 and len(u.record.calls) == 2
        assert [c.stream for c in u.record.calls] == [mode == "stream"] * 2
        assert u.record.calls[1].messages[-1]["role"] == "tool"  # the harness's own context for call 2
        assert [s.reward for s in u.samples()] == [1.0, 1.0]
        assert u.trajectory.ok and u.trajectory.reward == 1.0 and len(u.trajectory.turns) == 2
        # the cost ledger: tokens as the proxy recorded them, the task's sandbox and the grader's
        ledger = u.trajectory.ledger
        assert ledger.token_source == "proxy" and ledger.model_calls == 2
        assert ledger.prompt_tokens == sum(c.usage["prompt_tokens"] for c in u.record.calls) > 0
        assert ledger.completion_tokens == sum(c.usage["completion_tokens"] for c in u.record.calls) > 0
        # (resolved: the SWE tamper check's verdict run is a third sandbox)
        assert len(ledger.sandboxes) == 3 and all(s.wall_seconds > 0 for s in ledger.sandboxes)
    finally:
        env.close()
    # everything above held; the TCP-UNREACHABLE check needs bwrap's network namespace
    require("bwrap", WHY_NO_BWRAP)


def test_harness_crash_is_an_error_and_its_trajectory_is_dropped(local_root):
    env = ErrorFilter(make(local_root, react("crash-after-1"), max_seconds=300))
    try:
        env.reset(options={"task_id": TASK})
        obs, reward, terminated, truncated, info = env.step(apply_gold())  # right answer, then the harness crashes
        assert (reward, terminated, truncated) == (0.0, False, True)
        assert info["error"].startswith("the harness crashed: exit code 3") and info["discard"]
        u = env.unwrapped
        assert u.trajectory.error == info["error"] and not u.trajectory.ok
        assert u.record.status == "failed" and u.record.reward is None and len(u.record.calls) == 1
        assert u.samples() == [] and [s.reward for s in u.samples(drop_failed=False)] == [None]
        with pytest.raises(gym.error.ResetNeeded):
            env.step("more")
    finally:
        env.close()


def test_harness_that_dies_mid_call(local_root):
    env = make(local_root, react("die-mid-call"), max_seconds=300)
    try:
        env.reset(options={"task_id": TASK})
        obs, *_ = env.step(apply_gold())  # its next request arrives; then it dies while that waits
        rollout_id, calls = env.unwrapped.rollout_id, env.unwrapped.record.calls
        assert wait_until(lambda: not marked_pids(f"ORCHARD_HARNESS={rollout_id}") and len(calls) == 2
                          and calls[1].error, 60), "the harness did not die, or the proxy did not see it go"
        obs, reward, terminated, truncated, info = env.step("DONE")
        assert truncated and reward == 0.0 and "exit code 7" in info["error"]
        calls = env.unwrapped.record.calls
        assert len(calls) == 2 and calls[0].ok and not calls[1].ok  # the orphaned call is kept, marked
        assert "disconnected" in calls[1].error
    finally:
        env.close()


def test_harness_that_never_asks_fails_reset(local_root):
    env = make(local_root, react("no-call"))
    try:
        with pytest.raises(HarnessError, match=r"exited \(code 0\) before asking the model anything"):
            env.reset(options={"task_id": TASK})
        assert env.unwrapped.record.status == "failed" and env.unwrapped.task_env.sandbox is None
    finally:
        env.close()


@pytest.mark.parametrize("where", ["wrapper", "env"])
def test_wall_clock_timeout_kills_the_harness_and_marks_the_rollout(local_root, where):
    # the budget covers the reset too (a local harness starts in 1-2 s): 8 s leaves it room under load
    if where == "wrapper":
        env = WallClockTimeout(make(local_root, react("hang"), max_seconds=None), max_seconds=8)
    else:
        env = make(local_root, react("hang"), max_seconds=8)
    try:
        env.reset(options={"task_id": TASK})
        rollout_id = env.unwrapped.rollout_id
        assert wait_until(lambda: marked_pids(f"ORCHARD_HARNESS={rollout_id}"), 5)
        obs, reward, terminated, truncated, info = env.step(apply_gold())  # the harness then hangs
        assert (reward, terminated, truncated) == (0.0, False, True)
        assert info["error"].startswith("timeout: the rollout ran past its wall-clock budget of 8s")
        u = env.unwrapped
        assert u.record.status == "failed" and u.record.error.startswith("timeout") and u.trajectory.error
        assert wait_until(lambda: not marked_pids(f"ORCHARD_HARNESS={rollout_id}"), 10), "the harness lives on"
    finally:
        env.close()


def test_step_budget_stops_the_harness_and_grades(local_root):
    env = make(local_root, react(), max_steps=1, max_seconds=300)
    try:
        env.reset(options={"task_id": TASK})
        obs, reward, terminated, truncated, info = env.step(apply_gold())  # the harness asks again: over budget
        assert (reward, terminated, truncated) == (1.0, False, True) and "error" not in info
        assert "step budget" in info["truncation"] and env.unwrapped.record.status == "finished"
        assert [s.reward for s in env.unwrapped.samples()] == [1.0]  # the unanswered call is no sample
    finally:
        env.close()


def test_malformed_action_leaves_the_request_pending(local_root):
    env = make(local_root, react(), max_seconds=300)
    try:
        obs, info = env.reset(options={"task_id": TASK})
        for bad in (42, {"role": "user", "content": "x"}, {"tool_calls": "nope"}, []):
            again, reward, terminated, truncated, info2 = env.step(bad)
            assert again == obs and info2["action_error"] and not (terminated or truncated)
        assert len(env.unwrapped.record.calls) == 1 and env.unwrapped.trajectory.turns == []
        env.step(apply_gold())
        assert env.step("DONE")[1] == 1.0
    finally:
        env.close()


def test_concurrent_episodes_share_one_proxy_and_never_mix(local_root):
    async def main():
        sock = f"{default_socket_dir()}/test-{id(local_root) % 10**8}.sock"
        async with RecordingProxy(ProxyConfig(uds=sock)) as proxy, \
                AsyncSandboxClient({"type": "local", "root": str(local_root)}) as client:
            async def episode(i: int):
                env = HarnessEnv(SWEEnv(client=client), react(), proxy=proxy, max_seconds=300)
                try:
                    await env.areset(options={"task_id": TASK})
                    obs, *_ = await env.astep({"name": "bash", "arguments": {"command": f"echo episode-{i}"}})
                    assert last_message(obs)["content"].strip() == f"episode-{i}"
                    result = await env.astep("DONE")
                    return env.record, result
                finally:
                    await env.aclose()

            return await asyncio.gather(*(episode(i) for i in range(4)))

    results = asyncio.run(main())
    assert len({record.rollout_id for record, _ in results}) == 4
    for i, (record, (_obs, reward, terminated, _truncated, info)) in enumerate(results):
        assert terminated and reward == 0.0 and "error" not in info  # nothing fixed: graded 0, no error
        assert record.calls[1].messages[-1]["content"].strip() == f"episode-{i}"


def test_registration_without_harness_is_unchanged(local_root):
    env = gym.make("Orchard/SWE-v0", backend={"type": "local", "root": str(local_root)})
    assert type(env.unwrapped) is SWEEnv
    env.close()
    env = make(local_root, "mini-swe-agent", max_steps=7, max_seconds=60, test_timeout=100)
    assert isinstance(env.unwrapped, HarnessEnv) and env.unwrapped.max_steps == 7
    assert env.unwrapped.task_env.test_timeout == 100 and env.unwrapped.harness.name == "mini-swe-agent"
    env.close()
    with pytest.raises(ValueError, match="unknown harness"):
        make(local_root, "no-such-harness")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_mini_swe_agent_resolves_a_task_driven_through_the_proxy(local_root):
    """The real mini-swe-agent (pinned, in a cached venv the sandbox sees read-only), its own
    loop and prompts, our scripted policy as its model: gold patch via its bash tool, then
    its submit command. Every model call it made is in the record."""
    env = make(local_root, "mini-swe-agent", max_seconds=600)
    try:
        obs, info = env.reset(options={"task_id": TASK})
        request = json.loads(obs)
        assert [m["role"] for m in request["messages"]] == ["system", "user"]
        assert "Please solve this issue" in request["messages"][1]["content"]
        assert [t["function"]["name"] for t in request["tools"]] == ["bash"]
        assert info["request"]["model"] == "orchard-policy"
        obs, reward, terminated, truncated, info = env.step(
            {"role": "assistant", "content": "I will apply the fix.", "tool_calls": [apply_gold("echo applied")]})
        assert not (terminated or truncated), info
        observed = last_message(obs)
        assert observed["role"] == "tool" and '"returncode": 0' in observed["content"] and "applied" in observed["content"]
        obs, reward, terminated, truncated, info = env.step(
            {"name": "bash", "arguments": {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}})
        assert (reward, terminated, truncated) == (1.0, True, False), info
        assert info["report"]["status"] == "RESOLVED_FULL" and info["harness_exit_code"] == 0
        record = env.unwrapped.record
        assert record.status == "finished" and len(record.calls) == 2 and all(c.ok for c in record.calls)
        assert record.calls[0].message["content"] == "I will apply the fix."
        assert record.calls[1].messages[:2] == request["messages"] and len(record.calls[1].messages) == 4
        assert [s.reward for s in env.unwrapped.samples()] == [1.0, 1.0]
    finally:
        env.close()
