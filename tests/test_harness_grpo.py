"""GRPO on harness samples: a real harness process (the stdlib ReAct harness of
tests/harness_scripts.py) in real local sandboxes, its calls answered by a tiny model
through the recording proxy, one real TRL step.

Rewards: Orchard/Toy-v0 with a scripted grade (the real check still runs): the n-th graded
run of a task gets n % 2 and the 4th dies with an infrastructure error, so a group of 4
runs has terminal rewards {1, 0, 1, error} whatever the random model generates."""

from __future__ import annotations

import collections
import copy
import json
import math

import pytest

from conftest import require_module

torch = require_module("train", "torch")
require_module("train", "trl")
require_module("server", "fastapi")

from harness_scripts import react  # noqa: E402
from orchard_gym.algos.agent_rollout import ChatRenderer, SamplingParams  # noqa: E402
from orchard_gym.algos.harness_grpo import (  # noqa: E402
    HarnessGRPOArgs,
    build_trainer,
    grpo_config,
    parse_completion,
)
from orchard_gym.algos.tiny import build_tiny_model, toy_corpus  # noqa: E402
from orchard_gym.envs.toy.env import ToyEnv, make_tasks  # noqa: E402
from toy_grading import AlternatingToy  # noqa: E402
from orchard_gym.errors import SandboxFailed  # noqa: E402
from orchard_gym.wrappers.harness.env import HarnessEnv  # noqa: E402

torch.set_num_threads(1)
TASKS = make_tasks(["write"], num_tasks=1)
TASK = "write-000"


class ScriptedToy(AlternatingToy):
    async def grade(self, ctx, task):
        reward, report = await super().grade(ctx, task)
        if type(self).counts[task.task_id] % 4 == 0:
            raise SandboxFailed("injected: the sandbox died while grading")
        return reward, report


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    model, tokenizer = build_tiny_model(toy_corpus(TASKS.values(), "You are a test harness."), path, vocab_size=512,
                                        max_position_embeddings=4096)
    return path, model, tokenizer


def args_for(local_root, **kw) -> HarnessGRPOArgs:
    defaults = dict(env_id="Orchard/Toy-v0", harness="mini-swe-agent", backend={"type": "local", "root": str(local_root)},
                    group_size=4, prompts_per_step=1, max_calls=2, max_seconds=120, seed=0,
                    sampling=SamplingParams(max_new_tokens=12, linger=0.01))
    defaults.update(kw)
    return HarnessGRPOArgs(**defaults)


def make_env(client, proxy, max_calls=2):
    return HarnessEnv(ScriptedToy(tasks=TASKS, client=client), react(), proxy=proxy, max_steps=max_calls,
                      max_seconds=120)


@pytest.mark.timeout(900)
def test_harness_samples_rows_advantages_and_a_trl_step(tiny, local_root, tmp_path):
    path, model, tokenizer = tiny
    ScriptedToy.counts = collections.Counter()
    args = args_for(local_root)
    config = grpo_config(tmp_path / "run", args, steps=1, learning_rate=1e-2)
    assert config.num_generations == 8  # group_size × max_calls rows per group
    trainer, rollout = build_trainer(model, tokenizer, args, config, task_ids=[TASK], make_env=make_env,
                                     metrics_path=tmp_path / "run" / "metrics.jsonl")
    before = [p.detach().clone() for p in model.parameters()]
    try:
        trainer.train()
        runs, out = rollout.last_runs, rollout.last_rows
    finally:
        rollout.close()
    # 4 runs; the errored one gives no samples; each usable run answered exactly max_calls calls
    assert sorted(r.reward for r in runs if r.error is None) == [0.0, 1.0, 1.0]
    errored = [r for r in runs if r.error is not None]
    assert len(errored) == 1 and "grading failed" in errored[0].error and errored[0].samples == []
    assert all(len(r.samples) == 2 for r in runs if r.error is None)
    assert len(out["prompt_ids"]) == 8 and sum(1 for m in out["env_mask"] if any(m)) == 6
    assert out["env_reward"][6:] == [None, None]
    # the prompt is the harness's exact request, tokenised once: the recorded ids, which are its rendering
    renderer = ChatRenderer(tokenizer)
    samples = [s for r in runs if r.error is None for s in r.samples]
    for row, s in zip(out["prompt_ids"], samples, strict=False):
        assert row == s.prompt_token_ids == renderer.prompt_ids(s.messages, s.tools)
        assert s.messages[0] == {"role": "system", "content": "You are a test harness."}
    assert [len(c) for c in out["completion_ids"][:6]] == [len(s.completion_token_ids) for s in samples]
    # group-relative advantages over the runs: mu = 2/3, sigma = std([1, 0, 1])
    mu, sigma = 2 / 3, math.sqrt(((1 / 3) ** 2 * 2 + (2 / 3) ** 2) / 2)
    want = [(s.reward - mu) / (sigma + 1e-4) for s in samples] + [0.0, 0.0]
    assert all(math.isclose(a, b, abs_tol=1e-9) for a, b in zip(rollout.last_advantages, want, strict=True))
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert row["rollout/samples"] == 6 and row["rollout/errored_runs"] == 1 and row["rollout/runs"] == 4
    assert math.isclose(row["rollout/advantage_abs_mean"], sum(abs(a) for a in want[:6]) / 6, rel_tol=1e-6)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True)), "no update"


