"""BAR, Balanced Adaptive Rollout: assemble each prompt's group online, in strides.

Fixed-N group sampling spends N rollouts on every prompt, and a prompt the policy
always (or never) solves yields a group whose rewards are all equal: a zero
group-relative advantage, no gradient, N rollouts wasted. BAR (Orchard, §3.4)
instead generates per prompt in strides of `stride` rollouts and stops as soon as
a group of exactly `group_size` rollouts can be assembled whose positive-reward
fraction lies in `[low, high]`; that group goes to the group-relative estimator
(GRPO or any other: BAR only decides *which* rollouts form the group). If the
per-prompt budget `max_rollouts` runs out first, the prompt is dropped (the
default) or its best-effort group is kept (`on_exhausted="keep"`).

The paper gives the definition but no constants; the defaults here are ours:
group of 8 (the paper's group size), strides of 4, at most 32 rollouts per prompt,
target interval [0.25, 0.75] (at least 2 of 8 positive and 2 of 8 negative).

Assembly is order-preserving and content-blind: with `k` positives chosen, the
first `k` positive and the first `group_size - k` non-positive rollouts (in
completion order) form the group; `k` is the feasible count in the interval nearest
to half the group (`pick="balanced"`) or nearest to the observed success rate
(`pick="proportional"`). Rollouts that ended in an infrastructure error never enter
the pool (they still count as spent).

Everything here is plain Python (no torch), so schedules can be tested and
simulated with scripted reward sources:

    import asyncio, random
    from orchard_gym.algos.bar import BARConfig, BARSampler, Scripted
    rng = random.Random(0)
    outcome = asyncio.run(BARSampler(BARConfig()).sample(Scripted(0.2, rng)))
    print(outcome.spent, outcome.informative, [r.reward for r in outcome.group])
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol


class Rollout(Protocol):
    """What a sampler needs from a rollout: its reward and whether it is usable."""

    reward: float | None
    ok: bool


RunMany = Callable[[int], Awaitable[Sequence[Any]]]
"""`await run(n)` performs n fresh rollouts of one prompt (concurrently) and returns them."""


@dataclass
class GroupOutcome:
    """What a group sampler produced for one prompt.

    `group`: the rollouts handed to the estimator (exactly `group_size` of them when
    `informative` or kept; errored ones are included only by the fixed sampler, and
    trainers mask them); `spent`: every rollout generated for the prompt; `informative`:
    the group's usable rewards are not all equal; `dropped`: no group is trained on."""

    group: list[Any]
    spent: int
    informative: bool
    dropped: bool
    rollouts: list[Any] = field(default_factory=list)
    rounds: int = 1

    @property
    def positives(self) -> int:
        return sum(1 for r in self.group if r.ok and r.reward is not None and r.reward > 0)


def _informative(group: Sequence[Any]) -> bool:
    rewards = {round(float(r.reward), 9) for r in group if r.ok and r.reward is not None}
    return len(rewards) > 1


class GroupSampler(Protocol):
    group_size: int

    async def sample(self, run: RunMany) -> GroupOutcome: ...


class FixedSampler:
    """Plain GRPO: exactly `group_size` rollouts per prompt, all of them form the group."""

    def __init__(self, group_size: int = 8):
        if group_size < 2:
            raise ValueError("group_size must be at least 2")
        self.group_size = group_size

    async def sample(self, run: RunMany) -> GroupOutcome:
        rollouts = list(await run(self.group_size))
        informative = _informative(rollouts)
        return GroupOutcome(group=rollouts, spent=len(rollouts), informative=informative,
                            dropped=False, rollouts=rollouts)


