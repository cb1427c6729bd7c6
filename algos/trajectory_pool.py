"""The trajectory pool: every episode kept, resolved or not, with who produced it.

A pool is a JSONL file, one `PoolEntry` per line (appendable, streamable: `iter_pool`
reads it line by line). Entries come from `orchard eval` output (`Trajectory` lines),
from training runs (`AgentSample`s, with their token ids) and from proxy recordings
(`RolloutRecord` lines, one call per turn). Each holds the policy id, env and task,
reward, the conversation in OpenAI chat format (`messages`: system/user prompt, then
assistant action and observation per turn) and, where known, the token ids the policy
saw and generated.

Filters of the seed recipe (Orchard §3.1): prune trajectories over a token limit, drop
trajectories calling a tool the harness does not define, drop trajectories with an
unparsable action. Options: a cap per task instance and down-sampling of the majority
class (resolved vs unresolved).

    from orchard_gym.algos.trajectory_pool import from_eval_file, write_pool, read_pool
    entries = from_eval_file("runs/eval.jsonl", policy_id="sft-40", env_id="Orchard/Toy-v0")
    write_pool("pool.jsonl", entries, append=True)
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from orchard_gym.envs.actions import ActionError, parse_action
from orchard_gym.envs.rollout import SYSTEM_PROMPT, assistant_message, observation_message
from orchard_gym.trajectory import Trajectory

FORMAT = "orchard-pool/1"


class PoolError(ValueError):
    """A pool file or an input file that cannot be read (the message says where and why)."""


class PoolEntry(BaseModel):
    """One trajectory of the pool (one line of a pool file)."""

    format: Literal["orchard-pool/1"] = FORMAT
    entry_id: str
    policy_id: str = Field(description="the checkpoint (or harness + model) that produced it")
    env_id: str
    task_id: str
    source: Literal["eval", "train", "proxy"] = "eval"
    reward: float
    resolved: bool = Field(description="reward > 0 (or the env's report says passed)")
    messages: list[dict[str, Any]] = Field(description="system?, user prompt, then per turn assistant + observation")
    tools: list[dict[str, Any]] = Field(default_factory=list, description="tool schemas the harness offered")
    tool_names: list[str] = Field(default_factory=list, description="tools the harness defines ([] = unknown)")
    turns: int
    prompt_ids: list[int] | None = None
    completion_ids: list[int] | None = None
    action_mask: list[int] | None = Field(None, description="1 on completion tokens the policy generated")
    tokenizer: str | None = Field(None, description="fingerprint of the tokenizer of the token ids")
    calls: list[dict[str, Any]] | None = Field(None, description="proxy recordings: one dict per model call")
    metadata: dict[str, Any] = Field(default_factory=dict, description="repo, gold patch size, ...")

    def actions(self) -> list[dict]:
        return [m for m in self.messages if m.get("role") == "assistant"]


# ------------------------------------------------------------------------------ file format
def write_pool(path: str | Path, entries: Iterable[PoolEntry], *, append: bool = True) -> int:
    """Write entries as JSON lines (appending by default); returns how many."""
    n = 0
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a" if append else "w") as f:
        for e in entries:
            f.write(e.model_dump_json() + "\n")
            n += 1
    return n


def iter_pool(path: str | Path) -> Iterator[PoolEntry]:
    """Stream a pool file, one entry at a time; a bad line is a `PoolError` naming it."""
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield PoolEntry.model_validate_json(line)
            except ValidationError as e:
                raise PoolError(f"{path}:{lineno}: not a pool entry: {e.errors()[0]['msg']} "
                                f"at {'.'.join(map(str, e.errors()[0]['loc']))}") from None


def read_pool(*paths: str | Path) -> list[PoolEntry]:
    return [e for p in paths for e in iter_pool(p)]


def tokenizer_fingerprint(tokenizer) -> str:
    """Same fingerprint <=> same token ids for the same text (vocabulary and special tokens)."""
    vocab = sorted(tokenizer.get_vocab().items())
    blob = json.dumps([vocab, tokenizer.eos_token, tokenizer.chat_template], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _entry_id(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------ sources
def _resolved(t: Trajectory) -> bool:
    return bool(t.report.get("passed", t.reward > 0))


def conversation(t: Trajectory, prompt: list[dict]) -> list[dict]:
    """The chat messages of a trajectory, given the prompt that opened it."""
    messages = [dict(m) for m in prompt]
    for turn in t.turns:
        assistant = assistant_message(turn.action)
        if assistant.get("tool_calls"):  # a stable id: the same trajectory gives the same entry
            assistant["tool_calls"][0]["id"] = f"call_{turn.index}"
        messages += [assistant, observation_message(assistant, turn.observation)]
    return messages


class TaskInfo:
    """What an env knows about its tasks: the first observation, tool names, gold-patch facts."""

    def __init__(self, env_id: str, env_kwargs: dict | None = None, system_prompt: str | None = SYSTEM_PROMPT,
                 *, env=None):
        import gymnasium as gym

        import orchard_gym  # noqa: F401 - registers the env ids

        if env is None:  # a probe: it only answers questions, it never starts a sandbox (so needs no backend)
            try:
                env = gym.spec(env_id).make(**(env_kwargs or {})).unwrapped
            except gym.error.Error as e:
                raise PoolError(f"env {env_id!r}: {e}") from None
        self.env = env
        self.env_id = env_id
        self.system_prompt = system_prompt
        self.tool_names = list(self.env.tools)
        self.tools = self.env.tool_schemas

    def prompt(self, task_id: str) -> list[dict]:
        try:
            task = self.env.get_task(task_id)
        except KeyError:
            raise PoolError(f"task {task_id!r} is not a task of {self.env_id}") from None
        head = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return head + [{"role": "user", "content": self.env.first_observation(task)}]

    def metadata(self, task_id: str) -> dict:
        task = self.env.get_task(task_id)
        meta: dict[str, Any] = {}
        repo = getattr(task, "repo", None)
        if repo:
            meta["repo"] = repo
        patch = getattr(task, "patch", None)
        if isinstance(patch, str) and patch:
            meta["gold_files"] = sum(1 for line in patch.splitlines() if line.startswith("diff --git"))
            meta["gold_lines"] = sum(1 for line in patch.splitlines()
                                     if line[:1] in "+-" and not line.startswith(("+++", "---")))
        return meta


def from_trajectory(t: Trajectory, *, policy_id: str, info: TaskInfo | None = None, source: str = "eval",
                    prompt: list[dict] | None = None) -> PoolEntry:
    """A pool entry from an orchard-gym `Trajectory`. Its prompt comes from `prompt`, else
    the first turn's recorded messages, else the env (`info`)."""
    if prompt is None and t.turns and t.turns[0].messages:
        prompt = t.turns[0].messages
    if prompt is None:
        if info is None:
            raise PoolError(f"trajectory of {t.task_id!r} has no recorded prompt: give the env (--env) "
                            "so its first observation can be rebuilt")
        prompt = info.prompt(t.task_id)
    messages = conversation(t, prompt)
    return PoolEntry(entry_id=_entry_id(policy_id, t.task_id, t.sandbox_id, t.started_at, messages),
                     policy_id=policy_id, env_id=t.env_id, task_id=t.task_id, source=source, reward=float(t.reward),
                     resolved=_resolved(t), messages=messages, turns=t.steps,
                     tools=info.tools if info else [], tool_names=info.tool_names if info else [],
                     metadata={**(info.metadata(t.task_id) if info else {}),
                               **({"error": t.error} if t.error else {}),
                               **({"truncated": True} if t.truncated and not t.terminated else {}),
                               **({k: t.metadata[k] for k in ("mc_values", "mc_samples", "branch", "policy",
                                                                 "train_harness", "harness")
                                   if k in t.metadata}),  # branching rollouts; the cross-harness matrix's labels
                               "turn_errors": [turn.error for turn in t.turns]})


