"""BAR (Balanced Adaptive Rollout) with scripted reward sources, the step-budget curriculum,
and Orchard/Toy-v0 on real local sandboxes. No torch needed here."""

from __future__ import annotations

import asyncio
import random

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import orchard_gym  # noqa: F401 - registers the env ids
from orchard_gym.algos.bar import (
    BARConfig,
    BARSampler,
    FixedSampler,
    Scripted,
    ScriptedRollout,
    assemble,
    best_effort,
    simulate,
)
from orchard_gym.algos.grpo import parse_step_budget, step_budget_at
from orchard_gym.envs.toy.env import KINDS, make_tasks


def run(coro):
    return asyncio.run(coro)


class Sequence_:
    """A prompt whose rollouts have exactly these rewards, in order (None: an errored rollout)."""

    def __init__(self, rewards):
        self.rewards = list(rewards)
        self.calls = []

    async def __call__(self, n):
        self.calls.append(n)
        out = []
        for _ in range(n):
            r = self.rewards.pop(0)
            out.append(ScriptedRollout(reward=0.0 if r is None else r, ok=r is not None))
        return out


# ------------------------------------------------------------------ assembly
def test_admissible_counts_follow_the_interval():
    assert list(BARConfig().admissible_counts()) == [2, 3, 4, 5, 6]
    assert list(BARConfig(group_size=4, stride=2, max_rollouts=8, low=0.5, high=0.5).admissible_counts()) == [2]
    with pytest.raises(ValueError, match="no positive count"):
        BARConfig(group_size=4, max_rollouts=8, low=0.3, high=0.45)
    with pytest.raises(ValueError):
        BARConfig(max_rollouts=4)
    with pytest.raises(ValueError):
        BARConfig(low=0.8, high=0.2)


def test_assemble_picks_a_balanced_order_preserving_group():
    cfg = BARConfig()
    assert assemble([1, 0, 1, 0, 1, 0, 1], cfg) is None  # only 7 usable
    assert assemble([0] * 12, cfg) is None and assemble([1] * 12, cfg) is None
    # 6 positives, 6 negatives: 4 + 4, the first of each
    rewards = [1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0]
    assert assemble(rewards, cfg) == [0, 1, 2, 3, 6, 7, 8, 9]
    # 1 positive of 10: not admissible (needs >= 2 of 8)
    assert assemble([0, 0, 0, 1, 0, 0, 0, 0, 0, 0], cfg) is None
    # 2 positives among 10: k=2 is the only feasible count
    picked = assemble([0, 0, 0, 1, 0, 0, 0, 1, 0, 0], cfg)
    assert picked == [0, 1, 2, 3, 4, 5, 6, 7] and sum([0, 0, 0, 1, 0, 0, 0, 1, 0, 0][i] for i in picked) == 2
    # 9 positives and 3 negatives: at least 5 positives needed; balanced takes 5
    many = [1] * 9 + [0] * 3
    assert sum(many[i] for i in assemble(many, cfg)) == 5
    # proportional: nearest to the observed rate (9/12 of 8 = 6)
    prop = BARConfig(pick="proportional")
    assert sum(many[i] for i in assemble(many, prop)) == 6
    # rewards in {-1, +1}: positive means above the threshold
    assert sum(1 for i in assemble([-1, 1] * 4, cfg) if [-1, 1][i % 2] > 0) == 4


def test_best_effort_gets_as_close_to_the_interval_as_it_can():
    cfg = BARConfig()
    kept = best_effort([0] * 31 + [1], cfg)
    assert len(kept) == 8 and 31 in kept  # the one positive is in
    assert best_effort([1, 0, 1], cfg) == [0, 1, 2]  # fewer than a group: all of it


# ------------------------------------------------------------------ the online schedule
def test_bar_stops_at_the_first_stride_that_balances():
    source = Sequence_([1, 0, 1, 0, 0, 1, 0, 1] + [1] * 100)
    outcome = run(BARSampler().sample(source))
    assert source.calls == [4, 4] and outcome.spent == 8 and outcome.rounds == 2
    assert outcome.informative and not outcome.dropped and outcome.positives == 4 and len(outcome.group) == 8


