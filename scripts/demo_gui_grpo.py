"""Demo: vision-language GRPO on Orchard/GUI-v0 through the CLI, with the seed's step-budget
curriculum (15 steps per episode in the first half of training, 30 in the second).

    python scripts/demo_gui_grpo.py                      # 4 steps, one group of 4 episodes per step
    python scripts/demo_gui_grpo.py --steps 10 --out runs/demo-gui

What it does, all offline, on the local backend (real Xvfb + Chromium per episode):
1. A tiny LLaVA (algos/vision.py build_tiny_vlm: CLIP vision tower of one layer, a Qwen2 text
   model, ~150k parameters) with a byte-level BPE tokenizer trained on GUI-v0's observation
   texts and tool calls (gui_corpus), saved to RUN/tiny-vlm.
2. `orchard train grpo --env Orchard/GUI-v0 --step-budget 15,30 ...` on MiniWoB++ tasks, the
   page's real raw reward, no scripting. An untrained model this small does not produce a valid
   tool call, so it solves nothing and the demo shows the path and its costs, not learning:
   the step budget per step, episode lengths, images per episode, time per step.
3. RUN/train/metrics.jsonl, RUN/train/trajectories.jsonl (`orchard view` it), RUN/summary.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from orchard_gym.algos.vision import build_tiny_vlm, gui_corpus

SYSTEM = "Act."


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--prompts-per-step", type=int, default=1)
    p.add_argument("--task-id", action="append", default=None,
                   help="MiniWoB task ids (default: miniwob/click-test, miniwob/click-button)")
    p.add_argument("--width", type=int, default=320)
    p.add_argument("--height", type=int, default=240)
    p.add_argument("--out", default=f"runs/demo-gui-{time.strftime('%Y%m%d-%H%M%S')}")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    build_tiny_vlm(gui_corpus(SYSTEM), out / "tiny-vlm", vocab_size=1000, max_positions=8192)
    built = time.monotonic() - started
    tasks = a.task_id or ["miniwob/click-test", "miniwob/click-button"]
    argv = [str(Path(sys.executable).parent / "orchard"), "train", "grpo", "--env", "Orchard/GUI-v0",
            "--env-kwargs", json.dumps({"tasks": "miniwob", "width": a.width, "height": a.height}),
            "--model", str(out / "tiny-vlm"), "--steps", str(a.steps), "--group-size", str(a.group_size),
            "--prompts-per-step", str(a.prompts_per_step), "--step-budget", "15,30", "--no-render-tools",
            "--system-prompt", SYSTEM, "--max-new-tokens", "8", "--max-completion-tokens", "6000",
            "--no-dynamic-sampling", "--lr", "1e-3", "--max-seconds", "600", "--out", str(out / "train"),
            *[x for t in tasks for x in ("--task-id", t)]]
    print("$", " ".join(argv), flush=True)
    subprocess.run(argv, check=True)
    rows = [json.loads(line) for line in (out / "train" / "metrics.jsonl").read_text().splitlines() if line.strip()]
    episodes = [json.loads(line) for line in (out / "train" / "trajectories.jsonl").read_text().splitlines()]
    summary = {
        "build_seconds": round(built, 1), "total_seconds": round(time.monotonic() - started, 1),
        "steps": [{k: r.get(k) for k in ("step", "step_seconds", "rollout/step_budget", "rollout/episodes",
                                         "rollout/episode_turns", "rollout/episode_seconds", "rollout/success_rate",
                                         "rollout/errors", "rollout/completion_tokens", "rollout/seconds", "loss")}
                  for r in rows],
        "episodes": len(episodes),
        "truncated_at_budget": sum(1 for e in episodes if e.get("truncated")),
        "page_solved": sum(1 for e in episodes if (e.get("report") or {}).get("raw_reward") == 1),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
