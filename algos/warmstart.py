"""A few steps of supervised fine-tuning (TRL `SFTTrainer`) before RL: the warm start.

Conversations are OpenAI-style message lists with tool calls; the loss covers the
assistant turns only (TRL swaps in the chat template's training variant, whose
generation markers tell it which tokens are the assistant's).

    from orchard_gym.algos.warmstart import sft_warm_start
    sft_warm_start(model, tokenizer, [oracle_messages(t, "Act.") for t in tasks], steps=40)
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path


def sft_warm_start(model, tokenizer, conversations: Sequence[list[dict]], *, steps: int = 40,
                   learning_rate: float = 3e-3, batch_size: int = 16, output_dir: str | Path | None = None,
                   seed: int = 0, progress: str | None = None, **overrides):
    """Train `model` in place on `conversations` for `steps` optimiser steps; returns TRL's train output.
    `progress`: the label of a progress bar (with ETA and the loss) over the steps."""
    import torch
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    out = str(output_dir or tempfile.mkdtemp(prefix="orchard-sft-"))
    cpu = not torch.cuda.is_available()
    kwargs = dict(output_dir=out, max_steps=steps, learning_rate=learning_rate, per_device_train_batch_size=batch_size,
                  assistant_only_loss=True, logging_steps=max(steps // 5, 1), save_strategy="no", report_to="none",
                  use_cpu=cpu, bf16=False if cpu else None, lr_scheduler_type="constant", warmup_steps=0, seed=seed,
                  disable_tqdm=True)
    kwargs.update(overrides)
    if kwargs.get("bf16") is None:
        kwargs.pop("bf16")
    dataset = Dataset.from_dict({"messages": [list(c) for c in conversations]})
    trainer = SFTTrainer(model=model, args=SFTConfig(**kwargs), train_dataset=dataset, processing_class=tokenizer)
    if progress:
        from .progress import step_bar

        step_bar(trainer, progress, ("loss",))
    result = trainer.train()
    # The trainer leaves an instance `forward` wrapper bound to THIS object (and gradient checkpointing
    # on, with an input-grad hook): a copy.deepcopy of the model then runs the original's forward, so the
    # copy's parameters get no gradients and a copy trained afterwards (GRPO, OPD) silently never learns.
    model.__dict__.pop("forward", None)
    if getattr(model, "is_gradient_checkpointing", False):
        model.gradient_checkpointing_disable()
    if hasattr(model, "_require_grads_hook"):
        model.disable_input_require_grads()
    model.eval()
    return result
