"""Evaluating harnesses: every task through each harness, the same tasks for all, one table.

    from orchard_gym.wrappers.harness.eval import evaluate_harnesses, policy_from_spec
    results = evaluate_harnesses(["mini-swe-agent", "codex"], "Orchard/SWE-v0", ["semver-3.0.2"],
                                 policy_from_spec("openai:http://localhost:8000/v1#Qwen/Qwen3-8B"),
                                 backend={"type": "local"}, out="runs/eval.jsonl")

Each run is one `HarnessEnv` episode: the harness runs unchanged in the task's sandbox and
its model calls go to the recording proxy in policy mode, where the policy answers them:

- `openai:URL#MODEL`: any OpenAI-compatible chat-completions endpoint is the model (whatever
  endpoint the harness itself speaks: the proxy's normal form is chat-style);
- `oracle`: a scripted policy for tasks with a gold patch (SWE): the patch through the
  harness's own shell tool, then its finishing answer (`Harness.shell`, `Harness.finish`);
- `nothing`: the finishing answer at once (a do-nothing baseline: it must score 0).

Every run writes one JSON line: the harness, the task, the reward, the error, the
trajectory and the rollout's record (every model call, request and response).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchard_gym.endpoint import Endpoint, EndpointSpec, is_endpoint, parse_spec
from orchard_gym.errors import EndpointSpecError

from orchard_gym.envs.swe.oracle import apply_patch_command

from .spec import Harness, get_harness

# a policy: (harness, the task env's current task, the pending request's info) -> (action, tokens or None)
Policy = Callable[[Harness, Any, dict], Awaitable[tuple[Any, dict | None]]]


class OraclePolicy:
    """The gold patch through the harness's shell tool, then its finishing answer."""

    async def __call__(self, harness: Harness, task: Any, info: dict) -> tuple[Any, dict | None]:
        patch = getattr(task, "patch", None)
        if not isinstance(patch, str) or not patch.strip():
            raise ValueError(f"the oracle policy needs tasks with a gold patch; {type(task).__name__} has none")
        if info.get("step", 0) == 0:
            return harness.shell(apply_patch_command(patch)), None
        return harness.finish, None


class NothingPolicy:
    """The harness's finishing answer at once."""

    async def __call__(self, harness: Harness, task: Any, info: dict) -> tuple[Any, dict | None]:
        return harness.finish, None


class ChatPolicy:
    """An OpenAI-compatible chat-completions endpoint answers the harness's requests (through
    `orchard_gym.endpoint`; the recording proxy charges the usage returned, so the client does not)."""

    def __init__(self, url: str, model: str, api_key: str | None = None, timeout: float = 600.0,
                 temperature: float | None = None):
        self.endpoint = Endpoint(EndpointSpec(parse_spec(url, model_required=False).url, model), api_key=api_key,
                                 timeout=timeout, usage_source=None)
        self.url, self.model, self.temperature = self.endpoint.spec.route("chat/completions"), model, temperature

    async def __call__(self, harness: Harness, task: Any, info: dict) -> tuple[Any, dict | None]:
        tools = [t for t in info.get("tools") or [] if isinstance(t, dict) and t.get("type") == "function"
                 and "function" in t]  # hosted tools (web search, namespaces) are not chat tools
        reply = await self.endpoint.chat(info["messages"], tools=tools or None, temperature=self.temperature)
        content = reply.message.get("content")
        action = {"role": "assistant", "content": content if content is None else reply.content,
                  "tool_calls": reply.tool_calls}
        if action["content"] is None and not action["tool_calls"]:
            action["content"] = ""
        return action, ({"usage": reply.usage} if reply.usage is not None else None)

    async def aclose(self) -> None:
        await self.endpoint.aclose()


