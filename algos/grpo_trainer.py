"""The one `GRPOTrainer` subclass of agent GRPO: TRL's scored batch passes through a list of hooks.

TRL's `_generate_and_score_completions` (private, TRL 1.16) turns a rollout batch into
ids, masks and group-relative advantages. Every variant that changes that batch is a hook
`(trainer, output) -> output`, run in order after TRL's own scoring, so variants combine
instead of each needing its own subclass:

- `harness_grpo.harness_advantages`: advantages over a group's harness runs, not TRL's rows;
- `opd.opd_advantages`: adds the per-token on-policy-distillation term (B,) -> (B, T);
- `vision.vision_images`: hands the loss pass the episodes' images.

Order matters where hooks touch the same field: a hook that replaces the advantages comes
before one that adds to them (`build_trainer` in grpo.py keeps that order). Rollout-side
variants (BAR, dynamic sampling, branching, RPR, OPD's teacher scoring) live in the rollout
source, not here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

Hook = Callable[[Any, dict], dict]


@functools.cache
def agent_trainer_class():
    """`AgentGRPOTrainer` (built lazily: no TRL import at module import). Construct it with
    `hooks=[...]` and TRL's usual arguments."""
    from trl import GRPOTrainer

    class AgentGRPOTrainer(GRPOTrainer):
        def __init__(self, *args, hooks: Sequence[Hook] = (), **kwargs):
            self.batch_hooks: list[Hook] = list(hooks)
            super().__init__(*args, **kwargs)

        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            for hook in self.batch_hooks:
                output = hook(self, output)
            return output

    return AgentGRPOTrainer


def trainer_with(*hooks: Hook):
    """A subclass with these hooks fixed (what the former one-hook subclasses were); deprecated:
    pass `hooks=` to `agent_trainer_class()` instead."""
    base = agent_trainer_class()

    class Fixed(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args, **kwargs):
            super().__init__(*args, hooks=hooks, **kwargs)

    return Fixed
