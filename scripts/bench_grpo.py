"""Benchmarks of agent GRPO, each against a baseline measured in the same run.

    python scripts/bench_grpo.py                 # both parts, ~3-6 minutes on 2 CPU cores
    python scripts/bench_grpo.py --part overhead --steps 6
    python scripts/bench_grpo.py --part bar --budget 512

1. overhead: seconds per optimiser step of our multi-turn GRPO (Orchard/Toy-v0 episodes
   in real local sandboxes, turn-by-turn generation by the trained model, TRL's loss)
   against TRL's plain single-turn GRPOTrainer on the same model, batch and token counts
   (its prompts and completions are padded/forced to our measured mean lengths).
2. bar: BAR against fixed-N group sampling at the same rollout budget, over prompts of
   mixed difficulty: real Orchard/Toy-v0 episodes in local sandboxes with a scripted policy
   whose per-task success probability is known (it runs the oracle command with
   probability p, a wrong one otherwise; the env's grader decides the reward), and the
   same comparison simulated at a larger budget. Reports the share of informative groups
   (rewards not all equal), of balanced groups (positive fraction in [0.25, 0.75]), rollouts
   per informative group and the mean within-group reward std (the signal per group).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

SUCCESS_RATES = [0.0, 0.05, 0.2, 0.5, 0.8, 0.95, 1.0]


# ----------------------------------------------------------------------------- part 1
def bench_overhead(steps: int, group_size: int, prompts: int, root: str) -> dict:
    import torch

    torch.set_num_threads(int(os.environ.get("ORCHARD_THREADS", "2")))
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from orchard_gym.algos.agent_rollout import SamplingParams
    from orchard_gym.algos.grpo import AgentGRPOArgs, build_trainer, make_grpo_config
    from orchard_gym.algos.tiny import build_tiny_model, toy_corpus
    from orchard_gym.envs.toy.env import make_tasks

    system = "Act."
    tasks = make_tasks(["write", "secret"], num_tasks=16)
    work = Path(tempfile.mkdtemp(prefix="bench-grpo-"))
    build_tiny_model(toy_corpus(tasks.values(), system), work / "model", vocab_size=512, hidden_size=96,
                     num_layers=4, intermediate_size=288)

    class Timer(TrainerCallback):
        def __init__(self):
            self.times, self.t0 = [], 0.0

        def on_step_begin(self, *a, **k):
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            self.times.append(time.perf_counter() - self.t0)

    # ours: multi-turn episodes in sandboxes
    args = AgentGRPOArgs(env_id="Orchard/Toy-v0", env_kwargs={"kinds": ["write", "secret"], "num_tasks": 16},
                         backend={"type": "local", "root": root}, group_size=group_size, prompts_per_step=prompts,
                         dynamic_sampling=False, step_budget="3", max_seconds=120, system_prompt=system,
                         render_tools=False, sampling=SamplingParams(max_new_tokens=32, max_completion_tokens=128))
    model = AutoModelForCausalLM.from_pretrained(work / "model")
    tokenizer = AutoTokenizer.from_pretrained(work / "model")
    timer = Timer()
    config = make_grpo_config(work / "ours", args, steps=steps + 1, learning_rate=1e-4, disable_tqdm=True)
    trainer, rollout = build_trainer(model, tokenizer, args, config, metrics_path=work / "ours" / "metrics.jsonl",
                                     callbacks=[timer])
    try:
        trainer.train()
    finally:
        rollout.close()
    rows = [json.loads(x) for x in (work / "ours" / "metrics.jsonl").read_text().splitlines()][1:]
    ours_step = statistics.median(timer.times[1:])
    ours_rollout = statistics.median(r["rollout/seconds"] for r in rows)
    ours_generate = statistics.median(r["rollout/generate_seconds"] for r in rows)
    completion = round(statistics.mean(r["rollout/completion_tokens"] for r in rows))
    generated = statistics.mean(r["rollout/generated_tokens"] for r in rows) / (group_size * prompts)
    sample = rollout.last_slots[0].samples[0]
    prompt_text = tokenizer.decode(sample.prompt_ids)
    prompt_len = len(sample.prompt_ids)

    # baseline: TRL's own single-turn GRPO, same model, batch, prompt and completion lengths
    model = AutoModelForCausalLM.from_pretrained(work / "model")
    rng = random.Random(0)

    def random_reward(prompts, completions, **kw):
        return [float(rng.random() < 0.5) for _ in prompts]

    base_timer = Timer()
    base_config = GRPOConfig(
        output_dir=str(work / "plain"), max_steps=steps + 1, learning_rate=1e-4,
        per_device_train_batch_size=group_size * prompts, num_generations=group_size,
        max_completion_length=completion, generation_kwargs={"min_new_tokens": completion},
        temperature=1.0, top_k=0, loss_type="dapo", epsilon=0.2, epsilon_high=0.28, beta=0.0, logging_steps=1,
        save_strategy="no", report_to="none", use_cpu=not torch.cuda.is_available(), bf16=False,
        disable_tqdm=True)
    dataset = Dataset.from_dict({"prompt": [prompt_text] * 64})
    base = GRPOTrainer(model=model, reward_funcs=[random_reward], args=base_config, train_dataset=dataset,
                       processing_class=tokenizer, callbacks=[base_timer])
    base.train()
    plain_step = statistics.median(base_timer.times[1:])
    plain_lengths = [h["completions/mean_length"] for h in base.state.log_history if "completions/mean_length" in h]
    return {
        "batch": f"{prompts} prompts x {group_size} = {group_size * prompts} sequences",
        "prompt_tokens": prompt_len, "completion_tokens": completion,
        "ours_generated_tokens_per_episode": generated, "ours_turns_per_episode":
            statistics.mean(r["rollout/episode_turns"] for r in rows),
        "ours_seconds_per_step": ours_step, "ours_rollout_seconds_per_step": ours_rollout,
        "ours_generate_seconds_per_step": ours_generate,
        "plain_trl_seconds_per_step": plain_step, "overhead_ratio": ours_step / plain_step,
        "plain_trl_completion_tokens": statistics.mean(plain_lengths) if plain_lengths else None,
        "steps_timed": len(timer.times[1:]),
    }


# ----------------------------------------------------------------------------- part 2
class ScriptedPolicy:
    """Runs the task's oracle command with probability p (by task), a wrong one otherwise, then submits."""

    def __init__(self, rates: dict[str, float], rng: random.Random, env=None, solve: bool | None = None):
        self.rates, self.rng, self.env, self.solve = rates, rng, env, solve

    def bind(self, env):
        return ScriptedPolicy(self.rates, self.rng, env, self.rng.random() < self.rates[env.task.task_id])

    async def __call__(self, messages, tools):
        if not any(m["role"] == "assistant" for m in messages):
            command = self.env.task.solution if self.solve else "echo nope > answer.txt"
            return {"name": "bash", "arguments": {"command": command}}
        return {"name": "submit", "arguments": {}}


