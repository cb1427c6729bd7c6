"""Dense signals for agent GRPO: on-policy distillation (OPD) and rubric-based process reward
(RPR), with a tiny model built offline, real Orchard/Toy-v0 episodes in local sandboxes, a
real teacher model behind a vLLM-shaped prompt-logprobs server, a scripted judge server and
real TRL steps."""

from __future__ import annotations

import copy
import math

import pytest

from conftest import require_module

torch = require_module("train", "torch")
require_module("train", "trl")
require_module("server", "starlette")

from dense_servers import JudgeStub, TeacherServer, hand_logprobs  # noqa: E402
from trainer_spy import spy  # noqa: E402

from orchard_gym.algos.agent_rollout import AgentSample, SamplingParams  # noqa: E402
from orchard_gym.algos.grpo import AgentGRPOArgs, AgentRolloutFunc, build_trainer, make_grpo_config  # noqa: E402
from orchard_gym.algos.opd import (  # noqa: E402
    LocalTeacher,
    OPDConfig,
    OPDScorer,
    ServerTeacher,
    TeacherError,
)
from orchard_gym.algos.rpr import (  # noqa: E402
    RPRConfig,
    RPRScorer,
    load_rubric,
    parse_verdict,
    summarise,
)
from tiny_pair import student_and_teacher  # noqa: E402
from orchard_gym.algos.tiny import build_tokenizer  # noqa: E402
from orchard_gym.envs.toy.env import ToyEnv, make_tasks  # noqa: E402
from orchard_gym.trajectory import Trajectory, Turn  # noqa: E402

torch.set_num_threads(1)
TASKS = make_tasks(["write", "secret"], num_tasks=2)
SYSTEM = "Act."


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return student_and_teacher(tmp_path_factory, TASKS, SYSTEM)


def make_env(client, max_steps, max_seconds):
    return ToyEnv(tasks=TASKS, client=client, max_steps=max_steps, max_seconds=max_seconds)


class AlternatingToy(ToyEnv):
    """The real check runs in the sandbox; the reward alternates 1, 0, 1, ... (a random tiny
    model never solves a task, and BAR needs both outcomes)."""

    graded = 0

    async def grade(self, ctx, task):
        _, report = await super().grade(ctx, task)
        type(self).graded += 1
        return float(type(self).graded % 2), report


def make_alternating_env(client, max_steps, max_seconds):
    return AlternatingToy(tasks=TASKS, client=client, max_steps=max_steps, max_seconds=max_seconds)


def agent_args(local_root, **kw) -> AgentGRPOArgs:
    defaults = dict(env_id="Orchard/Toy-v0", backend={"type": "local", "root": str(local_root)}, group_size=2,
                    prompts_per_step=2, step_budget="2", max_seconds=60, system_prompt=SYSTEM, render_tools=False,
                    dynamic_sampling=False,
                    sampling=SamplingParams(max_new_tokens=12, max_completion_tokens=60, linger=0.01), seed=0)
    defaults.update(kw)
    return AgentGRPOArgs(**defaults)



