"""Trajectories as ATIF (Agent Trajectory Interchange Format, v1.8: `harbor.models.trajectories`).

One Orchard `Trajectory` (any env, any harness) becomes one ATIF trajectory:

- step 1, `source: "user"`: the task text (the first user message the policy saw, when recorded);
- one `source: "agent"` step per turn: the action's text as `message`, its tool call as
  `tool_calls[0]` (`tool_call_id` = the call's id, else `call_<turn>`), and the sandbox's answer as
  `observation.results[0]` with `source_call_id` pointing at that call; the command, exit code,
  duration, error and fingerprint go to the step's `extra`. A harness's turn (its action a chat
  message): every tool call of the message, the tool messages of the next request as results,
  and, given the run's recorded model calls, `metrics` (tokens, token ids, logprobs) per step;
- `final_metrics`: tokens and cost from the episode's ledger, `total_steps`;
- `extra`: env id, task id, reward, report, terminated/truncated, error (so nothing is lost).

`from_atif` reads it back into a `Trajectory` (every tool call and observation kept).
Written from the ATIF schema of harbor 0.25; `scripts/harbor_check.py` validates with Harbor's own
models where a Python >= 3.12 with harbor installed is at hand.
"""

from __future__ import annotations

import json
from datetime import datetime, UTC
from typing import Any

from . import __version__
from .trajectory import Trajectory, Turn

SCHEMA = "ATIF-v1.8"
TURN_EXTRA = ("command", "exit_code", "duration", "error", "fingerprint", "screenshot", "mc_value", "mc_samples")


def _iso(ts: float | None) -> str | None:
    return datetime.fromtimestamp(ts, UTC).isoformat() if ts is not None else None


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


def _calls(turn: Turn) -> list[dict]:
    """The turn's tool calls as ATIF ToolCalls: the env's parsed call, or the tool_calls of a
    harness's chat message (OpenAI format)."""
    if turn.tool is not None:
        return [{"tool_call_id": _call_id(turn), "function_name": turn.tool, "arguments": turn.arguments or {}}]
    action = turn.action if isinstance(turn.action, dict) else {}
    calls = []
    for i, call in enumerate(action.get("tool_calls") or []):
        fn = call.get("function") or {}
        args = fn.get("arguments")
        try:
            args = json.loads(args) if isinstance(args, str) else (args or {})
        except json.JSONDecodeError:
            args = {"_raw": args}
        calls.append({"tool_call_id": str(call.get("id") or f"call_{turn.index}_{i}"),
                      "function_name": str(fn.get("name") or call.get("name") or "unknown"),
                      "arguments": args if isinstance(args, dict) else {"_value": args}})
    return calls


def _request(turn: Turn | None) -> dict | None:
    """A harness turn's observation: the chat request the harness sent next (JSON), else None."""
    try:
        data = json.loads(turn.observation) if turn is not None else None
    except (json.JSONDecodeError, TypeError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("messages"), list) else None


def _results(turn: Turn, calls: list[dict], following: Turn | None) -> tuple[list[dict], bool]:
    """(ATIF observation results, whether the turn is a harness's chat turn). A harness turn's own
    observation is the request its action answered; its tool results are the tool messages of the
    request that follows."""
    if turn.tool is not None:
        return [{"content": turn.observation, "source_call_id": calls[0]["tool_call_id"]}], False
    if calls and _request(turn) is not None:
        ids = {c["tool_call_id"] for c in calls}
        nxt = _request(following) or {"messages": []}
        return [{"content": m.get("content") if isinstance(m.get("content"), str) else json.dumps(m.get("content")),
                 "source_call_id": m["tool_call_id"]}
                for m in nxt["messages"] if m.get("role") == "tool" and m.get("tool_call_id") in ids], True
    return [{"content": turn.observation}], False


def _metrics(call: dict | None) -> dict | None:
    """One recorded model call's usage, token ids and logprobs (the recording proxy's record)."""
    if not call:
        return None
    usage = call.get("usage") or {}
    logprobs = call.get("logprobs")
    if isinstance(logprobs, list):
        logprobs = [x.get("logprob") if isinstance(x, dict) else x for x in logprobs]
        logprobs = logprobs if all(isinstance(x, (int, float)) for x in logprobs) else None
    metrics = {"prompt_tokens": usage.get("prompt_tokens"), "completion_tokens": usage.get("completion_tokens"),
               "prompt_token_ids": call.get("prompt_token_ids"), "completion_token_ids": call.get("completion_token_ids"),
               "logprobs": logprobs}
    metrics = {k: v for k, v in metrics.items() if v is not None}
    return metrics or None


def to_atif(t: Trajectory, agent: str = "orchard-gym", calls: list[dict] | None = None) -> dict:
    """`calls`: the recorded model calls of a harness run (one per turn), for per-step metrics."""
    steps: list[dict] = [{"step_id": 1, "timestamp": _iso(t.started_at), "source": "user", "message": _task_text(t)}]
    per_turn = calls if calls is not None and len(calls) == len(t.turns) else [None] * len(t.turns)
    for i, (turn, call) in enumerate(zip(t.turns, per_turn)):
        step: dict[str, Any] = {"step_id": len(steps) + 1, "timestamp": _iso(turn.started_at), "source": "agent",
                                "message": _text(turn.action)}
        tool_calls = _calls(turn)
        if tool_calls:
            step["tool_calls"] = tool_calls
        results, chat = _results(turn, tool_calls, t.turns[i + 1] if i + 1 < len(t.turns) else None)
        if results:
            step["observation"] = {"results": results}
        metrics = _metrics(call)
        if metrics:
            step["metrics"] = metrics
        extra = {k: getattr(turn, k) for k in TURN_EXTRA if getattr(turn, k) is not None}
        extra["action"] = turn.action
        if chat:
            extra["observation"] = turn.observation  # the request the action answered, for the round trip
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
        action = extra.pop("action", step.get("message", ""))
        calls = step.get("tool_calls") or []
        results = (step.get("observation") or {}).get("results") or []
        content = extra.pop("observation", None) or (results[0].get("content") if results else "")
        chat = isinstance(action, dict) and "tool_calls" in action  # a harness's message: its calls are in it
        turns.append(Turn(index=len(turns), action=action,
                          tool=calls[0]["function_name"] if calls and not chat else None,
                          arguments=calls[0]["arguments"] if calls and not chat else None,
                          observation=content if isinstance(content, str) else json.dumps(content),
                          started_at=_ts(step.get("timestamp")) or 0.0,
                          **{k: v for k, v in extra.items() if k in TURN_EXTRA}))
    ledger = ((data.get("final_metrics") or {}).get("extra") or {}).get("ledger")
    if ledger is not None:
        outcome["ledger"] = ledger
    outcome.setdefault("env_id", "unknown")
    outcome.setdefault("task_id", "unknown")
    return Trajectory(turns=turns, **({"started_at": started} if started else {}), **outcome)
