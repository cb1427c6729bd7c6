"""The cost ledger: what each rollout used (sandbox CPU, memory, wall time; model tokens) and its price.

Per sandbox (`SandboxUsage`), read just before it is deleted:

- local backend: the sandbox's cgroup (v1 `cpuacct.usage`, `memory.max_usage_in_bytes`;
  v2 `cpu.stat` usage_usec, `memory.peak`), which holds the agent and everything it ran;
- docker/podman: the engine's stats (`cpu_stats.cpu_usage.total_usage`, `memory_stats.max_usage`
  where the engine reports it); Podman reports no peak, so on a local engine the container's
  own cgroup is read on the host (`State.CgroupPath`);
- elsewhere (kubernetes, or when the above gives nothing): the sandbox's own cgroup files as
  the sandbox sees them, read through the agent (`source="in-sandbox cgroup"`); a pod's
  container has a private cgroup namespace, so these are its container's totals (the agent's
  own read is included, a few ms). Where even that fails, only wall time is known
  (`source="none"`, `note` says why).

Per rollout (`Ledger`, in `Trajectory.ledger`): every sandbox the episode used (the task's, a
grader's fresh one), sandbox-seconds (their summed wall time), and model tokens. A policy
reports tokens with `record_tokens(prompt, completion)` while the episode runs (the runner
keeps the current episode's ledger in a context variable, so concurrent episodes never mix);
`OpenAIPolicy` does it from each response's `usage`, the trainer from the token ids it
generated, a harness episode from the recording proxy's call records.

Prices (`Prices`): per CPU-hour of sandbox CPU time and per 1,000 model tokens; `summarize`
sums trajectories and prices them.

    from orchard_gym.ledger import Prices, summarize
    totals = summarize(trajectories, Prices(cpu_hour=0.05, per_1k_tokens=0.002))
    print(totals["cpu_seconds"], totals["cost"])
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import time
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, Field

ACCOUNT_TIMEOUT = 10.0  # seconds one sandbox's accounting may take before it is given up (never blocks a delete)


class SandboxUsage(BaseModel):
    """One sandbox's totals at deletion. None: not known on this backend (see `source`, `note`)."""

    sandbox_id: str
    backend: str | None = None
    wall_seconds: float = Field(0.0, description="created -> deleted, as the client saw it")
    cpu_seconds: float | None = None
    memory_peak_bytes: int | None = None
    memory_bytes: int | None = Field(None, description="memory in use at the end (where no peak is known)")
    source: str = Field("none", description="'cgroup v1', 'cgroup v2', 'engine stats', 'in-sandbox cgroup' or 'none'")
    note: str | None = Field(None, description="why a number is missing")


class Ledger(BaseModel):
    """One rollout's costs."""

    sandboxes: list[SandboxUsage] = Field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model_calls: int = 0
    token_source: str | None = Field(None, description="'policy', 'proxy', 'trainer' or 'judge' (who reported first); None: no tokens reported")

    @property
    def sandbox_seconds(self) -> float:
        return sum(s.wall_seconds for s in self.sandboxes)

    @property
    def cpu_seconds(self) -> float:
        """CPU seconds of the sandboxes that were accounted (see `unaccounted`)."""
        return sum(s.cpu_seconds for s in self.sandboxes if s.cpu_seconds is not None)

    @property
    def unaccounted(self) -> int:
        """Sandboxes whose CPU time is not known."""
        return sum(1 for s in self.sandboxes if s.cpu_seconds is None)

    @property
    def memory_peak_bytes(self) -> int | None:
        peaks = [s.memory_peak_bytes for s in self.sandboxes if s.memory_peak_bytes is not None]
        return max(peaks) if peaks else None

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def add_tokens(self, prompt: int, completion: int, calls: int = 1, source: str = "policy") -> None:
        for name, value in (("prompt", prompt), ("completion", completion), ("calls", calls)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} tokens must be a non-negative integer, not {value!r}")
        self.prompt_tokens += prompt
        self.completion_tokens += completion
        self.model_calls += calls
        self.token_source = self.token_source or source