@dataclass
class BARConfig:
    """Balanced Adaptive Rollout settings (see the module docstring)."""

    group_size: int = field(default=8, metadata={"help": "rollouts in the group handed to the estimator"})
    stride: int = field(default=4, metadata={"help": "rollouts generated per round for a prompt"})
    max_rollouts: int = field(default=32, metadata={"help": "per-prompt budget of rollouts"})
    low: float = field(default=0.25, metadata={"help": "lowest admissible positive fraction of the group"})
    high: float = field(default=0.75, metadata={"help": "highest admissible positive fraction of the group"})
    positive_threshold: float = field(default=0.0, metadata={"help": "a reward above this counts as positive"})
    on_exhausted: Literal["drop", "keep"] = field(
        default="drop", metadata={"help": "budget spent without a balanced group: drop the prompt or keep "
                                          "the best-effort group"})
    pick: Literal["balanced", "proportional"] = field(
        default="balanced", metadata={"help": "which admissible positive count to take: nearest to half the "
                                              "group, or nearest to the observed success rate"})

    def __post_init__(self) -> None:
        if self.group_size < 2:
            raise ValueError("group_size must be at least 2")
        if self.stride < 1:
            raise ValueError("stride must be at least 1")
        if self.max_rollouts < self.group_size:
            raise ValueError("max_rollouts must be at least group_size")
        if not 0.0 <= self.low <= self.high <= 1.0:
            raise ValueError("need 0 <= low <= high <= 1")
        if self.on_exhausted not in ("drop", "keep"):
            raise ValueError("on_exhausted is 'drop' or 'keep'")
        if self.pick not in ("balanced", "proportional"):
            raise ValueError("pick is 'balanced' or 'proportional'")
        if not self.admissible_counts():
            raise ValueError(f"no positive count k with {self.low} <= k/{self.group_size} <= {self.high}")

    def admissible_counts(self) -> range:
        """Positive counts k whose fraction k/group_size lies in [low, high]."""
        g = self.group_size
        lo = math.ceil(self.low * g - 1e-9)
        hi = math.floor(self.high * g + 1e-9)
        return range(max(lo, 0), min(hi, g) + 1)


def assemble(rewards: Sequence[float], config: BARConfig) -> list[int] | None:
    """Indices (into `rewards`, the usable rollouts in completion order) of a balanced
    group, or None when none can be formed yet."""
    g = config.group_size
    pos = [i for i, r in enumerate(rewards) if r > config.positive_threshold]
    neg = [i for i, r in enumerate(rewards) if r <= config.positive_threshold]
    feasible = [k for k in config.admissible_counts() if k <= len(pos) and g - k <= len(neg)]
    if not feasible:
        return None
    if config.pick == "balanced":
        target = g / 2
    else:
        target = g * len(pos) / max(len(rewards), 1)
    k = min(feasible, key=lambda k: (abs(k - target), k))
    return sorted(pos[:k] + neg[: g - k])


def best_effort(rewards: Sequence[float], config: BARConfig) -> list[int]:
    """The group kept when the budget is spent: as close to the interval as the pool allows."""
    g = config.group_size
    pos = [i for i, r in enumerate(rewards) if r > config.positive_threshold]
    neg = [i for i, r in enumerate(rewards) if r <= config.positive_threshold]
    counts = config.admissible_counts()
    options = [k for k in range(0, g + 1) if k <= len(pos) and g - k <= len(neg)]
    if not options:  # fewer than g usable rollouts: take them all
        return list(range(len(rewards)))
    k = min(options, key=lambda k: (max(counts.start - k, k - counts.stop + 1, 0), abs(k - g / 2)))
    return sorted(pos[:k] + neg[: g - k])


class BARSampler:
    """Generates one prompt's rollouts in strides until a balanced group can be assembled."""

    def __init__(self, config: BARConfig | None = None):
        self.config = config or BARConfig()
        self.group_size = self.config.group_size

    async def sample(self, run: RunMany) -> GroupOutcome:
        cfg = self.config
        rollouts: list[Any] = []
        rounds = 0
        while len(rollouts) < cfg.max_rollouts:
            n = min(cfg.stride, cfg.max_rollouts - len(rollouts))
            rollouts.extend(await run(n))
            rounds += 1
            usable = [r for r in rollouts if r.ok and r.reward is not None]
            picked = assemble([float(r.reward) for r in usable], cfg)
            if picked is not None:
                group = [usable[i] for i in picked]
                return GroupOutcome(group=group, spent=len(rollouts), informative=_informative(group),
                                    dropped=False, rollouts=rollouts, rounds=rounds)
        usable = [r for r in rollouts if r.ok and r.reward is not None]
        if cfg.on_exhausted == "keep" and usable:
            group = [usable[i] for i in best_effort([float(r.reward) for r in usable], cfg)]
            return GroupOutcome(group=group, spent=len(rollouts), informative=_informative(group),
                                dropped=False, rollouts=rollouts, rounds=rounds)
        return GroupOutcome(group=[], spent=len(rollouts), informative=False, dropped=True,
                            rollouts=rollouts, rounds=rounds)


# --------------------------------------------------------------------- scripted reward sources
@dataclass
class ScriptedRollout:
    reward: float
    ok: bool = True
    index: int = 0


