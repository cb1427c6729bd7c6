"""Value-model demo: a trajectory pool from two checkpoints of a tiny model on Orchard/Toy-v0,
a value model trained on part of the tasks, best-of-N reranking of a third checkpoint's
candidates on held-out tasks, and credit-assignment SFT on the pool.

    python scripts/demo_value.py --out runs/demo-value          # ~10-20 minutes on 2 busy CPU cores
    python scripts/demo_value.py --seeds 0 1 2 --n 4

All offline, in real local sandboxes:
1. A byte-level BPE and a randomly initialised Qwen2 (~0.5M parameters), as in
   scripts/demo_learning.py; three SFT warm starts of different lengths give three
   checkpoints (weak, strong, and a middle one that plays the "new policy").
2. The pool: episodes of the weak and the strong checkpoint on the training tasks, with
   their token ids (`pool.from_sample`), filtered (undefined tools; unparsable actions
   are kept: the value model must see bad behaviour too).
3. Per seed: a value model (the tiny init model's backbone + a scalar head) trained on
   the pool, split by task; N candidates of the new policy on every held-out task,
   reranked: resolve rate of the value's pick vs random (expected), first, oracle.
4. Credit SFT (`--mode rise`, the value model as the judge) on the pool: how many tokens
   of unresolved trajectories carry loss, and a few TRL steps.
Writes OUT/summary.json and prints the table per seed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

torch.set_num_threads(int(os.environ.get("ORCHARD_THREADS", "2")))

from orchard_gym.algos import credit, pool as P, rerank, sft  # noqa: E402
from orchard_gym.algos.agent_rollout import SamplingParams  # noqa: E402
from orchard_gym.algos.grpo import AgentGRPOArgs, evaluate  # noqa: E402
from orchard_gym.algos.pool_tokens import EntryTokenizer  # noqa: E402
from orchard_gym.algos.tiny import build_tiny_model, toy_corpus  # noqa: E402
from orchard_gym.algos.value import ValueModel, ValueTrainArgs, train_value  # noqa: E402
from orchard_gym.algos.warmstart import sft_warm_start  # noqa: E402
from orchard_gym.envs.toy.env import make_tasks, oracle_messages  # noqa: E402

SYSTEM = "You act in a sandbox with the tools bash and submit. Reply with one tool call."


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/demo-value")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--n", type=int, default=4, help="candidates per held-out task")
    ap.add_argument("--tasks", type=int, default=16, help="tasks per kind")
    ap.add_argument("--held-out", type=int, default=6, help="held-out tasks per kind")
    ap.add_argument("--pool-episodes", type=int, default=2, help="episodes per training task and checkpoint")
    ap.add_argument("--sft-steps", type=int, nargs=3, default=[10, 40, 20], help="weak, strong, new policy")
    ap.add_argument("--sft-batch", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=8)
    a = ap.parse_args(argv)

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    env_kwargs = {"kinds": ["write", "secret", "count"], "num_tasks": a.tasks, "seed": 0, "variety": 1}
    tasks = make_tasks(**env_kwargs)
    held = sorted(t for t in tasks if int(t.split("-")[1]) >= a.tasks - a.held_out)
    train_ids = sorted(t for t in tasks if t not in held)
    args = AgentGRPOArgs(env_id="Orchard/Toy-v0", env_kwargs=env_kwargs, backend={"type": "local"},
                         system_prompt=SYSTEM, render_tools=False, concurrency=16, max_seconds=60,
                         sampling=SamplingParams(max_new_tokens=40, max_completion_tokens=160, temperature=1.0,
                                                 linger=0.02))
    info = P.TaskInfo("Orchard/Toy-v0", env_kwargs, SYSTEM)

    # 1. checkpoints
    _, tokenizer = build_tiny_model(toy_corpus(tasks.values(), SYSTEM), out / "init", vocab_size=512,
                                    hidden_size=a.hidden, num_layers=a.layers, num_heads=4, num_kv_heads=2,
                                    intermediate_size=a.hidden * 3)
    # one SFT run, three checkpoints along it: weak (early), new (middle: the "new policy"), strong (late)
    import copy

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(out / "init"))
    ckpts, done = {}, 0
    for name, steps in sorted(zip(("weak", "strong", "new"), a.sft_steps, strict=True), key=lambda x: x[1]):
        sft_warm_start(model, tokenizer, [oracle_messages(tasks[t], SYSTEM) for t in train_ids], steps=steps - done,
                       learning_rate=3e-3, batch_size=a.sft_batch, output_dir=out / f"sft-{name}", seed=steps)
        done = steps
        ckpts[name] = copy.deepcopy(model)
        print(f"[demo] checkpoint {name}: {steps} SFT steps", flush=True)

    def episodes(name, ids, reps):
        res = evaluate(ckpts[name], tokenizer, args, [t for t in ids for _ in range(reps)], max_steps=3)
        return [P.from_sample(s, policy_id=name, tokenizer=tokenizer, info=info) for s in res["samples"] if s.ok]

    # 2. the pool
    pool_file = out / "pool.jsonl"
    pool_file.unlink(missing_ok=True)
    raw = episodes("weak", train_ids, a.pool_episodes) + episodes("strong", train_ids, a.pool_episodes)
    entries, dropped = P.filter_entries(raw, drop_unparsable=False)
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
        cands = episodes("new", held, a.n)
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
