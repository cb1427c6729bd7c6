"""`orchard train sft`: supervised fine-tuning on pool trajectories with TRL's `SFTTrainer`,
on pre-tokenised examples with a per-token loss mask (observations are never trained).

Modes (one `SFTExample` = input ids + a 0/1 mask of the tokens that carry loss):

- `full`: one example per trajectory, loss on all of its action tokens;
- `rise`: credit-assignment SFT (Orchard §3.3): resolved trajectories train on all action
  tokens; unresolved ones only on the action tokens inside rise segments of their judged
  value curve (`algos/credit.py`), with the earlier history as context; the example ends
  with its last trained action;
- `per-turn`: one example per assistant turn, loss only on that turn, the turns before
  it as context (the GUI recipe);
- `calls`: one example per recorded proxy call (`PoolEntry.calls`), the call's prompt as
  the harness built it, loss on its response (the Claw recipe).

Data selection (`select`, Orchard §4 Table 10): random, diverse-repo (a cap per repo),
concentrated-repo (the repos with most resolved trajectories first), multi-file and
large-diff (by the gold patch's files / changed lines), composite (the mean rank of both).
"""

from __future__ import annotations

import os
import random
import tempfile
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .trajectory_pool import PoolEntry
from .pool_tokens import EntryTokenizer

MODES = ("full", "rise", "per-turn", "calls")
SELECTIONS = ("random", "diverse-repo", "concentrated-repo", "multi-file", "large-diff", "composite")


@dataclass
class SFTExample:
    input_ids: list[int]
    loss_mask: list[int]
    entry_id: str
    turn: int | None = None


# ------------------------------------------------------------------------------ examples
def _masked(ids: list[int], spans: list[tuple[int, int]], which: Sequence[int], entry_id: str,
            turn: int | None = None) -> SFTExample | None:
    which = [t for t in which if t < len(spans)]
    if not which:
        return None
    mask = [0] * len(ids)
    for t in which:
        a, b = spans[t]
        mask[a:b] = [1] * (b - a)
    end = spans[max(which)][1]
    return SFTExample(ids[:end], mask[:end], entry_id, turn)


def build_examples(entries: Sequence[PoolEntry], tokens: EntryTokenizer, mode: str, *,
                   curves: dict[str, list[float] | None] | None = None, eps: float = 0.05) -> list[SFTExample]:
    """Examples of `mode` (see the module docstring). `rise` needs `curves` by entry id (None
    for resolved entries); an unresolved entry with no curve is an error (annotate first)."""
    from .credit import trained_actions

    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
    out: list[SFTExample] = []
    for e in entries:
        if mode == "calls":
            if not e.calls:
                raise ValueError(f"entry {e.entry_id} has no recorded proxy calls: --mode calls needs proxy "
                                 "recordings (orchard pool add of a proxy export)")
            for i, call in enumerate(e.calls):
                prompt, response = tokens.call_ids(call)
                out.append(SFTExample(prompt + response, [0] * len(prompt) + [1] * len(response), e.entry_id, i))
            continue
        tk = tokens(e)
        if mode == "full":
            ex = _masked(tk.ids, tk.spans, range(len(tk.spans)), e.entry_id)
            if ex:
                out.append(ex)
        elif mode == "per-turn":
            for t in range(len(tk.spans)):
                out.append(_masked(tk.ids, tk.spans, [t], e.entry_id, t))
        else:  # rise
            if curves is None or e.entry_id not in curves:
                raise ValueError(f"entry {e.entry_id} has no value curve: annotate the pool first")
            curve = curves[e.entry_id]
            if curve is not None and len(curve) != len(tk.spans) + 1:
                raise ValueError(f"entry {e.entry_id}: {len(curve)} curve values for {len(tk.spans)} actions")
            ex = _masked(tk.ids, tk.spans, trained_actions(e, curve, eps) if not e.resolved
                         else range(len(tk.spans)), e.entry_id)
            if ex:
                out.append(ex)
    return out


# ------------------------------------------------------------------------------ data selection
def repo_of(e: PoolEntry) -> str:
    """The entry's repository (metadata 'repo'), else its task family (task id up to the last '-')."""
    return str(e.metadata.get("repo") or e.task_id.rsplit("-", 1)[0])


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    for r, i in enumerate(order):
        ranks[i] = r / max(len(values) - 1, 1)
    return ranks


