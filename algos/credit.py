"""Credit assignment for unresolved trajectories (Orchard §3.3): a retrospective value curve,
per-step credit and rise segments.

- A judge sees the whole trajectory and its gold test outcome and estimates, at a sparse
  set of key steps, the probability that the agent resolves the task given the history
  so far; the values in between are interpolated linearly (held flat before the first
  and after the last key step): V(s_0) .. V(s_T) for T actions.
- Credit of action t: `c_t = V(s_{t+1}) - V(s_t)`.
- Rise segments: maximal runs of actions with `c_t >= eps` (eps = 0.05); a tie at eps
  counts as a rise (compared with a 1e-9 tolerance, so 0.25 - 0.2 is a tie).
- A judge that fails (an HTTP error, a timeout, output that is no JSON, a step or a
  probability out of range) drops the trajectory: values are never invented or clipped.

Judges: `OpenAIJudge` (any OpenAI-compatible endpoint), `LocalJudge` (a local HF causal
LM), `ValueJudge` (the value model of `algos/value.py` stands in). The prompt is a file
(`prompts/credit_judge.md` by default) with the fields {task}, {trajectory},
{num_steps} and {outcome}.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from orchard_gym.endpoint import Endpoint
from orchard_gym.errors import EndpointError, JudgeError  # JudgeError's old home was here: still importable

from .local_chat import LocalChat
from .trajectory_pool import PoolEntry
from .pool_tokens import spans_of

DEFAULT_PROMPT = Path(__file__).parent / "prompts" / "credit_judge.md"
TIE = 1e-9


# ------------------------------------------------------------------------------ the maths
def interpolate(keys: dict[int, float], num_states: int) -> list[float]:
    """Values at states 0..num_states-1 from values at a few key states."""
    if not keys:
        raise JudgeError("no key steps")
    points = sorted(keys.items())
    out = []
    for s in range(num_states):
        if s <= points[0][0]:
            out.append(points[0][1])
        elif s >= points[-1][0]:
            out.append(points[-1][1])
        else:
            for (a, va), (b, vb) in zip(points, points[1:], strict=False):
                if a <= s <= b:
                    out.append(va + (vb - va) * (s - a) / (b - a))
                    break
    return out


def credits(curve: Sequence[float]) -> list[float]:
    """c_t = V(s_{t+1}) - V(s_t) for each action t (len(curve) - 1 of them)."""
    return [curve[t + 1] - curve[t] for t in range(len(curve) - 1)]


def rise_segments(c: Sequence[float], eps: float = 0.05) -> list[tuple[int, int]]:
    """Maximal runs [i, j) of actions with c_t >= eps (state span [s_i, s_j])."""
    return spans_of([v >= eps - TIE for v in c])


def trained_actions(entry: PoolEntry, curve: Sequence[float] | None, eps: float = 0.05) -> list[int]:
    """Which actions carry SFT loss: all of a resolved trajectory's, else those in rise segments."""
    if entry.resolved:
        return list(range(len(entry.actions())))
    if curve is None:
        raise ValueError("an unresolved trajectory needs its value curve")
    return [t for i, j in rise_segments(credits(curve), eps) for t in range(i, j)]


# ------------------------------------------------------------------------------ parsing the judge
def parse_judgement(text: str, num_actions: int) -> dict[int, float]:
    """{step: probability} from the judge's answer; a `JudgeError` on anything malformed."""
    if not isinstance(text, str) or not text.strip():
        raise JudgeError("empty judge answer")
    m = re.search(r"\{.*\}", text, re.DOTALL)
    if not m:
        raise JudgeError("no JSON object in the judge answer")
    try:
        obj = json.loads(m.group(0))
    except json.JSONDecodeError as e:
        raise JudgeError(f"the judge answer is no JSON: {e}") from None
    values = obj.get("values") if isinstance(obj, dict) else None
    if not isinstance(values, list) or not values:
        raise JudgeError('the judge answer has no "values" list')
    keys: dict[int, float] = {}
    for v in values:
        if not isinstance(v, dict):
            raise JudgeError(f"a value entry is no object: {v!r}")
        step, p = v.get("step"), v.get("p")
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= num_actions:
            raise JudgeError(f"step {step!r} is not an integer in [0, {num_actions}]")
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not math.isfinite(p) or not 0.0 <= p <= 1.0:
            raise JudgeError(f"probability {p!r} at step {step} is not in [0, 1]")
        if step in keys and keys[step] != float(p):
            raise JudgeError(f"step {step} given twice with different values")
        keys[step] = float(p)
    return keys


def render_trajectory(entry: PoolEntry, max_chars: int = 2000) -> tuple[str, str]:
    """(task text, numbered steps) for the judge prompt."""
    msgs = entry.messages
    first = next((i for i, m in enumerate(msgs) if m.get("role") == "assistant"), len(msgs))
    task = "\n".join(str(m.get("content") or "") for m in msgs[:first] if m.get("role") == "user")
    steps, t = [], 0
    for i in range(first, len(msgs), 2):
        a = msgs[i]
        calls = a.get("tool_calls")
        action = (f"{calls[0]['function']['name']}({calls[0]['function'].get('arguments')})" if calls
                  else str(a.get("content") or ""))
        obs = str(msgs[i + 1].get("content") or "") if i + 1 < len(msgs) else ""
        steps.append(f"### Step {t}\nACTION: {action[:max_chars]}\nOBSERVATION: {obs[:max_chars]}")
        t += 1
    return task, "\n\n".join(steps)