async def real_bar_vs_fixed(budget: int, root: str, concurrency: int, seed: int) -> dict:
    from orchard_gym.algos.bar import BARConfig, BARSampler, FixedSampler, SamplingStats
    from orchard_gym.client import AsyncSandboxClient
    from orchard_gym.envs.rollout import run_episodes
    from orchard_gym.envs.toy.env import ToyEnv, make_tasks

    tasks = make_tasks(["write"], num_tasks=len(SUCCESS_RATES) * 40, seed=seed)
    ids = sorted(tasks)
    rates = {t: SUCCESS_RATES[i % len(SUCCESS_RATES)] for i, t in enumerate(ids)}
    results = {}
    async with AsyncSandboxClient({"type": "local", "root": root}) as client:
        for name, sampler in (("fixed_n8", FixedSampler(8)), ("bar", BARSampler(BARConfig()))):
            policy = ScriptedPolicy(rates, random.Random(seed))
            stats = SamplingStats()
            started = time.monotonic()
            i = 0
            while stats.rollouts < budget:
                task = ids[i % len(ids)]
                i += 1

                async def run(n, task=task):
                    return await run_episodes(lambda c: ToyEnv(tasks=tasks, client=c, max_steps=3), policy,
                                              [task] * n, client=client, concurrency=concurrency, progress=False)

                stats.add(await sampler.sample(run))
            results[name] = {**stats.as_dict(), "seconds": time.monotonic() - started}
    return results


