"""GRPO on harness samples (OpenForge RL): any harness, unchanged, becomes trainable.

Each rollout is one run of a harness (mini-swe-agent, Codex, ...) in the task's sandbox
(`HarnessEnv`); its model calls go to the recording proxy in policy mode, and the model
being trained answers them. Every answered call is one training sample:

- prompt = the exact request the harness sent (its messages and tools, in the proxy's
  chat-style normal form), rendered with the chat template and tokenised **once**, when
  the call is answered; those ids are recorded on the call (`prompt_token_ids`) and the
  trainer uses the recorded ids, never a re-tokenisation of text;
- completion = the tokens the model generated for it (`completion_token_ids`, with their
  sampling log-probs), parsed into the assistant message the harness receives;
- reward r_t = γ^(T−t)·r_T (`wrappers/proxy/reconstruct.py`; γ = `gamma`, 1.0 by default);
- a rollout that ended in an error (harness crash, timeout, proxy failure, context
  exhausted) gives no samples;
- advantages are group-relative over the runs of one prompt: with μ, σ the mean and std of
  the terminal rewards r_T of the group's usable runs, sample t of a run gets
  A_t = (r_t − μ) / (σ + 1e-4), and 0 when σ = 0 (a group with no signal).

`HarnessRolloutFunc` is a rollout source plugged into the one GRPO path (`grpo.build_trainer`):
TRL's `GRPOTrainer` does the rest (clipped loss eps_low/eps_high, DAPO token aggregation,
optimiser) through `algos/grpo.py`'s config and trainer. TRL needs a fixed number of rows per
group: a group is `group_size × max_calls` rows (a run answers at most `max_calls` calls); rows
no sample fills are padding with a zero mask. TRL's own per-row advantage (its groups of rows
are not our groups of runs) is replaced by the one above (the `harness_advantages` trainer hook).

Shared flags: the step-budget curriculum caps the calls a run answers (at most `max_calls`);
dynamic sampling replaces a group whose usable runs all got the same reward with a fresh
prompt's group (up to `max_resamples` times; a group still without signal is not trained on);
OPD (with the outcome reward) adds its per-token term to these advantages. Refused: BAR,
`opd.only`, RPR and `branch_at` (see `HarnessGRPOArgs`).

    from orchard_gym.algos.harness_grpo import HarnessGRPOArgs, train
    train(HarnessGRPOArgs(env_id="Orchard/Toy-v0", harness="mini-swe-agent", group_size=2, prompts_per_step=1,
                          max_calls=3), model="runs/tiny", output_dir="runs/harness-grpo", steps=2)
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from orchard_gym._loop import LoopThread
from orchard_gym.chat import tool_call
from orchard_gym.envs.actions import tagged_tool_calls
from orchard_gym.wrappers.proxy.openai_format import text_messages

from .agent_rollout import BatchedGenerator
from .chat_render import ChatRenderer
from .grpo import (AgentGRPOArgs, build_trainer as build_grpo_trainer, client_kwargs, draw_task, make_grpo_config,
                   model_context, parse_step_budget, prepare_run_dir, step_budget_at, train_and_summarise)

log = logging.getLogger(__name__)


@dataclass
class HarnessGRPOArgs(AgentGRPOArgs):
    """`AgentGRPOArgs` plus the harness side. `group_size`: runs per prompt; `max_calls`:
    model calls answered per run (the harness is stopped and graded after that)."""

    harness: str = field(default="mini-swe-agent", metadata={"help": "a built-in harness name"})
    max_calls: int = field(default=8, metadata={"help": "model calls answered per run"})
    gamma: float = field(default=1.0, metadata={"help": "r_t = gamma^(T-t) * r_T"})

    def __post_init__(self) -> None:
        if self.use_vllm is not None:
            raise ValueError("--use-vllm does not combine with --harness yet: the harness's model calls are "
                             "answered by the HF generator (algos/harness_grpo.py)")
        super().__post_init__()
        from orchard_gym.wrappers.harness import get_harness

        get_harness(self.harness)  # unknown names fail here, not mid-training
        if self.max_calls < 1:
            raise ValueError("max_calls must be at least 1")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError("gamma must be in [0, 1]")
        if self.algo != "grpo":
            raise ValueError("harness GRPO samples fixed groups (algo='grpo')")
        # what the harness path cannot do yet is refused, never silently ignored
        if self.branch_at is not None:
            raise ValueError("--branch-at does not combine with --harness: a harness process cannot be forked "
                             "mid-run")
        if self.rpr is not None:
            raise ValueError("--rpr-judge does not combine with --harness yet: the judge reads our own episodes' "
                             "turns, not a harness's recorded calls")
        if self.opd is not None and self.opd.only:
            raise ValueError("--opd-only does not combine with --harness yet (a harness run is graded); "
                             "use --opd-teacher with the outcome reward")

    @property
    def rows_per_group(self) -> int:
        return self.group_size * self.max_calls


def parse_completion(text: str) -> dict:
    """The model's text -> the assistant message handed to the harness: `<tool_call>{json}</tool_call>`
    blocks (the chat template's tool-call format) become tool calls, the rest is content."""
    calls, rest = tagged_tool_calls(text)
    if not calls:
        return {"role": "assistant", "content": text}
    return {"role": "assistant", "content": rest or None,
            "tool_calls": [tool_call({"name": c.name, "arguments": c.arguments}) for c in calls]}


def harness_advantages(trainer, output: dict) -> dict:
    """Trainer hook (algos/grpo_trainer.py): TRL's per-row advantages replaced by the ones over
    the group's runs (see the module docstring)."""
    import torch

    ours = trainer.rollout_func.pop_advantages()
    if ours is None or len(ours) != output["advantages"].shape[0]:
        raise RuntimeError(f"harness advantages missing or misaligned ({None if ours is None else len(ours)} "
                           f"for {output['advantages'].shape[0]} rows)")
    output["advantages"] = torch.tensor(ours, dtype=output["advantages"].dtype, device=output["advantages"].device)
    return output


@dataclass
class HarnessRunResult:
    task_id: str
    reward: float | None  # None: errored (no samples)
    error: str | None
    samples: list  # wrappers.reconstruct.Sample
    calls: int
    seconds: float


class ContextFull(RuntimeError):
    """The harness's request does not fit the model's context."""


@dataclass
class HarnessGroup:
    """One group slot of a batch: the runs it trains on, after any replacements."""

    runs: list[HarnessRunResult]
    resamples: int = 0
    trained: bool = True

    @property
    def informative(self) -> bool:
        return len({r.reward for r in self.runs if r.error is None}) > 1


class HarnessRolloutFunc:
    """TRL `rollout_func` (a rollout source of `grpo.build_trainer`): each distinct prompt (task
    id) gets `group_size` harness runs; their samples are the rows (see the module docstring)."""

    def __init__(self, args: HarnessGRPOArgs, tokenizer, *, task_ids: list[str] | None = None,
                 max_context: int | None = None, make_env=None):
        import gymnasium as gym

        import orchard_gym  # noqa: F401 - registers the env ids

        self.args = args
        self.tokenizer = tokenizer
        self.spec = gym.spec(args.env_id)
        if task_ids is None:
            from orchard_gym.registration import list_task_ids

            task_ids = args.task_ids or list_task_ids(args.env_id, **args.env_kwargs)  # no sandbox, no backend
        if not task_ids:
            raise ValueError("no training tasks")
        self.task_pool = list(task_ids)
        # make_env(client, proxy, max_calls=N) -> HarnessEnv; default: the registered env with `harness=`
        self.make_env = make_env or (lambda client, proxy, max_calls=args.max_calls: self.spec.make(
            harness=args.harness, client=client, proxy=proxy, max_steps=max_calls,
            max_seconds=args.max_seconds, **args.env_kwargs).unwrapped)
        from .dense import make_scorers

        _, self.scorers = make_scorers(args, self.make_env, tokenizer)  # OPD (RPR and OPD-only are refused)
        self.renderer = ChatRenderer(tokenizer, render_tools=args.render_tools)
        self.max_context = max_context
        self._model = None
        self.generator = BatchedGenerator(lambda: self._model, tokenizer, args.sampling)
        self.rng = random.Random(args.seed)
        self.proxy = None
        self.client = None
        self.pending_stats: list[dict] = []
        self.last_runs: list[HarnessRunResult] = []
        self.last_groups: list[HarnessGroup] = []
        self.last_rows: dict[str, list] = {}
        self.last_output: dict[str, list] = {}
        self.last_advantages: list[float] = []
        self._advantages: list[float] | None = None
        self.__name__ = "harness_rollout"

    # ------------------------------------------------------------------ TRL entry point
    def __call__(self, prompts: list, trainer) -> dict[str, list]:
        rows = self.args.rows_per_group
        if trainer.num_generations != rows:
            raise ValueError(f"GRPOConfig.num_generations ({trainer.num_generations}) must be group_size × max_calls "
                             f"({rows})")
        if len(prompts) % rows:
            raise ValueError(f"{len(prompts)} prompts do not split into groups of {rows}")
        slots = [str(prompts[i]) for i in range(0, len(prompts), rows)]
        self._model = trainer.accelerator.unwrap_model(trainer.model)
        schedule = parse_step_budget(self.args.step_budget, max(trainer.state.max_steps, 1))
        calls = min(step_budget_at(schedule, trainer.state.global_step), self.args.max_calls)
        return self.rollout(slots, step=trainer.state.global_step, max_calls=calls)

    def trainer_hooks(self) -> list:
        return [harness_advantages]

    def rollout(self, task_ids: list[str], step: int = 0, max_calls: int | None = None) -> dict[str, list]:
        """Runs for each slot (calls per run: the step budget, at most `max_calls`), then the rows."""
        started = time.monotonic()
        calls = min(max_calls or self.args.max_calls, self.args.max_calls)
        slots = LoopThread.shared().run(self._collect(task_ids, calls))
        out = self.rows(slots)
        self.last_groups = slots
        self.last_runs = [r for g in slots for r in g.runs]
        self.pending_stats.append(self._stats(slots, out, time.monotonic() - started, step, calls))
        trained = [any(m) for m in out["env_mask"]]
        for scorer in self.scorers:  # OPD: per-token signal rows (may drop rows the teacher failed on)
            self.pending_stats[-1].update(scorer(out, self.last_runs, trained, self._model))
        self.last_output = out
        return out

    def pop_advantages(self) -> list[float] | None:
        adv, self._advantages = self._advantages, None
        return adv

    # ------------------------------------------------------------------ rows and advantages
    def rows(self, groups: list[HarnessGroup] | list[list[HarnessRunResult]]) -> dict[str, list]:
        """Each group's samples then padding, `rows_per_group` rows a group; advantages kept
        for the trainer's hook. A group not trained on (no signal after dynamic sampling) keeps
        its rows with a zero mask and no reward."""
        n = self.args.rows_per_group
        out: dict[str, list] = {k: [] for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask", "env_reward",
                                                "task_id")}
        advantages: list[float] = []
        for slot in groups:
            if not isinstance(slot, HarnessGroup):
                slot = HarnessGroup(runs=list(slot))
            group = slot.runs
            usable = [r for r in group if r.error is None]
            terminal = [r.reward for r in usable]
            mu = sum(terminal) / len(terminal) if terminal else 0.0
            sigma = (math.sqrt(sum((x - mu) ** 2 for x in terminal) / (len(terminal) - 1))
                     if len(terminal) > 1 else 0.0)
            filled = 0
            for run in usable:
                for s in run.samples:
                    ids, comp = s.prompt_token_ids, s.completion_token_ids
                    if not ids or not comp:
                        raise RuntimeError(f"call {s.call_id} has no recorded token ids")
                    out["prompt_ids"].append(list(ids))
                    out["completion_ids"].append(list(comp))
                    out["logprobs"].append([float(lp.get("logprob", 0.0)) for lp in s.logprobs or []]
                                           or [0.0] * len(comp))
                    out["env_mask"].append([int(slot.trained)] * len(comp))
                    out["env_reward"].append(s.reward if slot.trained else None)
                    out["task_id"].append(run.task_id)
                    advantages.append((s.reward - mu) / (sigma + 1e-4) if sigma > 0 and slot.trained else 0.0)
                    filled += 1
            if filled > n:
                raise RuntimeError(f"{filled} samples for a group of {n} rows (max_calls not enforced?)")
            pad_ids = [self.tokenizer.eos_token_id]
            for _ in range(n - filled):  # padding: never trained on (mask 0, no reward, advantage 0)
                out["prompt_ids"].append(list(pad_ids))
                out["completion_ids"].append(list(pad_ids))
                out["logprobs"].append([0.0])
                out["env_mask"].append([0])
                out["env_reward"].append(None)
                out["task_id"].append(group[0].task_id if group else "")
                advantages.append(0.0)
        self._advantages = advantages
        self.last_rows, self.last_advantages = out, list(advantages)
        return out

    # ------------------------------------------------------------------ runs
    async def _ensure_started(self) -> None:
        if self.proxy is None:
            from orchard_gym.client import AsyncSandboxClient
            from orchard_gym.envs.swe.venvs import cache_root
            from orchard_gym.wrappers.harness import get_harness
            from orchard_gym.wrappers.proxy import ProxyConfig, RecordingProxy, default_socket_dir

            harness = get_harness(self.args.harness)
            await asyncio.to_thread(harness.install)
            await asyncio.to_thread(harness.install_npm)
            cache_root().mkdir(parents=True, exist_ok=True)
            sock = os.path.join(default_socket_dir(), f"grpo-{os.getpid()}-{id(self) % 10**8}.sock")
            self.proxy = RecordingProxy(ProxyConfig(uds=sock))
            await self.proxy.start()
            self.client = AsyncSandboxClient(**client_kwargs(self.args))

    async def _collect(self, task_ids: list[str], max_calls: int | None = None) -> list[HarnessGroup]:
        await self._ensure_started()
        gate = asyncio.Semaphore(self.args.concurrency)
        self.generator.active = 0
        calls = max_calls or self.args.max_calls
        in_batch = set(task_ids)

        async def guarded(task_id: str) -> HarnessRunResult:
            async with gate:
                self.generator.active += 1
                try:
                    return await self.run_one(task_id, calls)
                finally:
                    self.generator.active -= 1

        async def slot(task_id: str) -> HarnessGroup:
            tried: set[str] = set()
            resamples = 0
            while True:
                group = HarnessGroup(runs=list(await asyncio.gather(*(guarded(task_id)
                                                                      for _ in range(self.args.group_size)))))
                if group.informative or not self.args.dynamic_sampling:
                    break
                if resamples >= self.args.max_resamples:  # still no signal: not trained on (as in grpo.py)
                    group.trained = False
                    break
                resamples += 1  # DAPO dynamic sampling: a fresh prompt's group instead
                tried.add(task_id)
                task_id = draw_task(self.task_pool, self.rng, in_batch, tried)
                in_batch.add(task_id)
            group.resamples = resamples
            return group

        return list(await asyncio.gather(*(slot(t) for t in task_ids)))

    async def _answer(self, info: dict) -> tuple[dict, dict]:
        """Tokenise the harness's request once, generate, parse: (message, recorded tokens)."""
        prompt_ids = self.renderer.prompt_ids(text_messages(info["messages"]), info["tools"] or None)
        max_new = self.args.sampling.max_new_tokens
        if self.max_context and len(prompt_ids) + max_new > self.max_context:
            raise ContextFull(f"the harness's request is {len(prompt_ids)} tokens; with {max_new} new ones it "
                              f"exceeds the model's context of {self.max_context}")
        ids, logps, _stopped = await self.generator.generate(prompt_ids, max_new)
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        # OpenAI's logprob entries (the harness gets them: clients such as litellm parse them) plus vLLM's token_id
        pieces = [self.tokenizer.decode([t]) for t in ids]
        tokens = {"prompt_token_ids": prompt_ids, "completion_token_ids": ids,
                  "logprobs": [{"token": p, "token_id": t, "logprob": lp, "bytes": list(p.encode()), "top_logprobs": []}
                               for p, t, lp in zip(pieces, ids, logps, strict=True)],
                  "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(ids),
                            "total_tokens": len(prompt_ids) + len(ids)}}
        return parse_completion(text), tokens

    async def run_one(self, task_id: str, max_calls: int | None = None) -> HarnessRunResult:
        calls = max_calls or self.args.max_calls
        env = (self.make_env(self.client, self.proxy) if calls == self.args.max_calls
               else self.make_env(self.client, self.proxy, max_calls=calls))
        started = time.monotonic()
        error = None
        try:
            try:
                obs, info = await env.areset(options={"task_id": task_id})
                while True:
                    try:
                        message, tokens = await self._answer(info)
                    except ContextFull as e:
                        await env.abort(f"context exhausted: {e}")
                        break
                    obs, reward, terminated, truncated, info = await env.astep(message, tokens=tokens)
                    if terminated or truncated:
                        break
            except Exception as e:  # reset failed: an errored run, no samples
                error = f"{type(e).__name__}: {e}"
            t = env.trajectory
            error = error or (t.error if t is not None else "no episode")
            samples = [] if error else env.samples(gamma=self.args.gamma)
            record = env.record
            return HarnessRunResult(task_id=task_id, reward=None if error else float(t.reward), error=error,
                                    samples=samples, calls=len(record.calls) if record else 0,
                                    seconds=time.monotonic() - started)
        finally:
            await env.aclose()

    # ------------------------------------------------------------------ statistics
    def _stats(self, groups: list[HarnessGroup], out: dict, seconds: float, step: int, max_calls: int) -> dict:
        runs = [r for g in groups for r in g.runs]
        usable = [r for r in runs if r.error is None]
        samples = sum(len(r.samples) for r in usable)
        adv = [a for a, m in zip(self._advantages or [], out["env_mask"], strict=True) if any(m)]
        return {
            "rollout/step": step,
            "rollout/runs": len(runs),
            "rollout/errored_runs": len(runs) - len(usable),
            "rollout/samples": samples,
            "rollout/padding_rows": len(out["env_mask"]) - samples,
            "rollout/reward_mean": _mean([r.reward for r in usable]),
            "rollout/success_rate": _mean([float(r.reward > 0) for r in usable]),
            "rollout/calls_per_run": _mean([r.calls for r in runs]),
            "rollout/informative_groups": sum(1 for g in groups if g.informative),
            "rollout/groups_trained": sum(1 for g in groups if g.trained),
            "rollout/resamples": sum(g.resamples for g in groups),
            "rollout/step_budget": max_calls,
            "rollout/advantage_abs_mean": _mean([abs(a) for a in adv]),
            "rollout/seconds": seconds,
        }

    def pop_stats(self) -> dict:
        stats, self.pending_stats = self.pending_stats, []
        return stats[-1] if stats else {}

    async def aclose(self) -> None:
        if self.client is not None:
            await self.client.aclose()
            self.client = None
        if self.proxy is not None:
            await self.proxy.stop()
            self.proxy = None

    def close(self) -> None:
        for scorer in self.scorers:
            scorer.close()
        LoopThread.shared().run(self.aclose())


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def build_trainer(model, tokenizer, args: HarnessGRPOArgs, config, *, task_ids: list[str] | None = None,
                  metrics_path: str | Path | None = None, make_env=None):
    """`grpo.build_trainer` with harness runs as its rollout source. Returns (trainer, rollout source)."""
    source = HarnessRolloutFunc(args, tokenizer, task_ids=task_ids, max_context=model_context(model),
                                make_env=make_env)
    return build_grpo_trainer(model, tokenizer, args, config, metrics_path=metrics_path, source=source)


def grpo_config(output_dir: str | Path, args: HarnessGRPOArgs, *, steps: int, learning_rate: float = 1e-6,
                **overrides):
    """`algos/grpo.py`'s config with TRL's group = our group's rows."""
    rows = replace(args, group_size=args.rows_per_group)
    return make_grpo_config(output_dir, rows, steps=steps, learning_rate=learning_rate, **overrides)


def train(args: HarnessGRPOArgs, model: str, output_dir: str | Path, *, steps: int, learning_rate: float = 1e-6,
          save: bool = True, **config_overrides) -> dict:
    """Train `model` (a path) on harness samples; metrics in OUTPUT_DIR/metrics.jsonl."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, metrics = prepare_run_dir(output_dir, args)
    tokenizer = AutoTokenizer.from_pretrained(model)
    policy = AutoModelForCausalLM.from_pretrained(model)
    config = grpo_config(out, args, steps=steps, learning_rate=learning_rate, **config_overrides)
    trainer, rollout = build_trainer(policy, tokenizer, args, config, metrics_path=metrics)
    return train_and_summarise(trainer, rollout, tokenizer, out, metrics, save=save, with_rows=True)
