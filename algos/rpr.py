"""Rubric-based process reward (RPR, Orchard §3.4): an LLM judge scores how an episode was done.

The judge reads a deterministic summary of the trajectory (the task as the agent saw it,
every action in full, observations clipped, the final diff if the env reports one (`diff`, or SWE's `patch`), and
the outcome as solved / not solved) and scores it against a rubric (YAML, weighted
criteria; `algos/rubrics/`). Its answer must be JSON of the form

    {"criteria": [{"id": "<criterion id>", "score": <0..1>, "reason": "<short>"}, ...]}

one entry per criterion, validated by a pydantic schema; the process score is the
weighted mean. A malformed or out-of-range answer is retried once with the validation
error shown; a timeout, a refusal or a second bad answer drops the sample (zero loss
mask, no reward) and is counted. The combined reward enters the same group-relative
estimator:

    sum:L     outcome + L * process
    gated:T   outcome if process >= T else 0
    process   process

The judge never sees the grader's report (hidden tests, check commands, expected
answers), the numeric reward or the trajectory's metadata.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError, field_validator

from orchard_gym._loop import LoopThread
from orchard_gym.endpoint import Endpoint, is_endpoint, parse_spec
from orchard_gym.errors import EndpointError, JudgeError  # JudgeError's old home was here: still importable

from .local_chat import LocalChat

log = logging.getLogger(__name__)

BUILTIN_RUBRICS = ("swe", "claw", "gui", "generic")


# ------------------------------------------------------------------------------ rubrics
class Criterion(BaseModel):
    id: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    weight: float = Field(gt=0)
    description: str = Field(min_length=1)


class Rubric(BaseModel):
    name: str
    description: str = ""
    criteria: list[Criterion] = Field(min_length=1)

    @field_validator("criteria")
    @classmethod
    def _unique(cls, v: list[Criterion]) -> list[Criterion]:
        ids = [c.id for c in v]
        if len(set(ids)) != len(ids):
            raise ValueError(f"criterion ids repeat: {ids}")
        return v

    def score(self, verdict: Verdict) -> float:
        weights = {c.id: c.weight for c in self.criteria}
        return sum(weights[c.id] * c.score for c in verdict.criteria) / sum(weights.values())


def load_rubric(spec: str | Path) -> Rubric:
    """A rubric from a YAML file, or a built-in one by name (swe, claw, gui, generic)."""
    import yaml

    if str(spec) in BUILTIN_RUBRICS:
        text = resources.files("orchard_gym.algos").joinpath("rubrics", f"{spec}.yaml").read_text()
        where = f"built-in rubric {spec!r}"
    else:
        path = Path(spec)
        if not path.is_file():
            raise ValueError(f"rubric {str(spec)!r} is neither a file nor a built-in ({', '.join(BUILTIN_RUBRICS)})")
        text, where = path.read_text(), str(path)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"{where}: not YAML: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{where}: a rubric is a mapping with 'name' and 'criteria'")
    try:
        return Rubric(**data)
    except ValidationError as e:
        raise ValueError(f"{where}: {e}") from None


def default_rubric(env_id: str) -> str:
    low = env_id.lower()
    for name in ("swe", "claw", "gui"):
        if name in low:
            return name
    return "generic"


# ------------------------------------------------------------------------------ verdicts
class CriterionScore(BaseModel):
    id: str
    score: float = Field(ge=0.0, le=1.0)
    reason: str = Field(max_length=600)


class Verdict(BaseModel):
    criteria: list[CriterionScore]


def parse_verdict(text: str, rubric: Rubric) -> Verdict:
    """The judge's JSON answer, validated against the schema and the rubric, or ValueError."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("the answer is empty")
    body = text.strip()
    fenced = re.search(r"```(?:json)?\s*(\{.*\})\s*```", body, re.S)
    if fenced:
        body = fenced.group(1)
    try:
        data = json.loads(body)
    except json.JSONDecodeError as e:
        raise ValueError(f"the answer is not JSON ({e})") from None
    try:
        verdict = Verdict(**data) if isinstance(data, dict) else None
    except ValidationError as e:
        raise ValueError("; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())) from None
    if verdict is None:
        raise ValueError('the answer must be a JSON object {"criteria": [...]}')
    want, got = [c.id for c in rubric.criteria], [c.id for c in verdict.criteria]
    if sorted(want) != sorted(got):
        raise ValueError(f"score each criterion exactly once: expected ids {want}, got {got}")
    return verdict


def verdict_schema() -> dict:
    return Verdict.model_json_schema()


# ------------------------------------------------------------------------------ what the judge sees
def clip(text: str, limit: int) -> str:
    """Head and tail of `text` within `limit` characters, with the number clipped in between."""
    if len(text) <= limit:
        return text
    if limit <= 0:
        return f"[{len(text)} chars clipped]"
    head = limit * 2 // 3
    return f"{text[:head]}\n[... {len(text) - limit} chars clipped ...]\n{text[len(text) - (limit - head):]}"


def _action_text(turn) -> str:
    if turn.tool is not None:
        return f"{turn.tool}({json.dumps(turn.arguments or {}, ensure_ascii=False, sort_keys=True)})"
    a = turn.action
    return a if isinstance(a, str) else json.dumps(a, ensure_ascii=False, sort_keys=True, default=str)


def summarise(trajectory, task_text: str, *, max_chars: int = 12_000, observation_chars: int = 1_500,
              task_chars: int = 3_000, show_outcome: bool = True) -> str:
    """The judge's view of one episode: deterministic, within `max_chars` as far as clipping the
    observations allows (actions are never clipped). Only whitelisted fields: no grader report,
    no reward value, no metadata."""
    limit = observation_chars
    while True:
        parts = [f"## Task\n{clip(task_text, task_chars)}", "## Steps"]
        for i, turn in enumerate(trajectory.turns, 1):
            parts.append(f"### Step {i}\nACTION: {_action_text(turn)}\nOBSERVATION: {clip(turn.observation, limit)}")
        report = trajectory.report if isinstance(trajectory.report, dict) else {}
        diff = report.get("diff") or report.get("patch")  # the SWE grader reports the submitted diff as 'patch'
        if isinstance(diff, str) and diff:
            parts.append(f"## Final diff\n{clip(diff, max(limit * 2, 200))}")
        if show_outcome:
            parts.append("## Outcome\n" + ("solved (the task's check passed)" if trajectory.reward > 0
                                           else "not solved (the task's check failed)"))
        text = "\n\n".join(parts)
        if len(text) <= max_chars or limit == 0:
            return text
        limit //= 2


def judge_messages(rubric: Rubric, summary: str) -> list[dict]:
    criteria = "\n".join(f"- {c.id} (weight {c.weight:g}): {c.description}" for c in rubric.criteria)
    example = json.dumps({"criteria": [{"id": c.id, "score": 0.5, "reason": "..."} for c in rubric.criteria[:2]]})
    system = ("You grade how an AI agent worked on a task, against a rubric. Judge the process shown in the "
              "transcript, not only the result. Reply with JSON only, no prose: an object whose 'criteria' lists "
              "every rubric criterion once, each with its 'id', a 'score' from 0.0 (not done) to 1.0 (fully "
              f"done) and a short 'reason'. Example shape: {example}")
    user = f"# Rubric: {rubric.name}\n{rubric.description}\n{criteria}\n\n# Transcript\n{summary}"
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


# ------------------------------------------------------------------------------ judges
class ServerJudge:
    """An OpenAI-compatible chat completions endpoint: `http(s)://HOST:PORT/v1#MODEL` (orchard_gym.endpoint)."""

    def __init__(self, spec: str, *, timeout: float = 60.0, max_tokens: int = 1024, api_key: str | None = None):
        self.endpoint = Endpoint(spec, api_key=api_key, timeout=timeout, usage_source="judge", what="judge")
        self.url, self.model, self.max_tokens = self.endpoint.url, self.endpoint.model, max_tokens
        self.timeout = timeout

    async def complete(self, messages: list[dict]) -> str:
        try:
            reply = await self.endpoint.chat(messages, temperature=0.0, max_tokens=self.max_tokens,
                                             response_format={"type": "json_schema", "json_schema": {
                                                 "name": "verdict", "schema": verdict_schema()}})
        except EndpointError as e:
            raise JudgeError.of(e) from None
        if reply.refusal is not None:
            raise JudgeError(f"judge refused: {reply.refusal[:200]}")
        return reply.content

    async def aclose(self) -> None:
        await self.endpoint.aclose()


class LocalJudge(LocalChat):
    """A Hugging Face chat model on this machine, greedy decoding (algos/local_chat.py)."""

    def __init__(self, path: str, *, max_tokens: int = 512):
        super().__init__(path, max_tokens=max_tokens, what="judge")


def make_judge(spec: str, timeout: float):
    if is_endpoint(spec):
        return ServerJudge(spec, timeout=timeout)
    if Path(spec).is_dir():
        return LocalJudge(spec)
    raise ValueError(f"judge must be URL#MODEL or a local model folder, not {spec!r}")


async def judge_once(judge, rubric: Rubric, summary: str, timeout: float) -> tuple[float, Verdict, int]:
    """(process score, verdict, attempts): one retry after a bad answer, with the error shown."""
    messages = judge_messages(rubric, summary)
    for attempt in (1, 2):
        try:
            text = await asyncio.wait_for(judge.complete(messages), timeout)
        except TimeoutError:
            raise JudgeError(f"judge timed out after {timeout:g}s") from None
        try:
            verdict = parse_verdict(text, rubric)
        except ValueError as e:
            if attempt == 2:
                raise JudgeError(f"judge answer invalid after a retry: {e}") from None
            messages = messages + [{"role": "assistant", "content": text},
                                   {"role": "user", "content": f"Your answer was invalid: {e}. Reply again with "
                                                               "only the JSON object, every criterion once, scores "
                                                               "between 0 and 1."}]
            continue
        return rubric.score(verdict), verdict, attempt
    raise AssertionError("unreachable")


# ------------------------------------------------------------------------------ combination
def parse_combine(spec: str) -> tuple[str, float]:
    """'sum:0.5' | 'gated:0.5' | 'process' -> (rule, parameter)."""
    rule, _, value = str(spec).partition(":")
    defaults = {"sum": 0.5, "gated": 0.5, "process": 0.0}
    if rule not in defaults or (rule == "process" and value):
        raise ValueError(f"rpr combine must be 'sum:LAMBDA', 'gated:THRESHOLD' or 'process', not {spec!r}")
    try:
        param = float(value) if value else defaults[rule]
    except ValueError:
        raise ValueError(f"rpr combine parameter is not a number: {spec!r}") from None
    if param != param or param < 0 or (rule == "gated" and param > 1):
        raise ValueError(f"rpr combine parameter out of range: {spec!r}")
    return rule, param


def combine(outcome: float, process: float, rule: str, param: float) -> float:
    if rule == "sum":
        return outcome + param * process
    if rule == "gated":
        return outcome if process >= param else 0.0
    return process


@dataclass
class RPRConfig:
    """`judge`: URL#MODEL or a local model folder; `rubric`: a YAML file or a built-in name
    (default: by env id); `combine`: 'sum:L', 'gated:T' or 'process'."""

    judge: str = field(metadata={"help": "OpenAI-compatible URL#MODEL, or a local HF model folder"})
    rubric: str | None = field(default=None, metadata={"help": "rubric YAML or swe|claw|gui|generic"})
    combine: str = field(default="sum:0.5", metadata={"help": "sum:LAMBDA | gated:THRESHOLD | process"})
    timeout: float = 60.0
    concurrency: int = 8
    max_chars: int = 12_000
    observation_chars: int = 1_500
    show_outcome: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.judge, str) or not self.judge.strip():
            raise ValueError("rpr judge must be URL#MODEL or a local model folder")
        if is_endpoint(self.judge):
            parse_spec(self.judge, what="the rpr judge")  # a ValueError that says the form
        parse_combine(self.combine)
        if self.rubric is not None:
            load_rubric(self.rubric)
        if not self.timeout > 0 or self.concurrency < 1 or self.max_chars < 200:
            raise ValueError("rpr timeout must be positive, concurrency at least 1, max_chars at least 200")