def from_sample(sample, *, policy_id: str, tokenizer, info: TaskInfo | None = None,
                prompt: list[dict] | None = None) -> PoolEntry:
    """A pool entry from a training-run `AgentSample`, keeping its exact token ids."""
    entry = from_trajectory(sample.trajectory, policy_id=policy_id, info=info, source="train", prompt=prompt)
    entry.prompt_ids = list(sample.prompt_ids)
    entry.completion_ids = list(sample.completion_ids)
    entry.action_mask = list(sample.action_mask or sample.env_mask)
    entry.tokenizer = tokenizer_fingerprint(tokenizer)
    if sample.excluded:
        entry.metadata["excluded"] = sample.excluded
    return entry


def from_rollout(record, *, policy_id: str, task_id: str | None = None, env_id: str = "harness") -> PoolEntry:
    """A pool entry from a proxy `RolloutRecord`: the last successful call's prompt plus its
    answer is the conversation; every call is kept in `calls` (for `--mode calls`)."""
    calls = [c for c in record.calls if c.ok]
    if record.status != "finished" or not calls:
        raise PoolError(f"rollout {record.rollout_id} is {record.status} with {len(calls)} answered calls: "
                        "only finished rollouts with calls go into the pool")
    last = calls[-1]
    messages = list(last.messages) + [last.message]
    tool_names = sorted({(t.get("function") or t).get("name") for c in calls for t in c.tools} - {None})
    return PoolEntry(entry_id=_entry_id(policy_id, record.rollout_id), policy_id=policy_id,
                     env_id=record.metadata.get("env_id", env_id),
                     task_id=task_id or record.metadata.get("task_id", record.rollout_id), source="proxy",
                     reward=float(record.reward), resolved=record.reward > 0, messages=messages,
                     tools=last.tools, tool_names=tool_names, turns=len(calls),
                     calls=[{"messages": c.messages, "tools": c.tools, "message": c.message,
                             "prompt_token_ids": c.prompt_token_ids, "completion_token_ids": c.completion_token_ids}
                            for c in calls],
                     metadata={k: v for k, v in record.metadata.items() if k not in ("env_id", "task_id")})


