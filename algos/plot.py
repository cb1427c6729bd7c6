"""Training curves of a run folder (`metrics.jsonl`, optionally `eval.jsonl`) as one PNG.

    from orchard_gym.algos.plot import plot_run
    plot_run("runs/toy")          # -> runs/toy/curves.png
"""

from __future__ import annotations

import json
from pathlib import Path

PANELS = [
    ("rollout/success_rate", "success rate (rollouts)"),
    ("rollout/informative_share", "informative-group share"),
    ("rollout/rollouts_per_prompt", "rollouts per prompt"),
    ("tokens_per_second", "tokens / s (step)"),
    ("rollout/episode_turns", "episode length (turns)"),
    ("loss", "policy loss"),
]


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _smooth(values: list[float], window: int) -> list[float]:
    out, acc = [], []
    for v in values:
        acc.append(v)
        if len(acc) > window:
            acc.pop(0)
        out.append(sum(acc) / len(acc))
    return out


def plot_run(run_dir: str | Path, out: str | Path | None = None, title: str | None = None) -> Path:
    """Draw the run's curves; returns the PNG's path (default RUN_DIR/curves.png)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = Path(run_dir)
    rows = read_jsonl(run / "metrics.jsonl")
    if not rows:
        raise FileNotFoundError(f"no metrics in {run / 'metrics.jsonl'}")
    evals = read_jsonl(run / "eval.jsonl")
    fig, axes = plt.subplots(2, 3, figsize=(13, 7))
    window = max(1, len(rows) // 10)
    for ax, (key, label) in zip(axes.flat, PANELS, strict=True):
        points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, color="tab:blue", alpha=0.35, lw=1, label="per step")
            if window > 1:
                ax.plot(xs, _smooth(list(ys), window), color="tab:blue", lw=2, label=f"mean of {window}")
        if key == "rollout/success_rate" and evals:
            ex = [e["step"] for e in evals]
            ax.plot(ex, [e["success_rate"] for e in evals], "o-", color="tab:red", lw=2,
                    label="evaluation (sampled)")
        ax.set_title(label)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(title or f"orchard train grpo: {run.name}")
    fig.tight_layout()
    path = Path(out) if out else run / "curves.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