def policy_from_spec(spec: str, api_key: str | None = None) -> Policy:
    """'oracle' | 'nothing' | 'openai:URL#MODEL'."""
    if spec == "oracle":
        return OraclePolicy()
    if spec == "nothing":
        return NothingPolicy()
    if is_endpoint(spec) and spec.startswith("openai:"):
        try:
            parsed = parse_spec(spec, what="a harness policy")
        except EndpointSpecError:
            pass
        else:
            return ChatPolicy(parsed.url, str(parsed.model), api_key)
    raise ValueError(f"unknown policy {spec!r}: use oracle, nothing or openai:URL#MODEL")


@dataclass
class HarnessRun:
    harness: str
    task_id: str
    reward: float
    error: str | None
    calls: int
    seconds: float
    trajectory: dict = field(repr=False)
    record: dict | None = field(repr=False)
    policy: str = ""  # the policy's name in a cross-harness matrix (`--policies NAME=SPEC`)
    train_harness: str | None = None  # the harness that policy's model was trained on, where the user said

    @property
    def resolved(self) -> bool:
        return self.error is None and self.reward > 0


async def run_one(harness: Harness, env_id: str, task_id: str, policy: Policy, *, client, proxy,
                  max_steps: int, max_seconds: float | None, env_kwargs: dict | None = None) -> HarnessRun:
    """One episode of `harness` on `task_id`, the policy answering every model call."""
    import gymnasium as gym

    from .env import HarnessEnv

    started = time.monotonic()
    env: HarnessEnv = gym.spec(env_id).make(harness=harness, client=client, proxy=proxy, max_steps=max_steps,
                                            max_seconds=max_seconds, **(env_kwargs or {})).unwrapped
    error = None
    reward = 0.0
    try:
        try:
            obs, info = await env.areset(options={"task_id": task_id})
            while True:
                try:
                    action, tokens = await policy(harness, env.task_env.task, info)
                except Exception as e:  # the policy failed: this run is an error, not a 0
                    await env.abort(f"policy failed: {type(e).__name__}: {e}")
                    break
                obs, reward, terminated, truncated, info = await env.astep(action, tokens=tokens)
                if terminated or truncated:
                    break
        except Exception as e:  # a reset that failed (HarnessError, infrastructure)
            error = f"{type(e).__name__}: {e}"
        t = env.trajectory
        error = error or (t.error if t else "no episode")
        record = env.record
        return HarnessRun(harness=harness.name, task_id=task_id, reward=0.0 if error else float(reward),
                          error=error, calls=len(record.calls) if record else 0,
                          seconds=time.monotonic() - started,
                          trajectory=t.model_dump(mode="json") if t else {},
                          record=record.model_dump(mode="json") if record else None)
    finally:
        await env.aclose()


