"""Trajectories as ATIF (Agent Trajectory Interchange Format, v1.8: `harbor.models.trajectories`).

One Orchard `Trajectory` (any env, any harness) becomes one ATIF trajectory:

- step 1, `source: "user"`: the task text (the first user message the policy saw, when recorded);
- one `source: "agent"` step per turn: the action's text as `message`, its tool call as
  `tool_calls[0]` (`tool_call_id` = the call's id, else `call_<turn>`), and the sandbox's answer as
  `observation.results[0]` with `source_call_id` pointing at that call; the command, exit code,
  duration, error and fingerprint go to the step's `extra`;
- `final_metrics`: tokens and cost from the episode's ledger, `total_steps`;
- `extra`: env id, task id, reward, report, terminated/truncated, error (so nothing is lost).

`from_atif` reads it back into a `Trajectory` (every tool call and observation kept).
Written from the ATIF schema of harbor 0.25; `scripts/harbor_check.py` validates with Harbor's own
models where a Python >= 3.12 with harbor installed is at hand.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from . import __version__
from .trajectory import Trajectory, Turn

SCHEMA = "ATIF-v1.8"
TURN_EXTRA = ("command", "exit_code", "duration", "error", "fingerprint", "screenshot", "mc_value", "mc_samples")


def _iso(ts: float | None) -> str | None:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat() if ts is not None else None


def _ts(text: str | None) -> float | None:
    return datetime.fromisoformat(text).timestamp() if text else None


def _text(action: Any) -> str:
    if isinstance(action, str):
        return action
    if isinstance(action, dict) and isinstance(action.get("content"), str):
        return action["content"]
    return ""


def _task_text(t: Trajectory) -> str:
    for turn in t.turns:
        for m in turn.messages or []:
            if m.get("role") == "user" and isinstance(m.get("content"), str):
                return m["content"]
    return ""


def _call_id(turn: Turn) -> str:
    action = turn.action if isinstance(turn.action, dict) else {}
    return str(action.get("id") or f"call_{turn.index}")


def to_atif(t: Trajectory, agent: str = "orchard-gym") -> dict:
    steps: list[dict] = [{"step_id": 1, "timestamp": _iso(t.started_at), "source": "user", "message": _task_text(t)}]
    for turn in t.turns:
        step: dict[str, Any] = {"step_id": len(steps) + 1, "timestamp": _iso(turn.started_at), "source": "agent",
                                "message": _text(turn.action)}
        result: dict[str, Any] = {"content": turn.observation}
        if turn.tool is not None:
            call_id = _call_id(turn)
            step["tool_calls"] = [{"tool_call_id": call_id, "function_name": turn.tool,
                                   "arguments": turn.arguments or {}}]
            result["source_call_id"] = call_id
        step["observation"] = {"results": [result]}
        extra = {k: getattr(turn, k) for k in TURN_EXTRA if getattr(turn, k) is not None}
        extra["action"] = turn.action
        step["extra"] = extra
        steps.append(step)
    ledger = t.ledger
    final = {"total_steps": len(steps)}
    if ledger is not None:
        usage = ledger.model_dump()
        for ours, theirs in (("prompt_tokens", "total_prompt_tokens"), ("completion_tokens", "total_completion_tokens")):
            if isinstance(usage.get(ours), int):
                final[theirs] = usage[ours]
        final["extra"] = {"ledger": usage}
    outcome = t.model_dump(include={"env_id", "task_id", "sandbox_id", "reward", "report", "terminated", "truncated",
                                    "error", "error_kind", "ended_at", "metadata"})
    return {"schema_version": SCHEMA, "session_id": t.sandbox_id or f"{t.env_id}:{t.task_id}",
            "agent": {"name": agent, "version": __version__}, "steps": steps, "final_metrics": final,
            "extra": {"orchard": outcome}}


def from_atif(data: dict) -> Trajectory:
    outcome = dict((data.get("extra") or {}).get("orchard") or {})
    steps = data.get("steps") or []
    started = _ts(steps[0].get("timestamp")) if steps else None
    turns = []
    for step in steps:
        if step.get("source") != "agent":
            continue
        extra = dict(step.get("extra") or {})
        calls = step.get("tool_calls") or []
        results = (step.get("observation") or {}).get("results") or []
        content = results[0].get("content") if results else ""
        turns.append(Turn(index=len(turns), action=extra.pop("action", step.get("message", "")),
                          tool=calls[0]["function_name"] if calls else None,
                          arguments=calls[0]["arguments"] if calls else None,
                          observation=content if isinstance(content, str) else json.dumps(content),
                          started_at=_ts(step.get("timestamp")) or 0.0,
                          **{k: v for k, v in extra.items() if k in TURN_EXTRA}))
    ledger = ((data.get("final_metrics") or {}).get("extra") or {}).get("ledger")
    if ledger is not None:
        outcome["ledger"] = ledger
    outcome.setdefault("env_id", "unknown")
    outcome.setdefault("task_id", "unknown")
    return Trajectory(turns=turns, **({"started_at": started} if started else {}), **outcome)
