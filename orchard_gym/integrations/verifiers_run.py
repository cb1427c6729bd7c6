"""Run verifiers' own eval CLI (`vf-eval`) on an Orchard env from another Python environment.

verifiers 0.4 cannot share a venv with OpenEnv 0.10 (mcp 2 against mcp<2), so it lives in
`.venv-verifiers` (scripts/install_verifiers.sh) and this module, which imports no verifiers,
drives it as a subprocess and reads back its traces:

    episodes = vf_eval("Orchard/Claw-v0", model="my-model", base_url="http://127.0.0.1:8000/v1",
                       tasks=["calendar-answer-001"], env_kwargs={"backend": {"type": "local"}},
                       out_dir="runs/vf")
    episodes[0].reward, episodes[0].error                 # orchard_reward, or the episode's error
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VENV = Path(__file__).resolve().parents[2] / ".venv-verifiers"  # the checkout's, as the install script makes it


@dataclass
class VfEpisode:
    """One episode of a vf-eval run, from its traces.jsonl."""

    task_id: str
    reward: float | None  # the trace's orchard_reward; None when the episode errored
    error: str | None
    agent_seconds: float  # verifiers' `agent` phase: the whole exchange (model, harness, env steps)
    turns: int
    metrics: dict  # the trace's metrics: orchard_step_ms, the median env step inside verifiers' loop


def venv_missing(venv: Path = VENV) -> str | None:
    """Why `venv` cannot run vf-eval (None when it can)."""
    if not (venv / "bin" / "vf-eval").exists():
        return f"{venv}/bin/vf-eval is missing (bash scripts/install_verifiers.sh)"
    return None


def toml_value(value: Any) -> str:
    """`value` (str, number, bool, list, dict) as a TOML value; JSON strings are TOML strings."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {type(value).__name__} into a vf-eval config")


def vf_eval(env_id: str, *, model: str, base_url: str, out_dir: str | Path, tasks: list[str] | None = None,
            env_kwargs: dict | None = None, venv: Path = VENV, timeout: float = 900,
            extra_env: dict[str, str] | None = None) -> list[VfEpisode]:
    """`vf-eval orchard-verifiers` (verifiers' own loop) on `env_id` with the OpenAI-compatible
    model at `base_url`; its episodes, read from the run's traces.jsonl."""
    if (why := venv_missing(venv)) is not None:
        raise FileNotFoundError(why)
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    taskset: dict[str, Any] = {"id": "orchard-verifiers", "env": env_id, "env_kwargs": env_kwargs or {}}
    if tasks is not None:
        taskset["tasks"] = list(tasks)
    config = (f"model = {toml_value(model)}\npush = false\noutput_dir = {toml_value(str(out_dir))}\n"
              f"[client]\nbase_url = {toml_value(base_url)}\n[env.taskset]\n"
              + "".join(f"{k} = {toml_value(v)}\n" for k, v in taskset.items()))
    with tempfile.NamedTemporaryFile("w", suffix=".toml", dir=out_dir, delete=False) as f:
        f.write(config)
    before = set(out_dir.glob("*/traces.jsonl"))
    env = {**os.environ, "PATH": f"{venv / 'bin'}:{os.environ.get('PATH', '')}",
           "PRIME_API_KEY": os.environ.get("PRIME_API_KEY", "unused"), **(extra_env or {})}
    run = subprocess.run([str(venv / "bin" / "vf-eval"), "@", f.name], env=env, capture_output=True, text=True,
                         timeout=timeout, stdin=subprocess.DEVNULL)
    new = sorted(set(out_dir.glob("*/traces.jsonl")) - before)
    if run.returncode != 0 or len(new) != 1:
        raise RuntimeError(f"vf-eval exited {run.returncode} with {len(new)} new runs:\n"
                           f"{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
    return [episode_of(json.loads(line)) for line in new[0].read_text().splitlines() if line.strip()]


def episode_of(record: dict) -> VfEpisode:
    """An episode that failed before its exchange opened (no sandbox) has no trace, only errors."""
    trace = (record.get("traces") or [{}])[0]
    errors = record.get("errors") or trace.get("errors") or []
    reward = (trace.get("rewards") or {}).get("orchard_reward")
    agent = (trace.get("timing") or {}).get("agent") or {}
    return VfEpisode(task_id=record["task"]["data"]["task_id"],  # the OrchardData of the episode
                     reward=None if reward is None or reward.get("score") is None else float(reward["score"]),
                     error="; ".join(f"{e.get('type')}: {e.get('message')}" for e in errors) or None,
                     agent_seconds=float(agent.get("end", 0) - agent.get("start", 0)),
                     turns=sum(1 for n in trace.get("nodes", []) if n.get("sampled")),
                     metrics=dict(trace.get("metrics") or {}))


__all__ = ["VENV", "VfEpisode", "venv_missing", "vf_eval"]
