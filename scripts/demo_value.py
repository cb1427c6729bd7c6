"""Value-model demo: a trajectory pool from two policies of different skill on Orchard/Toy-v0,
a value model on a tiny offline model trained on part of the tasks, best-of-N reranking of
a third policy's candidates on held-out tasks, and credit-assignment SFT on the pool.

    python scripts/demo_value.py --out runs/demo-value          # a few minutes on 2 CPU cores
    python scripts/demo_value.py --seeds 0 1 2 3 4 --n 4

All offline, in real local sandboxes (episodes through `envs.rollout.run_episodes`, graded
by the env's check command):
1. Three scripted policies stand in for checkpoints: each solves a task with probability
   P (weak 0.25, strong 0.8, new 0.5), else does something plausible but wrong (writes
   the wrong file, prints instead of writing, counts with the file name in the output,
   lists files), sometimes after an exploratory `ls`; then submits. (Why scripted: a tiny
   model SFT'd within this machine's CPU budget solved 0 of 60 episodes, and a pool with
   nothing resolved teaches a value model nothing.)
2. The pool: the weak and the strong policy on the training tasks, `pool.from_trajectory`
   with the env's prompts, the seed's filters.
3. Per seed: a value model (a randomly initialised ~0.1M-parameter Qwen2 backbone + a
   scalar head) trained on the pool, split by task; N candidates of the new policy on each
   held-out task, reranked: resolve rate of the value's pick vs random (expected), first,
   oracle, and selection accuracy on tasks with mixed outcomes.
4. Credit SFT (`--mode rise`, the value model as the judge) on the pool: how many action
   tokens of unresolved trajectories carry loss, and a few TRL steps.
Writes OUT/summary.json and prints the table per seed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path

import torch

torch.set_num_threads(int(os.environ.get("ORCHARD_THREADS", "1")))

from orchard_gym.algos import credit, trajectory_pool as P, rerank, sft  # noqa: E402
from orchard_gym.algos.pool_tokens import EntryTokenizer  # noqa: E402
from orchard_gym.algos.tiny import build_tiny_model, toy_corpus  # noqa: E402
from orchard_gym.algos.value import ValueModel, ValueTrainArgs, train_value  # noqa: E402
from orchard_gym.client import AsyncSandboxClient  # noqa: E402
from orchard_gym.envs.rollout import SYSTEM_PROMPT, run_episodes  # noqa: E402
from orchard_gym.envs.toy.env import ToyEnv, make_tasks  # noqa: E402



def wrong(task, rng: random.Random) -> str:
    """A plausible command that does not solve the task."""
    path = next(iter(task.files), None)
    options = {"write": [f"echo {task.answer} > answer.txt", f"echo {task.answer}", "ls"],
               "secret": [f"cat {path}", f"cp {path} secret.txt", "ls"],
               "count": [f"wc -l {path} > answer.txt", f"wc -l < {path}", "ls"]}[task.kind]
    return rng.choice(options)


class ScriptedPolicy:
    """Solves with probability `skill`; 30% of episodes start with an exploratory `ls`."""

    def __init__(self, skill: float, seed: int):
        self.skill, self.rng, self.env = skill, random.Random(seed), None

    def bind(self, env):
        bound = ScriptedPolicy(self.skill, 0)
        bound.rng, bound.env = self.rng, env
        bound.plan = None
        return bound

    async def __call__(self, messages, tools):
        if self.plan is None:
            task = self.env.task
            act = task.solution if self.rng.random() < self.skill else wrong(task, self.rng)
            self.plan = (["ls"] if self.rng.random() < 0.3 else []) + [act]
        if self.plan:
            return {"name": "bash", "arguments": {"command": self.plan.pop(0)}}
        return {"name": "submit", "arguments": {}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/demo-value")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--n", type=int, default=4, help="candidates per held-out task")
    ap.add_argument("--tasks", type=int, default=12, help="tasks per kind")
    ap.add_argument("--held-out", type=int, default=4, help="held-out tasks per kind")
    ap.add_argument("--pool-episodes", type=int, default=2, help="episodes per training task and checkpoint")
    ap.add_argument("--skills", type=float, nargs=3, default=[0.25, 0.8, 0.5], help="weak, strong, new policy")
    ap.add_argument("--hidden", type=int, default=48)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=16)
    a = ap.parse_args(argv)

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    env_kwargs = {"kinds": ["write", "secret", "count"], "num_tasks": a.tasks, "seed": 0, "variety": 4}
    tasks = make_tasks(**env_kwargs)
    held = sorted(t for t in tasks if int(t.split("-")[1]) >= a.tasks - a.held_out)
    train_ids = sorted(t for t in tasks if t not in held)
    info = P.TaskInfo("Orchard/Toy-v0", env_kwargs, SYSTEM_PROMPT)
    _, tokenizer = build_tiny_model(toy_corpus(tasks.values(), SYSTEM_PROMPT) + ["ls", "answer.txt", "(no output)"],
                                    out / "init", vocab_size=512, hidden_size=a.hidden, num_layers=a.layers,
                                    num_heads=4, num_kv_heads=2, intermediate_size=a.hidden * 2)

    def episodes(name, skill, ids, reps, seed):
        async def go():
            client = AsyncSandboxClient(backend={"type": "local"})
            try:
                return await run_episodes(lambda c: ToyEnv(tasks=tasks, client=c, max_steps=4),
                                          ScriptedPolicy(skill, seed), [t for t in ids for _ in range(reps)],
                                          concurrency=8, client=client, progress=False)
            finally:
                await client.aclose()

        return [P.from_trajectory(t, policy_id=name, info=info) for t in asyncio.run(go()) if t.ok]

    # 1-2. the pool
    pool_file = out / "pool.jsonl"
    raw = (episodes("weak", a.skills[0], train_ids, a.pool_episodes, 1)
           + episodes("strong", a.skills[1], train_ids, a.pool_episodes, 2))
    entries, dropped = P.filter_entries(raw)
    P.write_pool(pool_file, entries, append=False)
    by_policy = {p: {"episodes": sum(e.policy_id == p for e in entries),
                     "resolved": sum(e.resolved for e in entries if e.policy_id == p)} for p in ("weak", "strong")}
    print(f"[demo] pool: {P.summary(entries)}; dropped {dict(dropped)}; {by_policy}", flush=True)

    # 3. value models and reranking, per seed
    results = []
    for seed in a.seeds:
        vdir = out / f"value-{seed}"
        vs = train_value(entries, out / "init", vdir, ValueTrainArgs(epochs=a.epochs, learning_rate=5e-3,
                                                                     batch_size=4, val_fraction=0.2, seed=seed))
        vm = ValueModel.load(vdir)
        torch.manual_seed(1000 + seed)
        cands = episodes("new", a.skills[2], held, a.n, 100 + seed)
        groups = {t: g for t, g in rerank.group_by_task(cands).items() if len(g) >= 2}
        row = {"seed": seed, "value_val_mse": vs["history"][-1]["val_mse"]}
        for agg in ("final", "mean"):
            scores = {t: [rerank.score(vm.state_values(c), agg) for c in g] for t, g in groups.items()}
            row[agg] = rerank.compare(groups, scores, seed=seed)
        results.append(row)
        print(f"[demo] seed {seed} (val mse {row['value_val_mse']:.3f}):\n{rerank.format_table(row['final'])}"
              f"\n  mean aggregation: value {row['mean']['value']:.1%}", flush=True)

    # 4. credit-assignment SFT with the value model as the judge
    vm = ValueModel.load(out / f"value-{a.seeds[0]}")
    annotated, judge_dropped = credit.annotate(entries, credit.ValueJudge(vm))
    curves = {e.entry_id: c for e, c in annotated}
    tk = EntryTokenizer(tokenizer)
    rise = sft.build_examples([e for e, _ in annotated], tk, "rise", curves=curves)
    full = sft.build_examples([e for e, _ in annotated], tk, "full")
    unresolved_ids = {e.entry_id for e in entries if not e.resolved}
    tokens = {k: sum(sum(x.loss_mask) for x in xs if x.entry_id in unresolved_ids)
              for k, xs in (("rise", rise), ("full", full))}
    sft_summary = (sft.train_sft(rise, out / "init", out / "sft-rise", steps=10, learning_rate=3e-3, batch_size=8)
                   if rise else {"training_loss": float("nan"), "note": "no rise examples"})
    print(f"[demo] credit SFT: {len(rise)} examples; unresolved action tokens trained {tokens['rise']} of "
          f"{tokens['full']}; loss {sft_summary['training_loss']:.3f}", flush=True)

    def mean(key):
        return sum(r["final"][key] for r in results) / len(results)

    summary = {"command": " ".join([sys.executable, *sys.argv]), "wall_seconds": time.monotonic() - started,
               "pool": P.summary(entries), "pool_by_policy": by_policy, "dropped": dict(dropped),
               "held_out_tasks": len(held), "n": a.n, "per_seed": results,
               "mean_resolve": {k: mean(k) for k in ("value", "random", "first", "oracle")},
               "credit_sft": {"examples": len(rise), "unresolved_tokens_rise": tokens["rise"],
                              "unresolved_tokens_full": tokens["full"], "judge_dropped": dict(judge_dropped),
                              **sft_summary}}
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print(json.dumps({k: v for k, v in summary.items() if k != "per_seed"}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
