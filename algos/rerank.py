"""Best-of-N reranking with a value model, and the seed's comparison table.

Given N candidate trajectories of one task, pick the one whose value is highest. The
score of a candidate is an aggregation of its values V(s_0) .. V(s_{T-1}) at its
decision states:

- `final` (default): the value at the last decision state, just before the final action
  (the state whose target is the terminal reward itself);
- `mean`, `min`, `max` over the decision states; `end`: the value after the last action.

`compare` reports, over tasks, the resolve rate of the value's pick against random
selection (its exact expectation: the mean resolve rate of the candidates), the first
candidate and the oracle (a passing candidate whenever one exists), and the selection
accuracy on tasks with both passing and failing candidates.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable, Sequence

from .trajectory_pool import PoolEntry

AGGREGATIONS: dict[str, Callable[[list[float]], float]] = {
    "final": lambda v: v[-2] if len(v) >= 2 else v[-1],
    "end": lambda v: v[-1],
    "mean": lambda v: sum(v[:-1] or v) / len(v[:-1] or v),
    "min": lambda v: min(v[:-1] or v),
    "max": lambda v: max(v[:-1] or v),
}


def score(state_values: list[float], aggregation: str = "final") -> float:
    """A candidate's score from V(s_0) .. V(s_T)."""
    try:
        return AGGREGATIONS[aggregation](state_values)
    except KeyError:
        raise ValueError(f"unknown aggregation {aggregation!r}; choose from {', '.join(AGGREGATIONS)}") from None


def group_by_task(entries: Sequence[PoolEntry]) -> dict[str, list[PoolEntry]]:
    groups: dict[str, list[PoolEntry]] = defaultdict(list)
    for e in entries:
        groups[e.task_id].append(e)
    return dict(groups)


def pick(scores: Sequence[float]) -> int:
    """Index of the highest score (the first on ties)."""
    return max(range(len(scores)), key=lambda i: (scores[i], -i))


def compare(groups: dict[str, list[PoolEntry]], scores: dict[str, list[float]], *, seed: int = 0) -> dict:
    """The table: resolve rate of value / random / first / oracle picks and selection accuracy."""
    if not groups:
        raise ValueError("no candidate groups")
    rng = random.Random(seed)
    n = len(groups)
    value = random_expected = random_draw = first = oracle = 0.0
    mixed = mixed_hits = mixed_random = 0.0
    for task, cands in groups.items():
        ok = [c.resolved for c in cands]
        chosen = pick(scores[task])
        value += ok[chosen]
        random_expected += sum(ok) / len(ok)
        random_draw += ok[rng.randrange(len(ok))]
        first += ok[0]
        oracle += any(ok)
        if any(ok) and not all(ok):
            mixed += 1
            mixed_hits += ok[chosen]
            mixed_random += sum(ok) / len(ok)
    return {"tasks": n, "candidates": sum(len(c) for c in groups.values()),
            "value": value / n, "random": random_expected / n, "random_draw": random_draw / n,
            "first": first / n, "oracle": oracle / n, "mixed_tasks": int(mixed),
            "selection_accuracy": mixed_hits / mixed if mixed else None,
            "selection_accuracy_random": mixed_random / mixed if mixed else None}


def rerank(entries: Sequence[PoolEntry], model, aggregation: str = "final", *, seed: int = 0
           ) -> tuple[dict, dict[str, list[float]]]:
    """Score every candidate with `model` (a `ValueModel`) and compare; returns (table, scores)."""
    score(([0.0, 0.0]), aggregation)  # validate early
    groups = group_by_task(entries)
    scores = {t: [score(model.state_values(c), aggregation) for c in cands] for t, cands in groups.items()}
    return compare(groups, scores, seed=seed), scores


def format_table(table: dict) -> str:
    rows = [("random selection (expected)", table["random"]), ("first candidate", table["first"]),
            ("value model (best-of-N)", table["value"]), ("oracle", table["oracle"])]
    lines = [f"{table['tasks']} tasks, {table['candidates']} candidates", f"{'selection':32} resolve rate"]
    lines += [f"{name:32} {rate:.1%}" for name, rate in rows]
    if table["selection_accuracy"] is not None:
        lines.append(f"selection accuracy on {table['mixed_tasks']} mixed tasks: {table['selection_accuracy']:.1%} "
                     f"(random {table['selection_accuracy_random']:.1%})")
    return "\n".join(lines)
