"""On-policy distillation (OPD, Orchard §3.4): a teacher scores the student's own episodes.

The student samples its multi-turn episodes in sandboxes (the ordinary rollout path);
the teacher then reads exactly those token sequences and gives, for every action token
a_t, its log-probability under the teacher. The per-token signal is the reverse-KL
estimate

    d_t = log pi_T(a_t | h_t) - log pi_theta(a_t | h_t)     on action tokens, 0 on observation tokens

and it enters TRL's GRPO loss as a per-token advantage (TRL 1.16 accepts advantages of
shape (B, T) in `_compute_loss`; the `opd_advantages` trainer hook adds them after TRL's own scoring):

    A_{i,t} = A_i + coef * d_{i,t}      (with the outcome reward)
    A_{i,t} =       coef * d_{i,t}      (`only=True`: no outcome reward, grading skipped)

Teachers: `LocalTeacher` (a Hugging Face model with the student's tokenizer, else a clear
error) or `ServerTeacher`, an OpenAI-compatible completions endpoint that returns prompt
log-probs for token-id prompts (vLLM: `prompt_logprobs`). Calls are batched and run
concurrently; a sample the teacher could not score is dropped (zero loss mask, no reward),
never given a made-up value.

Single-turn data needs none of this: TRL's own `DistillationTrainer` (beta=1: reverse KL)
is the tool there (`algos/distill.py` builds it; docs/training.md).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from orchard_gym._loop import LoopThread, run_in_thread
from orchard_gym.endpoint import Endpoint, EndpointSpec, is_endpoint, parse_spec
from orchard_gym.errors import EndpointError

log = logging.getLogger(__name__)


class TeacherError(RuntimeError):
    """The teacher could not score a sequence (or cannot be used with this student at all)."""


@dataclass
class OPDConfig:
    """`teacher`: a model folder or `http(s)://HOST:PORT/v1[#MODEL]`; `coef`: weight of the
    per-token signal; `only`: no outcome reward (the env's grading is skipped)."""

    teacher: str = field(metadata={"help": "teacher model folder, or an OpenAI-compatible URL[#MODEL]"})
    coef: float = field(default=1.0, metadata={"help": "weight of the per-token reverse-KL advantage"})
    only: bool = field(default=False, metadata={"help": "OPD alone: no outcome reward, no grading"})
    batch_size: int = field(default=8, metadata={"help": "sequences per teacher call"})
    concurrency: int = field(default=4, metadata={"help": "teacher calls at once"})
    timeout: float = field(default=120.0, metadata={"help": "seconds per teacher call"})

    def __post_init__(self) -> None:
        if not isinstance(self.teacher, str) or not self.teacher.strip():
            raise ValueError("opd teacher must be a model folder or an http(s):// URL")
        if is_endpoint(self.teacher):
            parse_spec(self.teacher, model_required=False, what="the opd teacher")  # a ValueError saying the form
        if not (isinstance(self.coef, (int, float)) and self.coef > 0):
            raise ValueError(f"opd coef must be a positive number, not {self.coef!r}")
        if self.batch_size < 1 or self.concurrency < 1 or not self.timeout > 0:
            raise ValueError("opd batch_size and concurrency must be at least 1, timeout positive")


def check_compatible(args) -> None:
    """OPD-only has no outcome reward: nothing for BAR or dynamic sampling to select on."""
    if args.opd is not None and args.opd.only:
        if args.algo == "bar":
            raise ValueError("--opd-only has no outcome reward for BAR to balance: use --algo grpo, or OPD with "
                             "the outcome reward (drop --opd-only)")
        if args.rpr is not None:
            raise ValueError("--opd-only skips grading; it cannot be combined with a process reward")


# ------------------------------------------------------------------------------ log-probs
def token_logprobs(model, sequences: Sequence[Sequence[int]], starts: Sequence[int], *, batch_size: int = 8,
                   pad_id: int = 0) -> list[list[float]]:
    """log p(x_j | x_<j) for j >= start of every sequence, from one forward pass per batch."""
    import torch

    device = next(model.parameters()).device
    out: list[list[float]] = []
    was_training = model.training
    model.eval()
    try:
        for i in range(0, len(sequences), batch_size):
            chunk = [list(s) for s in sequences[i:i + batch_size]]
            width = max(len(s) for s in chunk)
            ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
            attention = torch.zeros((len(chunk), width), dtype=torch.long)
            for k, s in enumerate(chunk):  # right padding: positions stay those of the unpadded sequence
                ids[k, :len(s)] = torch.tensor(s, dtype=torch.long)
                attention[k, :len(s)] = 1
            with torch.no_grad():
                logits = model(input_ids=ids.to(device), attention_mask=attention.to(device)).logits.float()
            logps = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None].to(device)).squeeze(-1)
            for k, s in enumerate(chunk):
                start = starts[i + k]
                if start < 1:
                    raise ValueError("a scored token needs at least one token before it")
                out.append([float(v) for v in logps[k, start - 1:len(s) - 1].cpu().tolist()])
    finally:
        model.train(was_training)
    return out