async def aevaluate_harnesses(harnesses: Sequence[str | Harness], env_id: str, task_ids: Sequence[str],
                              policy: Policy, *, backend: dict | None = None, client_kwargs: dict | None = None,
                              attempts: int = 1, concurrency: int = 4, max_steps: int = 30,
                              max_seconds: float | None = 900.0, env_kwargs: dict | None = None,
                              out: str | Path | None = None, progress: bool = True, label: str = "",
                              train_harness: str | None = None, out_mode: str = "w") -> list[HarnessRun]:
    """Every task through each harness, `policy` answering every model call. `label` and
    `train_harness` name the policy (and what it was trained on) in the runs, their trajectories'
    metadata and the JSONL lines: aevaluate_matrix's rows."""
    from orchard_gym.client import AsyncSandboxClient
    from orchard_gym.envs.swe.venvs import cache_root

    from ..proxy.server import ProxyConfig, RecordingProxy, default_socket_dir

    resolved = [get_harness(h) for h in harnesses]
    if len({h.name for h in resolved}) != len(resolved):
        raise ValueError("a harness is named twice")
    if not task_ids:
        raise ValueError("no tasks")
    for h in resolved:  # install first (once, cached), so runs do not race their installs' time budgets
        await asyncio.to_thread(h.install)
        await asyncio.to_thread(h.install_npm)
    schedule = [(h, t) for h in resolved for t in task_ids for _ in range(attempts)]
    cache_root().mkdir(parents=True, exist_ok=True)
    sock = f"{default_socket_dir()}/eval-{int(time.time() * 1000) % 10**9}.sock"
    client_kwargs = dict(client_kwargs or {"backend": backend or {"type": "local"}})
    backend_cfg = dict(client_kwargs.get("backend") or {})
    network, proxy_config = "isolated", ProxyConfig(uds=sock)
    if backend_cfg.get("type", "local") != "local":  # containers: TCP to the proxy only (see harness/env.py)
        import socket

        with socket.socket() as s:
            s.bind(("0.0.0.0", 0))
            port = s.getsockname()[1]
        network, proxy_config = "proxy", ProxyConfig(host="0.0.0.0", port=port)
        if backend_cfg.get("type") == "docker":
            backend_cfg["host_guard_allow_ports"] = [*backend_cfg.get("host_guard_allow_ports", []), port]
        client_kwargs["backend"] = backend_cfg
    sink = None
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        sink = Path(out).open(out_mode)
    bar = _Progress(len(schedule), enabled=progress)
    gate = asyncio.Semaphore(concurrency)
    try:
        async with RecordingProxy(proxy_config) as proxy, AsyncSandboxClient(**client_kwargs) as client:
            async def one(h: Harness, task_id: str) -> HarnessRun:
                async with gate:
                    run = await run_one(h, env_id, task_id, policy, client=client, proxy=proxy, max_steps=max_steps,
                                        max_seconds=max_seconds, env_kwargs={**(env_kwargs or {}), "network": network})
                run.policy, run.train_harness = label, train_harness
                if run.trajectory:  # the labels travel with the trajectory (pools, viewer, ATIF)
                    run.trajectory.setdefault("metadata", {}).update(
                        harness=run.harness, **({"policy": label} if label else {}),
                        **({"train_harness": train_harness} if train_harness else {}))
                if sink is not None:
                    sink.write(json.dumps({"harness": run.harness, "policy": label or None,
                                           "train_harness": train_harness, "task_id": run.task_id, "reward": run.reward,
                                           "resolved": run.resolved, "error": run.error, "calls": run.calls,
                                           "seconds": run.seconds, "trajectory": run.trajectory,
                                           "record": run.record}) + "\n")
                    sink.flush()
                bar.update(run)
                return run

            ordered = await asyncio.gather(*(one(h, t) for h, t in schedule))
    finally:
        bar.close()
        if sink is not None:
            sink.close()
        if hasattr(policy, "aclose"):
            await policy.aclose()
    return list(ordered)


def evaluate_harnesses(*args, **kwargs) -> list[HarnessRun]:
    """Sync `aevaluate_harnesses`."""
    return asyncio.run(aevaluate_harnesses(*args, **kwargs))


async def aevaluate_matrix(harnesses: Sequence[str | Harness], env_id: str, task_ids: Sequence[str],
                           policies: dict[str, Policy], *, train_harness: dict[str, str] | None = None,
                           out: str | Path | None = None, **kwargs) -> list[HarnessRun]:
    """The cross-harness matrix: each named policy (a model) through every harness on the same
    tasks, one policy after the other; `train_harness` says which harness each was trained on.
    format_matrix prints "trained on x evaluated on"."""
    if not policies:
        raise ValueError("no policies")
    unknown = sorted(set(train_harness or {}) - set(policies))
    if unknown:
        raise ValueError(f"--train-harness names no policy: {unknown} (policies: {', '.join(policies)})")
    runs: list[HarnessRun] = []
    for i, (name, policy) in enumerate(policies.items()):
        runs += await aevaluate_harnesses(harnesses, env_id, task_ids, policy, out=out, out_mode="a" if i else "w",
                                          label=name, train_harness=(train_harness or {}).get(name), **kwargs)
    return runs


