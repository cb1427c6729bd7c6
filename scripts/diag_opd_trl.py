"""Diagnostic for OPD inside the real agent loop (TRL GRPOTrainer, multi-turn Orchard/Toy-v0
episodes, --opd-only): the exact full-vocabulary reverse KL KL(student || teacher) at the action
positions of a FIXED held-out set of the initial student's episodes, before training and after
every step; plus the checks that rule out token misalignment:

- the sampling log-probs of the rollout == the model re-scoring prompt_ids + completion_ids
  (the training sequence is the one that was sampled, turn by turn);
- TRL's per-token log-probs in `_compute_loss` (left-padded prompts, right-padded completions)
  == an unpadded forward of the same sequence (the positions the advantages act on).

    python scripts/diag_opd_trl.py runs/demo-opd-b --lr 1e-3 --steps 10    # a folder from demo_opd.py
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
torch.set_num_threads(int(os.environ.get("ORCHARD_THREADS", "1")))

from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback  # noqa: E402

from orchard_gym.algos.agent_rollout import SamplingParams  # noqa: E402
from orchard_gym.algos.grpo import AgentGRPOArgs, AgentRolloutFunc, build_trainer, make_grpo_config  # noqa: E402
from orchard_gym.algos.opd import token_logprobs  # noqa: E402
from orchard_gym.envs.toy.env import make_tasks  # noqa: E402

SYSTEM = "You act in a sandbox with the tools bash and submit. Reply with one tool call."


def exact_stats(student, teacher, rows) -> dict:
    """Mean exact reverse KL and the two entropies over the action tokens of `rows`."""
    kl = hs = ht = n = 0.0
    with torch.no_grad():
        for prompt, completion, mask in rows:
            x = torch.tensor([prompt + completion])
            start = len(prompt)
            ls = torch.log_softmax(student(x).logits[0, start - 1:-1].double(), -1)
            lt = torch.log_softmax(teacher(x).logits[0, start - 1:-1].double(), -1)
            m = torch.tensor(mask, dtype=torch.double)
            kl += float(((ls.exp() * (ls - lt)).sum(-1) * m).sum())
            hs += float((-(ls.exp() * ls).sum(-1) * m).sum())
            ht += float((-(lt.exp() * lt).sum(-1) * m).sum())
            n += float(m.sum())
    return {"kl": kl / n, "student_entropy": hs / n, "teacher_entropy": ht / n}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", help="folder with student/ and teacher/ (scripts/demo_opd.py --out)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--coef", type=float, default=1.0)
    ap.add_argument("--warmup", type=int, default=0, help="linear learning-rate warm-up steps")
    ap.add_argument("--out", default="runs/diag-opd-trl")
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    d = Path(a.models)
    tok = AutoTokenizer.from_pretrained(d / "student")
    student = AutoModelForCausalLM.from_pretrained(d / "student")
    teacher = AutoModelForCausalLM.from_pretrained(d / "teacher").eval()
    env_kwargs = {"kinds": ["write", "secret", "count"], "num_tasks": 16, "seed": 0, "variety": 1}
    ids = sorted(make_tasks(**env_kwargs))
    sampling = SamplingParams(max_new_tokens=40, max_completion_tokens=160, temperature=1.0, linger=0.02)
    base = dict(env_id="Orchard/Toy-v0", env_kwargs=env_kwargs, backend={"type": "local"}, task_ids=ids,
                group_size=4, prompts_per_step=4, step_budget="3", max_seconds=60, system_prompt=SYSTEM,
                render_tools=False, seed=0, concurrency=32, sampling=sampling)

    held = AgentRolloutFunc(AgentGRPOArgs(**base), tok)
    held._model = student
    try:
        out = held.rollout(ids[0:16:2] + ids[16:32:4] + ids[32:48:4], 3)
    finally:
        held.close()
    rows = [(p, c, m) for p, c, m in zip(out["prompt_ids"], out["completion_ids"], out["env_mask"], strict=True)
            if any(m)]
    diffs = []
    for (p, c, m), sampled in zip(rows, [lp for lp, m in zip(out["logprobs"], out["env_mask"]) if any(m)],
                                  strict=True):
        rescored = token_logprobs(student, [p + c], [len(p)])[0]
        diffs += [abs(x - y) for x, y, k in zip(rescored, sampled, m, strict=True) if k]
    print(f"held-out: {len(rows)} episodes, {sum(sum(m) for *_, m in rows)} action tokens; sampling vs "
          f"re-scored log-probs: max |diff| {max(diffs):.2e}", flush=True)
    history = [{"step": 0, **exact_stats(student, teacher, rows)}]
    print(json.dumps(history[-1]), flush=True)

    args = AgentGRPOArgs(**base, opd={"teacher": str(d / "teacher"), "coef": a.coef, "only": True})
    config = make_grpo_config(a.out, args, steps=a.steps, learning_rate=a.lr, disable_tqdm=True,
                               **({"lr_scheduler_type": "constant_with_warmup", "warmup_steps": a.warmup}
                                  if a.warmup else {}))

    class HeldOut(TrainerCallback):
        def on_step_end(self, targs, state, control, **kw):
            history.append({"step": state.global_step, **exact_stats(student, teacher, rows)})
            print(json.dumps(history[-1]), flush=True)

    metrics = Path(a.out) / "metrics.jsonl"
    trainer, rollout = build_trainer(student, tok, args, config, metrics_path=metrics, callbacks=[HeldOut()])
    checked = []
    forward = trainer._get_per_token_logps_and_entropies

    def check_alignment(model, input_ids, attention_mask, logits_to_keep, *rest, **kw):
        result = forward(model, input_ids, attention_mask, logits_to_keep, *rest, **kw)
        if torch.is_grad_enabled() and not checked:  # the loss forward of the first step
            worst = 0.0
            for b in range(input_ids.shape[0]):
                keep = attention_mask[b].bool()
                start = int(attention_mask[b, :input_ids.shape[1] - logits_to_keep].sum())
                ref = token_logprobs(model, [input_ids[b][keep].tolist()], [start])[0]
                worst = max(worst, float((result[0][b, :len(ref)].detach() - torch.tensor(ref)).abs().max()))
            checked.append(worst)
            print(f"TRL loss log-probs vs unpadded forward: max |diff| {worst:.2e}", flush=True)
        return result

    trainer._get_per_token_logps_and_entropies = check_alignment
    try:
        trainer.train()
    finally:
        rollout.close()
    on_policy = [json.loads(x).get("opd/kl") for x in metrics.read_text().splitlines()]
    print(json.dumps({"held_out": history, "opd_kl_on_policy": on_policy}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
