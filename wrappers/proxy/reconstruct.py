"""Trajectory reconstruction (OpenForge RL, eq. 1): a finished rollout's recorded calls
become training samples `(H(s_t), a_t, r_t)` with `r_t = γ^(T−t) · r_T` (γ = 1.0 by default).

`H(s_t)` is the prompt the harness built for call t (its messages and tools), `a_t` the
assistant message that answered it, `T` the index of the last successful call. Calls that
failed (upstream 500s, garbage, a harness that hung up) carry no answer and are no samples.
A rollout that ended in an error (harness crash, timeout, network or proxy failure) gives
no samples at all by default: a partial rollout would inject a misleading reward (a
correct prefix scored 0). Asked to keep them (`drop_failed=False`), their samples have
`reward=None`, never a made-up number.

    >>> from orchard_gym.wrappers.proxy.records import RolloutRecord, CallRecord
    >>> calls = [CallRecord(index=i, call_id=f"c{i}", request={}, message={"role": "assistant", "content": "x"})
    ...          for i in range(3)]
    >>> record = RolloutRecord(rollout_id="r", status="finished", reward=1.0, calls=calls)
    >>> [s.reward for s in reconstruct(record, gamma=0.5)]
    [0.25, 0.5, 1.0]
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

from pydantic import BaseModel, Field

from orchard_gym.trajectory import Trajectory, Turn

from .records import RolloutRecord


class Sample(BaseModel):
    """One training sample: the harness's prompt, the model's answer, its reward."""

    rollout_id: str
    t: int = Field(description="position among the rollout's successful calls")
    T: int = Field(description="index of the last successful call")
    call_id: str
    endpoint: str
    messages: list[dict[str, Any]] = Field(description="H(s_t): the prompt as the harness built it")
    tools: list[dict[str, Any]] = Field(default_factory=list)
    request: dict[str, Any] = Field(default_factory=dict, description="the whole request (sampling params, ...)")
    response: dict[str, Any] = Field(description="a_t: the assistant message")
    reward: float | None = Field(description="γ^(T−t)·r_T; None for a failed rollout")
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[dict[str, Any]] | None = None
    usage: dict[str, Any] | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


def discounted(terminal_reward: float, steps: int, gamma: float = 1.0) -> list[float]:
    """`[γ^(T−t)·r_T for t in 0..T]` with T = steps − 1."""
    if not 0.0 <= gamma <= 1.0:
        raise ValueError("gamma must be in [0, 1]")
    return [gamma ** (steps - 1 - t) * terminal_reward for t in range(steps)]


def reconstruct(rollout: RolloutRecord, gamma: float = 1.0, drop_failed: bool = True) -> list[Sample]:
    """The rollout's samples (see the module docstring). An open rollout has none yet."""
    if rollout.status == "open":
        raise ValueError(f"rollout {rollout.rollout_id} is still open: finish it with a reward or an error first")
    if rollout.status == "failed" and drop_failed:
        return []
    calls = [c for c in rollout.calls if c.ok]
    rewards = discounted(rollout.reward, len(calls), gamma) if rollout.status == "finished" else [None] * len(calls)
    T = len(calls) - 1
    return [Sample(rollout_id=rollout.rollout_id, t=t, T=T, call_id=c.call_id, endpoint=c.endpoint,
                   messages=c.messages, tools=c.tools, request=c.request, response=c.message, reward=rewards[t],
                   prompt_token_ids=c.prompt_token_ids, completion_token_ids=c.completion_token_ids,
                   logprobs=c.logprobs, usage=c.usage,
                   metadata={**rollout.metadata, "error": rollout.error} if rollout.error else dict(rollout.metadata))
            for t, c in enumerate(calls)]


def to_trajectory(rollout: RolloutRecord, env_id: str = "harness", task_id: str | None = None) -> Trajectory:
    """The rollout as an orchard-gym `Trajectory`: one turn per model call (`messages` the
    prompt, `action` the answer, `error` why a call failed), `error` set when it failed."""
    turns = [Turn(index=c.index, action=c.message, messages=c.messages, error=c.error, started_at=c.started_at,
                  duration=c.latency or 0.0)
             for c in rollout.calls]
    return Trajectory(env_id=rollout.metadata.get("env_id", env_id),
                      task_id=task_id or rollout.metadata.get("task_id", rollout.rollout_id), turns=turns,
                      reward=rollout.reward or 0.0, terminated=rollout.status == "finished",
                      truncated=rollout.status == "failed", error=rollout.error, started_at=rollout.created_at,
                      ended_at=rollout.finished_at,
                      metadata={**rollout.metadata, "rollout_id": rollout.rollout_id,
                                "calls": [c.model_dump(mode="json") for c in rollout.calls]})


T_ = TypeVar("T_")


def drop_errors(items: Iterable[T_]) -> list[T_]:
    """Keep what is safe to train on: trajectories with no `error`, rollouts that
    finished, samples with a reward. The error filter for trainers, as a function."""
    kept = []
    for item in items:
        if isinstance(item, RolloutRecord):
            ok = item.status == "finished"
        elif isinstance(item, Sample):
            ok = item.reward is not None
        else:
            ok = getattr(item, "error", None) is None
        if ok:
            kept.append(item)
    return kept