# --------------------------------------------------------------------------- prices


class Prices(BaseModel):
    """What a CPU-hour of sandbox CPU time and 1,000 model tokens cost (any currency, both optional)."""

    cpu_hour: float | None = None
    per_1k_tokens: float | None = None

    def model_post_init(self, _context: Any) -> None:
        _check_prices(self.cpu_hour, self.per_1k_tokens)

    @property
    def given(self) -> bool:
        return self.cpu_hour is not None or self.per_1k_tokens is not None

    def cost(self, cpu_seconds: float, tokens: int) -> dict:
        cpu = cpu_seconds / 3600 * self.cpu_hour if self.cpu_hour is not None else None
        tok = tokens / 1000 * self.per_1k_tokens if self.per_1k_tokens is not None else None
        total = (cpu or 0.0) + (tok or 0.0) if self.given else None
        return {"cost_cpu": cpu, "cost_tokens": tok, "cost": total}


def _check_prices(cpu_hour: Any, per_1k_tokens: Any) -> None:
    for flag, value in (("--price-cpu-hour", cpu_hour), ("--price-1k-tokens", per_1k_tokens)):
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{flag} must be a finite, non-negative number, not {value!r}")


def prices(cpu_hour: float | None = None, per_1k_tokens: float | None = None) -> Prices | None:
    """Prices from two optional numbers (the CLI flags); None when neither is given."""
    _check_prices(cpu_hour, per_1k_tokens)  # a plain ValueError (pydantic would wrap it)
    p = Prices(cpu_hour=cpu_hour, per_1k_tokens=per_1k_tokens)
    return p if p.given else None


def summarize(trajectories: Iterable[Any], price: Prices | None = None) -> dict:
    """Totals over trajectories (those without a ledger count as episodes with nothing recorded)."""
    ledgers = [getattr(t, "ledger", None) or Ledger() for t in trajectories]
    peaks = [ledger.memory_peak_bytes for ledger in ledgers if ledger.memory_peak_bytes is not None]
    out = {
        "episodes": len(ledgers),
        "sandboxes": sum(len(ledger.sandboxes) for ledger in ledgers),
        "sandboxes_unaccounted": sum(ledger.unaccounted for ledger in ledgers),
        "sandbox_seconds": sum(ledger.sandbox_seconds for ledger in ledgers),
        "cpu_seconds": sum(ledger.cpu_seconds for ledger in ledgers),
        "memory_peak_bytes": max(peaks) if peaks else None,
        "prompt_tokens": sum(ledger.prompt_tokens for ledger in ledgers),
        "completion_tokens": sum(ledger.completion_tokens for ledger in ledgers),
        "model_calls": sum(ledger.model_calls for ledger in ledgers),
    }
    out["tokens"] = out["prompt_tokens"] + out["completion_tokens"]
    out.update((price or Prices()).cost(out["cpu_seconds"], out["tokens"]))
    return out


def format_summary(totals: dict) -> str:
    """The ledger lines `orchard eval` prints."""
    n = max(totals["episodes"], 1)
    peak = totals["memory_peak_bytes"]
    lines = [f"ledger: {totals['sandboxes']} sandboxes, {totals['sandbox_seconds']:.1f} sandbox-s "
             f"({totals['sandbox_seconds'] / n:.2f}/episode), CPU {totals['cpu_seconds']:.2f} s "
             f"({totals['cpu_seconds'] / n:.3f}/episode), peak memory "
             f"{'-' if peak is None else f'{peak / 2**20:.1f} MiB'}"
             + (f"; CPU not accounted for {totals['sandboxes_unaccounted']} sandboxes"
                if totals["sandboxes_unaccounted"] else ""),
             f"tokens: {totals['prompt_tokens']} prompt + {totals['completion_tokens']} completion in "
             f"{totals['model_calls']} model calls"]
    if totals.get("cost") is not None:
        parts = [f"{name} {totals[key]:.4g}" for name, key in (("CPU", "cost_cpu"), ("tokens", "cost_tokens"))
                 if totals[key] is not None]
        lines.append(f"cost: {totals['cost']:.4g} ({', '.join(parts)}; {totals['cost'] / n:.4g}/episode)")
    return "\n".join(lines)


