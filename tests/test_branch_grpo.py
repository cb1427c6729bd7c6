"""GRPO groups forked at turn K (`AgentGRPOArgs.branch_at`, algos/branch_rollout.py): a tiny
model built offline plays the root in a real local sandbox, the group's episodes are forks
of it sharing its first K turns, whose tokens carry no loss."""

from __future__ import annotations

import pytest

from conftest import require_module  # noqa: E402

torch = require_module("train", "torch")
require_module("train", "trl")

from orchard_gym.algos.agent_rollout import SamplingParams  # noqa: E402
from orchard_gym.algos.grpo import AgentGRPOArgs, AgentRolloutFunc  # noqa: E402
from orchard_gym.algos.tiny import build_tiny_model, toy_corpus  # noqa: E402
from orchard_gym.envs.toy.env import ToyEnv, make_tasks  # noqa: E402
from orchard_gym.envs.tools import BashTool  # noqa: E402

torch.set_num_threads(1)
TASKS = make_tasks(["write"], num_tasks=1)
SYSTEM = "Act."


class BashOnlyToy(ToyEnv):
    """No submit tool: every episode runs its whole step budget, so the root always reaches turn K."""

    def make_tools(self):
        return [BashTool()]


def segments(mask):
    out, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            out.append((mask[start], start, i))
            start = i
    return out


def test_branched_groups_share_the_prefix_and_train_only_after_it(tmp_path, local_root):
    model, tok = build_tiny_model(toy_corpus(TASKS.values(), SYSTEM), tmp_path, vocab_size=512, hidden_size=32,
                                  num_layers=1, intermediate_size=64)
    args = AgentGRPOArgs(env_id="Orchard/Toy-v0", backend={"type": "local", "root": str(local_root)}, group_size=3,
                         prompts_per_step=1, step_budget="3", max_seconds=60, system_prompt=SYSTEM,
                         render_tools=False, dynamic_sampling=False, branch_at=1,
                         sampling=SamplingParams(max_new_tokens=12, max_completion_tokens=80, linger=0.01))
    rollout = AgentRolloutFunc(args, tok, make_env=lambda c, s, t: BashOnlyToy(tasks=TASKS, client=c, max_steps=s,
                                                                              max_seconds=t),
                               task_ids=list(TASKS))
    rollout._model = model
    try:
        out = rollout.rollout(["write-000"], max_steps=3)
    finally:
        rollout.close()
    samples = rollout.last_slots[0].samples
    assert len(samples) == 3 and all(s.ok for s in samples), [s.excluded for s in samples]
    first = samples[0].trajectory.turns[0].action
    for s, mask in zip(samples, out["env_mask"], strict=True):
        assert s.trajectory.steps == 3 and s.trajectory.turns[0].action == first  # the root's turn 0
        assert s.trajectory.metadata["branch"]["at"] == 1
        actions = [seg for seg in segments(s.action_mask) if seg[0] == 1]
        assert len(actions) == 3
        _, a0, b0 = actions[0]
        assert set(mask[a0:b0]) == {0}  # the shared turn: no loss
        assert all(set(mask[a:b]) == {1} for _, a, b in actions[1:])  # the forked turns train
        assert s.completion_ids[:actions[1][1]] == samples[0].completion_ids[:actions[1][1]]
    with pytest.raises(ValueError, match="branch_at is a turn"):
        AgentGRPOArgs(branch_at=-1)
    with pytest.raises(ValueError, match="branch_at is a turn"):
        AgentGRPOArgs(branch_at=1, algo="bar")