def test_bar_keeps_generating_a_hard_prompt_until_two_positives():
    rewards = [0] * 10 + [1] + [0] * 6 + [1] + [0] * 20
    source = Sequence_(rewards)
    outcome = run(BARSampler().sample(source))
    assert outcome.spent == 20 and source.calls == [4] * 5  # the 2nd positive is rollout 18: round 5
    assert outcome.positives == 2 and len(outcome.group) == 8 and outcome.informative


def test_bar_drops_a_prompt_when_the_budget_runs_out():
    source = Sequence_([0] * 40)
    outcome = run(BARSampler().sample(source))
    assert outcome.dropped and not outcome.informative and outcome.group == []
    assert outcome.spent == 32 and sum(source.calls) == 32
    kept = run(BARSampler(BARConfig(on_exhausted="keep")).sample(Sequence_([0] * 31 + [1])))
    assert not kept.dropped and len(kept.group) == 8 and kept.positives == 1 and kept.informative


def test_bar_never_puts_errored_rollouts_in_the_group():
    source = Sequence_([None, 1, None, 0, 1, 0, None, None, 1, 0, 1, 0] + [0] * 30)
    outcome = run(BARSampler().sample(source))
    assert all(r.ok for r in outcome.group) and len(outcome.group) == 8
    assert outcome.spent == 12  # 4 errored rollouts count as spent, not usable


def test_bar_uses_known_success_rates_as_expected():
    rng = random.Random(0)
    cfg = BARConfig()
    spent = {}
    for p in (0.05, 0.5, 0.95):
        outcomes = [run(BARSampler(cfg).sample(Scripted(p, rng))) for _ in range(200)]
        for o in outcomes:
            assert o.spent <= cfg.max_rollouts and o.spent % cfg.stride == 0
            if not o.dropped:
                assert len(o.group) == 8 and 2 <= o.positives <= 6
        spent[p] = sum(o.spent for o in outcomes) / len(outcomes)
        if p == 0.5:  # balanced prompts are assembled from the first 8 rollouts nearly always
            assert sum(o.spent == 8 for o in outcomes) > 0.8 * len(outcomes)
            assert 3.5 < sum(o.positives for o in outcomes) / len(outcomes) < 4.5
    assert spent[0.5] < spent[0.95] and spent[0.5] < spent[0.05]  # extremes cost more rollouts


def test_fixed_sampler_counts_all_equal_groups_as_uninformative():
    assert not run(FixedSampler(4).sample(Sequence_([1, 1, 1, 1]))).informative
    assert run(FixedSampler(4).sample(Sequence_([1, 0, 1, 1]))).informative
    # an errored rollout does not make a group informative
    assert not run(FixedSampler(4).sample(Sequence_([None, 0, 0, 0]))).informative


def test_bar_trains_only_balanced_groups_but_pays_more_rollouts_per_informative_group():
    """The trade at one budget on mixed difficulty: every group BAR trains on is balanced
    and carries twice the reward spread, but it spends its budget on hard prompts (up to 32
    rollouts before dropping one), so it ends with fewer informative groups than fixed-N,
    each costing more than twice the rollouts (seed 1: 201 groups at 39.9 rollouts each,
    against fixed-N's 478 at 16.7)."""
    rates = [0.0, 0.02, 0.1, 0.3, 0.5, 0.7, 0.9, 0.98, 1.0]
    fixed = run(simulate(FixedSampler(8), rates, budget=8000, seed=1))
    bar = run(simulate(BARSampler(), rates, budget=8000, seed=1))
    assert abs(fixed.rollouts - bar.rollouts) <= 32  # the same budget
    # the gain: BAR trains on balanced groups only; fixed-N hands on all-equal ones too
    assert bar.informative == bar.balanced == bar.prompts - bar.dropped
    assert bar.as_dict()["informative_share_of_trained"] == 1.0
    assert fixed.as_dict()["informative_share_of_trained"] < 0.6
    assert bar.as_dict()["mean_group_reward_std"] > 2 * fixed.as_dict()["mean_group_reward_std"]
    assert bar.balanced_share > fixed.balanced_share  # per prompt drawn, dropped ones included
    # the cost: fewer informative groups for the budget, each dearer, even per balanced group
    assert bar.dropped > 0.3 * bar.prompts  # the hopeless prompts' budgets are spent, then dropped
    assert fixed.informative > 2 * bar.informative and fixed.balanced > bar.balanced
    assert bar.rollouts_per_informative_group > 2 * fixed.rollouts_per_informative_group
    assert bar.rollouts_per_balanced_group > fixed.rollouts_per_balanced_group


