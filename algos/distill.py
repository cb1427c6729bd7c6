"""Single-turn on-policy distillation with TRL's own `DistillationTrainer`.

Where the data is single-turn (a prompt, one completion, no sandbox), the multi-turn OPD path
(`algos/opd.py`) is not needed: TRL 1.16's `DistillationTrainer` samples completions from the
student and minimises the generalised JSD to the teacher's full next-token distribution on
them; `beta=1.0` makes that the reverse KL (the OPD objective). In TRL 1.16 that trainer is
fully on-policy (no `lmbda` mix of dataset completions; that knob lives on the experimental
`GKDTrainer`). This module only builds it: prompts -> a `prompt` dataset, a CPU-safe
`DistillationConfig`, and the same tokenizer check the multi-turn path uses (TRL itself
only compares vocabulary sizes).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from orchard_gym.algos.opd import TeacherError, same_tokenizer


def _check_prompts(prompts) -> list:
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or not prompts:
        raise ValueError("prompts must be a non-empty list of strings or of chat message lists")
    for i, p in enumerate(prompts):
        text = isinstance(p, str) and p.strip()
        chat = (isinstance(p, list) and p and all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                                  and isinstance(m.get("content"), str) for m in p))
        if not (text or chat):
            raise ValueError(f"prompt {i} is neither a non-empty string nor a list of {{role, content}} messages: "
                             f"{p!r:.80}")
    if len({isinstance(p, str) for p in prompts}) > 1:
        raise ValueError("prompts mix plain strings and chat messages: use one format")
    return list(prompts)


def distill_single_turn(student, teacher, tokenizer, prompts, *, output_dir: str | Path, teacher_tokenizer=None,
                        beta: float = 1.0, max_steps: int = 100, learning_rate: float = 1e-5,
                        batch_size: int = 4, max_completion_length: int = 64, temperature: float = 1.0,
                        **config_kwargs):
    """A ready `trl.DistillationTrainer` (call `.train()`); `student`/`teacher` are models or folders.

    The teacher's tokenizer (loaded from its folder, or `teacher_tokenizer`) must equal the
    student's, else `TeacherError`. Sets `tokenizer.padding_side = "left"` (TRL needs it)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DistillationConfig, DistillationTrainer

    prompts = _check_prompts(prompts)
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0, 1] (1 = reverse KL), not {beta!r}")
    if isinstance(teacher, (str, Path)):
        try:
            teacher_tokenizer = teacher_tokenizer or AutoTokenizer.from_pretrained(str(teacher))
            teacher = AutoModelForCausalLM.from_pretrained(str(teacher))
        except (OSError, ValueError) as e:
            raise TeacherError(f"cannot load the teacher model {str(teacher)!r}: {e}") from None
    if teacher_tokenizer is not None:
        same_tokenizer(tokenizer, teacher_tokenizer)
    tokenizer.padding_side = "left"
    import torch

    cpu = not torch.cuda.is_available()
    kwargs = dict(output_dir=str(output_dir), beta=beta, max_steps=max_steps, learning_rate=learning_rate,
                  per_device_train_batch_size=batch_size, max_completion_length=max_completion_length,
                  temperature=temperature, logging_steps=1, save_strategy="no", report_to="none",
                  gradient_checkpointing=False, use_cpu=cpu)
    if cpu:
        kwargs["bf16"] = False  # TRL's default bf16=True needs an accelerator
    kwargs.update(config_kwargs)
    config = DistillationConfig(**kwargs)
    return DistillationTrainer(model=student, teacher_model=teacher, args=config,
                               train_dataset=Dataset.from_dict({"prompt": prompts}), processing_class=tokenizer)
