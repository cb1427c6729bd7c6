"""A few real agent-GRPO steps of each dense signal composed with BAR, on Orchard/Toy-v0 in
local sandboxes: OPD (teacher log-probs added to the outcome advantage) and RPR (a judge's
process score added to the outcome reward), with the teacher / judge time per step beside
the rollout time.

    python scripts/demo_dense_bar.py --models runs/demo-opd --steps 3

`--models` is a folder from scripts/demo_opd.py (its `student` and `teacher`). The teacher is
served by the vLLM-shaped prompt-logprobs server of tests/dense_servers.py (a real model
over HTTP); the judge is that file's scripted OpenAI-compatible stub (score 0.5 for every
criterion, every `--refuse-every`-th request refused, so dropped samples show up).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

torch.set_num_threads(int(os.environ.get("ORCHARD_THREADS", "1")))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from dense_servers import JudgeStub, TeacherServer  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from orchard_gym.algos.agent_rollout import SamplingParams  # noqa: E402
from orchard_gym.algos.grpo import AgentGRPOArgs, build_trainer, make_grpo_config  # noqa: E402

SYSTEM = "You act in a sandbox with the tools bash and submit. Reply with one tool call."
KEYS = ["rollout/episodes", "rollout/groups", "rollout/groups_trained", "rollout/rollouts_per_prompt",
        "rollout/excluded", "rollout/success_rate", "rollout/seconds", "opd/kl", "opd/scored", "opd/dropped",
        "opd/teacher_seconds", "opd/student_seconds", "rpr/judged", "rpr/dropped", "rpr/dropped_share",
        "rpr/retried", "rpr/process_mean", "rpr/judge_seconds", "step_seconds", "loss"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="runs/demo-opd")
    ap.add_argument("--out", default="runs/demo-dense-bar")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--refuse-every", type=int, default=7)
    a = ap.parse_args(argv)
    models, out = Path(a.models), Path(a.out)
    env_kwargs = {"kinds": ["write", "secret", "count"], "num_tasks": 16, "seed": 0, "variety": 1}
    base = dict(env_id="Orchard/Toy-v0", env_kwargs=env_kwargs, backend={"type": "local"}, algo="bar",
                group_size=4, prompts_per_step=4, step_budget="3", max_seconds=60, system_prompt=SYSTEM,
                render_tools=False, concurrency=32, bar={"group_size": 4, "stride": 4, "max_rollouts": 12},
                sampling=SamplingParams(max_new_tokens=40, max_completion_tokens=160, linger=0.02))
    tok = AutoTokenizer.from_pretrained(models / "student")
    teacher = AutoModelForCausalLM.from_pretrained(models / "teacher")
    results = {}
    with TeacherServer(teacher, tok) as tserver, JudgeStub(refuse_every=a.refuse_every) as judge:
        for name, extra in (("opd+bar", {"opd": {"teacher": f"{tserver.url}#teacher", "coef": 0.5}}),
                            ("rpr+bar", {"rpr": {"judge": f"{judge.url}#judge", "combine": "sum:0.5"}})):
            run = out / name
            run.mkdir(parents=True, exist_ok=True)
            args = AgentGRPOArgs(**base, **extra)
            model = AutoModelForCausalLM.from_pretrained(models / "student")
            config = make_grpo_config(run, args, steps=a.steps, learning_rate=3e-4, disable_tqdm=True)
            (run / "metrics.jsonl").unlink(missing_ok=True)
            trainer, rollout = build_trainer(model, tok, args, config, metrics_path=run / "metrics.jsonl")
            try:
                trainer.train()
            finally:
                rollout.close()
            rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
            results[name] = [{k: r.get(k) for k in ["step", *KEYS] if r.get(k) is not None} for r in rows]
        results["teacher_server"] = {"requests": tserver.requests, "prompts": tserver.prompts}
        results["judge_requests"] = len(judge.requests)
    (out / "summary.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