# --------------------------------------------------------------------------- tokens of the running episode

_CURRENT: contextvars.ContextVar[Ledger | None] = contextvars.ContextVar("orchard_ledger", default=None)


def current() -> Ledger | None:
    """The ledger of the episode running in this task (None outside an episode runner)."""
    return _CURRENT.get()


def bind(ledger: Ledger) -> contextvars.Token:
    """Make `ledger` the current episode's (the runner does this; undo with `unbind`)."""
    return _CURRENT.set(ledger)


def unbind(token: contextvars.Token) -> None:
    _CURRENT.reset(token)


def record_tokens(prompt: int, completion: int, calls: int = 1, source: str = "policy") -> bool:
    """Add a model call's tokens to the running episode's ledger; False when no episode is running."""
    ledger = _CURRENT.get()
    if ledger is None:
        return False
    ledger.add_tokens(prompt, completion, calls, source)
    return True


def record_usage(usage: Any, source: str = "policy") -> bool:
    """`record_tokens` from an OpenAI (`prompt_tokens`/`completion_tokens`) or Anthropic/Responses
    (`input_tokens`/`output_tokens`) usage object; False when there is none or no episode."""
    counts = usage_counts(usage)
    return counts is not None and record_tokens(*counts, source=source)


def usage_counts(usage: Any) -> tuple[int, int] | None:
    if not isinstance(usage, dict):
        return None
    prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
    completion = usage.get("completion_tokens", usage.get("output_tokens"))
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (prompt, completion)):
        return None
    return prompt, completion


def ledger_of(trajectory: Any) -> Ledger:
    """The trajectory's ledger, made on first use."""
    if trajectory.ledger is None:
        trajectory.ledger = Ledger()
    return trajectory.ledger


def charge_calls(trajectory: Any, calls: Iterable[Any]) -> None:
    """Tokens of a harness episode from the recording proxy's call records (usage of each call)."""
    ledger = ledger_of(trajectory)
    if ledger.token_source == "proxy":  # charged already (an episode ends once)
        return
    for call in calls:
        counts = usage_counts(getattr(call, "usage", None))
        if counts is not None:
            ledger.add_tokens(*counts, source="proxy")


def charge_sandbox(trajectory: Any, instance: Any) -> None:
    """Put a deleted sandbox's usage (collected by its delete) into the trajectory's ledger."""
    usage = getattr(instance, "usage", None)
    if trajectory is not None and usage is not None:
        ledger_of(trajectory).sandboxes.append(usage)


# --------------------------------------------------------------------------- reading a sandbox's usage

# the sandbox's own cgroup as it sees it: v2 (cgroup namespace root) first, then v1 controllers
IN_SANDBOX_SCRIPT = (
    "c=/sys/fs/cgroup; "
    "if [ -r $c/cpu.stat ]; then echo v2; sed -n 's/^usage_usec /cpu_usec /p' $c/cpu.stat; "
    "[ -r $c/memory.peak ] && echo peak $(cat $c/memory.peak); "
    "[ -r $c/memory.current ] && echo current $(cat $c/memory.current); "
    "else echo v1; [ -r $c/cpuacct/cpuacct.usage ] && echo cpu_ns $(cat $c/cpuacct/cpuacct.usage); "
    "[ -r $c/memory/memory.max_usage_in_bytes ] && echo peak $(cat $c/memory/memory.max_usage_in_bytes); "
    "[ -r $c/memory/memory.usage_in_bytes ] && echo current $(cat $c/memory/memory.usage_in_bytes); fi; true")


def parse_in_sandbox(text: str) -> dict:
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            values[key] = int(value)
    cpu = values["cpu_usec"] / 1e6 if "cpu_usec" in values else (values["cpu_ns"] / 1e9 if "cpu_ns" in values else None)
    return {"cpu_seconds": cpu, "memory_peak_bytes": values.get("peak"), "memory_bytes": values.get("current")}


