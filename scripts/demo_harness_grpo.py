"""Demo: GRPO on harness samples, a few real TRL steps on Orchard/Toy-v0 through the real
mini-swe-agent, the tiny offline model (algos/tiny.py) answering its calls via the proxy.

    .venv/bin/python scripts/demo_harness_grpo.py --steps 3 --out runs/demo-harness-grpo

Prints, per step: runs, errored runs, samples (recorded calls trained on), padding rows,
mean reward, informative groups, mean |advantage|, seconds. A random tiny model rarely
solves a toy task, so most groups carry no signal (advantage 0); the point is the plumbing:
each sample is one recorded call, prompt = the harness's exact request, tokenised once.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--harness", default="mini-swe-agent")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--group-size", type=int, default=2)
    p.add_argument("--prompts-per-step", type=int, default=1)
    p.add_argument("--max-calls", type=int, default=2)
    p.add_argument("--gamma", type=float, default=1.0)
    p.add_argument("--out", default="runs/demo-harness-grpo")
    a = p.parse_args()

    import torch

    from orchard_gym.algos.agent_rollout import SamplingParams
    from orchard_gym.algos.harness_grpo import HarnessGRPOArgs, train
    from orchard_gym.algos.tiny import build_tiny_model, toy_corpus
    from orchard_gym.envs.toy.env import make_tasks

    torch.set_num_threads(2)
    out = Path(a.out)
    tasks = make_tasks(["write"], num_tasks=4)
    build_tiny_model(toy_corpus(tasks.values(), "You are a helpful assistant."), out / "tiny", vocab_size=512,
                     max_position_embeddings=32768)
    args = HarnessGRPOArgs(env_id="Orchard/Toy-v0", env_kwargs={"kinds": ["write"], "num_tasks": 4},
                           harness=a.harness, group_size=a.group_size, prompts_per_step=a.prompts_per_step,
                           max_calls=a.max_calls, gamma=a.gamma, max_seconds=900, concurrency=4,
                           backend={"type": "local"}, sampling=SamplingParams(max_new_tokens=24, linger=0.05))
    summary = train(args, str(out / "tiny"), out / "run", steps=a.steps, learning_rate=1e-3, save=False)
    keys = ["rollout/runs", "rollout/errored_runs", "rollout/samples", "rollout/padding_rows", "rollout/reward_mean",
            "rollout/informative_groups", "rollout/advantage_abs_mean", "rollout/calls_per_run", "rollout/seconds",
            "loss"]
    for row in summary["rows"]:
        print(json.dumps({"step": row["step"], **{k.split("/")[-1]: row.get(k) for k in keys}}))
    print(f"{summary['steps']} steps in {summary['train_runtime']:.1f}s; metrics: {summary['metrics']}")


if __name__ == "__main__":
    main()
