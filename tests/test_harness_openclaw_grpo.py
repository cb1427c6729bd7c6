"""`train grpo --harness openclaw`: the real OpenClaw in real local sandboxes, its calls answered
by a tiny model through the recording proxy, one real TRL step (as tests/test_harness_grpo.py
does with a stdlib harness). OpenClaw's request is large (its system prompt and tool schemas,
~38 KB), so the tiny model gets a long context; each run answers one call. Its tokenizer is also
trained on OpenClaw's own texts (the workspace templates and skills its prompt is built from):
OpenClaw's request is ~12.5k tokens instead of ~30k with the toy corpus alone, and attention,
quadratic in that, was most of this test's time (138 s of a 20-minute CI run).

Rewards: Orchard/Toy-v0 with a scripted grade (the real check still runs): the n-th graded
run gets n % 2, so a group of 2 has terminal rewards {1, 0} whatever the model generates."""

from __future__ import annotations

import collections
import os
import statistics

import pytest

from conftest import require, require_module

torch = require_module("train", "torch")
require_module("train", "trl")
require_module("server", "fastapi")

from orchard_gym.algos.agent_rollout import ChatRenderer, SamplingParams  # noqa: E402
from orchard_gym.algos.harness_grpo import HarnessGRPOArgs, build_trainer, grpo_config  # noqa: E402
from orchard_gym.algos.tiny import build_tiny_model, toy_corpus  # noqa: E402
from orchard_gym.envs.toy.env import make_tasks  # noqa: E402
from toy_grading import AlternatingToy  # noqa: E402
from orchard_gym.wrappers.harness.env import HarnessEnv  # noqa: E402
from orchard_gym.wrappers.harness.plugins.openclaw import HARNESS as OPENCLAW  # noqa: E402


def _openclaw_texts() -> list[str]:
    """The texts OpenClaw builds its system prompt from, as shipped in its npm package."""
    package = OPENCLAW.install_npm() / "node_modules" / "openclaw"
    files = sorted(package.glob("docs/reference/templates/*.md")) + sorted(package.glob("skills/*/SKILL.md"))
    assert files, f"no workspace templates or skills under {package} (OpenClaw moved them? see the docstring)"
    return [f.read_text(errors="replace") for f in files]


def _installed() -> str | None:
    try:
        prefix = OPENCLAW.install_npm()
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return None if os.access(prefix / "node_modules" / ".bin" / "openclaw", os.X_OK) else f"no openclaw under {prefix}"


require("harnesses", _installed())

torch.set_num_threads(1)
TASKS = make_tasks(["write"], num_tasks=1)
TASK = "write-000"



@pytest.mark.timeout(1500)
def test_a_grpo_step_on_openclaw_runs(local_root, tmp_path):
    model, tokenizer = build_tiny_model(toy_corpus(TASKS.values()) + _openclaw_texts(), tmp_path / "tiny",
                                        vocab_size=4096, max_position_embeddings=65536)
    AlternatingToy.counts = collections.Counter()
    args = HarnessGRPOArgs(env_id="Orchard/Toy-v0", harness="openclaw", backend={"type": "local", "root": str(local_root)},
                           group_size=2, prompts_per_step=1, max_calls=1, max_seconds=600, seed=0,
                           sampling=SamplingParams(max_new_tokens=8, linger=0.01))
    # no gradient checkpointing: two layers of a tiny model need no memory saved, and recomputing
    # their forward pass over OpenClaw's long prompt was a fifth of the step
    config = grpo_config(tmp_path / "run", args, steps=1, learning_rate=1e-2, gradient_checkpointing=False)

    def make_env(client, proxy, max_calls=1):
        return HarnessEnv(AlternatingToy(tasks=TASKS, client=client), "openclaw", proxy=proxy, max_steps=max_calls,
                          max_seconds=600)

    trainer, rollout = build_trainer(model, tokenizer, args, config, task_ids=[TASK], make_env=make_env,
                                     metrics_path=tmp_path / "run" / "metrics.jsonl")
    before = [p.detach().clone() for p in model.parameters()]
    try:
        trainer.train()
        runs, out = rollout.last_runs, rollout.last_rows
    finally:
        rollout.close()
    assert [r.error for r in runs] == [None, None], [r.error for r in runs]
    assert sorted(r.reward for r in runs) == [0.0, 1.0]
    samples = [s for r in runs for s in r.samples]
    assert len(samples) == 2 and len(out["prompt_ids"]) == 2
    renderer = ChatRenderer(tokenizer)
    for row, s in zip(out["prompt_ids"], samples, strict=True):  # OpenClaw's own request, as it sent it
        assert row == s.prompt_token_ids == renderer.prompt_ids(s.messages, s.tools)
        assert "OpenClaw" in s.messages[0]["content"] and "exec" in [t["function"]["name"] for t in s.tools]
    a = 0.5 / (statistics.stdev([0.0, 1.0]) + 1e-4)  # group-relative: (r - mu) / (sigma + 1e-4)
    assert sorted(rollout.last_advantages) == pytest.approx([-a, a])
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True)), "no update"