async def collect(instance: Any, timeout: float = ACCOUNT_TIMEOUT) -> SandboxUsage:
    """What a live sandbox used so far: the backend's accounting, else its own cgroup files
    read through the agent. Never raises: what cannot be read is None, with a note."""
    record = instance.record
    usage = SandboxUsage(sandbox_id=instance.sandbox_id, backend=record.backend,
                         wall_seconds=max(0.0, time.time() - record.created_at))
    notes = []
    try:
        resources = await asyncio.wait_for(instance.resources(), timeout)
        found = resources.get("usage") or {}
        usage.source = resources.get("accounting") or _source_of(resources)
        for key in ("cpu_seconds", "memory_peak_bytes", "memory_bytes"):
            if found.get(key) is not None:
                setattr(usage, key, found[key])
        if resources.get("accounting_note"):
            notes.append(resources["accounting_note"])
    except Exception as e:  # accounting must never stop a delete
        notes.append(f"resources: {type(e).__name__}: {e}")
    missing = usage.cpu_seconds is None or usage.memory_peak_bytes is None
    if missing and record.backend != "local":  # a local sandbox's cgroupfs is the host's: never read it
        try:
            result = await asyncio.wait_for(instance.exec(IN_SANDBOX_SCRIPT, timeout=timeout), timeout + 1)
            found = parse_in_sandbox(result.stdout)
            if usage.cpu_seconds is None and found["cpu_seconds"] is not None:
                usage.cpu_seconds, usage.source = found["cpu_seconds"], "in-sandbox cgroup"
            if usage.memory_peak_bytes is None and found["memory_peak_bytes"] is not None:
                usage.memory_peak_bytes = found["memory_peak_bytes"]
                if usage.source != "in-sandbox cgroup":
                    notes.append("peak memory read inside the sandbox")
            usage.memory_bytes = usage.memory_bytes or found["memory_bytes"]
            if found["cpu_seconds"] is None:
                notes.append("no cgroup accounting visible inside the sandbox")
        except Exception as e:
            notes.append(f"in-sandbox read: {type(e).__name__}: {e}")
    if usage.cpu_seconds is None:
        usage.source = "none"
    if usage.memory_peak_bytes is None and usage.cpu_seconds is not None:
        notes.append("no peak memory (this backend's accounting keeps none)")
    usage.note = "; ".join(notes) or None
    return usage


def _source_of(resources: dict) -> str:
    kill = str(resources.get("kill") or "")
    if kill.startswith("cgroup v1"):
        return "cgroup v1"
    if kill.startswith("cgroup v2"):
        return "cgroup v2"
    return "none"


# --------------------------------------------------------------------------- training metrics

LEDGER_SUMMED = {f"ledger/{k}" for k in ("cpu_seconds", "sandbox_seconds", "prompt_tokens", "completion_tokens",
                                         "tokens", "sandboxes", "cost", "cost_cpu", "cost_tokens")}


def ledger_stats(trajectories: Iterable[Any], price: Prices | None = None, informative_groups: int | None = None) -> dict:
    """A training step's `ledger/*` metrics: every rollout spent (kept or dropped) counts. With
    `informative_groups` (BAR/GRPO), informative groups per unit cost (per CPU-hour and per 1k
    tokens always; per priced unit when prices are given)."""
    t = summarize(trajectories, price)
    out = {f"ledger/{k}": t[k] for k in ("cpu_seconds", "sandbox_seconds", "prompt_tokens", "completion_tokens",
                                          "tokens", "sandboxes", "memory_peak_bytes", "cost", "cost_cpu",
                                          "cost_tokens")}
    if informative_groups is not None:
        def per(amount):
            return informative_groups / amount if amount else None
        out["ledger/informative_groups_per_cpu_hour"] = per(t["cpu_seconds"] / 3600)
        out["ledger/informative_groups_per_1k_tokens"] = per(t["tokens"] / 1000)
        out["ledger/informative_groups_per_cost"] = per(t["cost"]) if t["cost"] is not None else None
    return out
