"""What the recording proxy keeps: one `RolloutRecord` per rollout, one `CallRecord` per
model call, in memory, in the proxy's event loop; `RolloutStore` owns them.

A rollout is open until it is finished with a terminal reward (`status="finished"`) or
with an error (`status="failed"`: harness crash, timeout, network or proxy failure).
Requests after that, or with the wrong token, are refused and noted in `rejected`; they
never become calls. In policy mode each call is parked on the rollout's queue until
the trainer/eval loop answers it (`next_call` / `respond`).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import secrets
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from .anthropic_format import MESSAGES, prompt_of_messages
from .openai_format import CHAT, prompt_of

Mode = Literal["upstream", "policy"]
Status = Literal["open", "finished", "failed"]


class CallRecord(BaseModel):
    """One model call the harness made: request, response, tokens, timings."""

    index: int = Field(description="order of arrival within the rollout, from 0")
    call_id: str
    endpoint: str = Field(CHAT, description="'chat.completions', 'responses' or 'messages'")
    stream: bool = False
    source: Mode = "upstream"
    request: dict[str, Any] = Field(description="the request body as the harness sent it")
    messages: list[dict[str, Any]] = Field(default_factory=list, description="the prompt, chat-style")
    tools: list[dict[str, Any]] = Field(default_factory=list)
    response: dict[str, Any] | None = Field(None, description="the whole response (assembled when streamed)")
    message: dict[str, Any] | None = Field(None, description="the assistant message, chat-style")
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[dict[str, Any]] | None = None
    status_code: int | None = None
    error: str | None = Field(None, description="why the call failed (then it is no training sample)")
    started_at: float = Field(default_factory=time.time)
    ended_at: float | None = None
    latency: float | None = Field(None, description="seconds from request to the last byte sent")
    upstream_latency: float | None = Field(None, description="seconds spent waiting on the upstream or the policy")
    time_to_first_byte: float | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.message is not None


class RolloutRecord(BaseModel):
    rollout_id: str
    mode: Mode = "upstream"
    status: Status = "open"
    reward: float | None = None
    error: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    calls: list[CallRecord] = Field(default_factory=list)
    rejected: list[dict[str, Any]] = Field(default_factory=list, description="refused requests: when, why")
    created_at: float = Field(default_factory=time.time)
    finished_at: float | None = None

    def summary(self) -> dict:
        return {**self.model_dump(exclude={"calls", "rejected"}), "calls": len(self.calls),
                "failed_calls": sum(1 for c in self.calls if c.error), "rejected": len(self.rejected)}


class RolloutNotFound(KeyError):
    def __str__(self) -> str:
        return f"no rollout {self.args[0]!r} (never opened, or deleted)"


class RolloutClosed(RuntimeError):
    """The rollout was finished: no more calls, no more answers."""


class PendingCall:
    """A policy-mode call parked until the trainer/eval loop answers it."""

    def __init__(self, record: CallRecord):
        self.record = record
        self.future: asyncio.Future = asyncio.get_running_loop().create_future()

    @property
    def call_id(self) -> str:
        return self.record.call_id

    @property
    def request(self) -> dict:
        return self.record.request


class Rollout:
    """A rollout's record plus what only lives in memory: its token and its queue."""

    def __init__(self, record: RolloutRecord, token: str):
        self.record = record
        self.token = token
        self.queue: asyncio.Queue[PendingCall] = asyncio.Queue()
        self.parked: dict[str, PendingCall] = {}
        self.closed = asyncio.Event()

    @property
    def id(self) -> str:
        return self.record.rollout_id

    def check_token(self, token: str | None) -> bool:
        return token is not None and hmac.compare_digest(token.encode(), self.token.encode())

    def new_call(self, endpoint: str, body: dict, stream: bool) -> CallRecord:
        if endpoint == MESSAGES:
            messages, tools = prompt_of_messages(body)
        else:
            messages, tools = prompt_of(endpoint, body)
        call = CallRecord(index=len(self.record.calls), call_id=f"call-{uuid.uuid4().hex[:16]}", endpoint=endpoint,
                          stream=stream, source=self.record.mode, request=body, messages=messages, tools=tools)
        self.record.calls.append(call)
        return call

    def reject(self, reason: str, path: str = "") -> None:
        self.record.rejected.append({"at": time.time(), "reason": reason, "path": path})


