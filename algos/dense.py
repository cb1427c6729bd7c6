"""Glue between agent GRPO (`grpo.py`) and the dense signals: OPD (`opd.py`) and RPR (`rpr.py`).

Both act on a whole rollout batch after BAR / dynamic sampling have assembled its groups
(so group selection stays on the outcome reward), before TRL computes advantages:
RPR replaces each trained row's reward by the configured combination with the judge's
process score, OPD adds a per-token signal that the trainer hook turns into per-token
advantages. Either may drop a row (zero loss mask, reward None) when its judge or
teacher failed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


def check_dense_args(args) -> None:
    """Turn dict configs into dataclasses and refuse combinations that cannot work."""
    from .opd import OPDConfig, check_compatible
    from .rpr import RPRConfig

    if isinstance(args.opd, dict):
        args.opd = OPDConfig(**args.opd)
    if isinstance(args.rpr, dict):
        args.rpr = RPRConfig(**args.rpr)
    if args.opd is not None and not isinstance(args.opd, OPDConfig):
        raise ValueError("opd must be an OPDConfig (or its fields as a dict)")
    if args.rpr is not None and not isinstance(args.rpr, RPRConfig):
        raise ValueError("rpr must be an RPRConfig (or its fields as a dict)")
    check_compatible(args)
    if args.opd is not None and args.opd.only and args.dynamic_sampling:
        # every reward is 0 without grading: every group would look uninformative and be replaced
        log.info("--opd-only: dynamic sampling is off (there is no outcome reward to select groups on)")
        args.dynamic_sampling = False


def make_scorers(args, make_env: Callable, tokenizer) -> tuple[Callable, list]:
    """(make_env, scorers): grading skipped under OPD-only; the RPR scorer first (it sets the
    rewards), then OPD."""
    scorers: list = []
    if args.rpr is not None:
        from .rpr import RPRScorer

        scorers.append(RPRScorer(args.rpr, tokenizer, env_id=args.env_id))
    if args.opd is not None:
        from .opd import OPDScorer, skip_grading

        scorers.append(OPDScorer(args.opd, tokenizer))
        if args.opd.only:
            make_env = skip_grading(make_env)
    return make_env, scorers


def trainer_class(args):
    """Deprecated (grpo.build_trainer composes hooks on one subclass, algos/grpo_trainer.py):
    TRL's GRPOTrainer, or the agent trainer with the OPD hook (per-token advantages)."""
    if args.opd is not None:
        from .opd import opd_trainer_class

        return opd_trainer_class()
    from trl import GRPOTrainer

    return GRPOTrainer


def opd_args(teacher: str | None, coef: float, only: bool):
    """The CLI's --opd-* flags as an OPDConfig (None without a teacher)."""
    from .opd import OPDConfig

    if teacher is None:
        if only:
            raise ValueError("--opd-only needs --opd-teacher")
        return None
    return OPDConfig(teacher=teacher, coef=coef, only=only)


def rpr_args(judge: str | None, rubric: str | None, combine: str):
    """The CLI's --rpr-* flags as an RPRConfig (None without a judge)."""
    from .rpr import RPRConfig

    if judge is None:
        if rubric is not None:
            raise ValueError("--rpr-rubric needs --rpr-judge")
        return None
    return RPRConfig(judge=judge, rubric=rubric, combine=combine)
