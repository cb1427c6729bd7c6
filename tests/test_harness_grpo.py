"""GRPO on harness samples: a real harness process (the stdlib ReAct harness of
tests/harness_scripts.py) in real local sandboxes, its calls answered by a tiny model
through the recording proxy, one real TRL step.

Rewards: Orchard/Toy-v0 with a scripted grade (the real check still runs): the n-th graded
run of a task gets n % 2 and the 4th dies with an infrastructure error, so a group of 4
runs has terminal rewards {1, 0, 1, error} whatever the random model generates."""

from __future__ import annotations

import collections
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
from orchard_gym.errors import SandboxFailed  # noqa: E402
from orchard_gym.wrappers.harness_env import HarnessEnv  # noqa: E402

torch.set_num_threads(1)
TASKS = make_tasks(["write"], num_tasks=1)
TASK = "write-000"


class ScriptedToy(ToyEnv):
    counts: collections.Counter = collections.Counter()

    async def grade(self, ctx, task):
        _, report = await super().grade(ctx, task)
        type(self).counts[task.task_id] += 1
        n = type(self).counts[task.task_id]
        if n % 4 == 0:
            raise SandboxFailed("injected: the sandbox died while grading")
        return float(n % 2), report


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