# ------------------------------------------------------------------ OPD: the per-token signal
def test_opd_signal_is_the_reverse_kl_on_a_two_turn_episode(tiny, local_root):
    student, teacher, tok, _ = tiny
    args = agent_args(local_root, sampling=SamplingParams(max_new_tokens=12, max_completion_tokens=200, linger=0.01))
    rollout = AgentRolloutFunc(args, tok, make_env=make_env, task_ids=list(TASKS))
    rollout._model = student
    try:
        out = rollout.rollout(["write-000"], max_steps=2)
    finally:
        rollout.close()
    samples = rollout.last_slots[0].samples
    two_turn = [i for i, s in enumerate(samples) if s.ok and s.turns == 2 and not s.context_exhausted]
    assert two_turn, [s.turns for s in samples]
    trained = [True] * len(samples)
    for name, t_model in (("teacher", teacher), ("self", student)):
        o = copy.deepcopy(out)
        scorer = OPDScorer(OPDConfig(teacher="local", batch_size=2), tok, teacher=LocalTeacher(t_model, tok))
        stats = scorer(o, samples, trained, student)
        assert stats["opd/dropped"] == 0 and stats["opd/scored"] == len(samples)
        for i in two_turn:
            s, signal = samples[i], o["opd_signal"][i]
            mask = o["env_mask"][i]
            assert 0 in mask and len(signal) == len(mask) == len(s.completion_ids)
            assert all(v == 0.0 for v, m in zip(signal, mask, strict=True) if not m)  # observations: exactly 0
            ids = s.prompt_ids + s.completion_ids
            if name == "self":  # teacher = student: zero everywhere
                assert all(v == 0.0 for v in signal)
                continue
            t = hand_logprobs(teacher, ids, len(s.prompt_ids))
            p = hand_logprobs(student, ids, len(s.prompt_ids))
            # independent of the concatenation: what the sampler saw turn by turn (KV cache, batched,
            # left-padded) gives the same log-probs, so every action token is scored in its sampled context
            assert max(abs(a - b) for a, b, m in zip(p, s.logprobs, mask, strict=True) if m) < 1e-4
            expected = [(a - b) if m else 0.0 for a, b, m in zip(t, p, mask, strict=True)]
            assert max(abs(x - y) for x, y in zip(signal, expected, strict=True)) < 1e-4
            assert any(abs(v) > 1e-3 for v in signal)  # two different models: a real signal
        if name == "teacher":  # opd/kl is the mean over action tokens of log pi_theta - log pi_T
            n = sum(sum(m) for m in o["env_mask"])
            assert math.isclose(stats["opd/kl"], -sum(map(sum, o["opd_signal"])) / n, rel_tol=1e-9)


def test_teacher_tokenizer_must_match(tiny):
    student, teacher, tok, _ = tiny
    other = build_tokenizer(["completely different words only"] * 5, vocab_size=300)
    with pytest.raises(TeacherError, match="tokenizer differs"):
        LocalTeacher(teacher, tok, teacher_tokenizer=other)
    with pytest.raises(TeacherError, match="cannot load"):
        LocalTeacher("/nonexistent/teacher", tok)


@pytest.mark.parametrize("bad", [dict(teacher=""), dict(teacher="m", coef=0), dict(teacher="m", coef="x"),
                                 dict(teacher="m", batch_size=0)])
def test_opd_config_garbage(bad):
    with pytest.raises(ValueError):
        OPDConfig(**bad)


def test_opd_only_refuses_bar(local_root):
    with pytest.raises(ValueError, match="BAR"):
        agent_args(local_root, algo="bar", opd={"teacher": "x", "only": True})
    args = agent_args(local_root, dynamic_sampling=True, opd={"teacher": "x", "only": True})
    assert args.dynamic_sampling is False and isinstance(args.opd, OPDConfig)


# ------------------------------------------------------------------ OPD: server teacher, TRL step
def test_opd_only_trl_step_with_a_server_teacher(tiny, local_root, tmp_path):
    """vLLM-shaped teacher server (a real model), batched concurrent calls, one failing call drops
    its samples; --opd-only: no grading, advantages = coef * signal per token."""
    student, teacher, tok, _ = tiny
    student = copy.deepcopy(student)
    with TeacherServer(teacher, tok, fail_every=3) as server:
        args = agent_args(local_root, group_size=2, prompts_per_step=2,
                          opd={"teacher": f"{server.url}#teacher", "coef": 0.5, "only": True, "batch_size": 1,
                               "concurrency": 4})
        config = make_grpo_config(tmp_path, args, steps=1, learning_rate=1e-2)
        trainer, rollout = build_trainer(student, tok, args, config, make_env=make_env,
                                         task_ids=["write-000", "secret-001"], metrics_path=tmp_path / "m.jsonl")
        captured = spy(trainer, lambda result: (result, copy.deepcopy(rollout.last_output), rollout.last_slots))
        before = {n: p.detach().clone() for n, p in student.named_parameters()}
        try:
            trainer.train()
        finally:
            rollout.close()
        assert server.requests == 4 and server.prompts == 3  # 4 samples, one call each; the 3rd failed
    result, out, slots = captured[0]
    samples = [s for slot in slots for s in slot.samples]
    assert all(s.trajectory.report == {"graded": False} for s in samples if s.ok)  # grading skipped
    adv, mask = result["advantages"], result["completion_mask"] * result["tool_mask"]
    assert adv.shape == result["completion_ids"].shape
    dropped = [i for i, row in enumerate(out["env_mask"]) if not any(row)]
    assert len(dropped) == 1 and out["env_reward"][dropped[0]] is None
    for i, row in enumerate(out["opd_signal"]):
        n = len(row)
        expected = 0.5 * torch.tensor(row, dtype=adv.dtype)
        assert torch.allclose(adv[i, :n], expected, atol=1e-6) and (adv[i, n:] == 0).all()
        assert (adv[i, :n][mask[i, :n] == 0] == 0).all()  # observation tokens: no advantage
    assert any(abs(v) > 1e-3 for row in out["opd_signal"] for v in row)
    assert any(not torch.equal(before[n], p) for n, p in student.named_parameters())
    import json

    row = json.loads((tmp_path / "m.jsonl").read_text().splitlines()[0])
    assert row["opd/dropped"] == 1 and row["opd/teacher_seconds"] > 0 and row["opd/kl"] is not None


