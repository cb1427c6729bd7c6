"""On-policy distillation demo: a weak student learns from a stronger teacher on Orchard/Toy-v0,
with `--opd-only` (no outcome reward, no grading), beside an outcome-only GRPO run with the
same seed and the same episode budget.

    python scripts/demo_opd.py --out runs/demo-opd            # ~15-25 minutes on 2 busy CPU cores

All offline, in real local sandboxes:
1. Orchard/Toy-v0 (write / secret / count, variety 1), a byte-level BPE and a random tiny Qwen2.
2. Teacher: the initial model SFT'd for `--teacher-sft-steps` on oracle conversations.
   Student: the same initial model SFT'd for only `--student-sft-steps` (weaker).
3. Run A: agent GRPO with `opd={"teacher": TEACHER, "only": True}` for `--steps` steps.
   Run B: outcome-only agent GRPO from the same student, same seed, same steps and group sizes.
4. Evaluations (fresh sampled episodes) at 0, every `--eval-every` steps and at the end; the
   per-token KL to the teacher (`opd/kl`) per step of run A; and the grading saving: the same
   greedy episodes timed with and without grading.
5. RUN/summary.json, RUN/{opd,outcome}/metrics.jsonl and the figure RUN/opd_demo.png
   (copied to docs/opd_demo.png with --docs).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import sys
import time
from pathlib import Path

import torch

torch.set_num_threads(int(os.environ.get("ORCHARD_THREADS", "1")))

from orchard_gym._loop import LoopThread  # noqa: E402
from orchard_gym.algos.agent_rollout import EpisodeRunner, SamplingParams  # noqa: E402
from orchard_gym.algos.grpo import (  # noqa: E402
    AgentGRPOArgs,
    build_trainer,
    client_kwargs,
    env_factory,
    evaluate,
    make_grpo_config,
)
from orchard_gym.algos.opd import skip_grading  # noqa: E402
from orchard_gym.algos.tiny import build_tiny_model, toy_corpus  # noqa: E402
from orchard_gym.algos.warmstart import sft_warm_start  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from orchard_gym.envs.toy.env import make_tasks, oracle_messages  # noqa: E402

SYSTEM = "You act in a sandbox with the tools bash and submit. Reply with one tool call."


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/demo-opd")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--teacher-sft-steps", type=int, default=80)
    ap.add_argument("--student-sft-steps", type=int, default=12)
    ap.add_argument("--sft-lr", type=float, default=3e-3)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--opd-coef", type=float, default=1.0)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--prompts-per-step", type=int, default=4)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--eval-tasks", type=int, default=6, help="tasks per kind in each evaluation")
    ap.add_argument("--eval-episodes", type=int, default=2, help="sampled episodes per evaluation task")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--docs", action="store_true", help="copy the figure to docs/opd_demo.png")
    a = ap.parse_args(argv)

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    env_kwargs = {"kinds": ["write", "secret", "count"], "num_tasks": 16, "seed": a.seed, "variety": 1}
    tasks = make_tasks(**env_kwargs)
    train_ids = sorted(tasks)
    eval_ids = [t for t in train_ids if int(t.split("-")[1]) < a.eval_tasks]
    sampling = SamplingParams(max_new_tokens=40, max_completion_tokens=160, temperature=1.0, linger=0.02)
    base = dict(env_id="Orchard/Toy-v0", env_kwargs=env_kwargs, backend={"type": "local"}, task_ids=train_ids,
                group_size=a.group_size, prompts_per_step=a.prompts_per_step, step_budget="3", max_seconds=60,
                system_prompt=SYSTEM, render_tools=False, seed=a.seed, concurrency=32, sampling=sampling)

    init, tokenizer = build_tiny_model(toy_corpus(tasks.values(), SYSTEM), out / "init", vocab_size=512,
                                       hidden_size=a.hidden, num_layers=a.layers, num_heads=4, num_kv_heads=2,
                                       intermediate_size=a.hidden * 3, seed=a.seed)
    conversations = [oracle_messages(tasks[t], SYSTEM) for t in train_ids]
    models = {}
    for name, steps in (("teacher", a.teacher_sft_steps), ("student", a.student_sft_steps)):
        m = copy.deepcopy(init)
        r = sft_warm_start(m, tokenizer, conversations, steps=steps, learning_rate=a.sft_lr, batch_size=16,
                           output_dir=out / f"sft-{name}", seed=a.seed)
        m.save_pretrained(str(out / name))
        tokenizer.save_pretrained(str(out / name))
        # train from the saved folder, as `orchard train grpo --model DIR` does: not the object SFTTrainer
        # left behind (gradient checkpointing switched on, an input-grad hook registered)
        models[name] = AutoModelForCausalLM.from_pretrained(str(out / name))
        print(f"[demo] {name}: SFT {steps} steps, loss {r.training_loss:.3f}", flush=True)

    eval_args = AgentGRPOArgs(**base)

    def run_eval(model, tag: str, step: int, log: list) -> dict:
        sampled = evaluate(model, tokenizer, eval_args, eval_ids * a.eval_episodes, max_steps=3)
        row = {"step": step, "success_rate": sampled["success_rate"], "episodes": sampled["episodes"],
               "errors": sampled["errors"]}
        log.append(row)
        print(f"[demo] {tag} eval @ {step}: success {row['success_rate']:.3f}", flush=True)
        return row

    teacher_eval = run_eval(models["teacher"], "teacher", 0, [])

    # the grading saving: identical greedy episodes, graded and not
    make_env, _ = env_factory(eval_args)
    greedy = SamplingParams(**{**sampling.__dict__, "temperature": 0.0})
    timing: dict = {"grade_calls_seconds": []}

    def timed_grading(client, max_steps, max_seconds):  # the time spent inside grade() itself
        env = make_env(client, max_steps, max_seconds)
        grade = env.grade

        async def timed(ctx, task):
            t0 = time.monotonic()
            try:
                return await grade(ctx, task)
            finally:
                timing["grade_calls_seconds"].append(time.monotonic() - t0)

        env.grade = timed
        return env

    for label, factory in (("graded", timed_grading), ("ungraded", skip_grading(make_env))):
        runner = EpisodeRunner(factory, tokenizer, lambda: models["student"], greedy,
                               client_kwargs=client_kwargs(eval_args), system_prompt=SYSTEM, render_tools=False,
                               concurrency=8)

        async def go(runner=runner):
            try:
                t0 = time.monotonic()
                res = await runner.run_many(eval_ids * 2, 3, 60)
                return time.monotonic() - t0, res
            finally:
                await runner.aclose()

        seconds, res = LoopThread.shared().run(go())
        timing[label] = {"wall_seconds": seconds, "episode_seconds_sum": sum(s.seconds for s in res),
                         "episodes": len(res)}
    calls = timing.pop("grade_calls_seconds")
    timing["grade_seconds_per_episode"] = sum(calls) / len(calls) if calls else None
    print(f"[demo] grading saving: {timing}", flush=True)

    from transformers import TrainerCallback

    runs = {}
    for name, extra in (("opd", {"opd": {"teacher": str(out / "teacher"), "coef": a.opd_coef, "only": True}}),
                        ("outcome", {})):
        run_dir = out / name
        if run_dir.exists():
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True)
        args = AgentGRPOArgs(**base, **extra)
        model = copy.deepcopy(models["student"])
        evals: list = []
        run_eval(model, name, 0, evals)

        class EvalEvery(TrainerCallback):
            def on_step_end(self, targs, state, control, model=model, evals=evals, **kw):
                if state.global_step % a.eval_every == 0 and state.global_step < a.steps:
                    run_eval(model, name, state.global_step, evals)

        config = make_grpo_config(run_dir, args, steps=a.steps, learning_rate=a.lr, disable_tqdm=True)
        trainer, rollout = build_trainer(model, tokenizer, args, config, metrics_path=run_dir / "metrics.jsonl",
                                         callbacks=[EvalEvery()])
        t0 = time.monotonic()
        try:
            trainer.train()
        finally:
            rollout.close()
        train_seconds = time.monotonic() - t0
        run_eval(model, name, a.steps, evals)
        rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        runs[name] = {"evals": evals, "rows": rows, "train_seconds": train_seconds,
                      "episodes": sum(r.get("rollout/episodes") or 0 for r in rows)}

    png = plot(runs, out / "opd_demo.png", teacher_eval["success_rate"], a)
    if a.docs:
        shutil.copy(png, Path(__file__).resolve().parents[1] / "docs" / "opd_demo.png")
    kl = [r.get("opd/kl") for r in runs["opd"]["rows"] if r.get("opd/kl") is not None]
    k = max(1, len(kl) // 5)

    def mean_of(rows, key):
        vals = [r[key] for r in rows if r.get(key) is not None]
        return sum(vals) / len(vals) if vals else None

    summary = {
        "command": " ".join([sys.executable, *sys.argv]), "wall_seconds": time.monotonic() - started,
        "teacher_success": teacher_eval["success_rate"],
        **{f"{n}_success_{e['step']}": e["success_rate"] for n in runs for e in runs[n]["evals"]},
        **{f"{n}_episodes": runs[n]["episodes"] for n in runs},
        **{f"{n}_train_seconds": runs[n]["train_seconds"] for n in runs},
        f"opd_kl_first_{k}": sum(kl[:k]) / k if kl else None, f"opd_kl_last_{k}": sum(kl[-k:]) / k if kl else None,
        "opd_teacher_seconds_per_step": mean_of(runs["opd"]["rows"], "opd/teacher_seconds"),
        "opd_student_seconds_per_step": mean_of(runs["opd"]["rows"], "opd/student_seconds"),
        "rollout_seconds_per_step": {n: mean_of(runs[n]["rows"], "rollout/seconds") for n in runs},
        "episode_seconds_mean": {n: mean_of(runs[n]["rows"], "rollout/episode_seconds") for n in runs},
        "grading_saving": timing, "figure": str(png),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    return 0


def plot(runs: dict, path: Path, teacher_success: float, a) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    colors = {"opd": "tab:blue", "outcome": "tab:orange"}
    labels = {"opd": "OPD only (teacher log-probs, no grading)", "outcome": "outcome-only GRPO"}
    for name, run in runs.items():
        ev = run["evals"]
        axes[0].plot([e["step"] for e in ev], [e["success_rate"] for e in ev], "o-", color=colors[name],
                     label=labels[name])
        rows = run["rows"]
        axes[1].plot([r["step"] for r in rows], [r.get("rollout/seconds") for r in rows], ".-", alpha=0.7,
                     color=colors[name], label=f"{name}: rollout seconds")
    rows = runs["opd"]["rows"]
    axes[1].plot([r["step"] for r in rows], [r.get("opd/teacher_seconds") for r in rows], "x-", alpha=0.7,
                 color="tab:green", label="opd: teacher seconds")
    axes[0].axhline(teacher_success, ls="--", color="gray", label="teacher")
    axes[0].set(title="evaluation success (fresh sampled episodes)", xlabel="step", ylabel="success rate",
                ylim=(-0.02, 1.02))
    axes[0].legend(fontsize=8)
    axes[1].set(title="seconds per step", xlabel="step", ylabel="seconds")
    axes[1].legend(fontsize=7)
    rows = runs["opd"]["rows"]
    axes[2].plot([r["step"] for r in rows], [r.get("opd/kl") for r in rows], ".-", color=colors["opd"])
    axes[2].set(title="OPD: per-token KL to the teacher (mean over action tokens)", xlabel="step",
                ylabel="mean(log pi_student - log pi_teacher)")
    fig.suptitle(f"Orchard/Toy-v0, tiny Qwen2 ({a.hidden}x{a.layers}); teacher SFT {a.teacher_sft_steps} steps, "
                 f"student SFT {a.student_sft_steps}; {a.steps} steps x {a.group_size * a.prompts_per_step} episodes")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


if __name__ == "__main__":
    sys.exit(main())