class RolloutStore:
    """Rollouts by id. Use it from the event loop the proxy serves on."""

    def __init__(self, max_rejected: int = 1000):
        self.rollouts: dict[str, Rollout] = {}
        self.max_rejected = max_rejected

    # ------------------------------------------------------------------ lifecycle
    def open(self, mode: Mode = "upstream", metadata: dict | None = None, rollout_id: str | None = None) -> Rollout:
        rollout_id = rollout_id or uuid.uuid4().hex
        if rollout_id in self.rollouts:
            raise ValueError(f"rollout {rollout_id!r} exists")
        rollout = Rollout(RolloutRecord(rollout_id=rollout_id, mode=mode, metadata=metadata or {}),
                          token=secrets.token_urlsafe(24))
        self.rollouts[rollout_id] = rollout
        return rollout

    def get(self, rollout_id: str) -> Rollout:
        try:
            return self.rollouts[rollout_id]
        except KeyError:
            raise RolloutNotFound(rollout_id) from None

    def finish(self, rollout_id: str, reward: float | None = None, error: str | None = None) -> RolloutRecord:
        """End a rollout with its terminal reward, or with the error that spoiled it.
        An error wins: a failed rollout has no reward. Finishing twice is refused."""
        rollout = self.get(rollout_id)
        record = rollout.record
        if record.status != "open":
            raise RolloutClosed(f"rollout {rollout_id} is already {record.status}")
        if error is None and reward is None:
            raise ValueError("finish a rollout with a reward or an error")
        record.status = "failed" if error is not None else "finished"
        record.error, record.reward = error, None if error is not None else float(reward)
        record.finished_at = time.time()
        for pending in list(rollout.parked.values()):  # harness requests still waiting: refuse them
            if not pending.future.done():
                pending.future.set_exception(RolloutClosed(f"rollout {rollout_id} is {record.status}"))
        rollout.parked.clear()
        rollout.closed.set()
        return record

    def delete(self, rollout_id: str) -> RolloutRecord:
        rollout = self.get(rollout_id)
        if rollout.record.status == "open":
            self.finish(rollout_id, error="deleted while open")
        return self.rollouts.pop(rollout_id).record

    # ------------------------------------------------------------------ policy mode
    def park(self, rollout: Rollout, call: CallRecord) -> PendingCall:
        pending = PendingCall(call)
        rollout.parked[call.call_id] = pending
        rollout.queue.put_nowait(pending)
        return pending

    async def next_call(self, rollout_id: str, timeout: float | None = None) -> PendingCall | None:
        """The next parked call of a policy-mode rollout (in arrival order); None on timeout
        or when the rollout ends first. Calls whose harness gave up are skipped."""
        rollout = self.get(rollout_id)
        deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
        while True:
            if rollout.record.status != "open":
                return None
            if not rollout.queue.empty():
                pending = rollout.queue.get_nowait()
            else:
                getter = asyncio.ensure_future(rollout.queue.get())
                closer = asyncio.ensure_future(rollout.closed.wait())
                left = None if deadline is None else max(0.0, deadline - asyncio.get_running_loop().time())
                try:
                    await asyncio.wait({getter, closer}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    closer.cancel()
                    if not getter.done():
                        getter.cancel()
                if not getter.done() or getter.cancelled():
                    return None
                pending = getter.result()
            if not pending.future.done():
                return pending

    def respond(self, rollout_id: str, call_id: str, message: dict, **extra: Any) -> CallRecord:
        """Answer a parked call with an assistant message (and optionally usage,
        prompt_token_ids, completion_token_ids, logprobs)."""
        rollout = self.get(rollout_id)
        if rollout.record.status != "open":
            raise RolloutClosed(f"rollout {rollout_id} is {rollout.record.status}")
        pending = rollout.parked.pop(call_id, None)
        if pending is None:
            raise KeyError(f"no parked call {call_id!r} in rollout {rollout_id}")
        if not pending.future.done():
            pending.future.set_result((message, extra))
        return pending.record

    # ------------------------------------------------------------------ export
    def records(self, status: Iterable[str] | None = None) -> list[RolloutRecord]:
        wanted = set(status) if status else None
        return [r.record for r in self.rollouts.values() if wanted is None or r.record.status in wanted]

    def export_jsonl(self, path: str | Path, status: Iterable[str] | None = None) -> int:
        """Write every (or every `status`) rollout as one JSON line; returns how many."""
        records = self.records(status)
        with open(path, "w") as f:
            for record in records:
                f.write(record.model_dump_json() + "\n")
        return len(records)


def load_jsonl(path: str | Path) -> list[RolloutRecord]:
    """Read rollouts written by `export_jsonl` (or `GET /export`)."""
    with open(path) as f:
        return [RolloutRecord.model_validate(json.loads(line)) for line in f if line.strip()]
