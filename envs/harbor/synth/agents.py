"""The pipeline's agents: proposer and pruner (one tool call each), builder and refiner (the
project's ReAct loop, `envs.rollout.run_episode`, with bash in an Orchard sandbox).

Every model call goes through `orchard_gym.policies.OpenAIPolicy` (the `URL#MODEL` client of
`orchard eval`), which charges each response's usage to the ledger bound at the time: an
episode's own (the ReAct runs) or a fresh one here (the single calls). The ledger of every run
is kept in the store.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from orchard_gym import ledger as ledgers
from orchard_gym.errors import InvalidRequest
from orchard_gym.policies import OpenAIPolicy
from orchard_gym.trajectory import Trajectory

from ...rollout import run_episode
from . import prompts
from .workshop import Job, WorkshopEnv


class ModelFailed(RuntimeError):
    """A model call failed (unreachable, an HTTP error): the run stops; the store keeps its place."""


class MalformedOutput(ValueError):
    """The model answered, but not with what its role asks for."""


def check_model(spec: str, flag: str = "--model") -> str:
    """`URL#MODEL` with an http(s) URL, or a ValueError naming the flag."""
    url, sep, model = spec.partition("#")
    parsed = urlparse(url)
    if not sep or not model.strip() or parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ValueError(f"{flag} must be URL#MODEL with an http(s) URL, e.g. http://localhost:8000/v1#Qwen/Qwen3-8B, "
                         f"not {spec!r}")
    return spec


def make_policy(spec: str) -> OpenAIPolicy:
    # every role (proposer, pruner, builder, refiner, tester) calls through OpenAIPolicy, i.e. orchard_gym.endpoint
    try:
        return OpenAIPolicy(spec, temperature=0.7, max_tokens=4096)
    except InvalidRequest as e:
        raise ValueError(str(e)) from None


def _failure(e: Exception, spec: str) -> ModelFailed:
    return ModelFailed(f"the model at {spec.split('#')[0]} ({spec.split('#', 1)[-1]}) failed: "
                       f"{type(e).__name__}: {e}")


async def call_tool(spec: str, system: str, user: str, tool: dict) -> tuple[dict, ledgers.Ledger]:
    """One call that must answer with `tool` (or its arguments as a JSON object in text)."""
    policy = make_policy(spec)
    ledger = ledgers.Ledger()
    bound = ledgers.bind(ledger)
    try:
        action = await policy([{"role": "system", "content": system}, {"role": "user", "content": user}], [tool])
    except Exception as e:
        raise _failure(e, spec) from None
    finally:
        ledgers.unbind(bound)
        await policy.aclose()
    name = tool["function"]["name"]
    if isinstance(action, dict):
        if action.get("name") != name:
            raise MalformedOutput(f"called {action.get('name')!r}, not {name!r}")
        raw = action.get("arguments") or "{}"
    else:
        found = re.search(r"\{.*\}", str(action), re.S)  # a model without tool calls may answer in JSON text
        if not found:
            raise MalformedOutput(f"no {name} call and no JSON object in the answer: {str(action)[:200]!r}")
        raw = found.group(0)
    try:
        arguments = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError as e:
        raise MalformedOutput(f"the {name} arguments are not JSON ({e}): {str(raw)[:200]!r}") from None
    if not isinstance(arguments, dict):
        raise MalformedOutput(f"the {name} arguments are not a JSON object: {str(raw)[:200]!r}")
    return arguments, ledger


# --------------------------------------------------------------------------- propose and prune


async def propose(spec: str, domain: str, pool_digest: str, known: list[str], count: int,
                  angle: int) -> tuple[list[tuple[str, str | None]], ledgers.Ledger]:
    """[(instruction, rationale)] drafted by one proposer."""
    user = prompts.proposer_user(domain, pool_digest, known, count, angle)
    arguments, ledger = await call_tool(spec, prompts.PROPOSER_SYSTEM, user, prompts.PROPOSE_TOOL)
    items = arguments.get("instructions")
    if not isinstance(items, list):
        raise MalformedOutput(f"propose needs an 'instructions' list, got {json.dumps(arguments)[:200]}")
    out = []
    for item in items:
        text, why = (item.get("instruction"), item.get("rationale")) if isinstance(item, dict) else (item, None)
        if isinstance(text, str) and text.strip():
            out.append((text.strip(), why if isinstance(why, str) else None))
    if not out:
        raise MalformedOutput(f"propose gave no instruction: {json.dumps(arguments)[:200]}")
    return out, ledger


@dataclass
class Selection:
    keep: list[int]
    reasons: dict[int, str]


async def select(spec: str, domain: str, candidates: list[tuple[int, str]], n: int) -> tuple[Selection, ledgers.Ledger]:
    """The pruner's choice of `n` of `candidates` ([(id, instruction)]), with a reason for each other."""
    arguments, ledger = await call_tool(spec, prompts.PRUNER_SYSTEM, prompts.pruner_user(domain, candidates, n),
                                        prompts.SELECT_TOOL)
    ids = {i for i, _ in candidates}
    keep = arguments.get("keep")
    if not isinstance(keep, list) or not keep or not all(isinstance(k, int) and k in ids for k in keep):
        raise MalformedOutput(f"select needs 'keep': a list of the candidates' ids ({sorted(ids)}), got "
                              f"{json.dumps(arguments)[:200]}")
    reasons = {}
    for item in arguments.get("discard") or []:
        if isinstance(item, dict) and item.get("id") in ids and isinstance(item.get("reason"), str):
            reasons[item["id"]] = item["reason"]
    return Selection(keep=list(dict.fromkeys(keep))[:n], reasons=reasons), ledger


# --------------------------------------------------------------------------- build, refine (ReAct in a sandbox)


@dataclass
class WorkshopRun:
    trajectory: Trajectory
    folder: bytes | None  # the packed task folder (None: the sandbox never got to the end)
    problems: list[str]
    verdict: str | None


async def workshop(spec: str, job: Job, backend: Any, max_steps: int, system: str) -> WorkshopRun:
    """A builder or refiner episode: the project's ReAct loop (run_episode) in a WorkshopEnv."""
    env = WorkshopEnv(job=job, backend=backend, max_steps=max_steps)
    policy = make_policy(spec)
    try:
        trajectory = await run_episode(env, policy, "job", system_prompt=system)
    finally:
        await policy.aclose()
        await env.aclose()  # the sandbox's usage goes into the trajectory's ledger
    if trajectory.error and trajectory.error.startswith("policy failed"):
        raise ModelFailed(f"the model at {spec.split('#')[0]} failed: {trajectory.error[len('policy failed: '):]}")
    report = trajectory.report or {}
    return WorkshopRun(trajectory, env.result, list(report.get("problems") or []), report.get("verdict"))
