"""Seeing what TRL trained on: record each processed batch of a GRPO trainer's steps."""

from __future__ import annotations


def spy(trainer, capture) -> list:
    """After every `_generate_and_score_completions` (TRL's processed batch: advantages, masks,
    ids), append `capture(batch)` to the returned list; the trainer behaves as before."""
    captured = []
    original = trainer._generate_and_score_completions

    def wrapped(inputs):
        out = original(inputs)
        captured.append(capture(out))
        return out

    trainer._generate_and_score_completions = wrapped
    return captured