def evaluate_matrix(*args, **kwargs) -> list[HarnessRun]:
    """Sync `aevaluate_matrix`."""
    return asyncio.run(aevaluate_matrix(*args, **kwargs))


class _Progress:
    def __init__(self, total: int, enabled: bool):
        self.bar = None
        self.resolved = self.errors = 0
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc="harness runs", unit="run", file=sys.stderr, dynamic_ncols=True)

    def update(self, run: HarnessRun) -> None:
        self.resolved += run.resolved
        self.errors += run.error is not None
        if self.bar is not None:
            self.bar.set_postfix_str(f"resolved {self.resolved} errors {self.errors} last {run.harness}/{run.task_id}")
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def summary_table(runs: Sequence[HarnessRun]) -> list[dict]:
    """One row per harness (in first-seen order): runs, resolved, resolve rate, errors, calls, seconds."""
    rows: dict[str, dict] = {}
    for r in runs:
        row = rows.setdefault(r.harness, {"harness": r.harness, "runs": 0, "resolved": 0, "errors": 0,
                                          "calls": 0, "seconds": 0.0})
        row["runs"] += 1
        row["resolved"] += r.resolved
        row["errors"] += r.error is not None
        row["calls"] += r.calls
        row["seconds"] += r.seconds
    for row in rows.values():
        row["resolve_rate"] = row["resolved"] / row["runs"]
        row["mean_calls"] = row.pop("calls") / row["runs"]
        row["mean_seconds"] = row.pop("seconds") / row["runs"]
    return list(rows.values())


def format_table(runs: Sequence[HarnessRun]) -> str:
    """The comparison: one line per harness, then one line per task with each harness's outcome."""
    table = summary_table(runs)
    lines = [f"{'harness':18} {'runs':>5} {'resolved':>9} {'rate':>7} {'errors':>7} {'calls':>6} {'secs':>7}"]
    for row in table:
        lines.append(f"{row['harness']:18} {row['runs']:>5} {row['resolved']:>9} {row['resolve_rate']:>7.1%} "
                     f"{row['errors']:>7} {row['mean_calls']:>6.1f} {row['mean_seconds']:>7.1f}")
    names = [row["harness"] for row in table]
    tasks = list(dict.fromkeys(r.task_id for r in runs))
    lines.append("")
    lines.append(f"{'task':28} " + " ".join(f"{n:>16}" for n in names))
    for t in tasks:
        cells = []
        for n in names:
            mine = [r for r in runs if r.harness == n and r.task_id == t]
            cells.append(f"{sum(r.resolved for r in mine)}/{len(mine)}" + (" err" if any(r.error for r in mine) else ""))
        lines.append(f"{t:28} " + " ".join(f"{c:>16}" for c in cells))
    return "\n".join(lines)


def format_matrix(runs: Sequence[HarnessRun]) -> str:
    """Trained on x evaluated on: one row per policy (its training harness beside it), one column
    per harness, each cell resolved/runs and the rate; errors counted in the cell."""
    policies = list(dict.fromkeys(r.policy for r in runs))
    names = list(dict.fromkeys(r.harness for r in runs))
    lines = [f"{'policy':20} {'trained on':16} " + " ".join(f"{n:>18}" for n in names)]
    for p in policies:
        mine = [r for r in runs if r.policy == p]
        trained = next((r.train_harness for r in mine if r.train_harness), None) or "-"
        cells = []
        for n in names:
            cell = [r for r in mine if r.harness == n]
            errors = sum(r.error is not None for r in cell)
            rate = sum(r.resolved for r in cell) / len(cell) if cell else 0.0
            text = f"{sum(r.resolved for r in cell)}/{len(cell)} {rate:.0%}" + (f" ({errors} err)" if errors else "")
            cells.append(f"{text:>18}")
        lines.append(f"{p:20} {trained:16} " + " ".join(cells))
    return "\n".join(lines)