def from_file(path: str | Path, *, policy_id: str, info: TaskInfo | None = None) -> tuple[list[PoolEntry], int]:
    """Entries from an `orchard eval` trajectories file or a proxy export (detected per line).
    Returns (entries, skipped): trajectories that ended in an infrastructure error or
    rollouts that failed are skipped (they have no trustworthy reward)."""
    from orchard_gym.wrappers.proxy.records import RolloutRecord

    entries, skipped = [], 0
    try:
        f = open(path)
    except OSError as e:
        raise PoolError(f"{path}: {e.strerror}") from None
    with f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise PoolError(f"{path}:{lineno}: not JSON: {e}") from None
            if not isinstance(obj, dict):
                raise PoolError(f"{path}:{lineno}: not a trajectory or rollout record")
            try:
                if "rollout_id" in obj and "calls" in obj:
                    record = RolloutRecord.model_validate(obj)
                    if record.status != "finished":
                        skipped += 1
                        continue
                    entries.append(from_rollout(record, policy_id=policy_id))
                elif "format" in obj and obj.get("format") == FORMAT:
                    entries.append(PoolEntry.model_validate(obj))
                else:
                    t = Trajectory.model_validate(obj)
                    if t.error:
                        skipped += 1
                        continue
                    entries.append(from_trajectory(t, policy_id=policy_id, info=info))
            except ValidationError as e:
                err = e.errors()[0]
                raise PoolError(f"{path}:{lineno}: not a trajectory or rollout record: {err['msg']} at "
                                f"{'.'.join(map(str, err['loc']))}") from None
    return entries, skipped


# ------------------------------------------------------------------------------ filters
def action_problem(message: dict, tool_names: Sequence[str], error: str | None = None) -> str | None:
    """'undefined-tool', 'unparsable' or None for one assistant message."""
    if tool_names:
        calls = message.get("tool_calls")
        action: Any = ({"name": calls[0]["function"]["name"], "arguments": calls[0]["function"].get("arguments")}
                       if calls else message.get("content") or "")
        try:
            parse_action(action, list(tool_names))
        except ActionError as e:
            return "undefined-tool" if str(e).startswith("unknown tool") else "unparsable"
        return None
    if error:  # no tool list: the env's own verdict on the turn
        return "undefined-tool" if error.startswith("unknown tool") else "unparsable"
    return None