# ------------------------------------------------------------------ curriculum
def test_step_budget_curriculum():
    assert parse_step_budget("15,30@50%", 100) == [(0, 15), (50, 30)]
    assert parse_step_budget("15,30@40", 100) == [(0, 15), (40, 30)]
    assert parse_step_budget("8", 10) == [(0, 8)]
    schedule = parse_step_budget("15,30@50%", 10)
    assert [step_budget_at(schedule, s) for s in (0, 4, 5, 9)] == [15, 15, 30, 30]
    assert parse_step_budget("15,30", 10) == [(0, 15), (5, 30)]  # no '@': equal phases
    assert parse_step_budget("5,10,20", 9) == [(0, 5), (3, 10), (6, 20)]
    for bad in ("15@3", "15,30@2,40", "x", "0", "15,30@5,40@2", "15,0"):
        with pytest.raises(ValueError):
            parse_step_budget(bad, 10)


# ------------------------------------------------------------------ Orchard/Toy-v0
@pytest.fixture
def toy(local_root):
    env = gym.make("Orchard/Toy-v0", backend={"type": "local", "root": str(local_root)}, num_tasks=3, max_steps=4)
    yield env
    env.close()


def test_toy_tasks_are_deterministic_and_cover_every_kind():
    a, b = make_tasks(num_tasks=5, seed=3), make_tasks(num_tasks=5, seed=3)
    assert a == b and len(a) == 15 and {t.kind for t in a.values()} == set(KINDS)
    assert make_tasks(num_tasks=5, seed=4) != a
    with pytest.raises(ValueError, match="unknown toy task kind"):
        make_tasks(["nope"])


def test_toy_env_passes_check_env(toy):
    check_env(toy.unwrapped, skip_render_check=True)


@pytest.mark.parametrize("kind", KINDS)
def test_toy_oracle_solves_and_doing_nothing_fails(toy, kind):
    task_id = f"{kind}-001"
    obs, info = toy.reset(options={"task_id": task_id})
    assert toy.unwrapped.task.instruction in obs and {t["function"]["name"] for t in info["tools"]} == {"bash", "submit"}
    toy.step({"name": "bash", "arguments": {"command": toy.unwrapped.task.solution}})
    _, reward, terminated, _, info = toy.step({"name": "submit", "arguments": {}})
    assert terminated and reward == 1.0 and info["report"]["passed"]
    toy.reset(options={"task_id": task_id})
    toy.step("```bash\necho wrong > answer.txt\n```")
    _, reward, terminated, _, info = toy.step({"name": "submit", "arguments": {}})
    assert reward == 0.0 and not info["report"]["passed"]


def test_toy_step_budget_truncates_and_grades(toy):
    toy.reset(options={"task_id": "write-000"})
    task = toy.unwrapped.task
    for _ in range(3):
        toy.step("not an action")
    _, reward, terminated, truncated, info = toy.step({"name": "bash", "arguments": {"command": task.solution}})
    assert truncated and not terminated and reward == 1.0 and "step budget" in info["truncation"]


def test_training_modules_import_without_torch():
    import subprocess
    import sys

    probe = ("import sys, orchard_gym.cli, orchard_gym.algos.grpo, orchard_gym.algos.bar, orchard_gym.algos.plot; "
             "heavy = {'torch', 'transformers', 'trl', 'matplotlib'} & set(sys.modules); assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", probe], check=True)