def test_server_teacher_answers_what_the_local_teacher_does(tiny):
    _, teacher, tok, _ = tiny
    from orchard_gym._loop import LoopThread

    ids = [tok.encode("Create a file named lark.txt"), tok.encode("Then call submit. ok")]
    with TeacherServer(teacher, tok) as server:
        remote = ServerTeacher(server.url, batch_size=2)  # no #MODEL: the first /models entry

        async def both():
            try:
                return await remote.logprobs(ids, [1, 2]), await LocalTeacher(teacher, tok).logprobs(ids, [1, 2])
            finally:
                await remote.aclose()

        got, want = LoopThread.shared().run(both())
        bad = ServerTeacher(server.url + "#nope")
        with pytest.raises(TeacherError, match="404"):
            LoopThread.shared().run(bad.logprobs(ids, [1, 1]))
    assert remote.model == "teacher" and [len(r) for r in got] == [len(ids[0]) - 1, len(ids[1]) - 2]
    assert max(abs(a - b) for r, s in zip(got, want, strict=True) for a, b in zip(r, s, strict=True)) < 1e-5
    with pytest.raises(ValueError, match="http"):
        ServerTeacher("ftp://x")


# ------------------------------------------------------------------ RPR
def episode(marker: str, reward: float, tok, *, obs: str = "(no output)") -> AgentSample:
    turns = [Turn(index=0, action=f"echo {marker}", tool="bash", arguments={"command": f"echo {marker}"},
                  observation=obs),
             Turn(index=1, action="submit", tool="submit", arguments={}, observation="Submitted.")]
    t = Trajectory(env_id="Orchard/Toy-v0", task_id="write-000", turns=turns, reward=reward, terminated=True,
                   report={"check": "test SECRET-ANSWER-42 = x", "diff": "+plum"}, metadata={"leak": "META-LEAK"})
    ids = tok.encode("Create a file named lark.txt that contains the word plum.")
    return AgentSample(task_id="write-000", prompt_ids=ids, completion_ids=[1, 2], env_mask=[1, 1],
                       logprobs=[0.0, 0.0], trajectory=t, action_mask=[1, 1])


@pytest.fixture(scope="module")
def judge():
    with JudgeStub(slow_seconds=2.5) as stub:
        yield stub