def select(entries: Sequence[PoolEntry], n: int, strategy: str = "random", *, seed: int = 0,
           repo_cap: int | None = None) -> list[PoolEntry]:
    """`n` entries chosen by `strategy` (see the module docstring); all of them when fewer."""
    if strategy not in SELECTIONS:
        raise ValueError(f"unknown selection {strategy!r}; choose from {', '.join(SELECTIONS)}")
    if n < 1:
        raise ValueError("select at least one trajectory")
    rng = random.Random(seed)
    pool = list(entries)
    rng.shuffle(pool)  # ties broken at random, reproducibly
    if strategy == "random":
        return pool[:n]
    if strategy == "diverse-repo":
        by_repo: dict[str, list[PoolEntry]] = defaultdict(list)
        for e in pool:
            by_repo[repo_of(e)].append(e)
        cap = repo_cap or max(1, -(-n // len(by_repo)))
        chosen, depth = [], 0
        while len(chosen) < n and depth < cap:  # round robin: one per repo per round
            for repo in sorted(by_repo):
                if depth < len(by_repo[repo]) and len(chosen) < n:
                    chosen.append(by_repo[repo][depth])
            depth += 1
        return chosen
    if strategy == "concentrated-repo":
        counts = Counter(repo_of(e) for e in pool if e.resolved)
        return sorted(pool, key=lambda e: -counts[repo_of(e)])[:n]
    files = [float(e.metadata.get("gold_files", 0)) for e in pool]
    lines = [float(e.metadata.get("gold_lines", 0)) for e in pool]
    if strategy == "multi-file":
        key = files
    elif strategy == "large-diff":
        key = lines
    else:  # composite: mean rank of the gold-patch properties
        key = [(a + b) / 2 for a, b in zip(_ranks(files), _ranks(lines), strict=True)]
    order = sorted(range(len(pool)), key=lambda i: -key[i])
    return [pool[i] for i in order[:n]]


# ------------------------------------------------------------------------------ training
def to_dataset(examples: Sequence[SFTExample]):
    """A `datasets.Dataset` TRL takes as pre-tokenised: `input_ids` + `assistant_masks`."""
    from datasets import Dataset

    if not examples:
        raise ValueError("no SFT examples (nothing selected, or no token carries loss)")
    return Dataset.from_dict({"input_ids": [x.input_ids for x in examples],
                              "assistant_masks": [x.loss_mask for x in examples]})


def make_trainer(model, tokenizer, examples: Sequence[SFTExample], *, steps: int, output_dir: str | Path | None = None,
                 learning_rate: float = 1e-5, batch_size: int = 8, seed: int = 0, **overrides):
    """A TRL `SFTTrainer` over pre-tokenised examples (loss only where the mask is 1)."""
    import torch
    from trl import SFTConfig, SFTTrainer

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    cpu = not torch.cuda.is_available()
    kwargs = dict(output_dir=str(output_dir or tempfile.mkdtemp(prefix="orchard-sft-")), max_steps=steps,
                  learning_rate=learning_rate, per_device_train_batch_size=batch_size, max_length=None,
                  logging_steps=max(steps // 10, 1), save_strategy="no", report_to="none", use_cpu=cpu,
                  bf16=False if cpu else None, lr_scheduler_type="constant", warmup_steps=0, seed=seed,
                  disable_tqdm=True, remove_unused_columns=True)
    kwargs.update(overrides)
    if kwargs.get("bf16") is None:
        kwargs.pop("bf16")
    return SFTTrainer(model=model, args=SFTConfig(**kwargs), train_dataset=to_dataset(examples),
                      processing_class=tokenizer)


def train_sft(examples: Sequence[SFTExample], model_path: str | Path, output_dir: str | Path, *, steps: int,
              learning_rate: float = 1e-5, batch_size: int = 8, seed: int = 0, **overrides) -> dict:
    """Fine-tune the model at `model_path` on `examples`; saves OUTPUT_DIR/final. Returns a summary."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    model = AutoModelForCausalLM.from_pretrained(str(model_path))
    trainer = make_trainer(model, tokenizer, examples, steps=steps, output_dir=output_dir,
                           learning_rate=learning_rate, batch_size=batch_size, seed=seed, **overrides)
    result = trainer.train()
    final = Path(output_dir) / "final"
    trainer.save_model(str(final))
    tokenizer.save_pretrained(str(final))
    return {"steps": result.global_step, "training_loss": result.training_loss, "examples": len(examples),
            "loss_tokens": sum(sum(x.loss_mask) for x in examples), "model": str(final)}
