"""Trajectory records: both sides of every turn, joined, plus the outcome."""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, Field

from .ledger import Ledger


class Turn(BaseModel):
    """One step: what the policy did and what the sandbox answered."""

    index: int
    action: Any = Field(description="the action as the policy gave it (text or a tool call)")
    tool: str | None = Field(None, description="the tool the action was parsed into, None if it did not parse")
    arguments: dict[str, Any] | None = None
    observation: str = ""
    command: str | list[str] | None = Field(None, description="what ran in the sandbox, if anything")
    exit_code: int | None = None
    duration: float = 0.0
    fingerprint: str | None = Field(None, description="hash of the working tree's state after the step")
    error: str | None = Field(None, description="why the action was refused (malformed, unknown tool, ...)")
    started_at: float = Field(default_factory=time.time)
    messages: list[dict[str, Any]] | None = Field(None, description="the prompt the policy saw, when recorded")
    screenshot: str | None = Field(None, description="image observation after the step (GUI): a data: URL or a "
                                   "path relative to the trajectories file; `orchard view` shows it")
    mc_value: float | None = Field(None, description="Monte Carlo value of the state before this action: the share "
                                   "of successful continuations forked there (envs/branching.py)")
    mc_samples: int | None = Field(None, description="how many continuations `mc_value` is the share of")


class Trajectory(BaseModel):
    """One episode. `error` is set when infrastructure failed: trainers drop such episodes."""

    env_id: str
    task_id: str
    sandbox_id: str | None = None
    turns: list[Turn] = Field(default_factory=list)
    reward: float = 0.0
    report: dict[str, Any] = Field(default_factory=dict)
    terminated: bool = False
    truncated: bool = False
    error: str | None = None
    error_kind: str | None = Field(None, description="'grading' when the task could not be graded (a broken task)")
    started_at: float = Field(default_factory=time.time)
    ended_at: float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    ledger: Ledger | None = Field(None, description="what the episode cost: sandboxes' CPU/memory/wall time, "
                                  "model tokens (orchard_gym.ledger); None in files from before it")

    @property
    def steps(self) -> int:
        return len(self.turns)

    @property
    def ok(self) -> bool:
        """True when the episode ended without an infrastructure error (safe to train on)."""
        return self.error is None