class LocalTeacher:
    """A Hugging Face causal LM on this machine; it must share the student's tokenizer."""

    def __init__(self, model, student_tokenizer, *, teacher_tokenizer=None, batch_size: int = 8):
        if isinstance(model, str):
            from transformers import AutoModelForCausalLM, AutoTokenizer

            try:
                teacher_tokenizer = teacher_tokenizer or AutoTokenizer.from_pretrained(model)
                model = AutoModelForCausalLM.from_pretrained(model)
            except (OSError, ValueError) as e:
                raise TeacherError(f"cannot load the teacher model {model!r}: {e}") from None
        if teacher_tokenizer is not None:
            same_tokenizer(student_tokenizer, teacher_tokenizer)
        self.model = model
        self.model.eval()
        self.pad_id = student_tokenizer.pad_token_id or 0
        self.batch_size = batch_size
        self.name = getattr(getattr(model, "config", None), "_name_or_path", "local")

    async def logprobs(self, sequences: list[list[int]], starts: list[int]) -> list[list[float]]:
        return await run_in_thread(functools.partial(token_logprobs, batch_size=self.batch_size, pad_id=self.pad_id),
                                   self.model, sequences, starts)

    async def aclose(self) -> None:
        return None


def same_tokenizer(student, teacher) -> None:
    """Token ids mean the same to both, or a clear error (OPD compares per-token log-probs)."""
    if student.get_vocab() != teacher.get_vocab():
        raise TeacherError("the teacher's tokenizer differs from the student's (different vocabularies): "
                           "on-policy distillation scores the student's token ids, so both must share one tokenizer")
    if (student.eos_token_id, student.pad_token_id) != (teacher.eos_token_id, teacher.pad_token_id):
        raise TeacherError("the teacher's tokenizer has different eos/pad tokens from the student's")


class ServerTeacher:
    """An OpenAI-compatible completions endpoint that returns prompt log-probs for token-id
    prompts (vLLM: `{"prompt": [[ids...], ...], "max_tokens": 1, "prompt_logprobs": 0}`).

    `url` is the API root (`http://host:8000/v1`); `#MODEL` after it names the served model
    (default: the first one `/models` lists)."""

    def __init__(self, url: str, *, model: str | None = None, batch_size: int = 8, concurrency: int = 4,
                 timeout: float = 120.0, api_key: str | None = None):
        spec = parse_spec(url, model_required=False, what="the teacher")
        self.endpoint = Endpoint(EndpointSpec(spec.url, spec.model or model or None), api_key=api_key,
                                 timeout=timeout, usage_source=None)  # prompt scoring: no episode to charge
        self.url = spec.url
        self.batch_size = batch_size
        self.timeout = timeout
        self._gate = asyncio.Semaphore(concurrency)

    @property
    def model(self) -> str | None:
        return self.endpoint.model

    @property
    def name(self) -> str:
        return f"{self.url}#{self.model or '?'}"

    async def _call(self, sequences: list[list[int]], starts: list[int]) -> list[list[float]]:
        async with self._gate:
            try:
                data = await self.endpoint.completions(sequences, max_tokens=1, temperature=0.0, prompt_logprobs=0)
            except EndpointError as e:
                raise TeacherError(f"teacher call failed ({e.reason}): {e}") from None
        try:
            choices = sorted(data["choices"], key=lambda c: c.get("index", 0))
        except (KeyError, TypeError, AttributeError) as e:
            raise TeacherError(f"teacher answer is not a completions response: {e}") from None
        if len(choices) != len(sequences):
            raise TeacherError(f"teacher returned {len(choices)} choices for {len(sequences)} prompts")
        return [_prompt_logprobs(c, s, start) for c, s, start in zip(choices, sequences, starts, strict=True)]

    async def logprobs(self, sequences: list[list[int]], starts: list[int]) -> list[list[float]]:
        b = self.batch_size
        parts = await asyncio.gather(*(self._call(sequences[i:i + b], starts[i:i + b])
                                       for i in range(0, len(sequences), b)))
        return [row for part in parts for row in part]

    async def aclose(self) -> None:
        await self.endpoint.aclose()