class RPRScorer:
    """Judges the trained rows of a rollout batch and replaces their rewards by the combination."""

    def __init__(self, config: RPRConfig, tokenizer, *, env_id: str = "", judge=None):
        self.config = config
        self.tokenizer = tokenizer
        self.rubric = load_rubric(config.rubric or default_rubric(env_id))
        self.rule, self.param = parse_combine(config.combine)
        self.judge = judge or make_judge(config.judge, config.timeout)
        self.last_results: list = []

    def task_text(self, sample) -> str:
        return self.tokenizer.decode(sample.prompt_ids, skip_special_tokens=True)

    def __call__(self, out: dict[str, list], samples: Sequence, trained: Sequence[bool], model=None) -> dict:
        started = time.monotonic()
        rows = [i for i, t in enumerate(trained) if t and out["env_reward"][i] is not None]
        cfg = self.config
        summaries = [summarise(samples[i].trajectory, self.task_text(samples[i]), max_chars=cfg.max_chars,
                               observation_chars=cfg.observation_chars, show_outcome=cfg.show_outcome) for i in rows]
        results = LoopThread.shared().run(self._judge_all(summaries)) if rows else []
        self.last_results = results
        processes, dropped, retried, errors = [], 0, 0, []
        for i, result in zip(rows, results, strict=True):
            if isinstance(result, BaseException):
                dropped += 1
                errors.append(str(result))
                out["env_mask"][i] = [0] * len(out["env_mask"][i])
                out["env_reward"][i] = None
                continue
            process, _, attempts = result
            retried += attempts - 1
            processes.append(process)
            out["env_reward"][i] = combine(float(out["env_reward"][i]), process, self.rule, self.param)
        if errors:
            log.warning("judge failed on %d of %d samples (dropped); the first: %s", dropped, len(rows), errors[0])
        return {"rpr/judged": len(rows) - dropped, "rpr/dropped": dropped,
                "rpr/dropped_share": dropped / len(rows) if rows else 0.0, "rpr/retried": retried,
                "rpr/process_mean": sum(processes) / len(processes) if processes else None,
                "rpr/judge_seconds": time.monotonic() - started}

    async def _judge_all(self, summaries: list[str]) -> list:
        gate = asyncio.Semaphore(self.config.concurrency)

        async def one(summary: str):
            async with gate:
                try:
                    return await judge_once(self.judge, self.rubric, summary, self.config.timeout)
                except JudgeError as e:
                    return e
                except Exception as e:  # any failure drops the sample, reported
                    return JudgeError(f"{type(e).__name__}: {e}")

        return list(await asyncio.gather(*(one(s) for s in summaries)))

    def close(self) -> None:
        try:
            LoopThread.shared().run(self.judge.aclose())
        except Exception:
            pass