def test_parse_completion_and_bad_args(local_root):
    msg = parse_completion('ok <tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>')
    assert msg["content"] == "ok" and msg["tool_calls"][0]["function"] == {"name": "bash",
                                                                            "arguments": '{"command": "ls"}'}
    assert parse_completion("<tool_call>not json</tool_call>") == {"role": "assistant",
                                                                    "content": "<tool_call>not json</tool_call>"}
    assert parse_completion("") == {"role": "assistant", "content": ""}
    for bad, match in [({"harness": "no-such"}, "unknown harness"), ({"max_calls": 0}, "max_calls"),
                       ({"gamma": 1.5}, "gamma"), ({"algo": "bar"}, "fixed groups")]:
        with pytest.raises(ValueError, match=match):
            args_for(local_root, **bad)


# ------------------------------------------------------------------ the shared GRPO flags with --harness
class FirstTwoDull(ToyEnv):
    """The first two graded runs (whatever their task) get 0.0, then 1, 0, 1, ...: the batch's first
    group carries no signal, the replacement group does."""

    graded = 0

    async def grade(self, ctx, task):
        _, report = await super().grade(ctx, task)
        type(self).graded += 1
        n = type(self).graded
        return (0.0 if n <= 2 else float(n % 2)), report


def make_dull_env(client, proxy, max_calls=2):
    return HarnessEnv(FirstTwoDull(tasks=TWO_TASKS, client=client), react(), proxy=proxy, max_steps=max_calls,
                      max_seconds=120)


TWO_TASKS = make_tasks(["write"], num_tasks=2)


@pytest.mark.timeout(900)
def test_harness_with_opd_dynamic_sampling_and_step_budget_in_one_trl_step(tiny, local_root, tmp_path):
    """--harness --opd-teacher --dynamic-sampling --step-budget 1 in one real TRL step: the dull group is
    replaced, every run answers 1 call (not max_calls=2), and the trained advantages are the harness's
    group-relative ones plus coef × the teacher's per-token signal (two trainer hooks composed)."""
    from dense_servers import TeacherServer
    from trainer_spy import spy

    from orchard_gym.algos.tiny import build_model

    path, model, tokenizer = tiny
    model = copy.deepcopy(model)
    teacher = build_model(tokenizer, max_position_embeddings=4096, seed=1)
    FirstTwoDull.graded = 0
    with TeacherServer(teacher, tokenizer) as server:
        args = args_for(local_root, group_size=2, step_budget="1", dynamic_sampling=True, max_resamples=2,
                        opd={"teacher": f"{server.url}#teacher", "coef": 0.5})
        config = grpo_config(tmp_path / "run", args, steps=1, learning_rate=1e-2)
        trainer, rollout = build_trainer(model, tokenizer, args, config, task_ids=["write-000", "write-001"],
                                         make_env=make_dull_env, metrics_path=tmp_path / "run" / "metrics.jsonl")
        seen = spy(trainer, lambda result: (result, copy.deepcopy(rollout.last_output),
                                            list(rollout.last_advantages)))
        before = [p.detach().clone() for p in model.parameters()]
        try:
            trainer.train()
        finally:
            rollout.close()
        assert server.requests >= 1
    result, out, harness_adv = seen[0]
    group = rollout.last_groups[0]
    assert group.resamples == 1 and group.trained and FirstTwoDull.graded == 4
    assert sorted(r.reward for r in group.runs) == [0.0, 1.0]
    assert all(len(r.samples) == 1 for r in group.runs)  # the step budget, not max_calls
    assert len(out["prompt_ids"]) == 4 and out["env_reward"][2:] == [None, None]  # 2 samples, 2 padding rows
    adv, mask = result["advantages"], result["completion_mask"]
    assert adv.shape == result["completion_ids"].shape  # OPD made them per-token
    assert any(abs(v) > 1e-3 for row in out["opd_signal"][:2] for v in row)
    for i, row in enumerate(out["opd_signal"]):
        n = len(row)
        want = harness_adv[i] + 0.5 * torch.tensor(row, dtype=adv.dtype)
        assert torch.allclose(adv[i, :n][mask[i, :n] == 1], want[mask[i, :n] == 1], atol=1e-5)
    assert abs(harness_adv[0]) > 0.5  # group-relative over the runs, not zero
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert row["rollout/resamples"] == 1 and row["rollout/step_budget"] == 1 and row["rollout/groups_trained"] == 1
    assert row["opd/scored"] == 2 and row["opd/dropped"] == 0 and row["opd/kl"] is not None
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True)), "no update"


@pytest.mark.parametrize("flags, why", [
    (["--harness", "mini-swe-agent", "--branch-at", "1"], "--branch-at does not combine with --harness"),
    (["--harness", "mini-swe-agent", "--rpr-judge", "http://x/v1#m"], "--rpr-judge does not combine with --harness"),
    (["--harness", "mini-swe-agent", "--opd-teacher", "t", "--opd-only"], "--opd-only does not combine"),
    (["--harness", "mini-swe-agent", "--algo", "bar"], "fixed groups"),
    (["--harness", "mini-swe-agent", "--system-prompt", "hi"], "--system-prompt does not combine with --harness"),
    (["--harness", "no-such"], "unknown harness"),
    (["--gamma", "0.5"], "--gamma only apply with --harness"),
    (["--max-calls", "3"], "--max-calls only apply with --harness"),
])
def test_cli_harness_flags_that_do_not_combine_are_refused(flags, why, tmp_path):
    """Refused with a usage error (exit 2) before anything starts: no run folder, no model loaded."""
    from click.testing import CliRunner

    from orchard_gym.cli import main

    run = tmp_path / "run"
    r = CliRunner().invoke(main, ["train", "grpo", "--model", str(tmp_path), "--out", str(run), *flags])
    assert r.exit_code == 2 and why in r.output, r.output
    assert not run.exists()