def _prompt_logprobs(choice: dict, ids: list[int], start: int) -> list[float]:
    """The log-prob of each prompt token from `start` on, out of vLLM's `prompt_logprobs`
    (a list with None first, then {token_id: {"logprob": ...}, ...} per position)."""
    entries = choice.get("prompt_logprobs")
    if not isinstance(entries, list) or len(entries) != len(ids):
        raise TeacherError("teacher returned no prompt_logprobs for every prompt token (is it vLLM with "
                           "prompt_logprobs support?)")
    out = []
    for j in range(start, len(ids)):
        entry = entries[j] or {}
        value = entry.get(str(ids[j]), entry.get(ids[j])) if isinstance(entry, dict) else None
        lp = value.get("logprob") if isinstance(value, dict) else value
        if not isinstance(lp, (int, float)) or lp != lp or lp > 1e-6:
            raise TeacherError(f"teacher gave no valid log-prob for token {ids[j]} at position {j}")
        out.append(float(lp))
    return out


def make_teacher(spec: str, student_tokenizer, config: OPDConfig | None = None):
    config = config or OPDConfig(teacher=spec)
    if is_endpoint(spec):
        return ServerTeacher(spec, batch_size=config.batch_size, concurrency=config.concurrency,
                             timeout=config.timeout)
    return LocalTeacher(spec, student_tokenizer, batch_size=config.batch_size)


# ------------------------------------------------------------------------------ the signal
def opd_signal(teacher_logps: Sequence[float], student_logps: Sequence[float],
               action_mask: Sequence[int]) -> list[float]:
    """d_t = log pi_T - log pi_theta on action tokens (mask 1); exactly 0.0 elsewhere."""
    if not len(teacher_logps) == len(student_logps) == len(action_mask):
        raise ValueError("teacher, student and mask lengths differ")
    return [float(t) - float(s) if m else 0.0 for t, s, m in zip(teacher_logps, student_logps, action_mask,
                                                                   strict=True)]


