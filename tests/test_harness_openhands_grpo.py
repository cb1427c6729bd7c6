"""GRPO through OpenHands (tests/test_harness_grpo.py's pattern, with the real OpenHands
harness instead of the stdlib ReAct one): real OpenHands runs in local sandboxes, its calls
answered by a tiny model through the recording proxy, one real TRL step.

The tiny model's tokenizer is trained on OpenHands' own prompt (its system prompt and tool
schemas, taken from one real run) so the ~30k-character prompt fits a small context.
Rewards: Orchard/Toy-v0 with a scripted grade (the real check still runs): the n-th graded run
gets n % 2, so a group of 2 runs has rewards {1, 0} whatever the random model says."""

from __future__ import annotations

import collections
import json

import pytest

from conftest import require, require_module

torch = require_module("train", "torch")
require_module("train", "trl")
require_module("server", "fastapi")

from orchard_gym.algos.harness_grpo import HarnessGRPOArgs, build_trainer, grpo_config  # noqa: E402
from orchard_gym.algos.agent_rollout import SamplingParams  # noqa: E402
from orchard_gym.algos.tiny import build_tiny_model, toy_corpus  # noqa: E402
from orchard_gym.envs.toy.env import ToyEnv, make_tasks  # noqa: E402
from toy_grading import AlternatingToy  # noqa: E402
from orchard_gym.wrappers.harness.env import HarnessEnv  # noqa: E402
from orchard_gym.wrappers.harness.plugins.openhands import HARNESS as OPENHANDS  # noqa: E402


def _installed() -> str | None:
    try:
        OPENHANDS.install()
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return None


require("harnesses", _installed())

torch.set_num_threads(1)
TASKS = make_tasks(["write"], num_tasks=1)
TASK = "write-000"



def make_env(client, proxy, max_calls=1):
    return HarnessEnv(AlternatingToy(tasks=TASKS, client=client), OPENHANDS, proxy=proxy, max_steps=max_calls,
                      max_seconds=600)


@pytest.mark.timeout(1800)
def test_a_grpo_step_on_openhands_runs(local_root, tmp_path):
    # OpenHands' prompt, from one real run (reset shows its first request)
    env = HarnessEnv(ToyEnv(tasks=TASKS, backend={"type": "local", "root": str(local_root)}), OPENHANDS,
                     max_steps=1, max_seconds=600)
    try:
        obs, _ = env.reset(options={"task_id": TASK})
    finally:
        env.close()
    request = json.loads(obs)
    texts = [m["content"] if isinstance(m["content"], str) else json.dumps(m["content"])
             for m in request["messages"]]
    model, tokenizer = build_tiny_model(toy_corpus(TASKS.values(), tools=request["tools"]) + texts * 3,
                                        tmp_path / "tiny", vocab_size=4096, max_position_embeddings=32768)
    AlternatingToy.counts = collections.Counter()
    args = HarnessGRPOArgs(env_id="Orchard/Toy-v0", harness="openhands",
                           backend={"type": "local", "root": str(local_root)}, group_size=2, prompts_per_step=1,
                           max_calls=1, max_seconds=600, seed=0,
                           sampling=SamplingParams(max_new_tokens=8, linger=0.01))
    config = grpo_config(tmp_path / "run", args, steps=1, learning_rate=1e-2)
    trainer, rollout = build_trainer(model, tokenizer, args, config, task_ids=[TASK], make_env=make_env,
                                     metrics_path=tmp_path / "run" / "metrics.jsonl")
    before = [p.detach().clone() for p in model.parameters()]
    try:
        trainer.train()
        runs = rollout.last_runs
    finally:
        rollout.close()
    assert [r.error for r in runs] == [None, None]
    assert sorted(r.reward for r in runs) == [0.0, 1.0] and all(len(r.samples) == 1 for r in runs)
    for r in runs:  # the sample's prompt is OpenHands' exact request
        (s,) = r.samples
        assert s.messages[0]["role"] == "system" and {t["function"]["name"] for t in s.tools} >= {"terminal", "finish"}
    sigma = 0.5 ** 0.5  # the sample std of {0, 1}
    assert sorted(rollout.last_advantages) == pytest.approx([-0.5 / (sigma + 1e-4), 0.5 / (sigma + 1e-4)])
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True)), "no update"