def token_count(entry: PoolEntry, tokenizer=None) -> int | None:
    if entry.prompt_ids is not None and entry.completion_ids is not None:
        return len(entry.prompt_ids) + len(entry.completion_ids)
    if tokenizer is None:
        return None
    return len(tokenizer.apply_chat_template(entry.messages, tokenize=True, return_dict=False))


def filter_entries(entries: Iterable[PoolEntry], *, max_tokens: int | None = None, tokenizer=None,
                   drop_undefined_tools: bool = True, drop_unparsable: bool = True) -> tuple[list[PoolEntry], Counter]:
    """The seed's quality filters. Returns (kept, Counter of why the others were dropped)."""
    kept, dropped = [], Counter()
    for e in entries:
        if max_tokens is not None:
            n = token_count(e, tokenizer)
            if n is None:
                raise PoolError(f"entry {e.entry_id} has no token ids: give a tokenizer to count its tokens")
            if n > max_tokens:
                dropped["over-token-limit"] += 1
                continue
        errors = e.metadata.get("turn_errors") or []
        problems = {action_problem(m, e.tool_names, errors[i] if i < len(errors) else None)
                    for i, m in enumerate(e.actions())} - {None}
        if drop_undefined_tools and "undefined-tool" in problems:
            dropped["undefined-tool"] += 1
            continue
        if drop_unparsable and "unparsable" in problems:
            dropped["unparsable"] += 1
            continue
        kept.append(e)
    return kept, dropped


def cap_per_task(entries: Sequence[PoolEntry], cap: int, seed: int = 0) -> list[PoolEntry]:
    """At most `cap` entries per task (a random subset of each larger one), order kept."""
    if cap < 1:
        raise ValueError("the per-task cap must be at least 1")
    rng = random.Random(seed)
    by_task: dict[str, list[int]] = defaultdict(list)
    for i, e in enumerate(entries):
        by_task[e.task_id].append(i)
    keep = {i for ids in by_task.values() for i in (rng.sample(ids, cap) if len(ids) > cap else ids)}
    return [e for i, e in enumerate(entries) if i in keep]


def balance_classes(entries: Sequence[PoolEntry], ratio: float = 1.0, seed: int = 0) -> list[PoolEntry]:
    """Down-sample the majority class (resolved or unresolved) to at most `ratio` times the minority."""
    if ratio < 1.0:
        raise ValueError("ratio must be at least 1")
    pos = [i for i, e in enumerate(entries) if e.resolved]
    neg = [i for i, e in enumerate(entries) if not e.resolved]
    major, minor = (pos, neg) if len(pos) > len(neg) else (neg, pos)
    limit = int(len(minor) * ratio)
    if len(major) > limit:
        major = random.Random(seed).sample(major, limit)
    keep = set(major) | set(minor)
    return [e for i, e in enumerate(entries) if i in keep]


def split_by_task(entries: Sequence[PoolEntry], val_fraction: float, seed: int = 0
                  ) -> tuple[list[PoolEntry], list[PoolEntry]]:
    """Train/validation split by task: validation tasks are unseen in training."""
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError("val_fraction must be in [0, 1)")
    tasks = sorted({e.task_id for e in entries})
    random.Random(seed).shuffle(tasks)
    n_val = round(len(tasks) * val_fraction)
    val = set(tasks[:n_val])
    return [e for e in entries if e.task_id not in val], [e for e in entries if e.task_id in val]


def summary(entries: Sequence[PoolEntry]) -> dict:
    return {"entries": len(entries), "resolved": sum(e.resolved for e in entries),
            "tasks": len({e.task_id for e in entries}),
            "policies": dict(Counter(e.policy_id for e in entries))}