class OPDScorer:
    """Scores a rollout batch with the teacher: adds `opd_signal` rows to the rollout output;
    rows the teacher failed on are dropped (mask zeroed, reward None)."""

    def __init__(self, config: OPDConfig, student_tokenizer, teacher=None):
        self.config = config
        self.teacher = teacher or make_teacher(config.teacher, student_tokenizer, config)
        self.pad_id = student_tokenizer.pad_token_id or 0

    def __call__(self, out: dict[str, list], samples: Sequence, trained: Sequence[bool], model) -> dict:
        started = time.monotonic()
        rows = [i for i, t in enumerate(trained) if t and any(out["env_mask"][i])]
        seqs = [list(out["prompt_ids"][i]) + list(out["completion_ids"][i]) for i in rows]
        starts = [len(out["prompt_ids"][i]) for i in rows]
        student = token_logprobs(model, seqs, starts, pad_id=self.pad_id) if rows else []
        student_seconds = time.monotonic() - started
        teacher_started = time.monotonic()
        results = LoopThread.shared().run(self._teacher(seqs, starts)) if rows else []
        teacher_seconds = time.monotonic() - teacher_started
        signal = [[0.0] * len(c) for c in out["completion_ids"]]
        kl, tokens, dropped, errors = 0.0, 0, 0, []
        for i, s_lp, t_lp in zip(rows, student, results, strict=True):
            if isinstance(t_lp, BaseException):
                dropped += 1
                errors.append(str(t_lp))
                out["env_mask"][i] = [0] * len(out["env_mask"][i])
                out["env_reward"][i] = None
                continue
            mask = out["env_mask"][i]
            signal[i] = opd_signal(t_lp, s_lp, mask)
            kl -= sum(signal[i])
            tokens += sum(mask)
        if errors:
            log.warning("teacher failed on %d of %d samples (dropped); the first: %s", dropped, len(rows), errors[0])
        if self.config.only:  # no outcome reward: the group-relative part of the advantage is zero
            out["env_reward"] = [None if r is None else 0.0 for r in out["env_reward"]]
        out["opd_signal"] = signal
        return {"opd/kl": kl / tokens if tokens else None, "opd/scored": len(rows) - dropped,
                "opd/dropped": dropped, "opd/dropped_share": dropped / len(rows) if rows else 0.0,
                "opd/teacher_seconds": teacher_seconds, "opd/student_seconds": student_seconds}

    async def _teacher(self, seqs: list[list[int]], starts: list[int]) -> list:
        """Teacher log-probs per sequence, or the exception that sequence's batch failed with."""
        b = self.config.batch_size
        batches = [(seqs[i:i + b], starts[i:i + b]) for i in range(0, len(seqs), b)]
        gate = asyncio.Semaphore(self.config.concurrency)

        async def one(chunk, chunk_starts):
            async with gate:
                try:
                    rows = await asyncio.wait_for(self.teacher.logprobs(chunk, chunk_starts), self.config.timeout)
                except TimeoutError:
                    return [TeacherError(f"teacher timed out after {self.config.timeout:.0f}s")] * len(chunk)
                except Exception as e:  # any failure drops these samples, reported
                    return [e if isinstance(e, TeacherError) else TeacherError(f"{type(e).__name__}: {e}")] * len(chunk)
                for row, seq, start in zip(rows, chunk, chunk_starts, strict=True):
                    if len(row) != len(seq) - start:
                        return [TeacherError("teacher returned the wrong number of log-probs")] * len(chunk)
                return rows

        parts = await asyncio.gather(*(one(c, s) for c, s in batches))
        return [r for part in parts for r in part]

    def close(self) -> None:
        try:
            LoopThread.shared().run(self.teacher.aclose())
        except Exception:
            pass


# ------------------------------------------------------------------------------ grading skipped
async def _ungraded(ctx, task) -> tuple[float, dict]:
    return 0.0, {"graded": False}


def skip_grading(make_env):
    """`make_env` whose envs do not grade (OPD-only needs no outcome): any env, no env changes."""

    def factory(client, max_steps, max_seconds):
        env = make_env(client, max_steps, max_seconds)
        env.grade = _ungraded
        return env

    return factory


# ------------------------------------------------------------------------------ TRL hook
def dense_advantages(advantages, signal_rows: Sequence[Sequence[float]], width: int, *, coef: float, only: bool):
    """(B,) group-relative advantages and per-token signals -> (B, width) advantages."""
    import torch

    signal = torch.zeros((len(signal_rows), width), dtype=advantages.dtype, device=advantages.device)
    for i, row in enumerate(signal_rows):
        n = min(len(row), width)
        if n:
            signal[i, :n] = torch.tensor(row[:n], dtype=advantages.dtype)
    base = torch.zeros_like(signal) if only else advantages.reshape(-1, 1).expand_as(signal)
    return base + coef * signal


def opd_advantages(trainer, output: dict) -> dict:
    """Trainer hook (algos/grpo_trainer.py): the OPD per-token term added to the batch's advantages
    (TRL 1.16 takes (B, T) advantages)."""
    source = trainer.rollout_func
    rows = (getattr(source, "last_output", None) or {}).get("opd_signal")
    if rows is None or len(rows) != output["completion_ids"].shape[0]:
        raise RuntimeError("the rollout did not provide one OPD signal row per completion")
    cfg = source.args.opd
    output["advantages"] = dense_advantages(output["advantages"], rows, output["completion_ids"].shape[1],
                                            coef=cfg.coef, only=cfg.only)
    return output


def opd_trainer_class():
    """Deprecated: the agent trainer with the OPD hook alone (`grpo_trainer.agent_trainer_class()`
    with `hooks=[opd_advantages, ...]` combines it with others)."""
    from .grpo_trainer import trainer_with

    return trainer_with(opd_advantages)