async def simulated_bar_vs_fixed(budget: int, seed: int) -> dict:
    from orchard_gym.algos.bar import BARConfig, BARSampler, FixedSampler, simulate

    samplers = (("fixed_n8", FixedSampler(8)), ("bar", BARSampler(BARConfig())),
                ("bar_max16", BARSampler(BARConfig(max_rollouts=16))),
                ("bar_keep", BARSampler(BARConfig(on_exhausted="keep"))))
    return {name: (await simulate(s, SUCCESS_RATES, budget, seed=seed)).as_dict() for name, s in samplers}


def fmt(d: dict) -> str:
    return json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in d.items()})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=["all", "overhead", "bar"], default="all")
    ap.add_argument("--steps", type=int, default=10, help="timed optimiser steps (after one warm-up step)")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--budget", type=int, default=448, help="rollouts per sampler, real episodes")
    ap.add_argument("--sim-budget", type=int, default=20000, help="rollouts per sampler, simulated")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="also write the results here")
    a = ap.parse_args(argv)
    root = tempfile.mkdtemp(prefix="og-bench-", dir="/tmp")
    out = {}
    if a.part in ("all", "overhead"):
        r = bench_overhead(a.steps, a.group_size, a.prompts, root)
        out["overhead"] = r
        print(f"\n[1] seconds per GRPO step (median of {r['steps_timed']}), {r['batch']}, prompt "
              f"{r['prompt_tokens']} + completion {r['completion_tokens']} tokens")
        print(f"    multi-turn agent GRPO (sandboxes): {r['ours_seconds_per_step']:.2f} s/step "
              f"(rollout {r['ours_rollout_seconds_per_step']:.2f} s of which generate "
              f"{r['ours_generate_seconds_per_step']:.2f} s; {r['ours_turns_per_episode']:.2f} turns, "
              f"{r['ours_generated_tokens_per_episode']:.1f} generated tokens per episode)")
        print(f"    plain single-turn TRL GRPOTrainer: {r['plain_trl_seconds_per_step']:.2f} s/step "
              f"({r['plain_trl_completion_tokens']:.1f} completion tokens generated per sequence)")
        print(f"    overhead ratio: {r['overhead_ratio']:.2f}x")
    if a.part in ("all", "bar"):
        real = asyncio.run(real_bar_vs_fixed(a.budget, root, a.concurrency, a.seed))
        sim = asyncio.run(simulated_bar_vs_fixed(a.sim_budget, a.seed))
        out["bar_real"], out["bar_simulated"] = real, sim
        print(f"\n[2] BAR vs fixed N=8 at the same rollout budget, success rates {SUCCESS_RATES} (cycled)")
        for label, res in ((f"real episodes, budget {a.budget}", real), (f"simulated, budget {a.sim_budget}", sim)):
            print(f"    {label}:")
            for name, s in res.items():
                print(f"      {name:9} prompts {s['prompts']:5}  rollouts {s['rollouts']:6}  "
                      f"informative {s['informative_share']:.3f} (of trained groups "
                      f"{s['informative_share_of_trained']:.3f})  balanced {s['balanced_share']:.3f}  "
                      f"rollouts/informative group {s['rollouts_per_informative_group']:.1f}  "
                      f"group reward std {s['mean_group_reward_std']:.3f}  dropped {s['dropped']}")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
