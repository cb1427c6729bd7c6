"""Dense signals on real episodes. RPR: one oracle episode of Orchard/SWE-v0, Orchard/Claw-v0 and Orchard/GUI-v0
in local sandboxes, fed through `RPRScorer` to the scripted judge server (tests/dense_servers.py):
the env's rubric is picked, the judge sees every action, the SWE patch and clipped
observations but no grader report or reward, and its score enters the reward as configured.
OPD: the per-token signal on the tokens of a real Claw episode played by a tiny model."""

from __future__ import annotations

import asyncio
import json
import shutil

import pytest

from components import needs
from conftest import require_module

torch = require_module("train", "torch")
require_module("server", "starlette")

from dense_servers import JudgeStub, hand_logprobs  # noqa: E402

from orchard_gym import AsyncSandboxClient  # noqa: E402
from orchard_gym.algos.agent_rollout import AgentSample  # noqa: E402
from orchard_gym.algos.rpr import RPRConfig, RPRScorer, load_rubric  # noqa: E402
from orchard_gym.algos.tiny import build_tokenizer  # noqa: E402
from orchard_gym.envs.claw.env import ClawEnv, ClawOraclePolicy  # noqa: E402
from orchard_gym.envs.claw.tasks import load_tasks as claw_tasks  # noqa: E402
from orchard_gym.envs.gui.env import GUIEnv  # noqa: E402
from orchard_gym.envs.gui.oracles import GUIOraclePolicy  # noqa: E402
from orchard_gym.envs.rollout import run_episodes  # noqa: E402
from orchard_gym.envs.swe.env import SWEEnv  # noqa: E402
from orchard_gym.policies import OraclePolicy  # noqa: E402

torch.set_num_threads(1)
OBS_CHARS = {"Orchard/SWE-v0": 120, "Orchard/Claw-v0": 120, "Orchard/GUI-v0": 12}  # GUI text lines are short


def claw_task() -> str:
    tasks = claw_tasks("builtin")
    return sorted(t for t, task in tasks.items() if 2 <= len(task.oracle) <= 4)[0]


class LooksFirst:
    """One read-only command with a long answer (as an agent reading a file would), then the
    env's oracle, which is shown the conversation without that exchange."""

    def __init__(self, inner, action: dict, n0: int | None = None, skip: int | None = None):
        self.inner, self.action, self.n0, self.skip = inner, action, n0, skip

    def bind(self, env):
        return LooksFirst(self.inner.bind(env), self.action)

    async def __call__(self, messages, tools):
        if self.n0 is None:
            self.n0 = len(messages)
            return self.action
        if self.skip is None:
            self.skip = len(messages) - self.n0
        return await self.inner(messages[:self.n0] + messages[self.n0 + self.skip:], tools)


READ_SEMVER = {"name": "bash", "arguments": {"command": "cat src/semver/version.py"}}
CASES = {"Orchard/SWE-v0": (lambda c: SWEEnv(client=c), LooksFirst(OraclePolicy(), READ_SEMVER), "semver-3.0.2",
                            "swe"),
         "Orchard/Claw-v0": (lambda c: ClawEnv(client=c), ClawOraclePolicy(), claw_task(), "claw"),
         "Orchard/GUI-v0": (lambda c: GUIEnv(client=c, tasks="miniwob"), GUIOraclePolicy(), "miniwob/enter-text",
                            "gui")}


