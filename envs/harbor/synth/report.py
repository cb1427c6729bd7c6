"""The run's report: per-stage yields, costs (from the ledgers in the store), drop reasons."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from orchard_gym.ledger import Ledger, Prices, summarize

from .store import Store

REPORT_NAME = "synth-report.json"
STAGE_ORDER = ("propose", "prune", "build", "test", "refine")


def make_report(store: Store, cfg: Any, price: Prices | None = None) -> dict:
    counts = store.counts()
    tasks = store.tasks()
    proposed = len(tasks) + len(store.duplicates())
    costs = {}
    for stage in STAGE_ORDER:
        ledgers = [SimpleNamespace(ledger=Ledger.model_validate_json(r["ledger"])) for r in store.runs(stage=stage)]
        totals = summarize(ledgers, price)
        costs[stage] = {k: totals[k] for k in ("episodes", "model_calls", "prompt_tokens", "completion_tokens",
                                               "tokens", "sandbox_seconds", "cpu_seconds", "cost")}
    total = {k: sum(c[k] or 0 for c in costs.values()) for k in costs["propose"]}
    if price is None:
        total["cost"] = None
    kept = counts["accepted"]
    selected = len(tasks) - counts["discarded"]
    refined = {r["task"] for r in store.runs(stage="refine")}
    yields = {  # stage: [tasks in, tasks out]
        "propose": [proposed, len(tasks)],  # drafted -> unique
        "prune": [len(tasks), selected],
        "build": [len({r["task"] for r in store.runs(stage="build")}),
                  len({r["task"] for r in store.runs(stage="build") if r["ok"]})],  # -> a folder that loads
        "test": [len({r["task"] for r in store.runs(stage="test")}), kept],
        "refine": [len(refined), sum(1 for t in tasks if t["id"] in refined and t["stage"] == "accepted")],
    }
    dropped = [{"id": t["id"], "stage": t["stage"], "instruction": t["instruction"], "reason": t["reason"]}
               for t in tasks if t["stage"] in ("discarded", "dropped")]
    dropped += [{"id": None, "stage": "duplicate", "instruction": d["instruction"],
                 "reason": f"duplicate of #{d['duplicate_of']} (refused by the store)"} for d in store.duplicates()]
    accepted = []
    for t in tasks:
        if t["stage"] == "accepted":
            checks = json.loads(t["checks"] or "{}")
            accepted.append({"id": t["id"], "folder": t["slug"], "instruction": t["instruction"],
                             "refines": t["refines"], "tester_reward": (checks.get("tester") or {}).get("reward")})
    return {
        "domain": cfg.domain, "n": cfg.n, "stages": counts, "yields": yields, "kept": kept,
        "yield": kept / proposed if proposed else 0.0,
        "repaired": yields["refine"][1],
        "costs": costs, "total": total,
        "per_kept_task": {k: (v / kept if kept and v is not None else None) for k, v in total.items()},
        "accepted": accepted, "dropped": dropped,
    }


def write_report(report: dict, out: Path) -> Path:
    path = out / REPORT_NAME
    path.write_text(json.dumps(report, indent=2) + "\n")
    return path


def format_report(report: dict) -> str:
    """The lines `orchard tasks synth` prints."""
    y = report["yields"]
    lines = [f"{report['domain']!r}: {report['kept']} task(s) kept of {y['propose'][0]} proposed "
             f"(yield {report['yield']:.2f}; wanted {report['n']})",
             "stage      in -> out  model calls  tokens  sandbox-s"]
    for stage in STAGE_ORDER:
        c = report["costs"][stage]
        lines.append(f"{stage:<9} {y[stage][0]:>3} -> {y[stage][1]:<3}  {c['model_calls']:>11}  {c['tokens']:>6}  "
                     f"{c['sandbox_seconds']:>9.1f}")
    per = report["per_kept_task"]
    if per["tokens"] is not None:
        lines.append(f"per kept task: {per['tokens']:.0f} tokens, {per['sandbox_seconds']:.1f} sandbox-s"
                     + (f", cost {per['cost']:.4g}" if per.get("cost") is not None else ""))
    for d in report["dropped"]:
        lines.append(f"  {d['stage']}: #{d['id'] or '-'} {d['instruction'][:60]!r}: {d['reason']}")
    return "\n".join(lines)