@pytest.mark.parametrize("combine, expected", [
    ("sum:0.5", [1 + 0.5 * 0.8, 0 + 0.5 * 0.2, None, 1 + 0.5 * 0.75, None, None, None]),
    ("gated:0.5", [1.0, 0.0, None, 1.0, None, None, None]),
    ("process", [0.8, 0.2, None, 0.75, None, None, None]),
])
def test_rpr_rewards_combined_and_failures_dropped(tiny, judge, combine, expected):
    _, _, tok, _ = tiny
    marks = [("JUDGE:score=0.8", 1.0), ("JUDGE:score=0.2", 0.0), ("JUDGE:malformed", 1.0),
             ("JUDGE:malformed-once", 1.0), ("JUDGE:range", 1.0), ("JUDGE:refuse", 0.0), ("JUDGE:slow", 1.0)]
    samples = [episode(m, r, tok) for m, r in marks]
    out = {"env_mask": [[1, 1] for _ in samples], "env_reward": [r for _, r in marks]}
    judge.requests.clear()
    scorer = RPRScorer(RPRConfig(judge=f"{judge.url}#judge", rubric="generic", combine=combine, timeout=1.0),
                       tok, env_id="Orchard/Toy-v0")
    try:
        stats = scorer(out, samples, [True] * len(samples))
    finally:
        scorer.close()
    assert out["env_reward"] == pytest.approx(expected)
    for i, r in enumerate(expected):
        assert (out["env_mask"][i] == [0, 0]) == (r is None)
    assert stats["rpr/dropped"] == 4 and stats["rpr/dropped_share"] == pytest.approx(4 / 7)
    assert stats["rpr/retried"] == 1
    # one retry, with the validation error shown, for the malformed and out-of-range answers only
    by_mark = {}
    for body in judge.requests:
        user = body["messages"][1]["content"]
        by_mark.setdefault(next(m for m, _ in marks if f'echo {m}"' in user), []).append(body)
    assert {m: len(v) for m, v in by_mark.items()} == {
        "JUDGE:score=0.8": 1, "JUDGE:score=0.2": 1, "JUDGE:malformed": 2, "JUDGE:malformed-once": 2,
        "JUDGE:range": 2, "JUDGE:refuse": 1, "JUDGE:slow": 1}
    retry = by_mark["JUDGE:range"][1]["messages"][-1]["content"]
    assert "invalid" in retry and "less than or equal to 1" in retry
    # the judge saw the task, the actions, the diff and the outcome, never the report's check or metadata
    seen = by_mark["JUDGE:score=0.8"][0]["messages"][1]["content"]
    assert "lark.txt" in seen and "echo JUDGE:score=0.8" in seen and "+plum" in seen and "solved" in seen
    assert "SECRET-ANSWER-42" not in seen and "META-LEAK" not in seen


def test_long_trajectories_are_summarised_deterministically(tiny):
    _, _, tok, _ = tiny
    s = episode("JUDGE:score=1", 1.0, tok, obs="x" * 50_000)
    s.trajectory.turns = s.trajectory.turns * 20
    a = summarise(s.trajectory, "task", max_chars=4_000)
    assert a == summarise(s.trajectory, "task", max_chars=4_000) and len(a) <= 4_000
    assert a.count("ACTION: bash({\"command\": \"echo JUDGE:score=1\"})") == 20  # every action kept
    assert "chars clipped" in a


def test_rubrics_ship_and_verdicts_validate(tmp_path):
    swe = load_rubric("swe")
    assert {c.id for c in swe.criteria} >= {"reproduced_first", "ran_tests", "kept_tests", "minimal_change"}
    assert load_rubric("claw").criteria and load_rubric("gui").criteria
    good = '{"criteria": [' + ", ".join(f'{{"id": "{c.id}", "score": 1, "reason": "ok"}}' for c in swe.criteria) + "]}"
    assert swe.score(parse_verdict(good, swe)) == 1.0
    for bad, why in [("nope", "not JSON"), ('{"criteria": []}', "exactly once"), ("[1]", "object"),
                     (good.replace('"score": 1', '"score": -1', 1), "greater than or equal")]:
        with pytest.raises(ValueError, match=why):
            parse_verdict(bad, swe)
    f = tmp_path / "r.yaml"
    for text, why in [("name: x\ncriteria: []", "at least 1"), (":", "YAML"), ("- a", "mapping"),
                      ("name: x\ncriteria:\n - {id: a, weight: -1, description: d}", "greater than 0")]:
        f.write_text(text)
        with pytest.raises(ValueError, match=why):
            load_rubric(f)
    with pytest.raises(ValueError, match="neither a file"):
        load_rubric("no-such-rubric")


@pytest.mark.parametrize("bad", [dict(judge="http://x/v1"), dict(judge="http://x/v1#m", combine="max"),
                                 dict(judge="http://x/v1#m", combine="gated:2"), dict(judge=""),
                                 dict(judge="http://x/v1#m", combine="sum:abc"), dict(judge="j", timeout=0)])
def test_rpr_config_garbage(bad):
    with pytest.raises(ValueError):
        RPRConfig(**bad)