class Scripted:
    """A prompt with a known success rate `p`: each rollout is +1 with probability p, else 0
    (or errored with probability `error_rate`). For tests, simulations and benchmarks."""

    def __init__(self, p: float, rng: random.Random, error_rate: float = 0.0, negative: float = 0.0):
        self.p, self.rng, self.error_rate, self.negative = p, rng, error_rate, negative
        self.calls = 0

    async def __call__(self, n: int) -> list[ScriptedRollout]:
        out = []
        for _ in range(n):
            self.calls += 1
            if self.rng.random() < self.error_rate:
                out.append(ScriptedRollout(reward=0.0, ok=False, index=self.calls))
            else:
                out.append(ScriptedRollout(reward=1.0 if self.rng.random() < self.p else self.negative,
                                           index=self.calls))
        await asyncio.sleep(0)
        return out


@dataclass
class SamplingStats:
    """Totals over many prompts: informative-group share (rewards not all equal) and balanced-group
    share (positive fraction in [low, high]), and what each cost in rollouts."""

    prompts: int = 0
    rollouts: int = 0
    informative: int = 0
    balanced: int = 0
    dropped: int = 0
    low: float = 0.25
    high: float = 0.75
    reward_std_sum: float = 0.0
    cost: float = 0.0  # what the rollouts cost, when `add` is told (orchard_gym.ledger prices)

    def add(self, outcome: GroupOutcome, cost: float | None = None) -> None:
        """Count one prompt's outcome; `cost`: what its rollouts cost (default: one unit each)."""
        self.prompts += 1
        self.rollouts += outcome.spent
        self.cost += outcome.spent if cost is None else cost
        self.dropped += int(outcome.dropped)
        if outcome.dropped:
            return
        self.informative += int(outcome.informative)
        usable = [float(r.reward) for r in outcome.group if r.ok and r.reward is not None]
        if usable:
            fraction = sum(1 for r in usable if r > 0) / len(usable)
            self.balanced += int(self.low - 1e-9 <= fraction <= self.high + 1e-9)
            mean = sum(usable) / len(usable)
            self.reward_std_sum += (sum((r - mean) ** 2 for r in usable) / len(usable)) ** 0.5

    @property
    def informative_share(self) -> float:
        return self.informative / self.prompts if self.prompts else 0.0

    @property
    def rollouts_per_prompt(self) -> float:
        return self.rollouts / self.prompts if self.prompts else 0.0

    @property
    def rollouts_per_informative_group(self) -> float:
        return self.rollouts / self.informative if self.informative else math.inf

    @property
    def informative_groups_per_cost(self) -> float:
        """Informative groups per unit of cost (per rollout when no costs were given)."""
        return self.informative / self.cost if self.cost else 0.0

    @property
    def balanced_share(self) -> float:
        return self.balanced / self.prompts if self.prompts else 0.0

    @property
    def rollouts_per_balanced_group(self) -> float:
        return self.rollouts / self.balanced if self.balanced else math.inf

    def as_dict(self) -> dict:
        trained = self.prompts - self.dropped
        return {"prompts": self.prompts, "rollouts": self.rollouts, "informative_groups": self.informative,
                "balanced_groups": self.balanced, "dropped": self.dropped,
                "informative_share": self.informative_share, "balanced_share": self.balanced_share,
                "informative_share_of_trained": self.informative / trained if trained else 0.0,
                "rollouts_per_prompt": self.rollouts_per_prompt,
                "rollouts_per_informative_group": self.rollouts_per_informative_group,
                "rollouts_per_balanced_group": self.rollouts_per_balanced_group,
                "cost": self.cost, "informative_groups_per_cost": self.informative_groups_per_cost,
                "mean_group_reward_std": self.reward_std_sum / trained if trained else 0.0}


async def simulate(sampler: GroupSampler, success_rates: Sequence[float], budget: int, seed: int = 0,
                   error_rate: float = 0.0, interval: tuple[float, float] = (0.25, 0.75)) -> SamplingStats:
    """Spend `budget` rollouts over prompts drawn in turn from `success_rates` (cycled), one
    group per prompt, and count what came out. The last prompt may overshoot the budget by
    less than one group (fixed) or one prompt's budget (BAR)."""
    rng = random.Random(seed)
    stats = SamplingStats(low=interval[0], high=interval[1])
    i = 0
    while stats.rollouts < budget:
        p = success_rates[i % len(success_rates)]
        stats.add(await sampler.sample(Scripted(p, rng, error_rate)))
        i += 1
    return stats