class PromptJudge:
    """A judge that fills the prompt file and parses a text answer (`complete(prompt) -> text`)."""

    def __init__(self, prompt_path: str | Path | None = None):
        path = Path(prompt_path or DEFAULT_PROMPT)
        try:
            self.template = path.read_text()
        except OSError as e:
            raise ValueError(f"judge prompt {path}: {e.strerror}") from None
        for name in ("{trajectory}", "{num_steps}", "{outcome}"):
            if name not in self.template:
                raise ValueError(f"judge prompt {path} lacks the field {name}")

    def prompt(self, entry: PoolEntry) -> str:
        task, steps = render_trajectory(entry)
        n = len(entry.actions())
        return self.template.format(task=task, trajectory=steps, num_steps=n,
                                    outcome="resolved" if entry.resolved else "not resolved (the tests failed)")

    def complete(self, prompt: str) -> str:
        raise NotImplementedError

    def __call__(self, entry: PoolEntry) -> list[float]:
        n = len(entry.actions())
        try:
            text = self.complete(self.prompt(entry))
        except JudgeError:
            raise
        except Exception as e:  # any failure of the judge drops the trajectory
            raise JudgeError(f"judge call failed: {type(e).__name__}: {e}") from None
        return interpolate(parse_judgement(text, n), n + 1)


class OpenAIJudge(PromptJudge):
    """Chat completions at an OpenAI-compatible endpoint: `URL#MODEL` (orchard_gym.endpoint)."""

    def __init__(self, spec: str, prompt_path: str | Path | None = None, *, api_key: str | None = None,
                 timeout: float = 120.0, max_tokens: int = 1024):
        super().__init__(prompt_path)
        self.endpoint = Endpoint(spec, api_key=api_key, timeout=timeout, usage_source="judge", what="the judge")
        self.model, self.url = self.endpoint.model, self.endpoint.spec.route("chat/completions")
        self.timeout, self.max_tokens = timeout, max_tokens

    def complete(self, prompt: str) -> str:
        try:
            reply = self.endpoint.chat_sync([{"role": "user", "content": prompt}], temperature=0.0,
                                            max_tokens=self.max_tokens)
        except EndpointError as e:
            raise JudgeError.of(e) from None
        return reply.content


class LocalJudge(PromptJudge):
    """A local Hugging Face causal LM, greedy, through its chat template (algos/local_chat.py)."""

    def __init__(self, model_path: str | Path, prompt_path: str | Path | None = None, max_new_tokens: int = 512):
        super().__init__(prompt_path)
        self.chat = LocalChat(model_path, max_tokens=max_new_tokens, what="judge")
        self.tokenizer, self.model, self.max_new_tokens = self.chat.tokenizer, self.chat.model, max_new_tokens

    def complete(self, prompt: str) -> str:
        return self.chat.generate([{"role": "user", "content": prompt}])


class MonteCarloJudge:
    """Branching rollouts stand in for the judge: the Monte Carlo values of the entry's states
    (`metadata["mc_values"]`, envs/branching.py) and its outcome at the end, interpolated between."""

    def __call__(self, entry: PoolEntry) -> list[float]:
        n = len(entry.actions())
        keys = {int(k): float(p) for k, p in (entry.metadata.get("mc_values") or {}).items()
                if p is not None and 0 <= int(k) < n}
        if not keys:
            raise JudgeError("no Monte Carlo values (not the root of a branching rollout)")
        keys[n] = 1.0 if entry.resolved else 0.0
        return interpolate(keys, n + 1)


class ValueJudge:
    """The value model stands in for the judge: V(s_0)..V(s_T) mapped onto [0, 1]."""

    def __init__(self, model):
        self.model = model

    def __call__(self, entry: PoolEntry) -> list[float]:
        values = self.model.state_values(entry)
        if any(not math.isfinite(v) for v in values):
            raise JudgeError("the value model gave a non-finite value")
        return [self.model.probability(v) for v in values]


def annotate(entries: Sequence[PoolEntry], judge, *, concurrency: int = 4
             ) -> tuple[list[tuple[PoolEntry, list[float] | None]], Counter]:
    """(entry, curve) for every resolved entry (curve None: all actions train) and every
    unresolved one the judge could score; the others are dropped and counted by reason."""
    dropped: Counter = Counter()
    todo = [e for e in entries if not e.resolved]

    def one(e: PoolEntry):
        try:
            curve = judge(e)
        except JudgeError as err:
            return e, None, str(err)
        if len(curve) != len(e.actions()) + 1:
            return e, None, f"the curve has {len(curve)} values for {len(e.actions()) + 1} states"
        return e, curve, None

    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        results = {id(e): r for e, r in zip(todo, pool.map(one, todo), strict=True)}
    out = []
    for e in entries:
        if e.resolved:
            out.append((e, None))
            continue
        _, curve, err = results[id(e)]
        if err is not None:
            dropped[err.split(":")[0][:80]] += 1
            continue
        out.append((e, curve))
    return out, dropped