def test_rpr_with_bar_trl_step(tiny, judge, local_root, tmp_path):
    """A real TRL step: BAR assembles the groups on the outcome, the judge's process score (scripted
    0.5) is added with lambda 0.5, the combination is what TRL's group-relative estimator sees."""
    student, _, tok, _ = tiny
    student = copy.deepcopy(student)
    args = agent_args(local_root, algo="bar", dynamic_sampling=True, group_size=2, prompts_per_step=1,
                      bar={"group_size": 2, "stride": 2, "max_rollouts": 4},
                      rpr={"judge": f"{judge.url}#judge", "combine": "sum:0.5"})
    config = make_grpo_config(tmp_path, args, steps=1, learning_rate=1e-2)
    trainer, rollout = build_trainer(student, tok, args, config, make_env=make_alternating_env,
                                     task_ids=["write-000"], metrics_path=tmp_path / "m.jsonl")
    seen = spy(trainer, lambda result: (copy.deepcopy(rollout.last_output), rollout.last_slots))
    try:
        trainer.train()
    finally:
        rollout.close()
    out, slots = seen[0]
    samples = slots[0].samples
    assert slots[0].trained and sorted(s.trajectory.reward for s in samples) == [0.0, 1.0]  # BAR: balanced
    assert out["env_reward"] == [pytest.approx(s.trajectory.reward + 0.5 * 0.5) for s in samples]
    import json

    row = json.loads((tmp_path / "m.jsonl").read_text().splitlines()[0])
    assert row["rpr/judged"] == 2 and row["rpr/dropped"] == 0 and row["rpr/judge_seconds"] > 0


# ------------------------------------------------------------------ CLI
@pytest.mark.parametrize("flags, why", [(["--opd-only"], "needs --opd-teacher"),
                                        (["--opd-teacher", "t", "--opd-only", "--algo", "bar"], "BAR"),
                                        (["--rpr-judge", "http://x/v1#m", "--rpr-combine", "max"], "combine"),
                                        (["--rpr-rubric", "swe"], "needs --rpr-judge"),
                                        (["--opd-teacher", "t", "--opd-coef", "-1"], "coef")])
def test_cli_dense_flags_garbage(flags, why, tmp_path):
    from click.testing import CliRunner

    from orchard_gym.cli import main

    r = CliRunner().invoke(main, ["train", "grpo", "--model", str(tmp_path), *flags])
    assert r.exit_code == 2 and why in r.output, r.output


def test_local_judge_model_garbage_is_retried_then_dropped(tiny):
    """A local HF judge (here the random tiny model: it cannot write JSON) goes through the same
    validation: one retry with the error shown, then the sample is dropped."""
    _, _, tok, tpath = tiny
    from orchard_gym._loop import LoopThread
    from orchard_gym.algos.rpr import JudgeError, LocalJudge, judge_once

    judge = LocalJudge(str(tpath), max_tokens=8)
    rubric = load_rubric("generic")
    with pytest.raises(JudgeError, match="invalid after a retry"):
        LoopThread.shared().run(judge_once(judge, rubric, summarise(episode("x", 1.0, tok).trajectory, "t"), 60))
    with pytest.raises(ValueError, match="local model folder"):
        RPRScorer(RPRConfig(judge="/no/such/judge"), tok)


def test_a_copy_of_a_warm_started_model_gets_gradients(tiny):
    """Regression: SFTTrainer left a `forward` wrapper bound to the SFT'd object, so a deepcopy of it
    (scripts/demo_opd.py trained one) ran the original's forward and its own parameters never got a
    gradient: the OPD (and outcome) runs trained nothing and the KL to the teacher stayed flat."""
    from orchard_gym.algos.warmstart import sft_warm_start
    from orchard_gym.envs.toy.env import oracle_messages

    student, _, tok, tpath = tiny
    model = copy.deepcopy(student)
    sft_warm_start(model, tok, [oracle_messages(t, SYSTEM) for t in TASKS.values()], steps=1, learning_rate=1e-9,
                   batch_size=2, output_dir=str(tpath / "sft"))
    clone = copy.deepcopy(model).train()
    x = torch.tensor([tok("echo hi > out.txt")["input_ids"]])
    clone(input_ids=x).logits.log_softmax(-1)[..., 1].sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in clone.parameters())
    assert all(p.grad is None for p in model.parameters())  # the original was not the one trained