def gui_missing() -> str | None:
    for tool in ("Xvfb", "chromium", "xdotool", "openbox", "bwrap"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    try:
        from orchard_gym.envs.gui.tasks import miniwob_html

        miniwob_html()  # the MiniWoB++ pages the task needs
    except ValueError as e:
        return str(e)
    return None


ENVS = ["Orchard/SWE-v0", "Orchard/Claw-v0", pytest.param("Orchard/GUI-v0", marks=needs("gui", gui_missing()))]


@pytest.fixture(scope="module")
def judge():
    with JudgeStub() as stub:
        yield stub


def one_episode(local_root, make_env, policy, task_id):
    async def main():
        async with AsyncSandboxClient({"type": "local", "root": str(local_root)}) as client:
            return await run_episodes(make_env, policy, [task_id], concurrency=1, client=client, progress=False,
                                      record_messages=True)

    [t] = asyncio.run(main())
    assert t.ok and t.reward == 1.0, (t.error, t.report)
    return t


@pytest.mark.parametrize("env_id", ENVS)
def test_rpr_on_a_real_oracle_episode(env_id, judge, local_root):
    make_env, policy, task_id, rubric = CASES[env_id]
    traj = one_episode(local_root, make_env, policy, task_id)
    content = traj.turns[0].messages[1]["content"]  # the task as the agent saw it (GUI: text + screenshot)
    task_text = content if isinstance(content, str) else "\n".join(p["text"] for p in content if p["type"] == "text")
    assert isinstance(task_text, str) and task_text
    tok = build_tokenizer([task_text], vocab_size=300)  # byte-level: decodes back to the task text
    sample = AgentSample(task_id=task_id, prompt_ids=tok.encode(task_text), completion_ids=[1, 2], env_mask=[1, 1],
                         logprobs=[0.0, 0.0], trajectory=traj, action_mask=[1, 1])
    out = {"env_mask": [[1, 1]], "env_reward": [traj.reward]}
    judge.requests.clear()
    config = RPRConfig(judge=f"{judge.url}#judge", combine="sum:0.5", observation_chars=OBS_CHARS[env_id])
    scorer = RPRScorer(config, tok, env_id=env_id)  # no rubric given: picked by env id
    try:
        stats = scorer(out, [sample], [True])
    finally:
        scorer.close()
    assert scorer.rubric == load_rubric(rubric)  # the env's default rubric
    [request] = judge.requests
    user = next(m["content"] for m in request["messages"] if m["role"] == "user")
    assert f"# Rubric: {rubric}\n" in user
    transcript = user.split("# Transcript\n", 1)[1]
    assert task_text[:200] in transcript
    assert transcript.count("### Step ") == len(traj.turns) >= 2
    for turn in traj.turns:  # every action, in full
        assert json.dumps(turn.arguments or {}, ensure_ascii=False, sort_keys=True) in transcript
    long = [t.observation for t in traj.turns if len(t.observation) > OBS_CHARS[env_id] + 5]
    assert long, [t.observation for t in traj.turns]
    assert "chars clipped" in transcript and not any(o in transcript for o in long)
    patch = traj.report.get("patch")
    if env_id == "Orchard/SWE-v0":  # the submitted diff is shown (the SWE grader reports it as 'patch')
        assert patch and "## Final diff\ndiff --git a/src/semver/version.py" in transcript
        assert patch[:150] in transcript  # clipped like an observation (head and tail, 2x the limit)
    hidden = {k: v for k, v in traj.report.items() if k not in ("patch", "diff")}
    assert hidden, traj.report
    assert json.dumps(traj.report)[:60] not in transcript
    for k, v in hidden.items():  # no grader report field, no reward value
        assert f'"{k}"' not in transcript and f"{k}:" not in transcript.lower()
        if isinstance(v, str) and len(v) >= 12:
            assert v not in transcript
    assert "reward" not in transcript.lower()
    # the stub's score (0.5 on every criterion) enters as outcome + 0.5 * process
    assert stats["rpr/judged"] == 1 and stats["rpr/process_mean"] == pytest.approx(0.5)
    assert out["env_reward"] == [pytest.approx(1.0 + 0.5 * 0.5)]


# ------------------------------------------------------------------ OPD on a real Claw episode's tokens

def test_opd_signal_on_a_real_claw_episode(local_root):
    """A tiny student plays a real Claw task (its actions are gibberish: the env's error messages
    are the observations); the per-token signal is log pT - log pS on its action tokens, 0.0 on
    the env's tokens."""
    require_module("train", "trl")
    from orchard_gym.algos.agent_rollout import SamplingParams
    from orchard_gym.algos.grpo import AgentGRPOArgs, AgentRolloutFunc
    from orchard_gym.algos.opd import LocalTeacher, OPDConfig, OPDScorer
    from orchard_gym.algos.tiny import build_model

    task_id = claw_task()
    task = claw_tasks("builtin")[task_id]
    tok = build_tokenizer([json.dumps(task.model_dump(), default=str)] * 2, vocab_size=400)
    student = build_model(tok, hidden_size=32, num_layers=1, intermediate_size=64, seed=0)
    teacher = build_model(tok, hidden_size=32, num_layers=1, intermediate_size=64, seed=1)
    args = AgentGRPOArgs(env_id="Orchard/Claw-v0", backend={"type": "local", "root": str(local_root)}, group_size=2,
                         prompts_per_step=1, step_budget="2", max_seconds=60, system_prompt="Act.",
                         render_tools=False, dynamic_sampling=False, seed=0,
                         sampling=SamplingParams(max_new_tokens=10, max_completion_tokens=4000, linger=0.01))
    rollout = AgentRolloutFunc(args, tok, task_ids=[task_id])
    rollout._model = student
    try:
        out = rollout.rollout([task_id], max_steps=2)
    finally:
        rollout.close()
    samples = rollout.last_slots[0].samples
    stats = OPDScorer(OPDConfig(teacher="local"), tok, teacher=LocalTeacher(teacher, tok))(out, samples,
                                                                                          [True] * len(samples),
                                                                                          student)
    assert stats["opd/dropped"] == 0 and stats["opd/scored"] == len(samples)
    multi = [i for i, s in enumerate(samples) if s.ok and s.turns >= 2 and 0 in out["env_mask"][i]]
    assert multi, [(s.turns, s.ok) for s in samples]
    for i in multi:
        s, signal, mask = samples[i], out["opd_signal"][i], out["env_mask"][i]
        assert s.trajectory.env_id == "Orchard/Claw-v0" and len(signal) == len(mask) == len(s.completion_ids)
        ids = s.prompt_ids + s.completion_ids
        t, p = hand_logprobs(teacher, ids, len(s.prompt_ids)), hand_logprobs(student, ids, len(s.prompt_ids))
        expected = [(a - b) if m else 0.0 for a, b, m in zip(t, p, mask, strict=True)]
        assert all(v == 0.0 for v, m in zip(signal, mask, strict=True) if not m)  # the env's tokens: exactly 0
        assert max(abs(x - y) for x, y in zip(signal, expected, strict=True)) < 1e-4
        assert any(abs(v) > 1e-3 for v in signal)
