"""The optional LLM-judge check: a free-text answer judged by any OpenAI-compatible endpoint.

    {"type": "judge", "rubric": "The answer names the two overdue invoices and their amounts.",
     "max_chars": 300, "must_not_contain": ["INV-0042"]}      # optional precision, as for `answer`

The env is given `judge="URL#MODEL"` (and `judge_api_key=`). The judge is asked for a JSON
object `{"verdict": "pass"|"fail", "reason": ...}`. The prompt carries the precision
requirements: a shotgun answer (candidates listed, records pasted) fails, and so does one that
breaks the check's `max_chars` or `must_not_contain` — which checks.py also enforces itself,
so such an answer fails without a judge call. When the endpoint fails or answers
something else, grading raises `JudgeFailed`: the trajectory is marked errored (like a dead
sandbox) and trainers drop it; a score is never made up.
"""

from __future__ import annotations

import json
import re

import httpx

from orchard_gym.errors import SandboxFailed

PROMPT = """You grade an assistant's final answer to a user's task. Reply with only a JSON object
{{"verdict": "pass" or "fail", "reason": "<one sentence>"}}.

Task given to the assistant:
{instruction}

Rubric (the answer passes only if it meets all of it):
{rubric}

Precision (as binding as the rubric): the answer must answer the task, not cover every
possibility. It fails if it lists several candidate answers, or pastes records, files or
messages instead of answering.{requirements}

The assistant's final answer:
<<<
{answer}
>>>"""


class JudgeFailed(SandboxFailed):
    """The judge could not give a verdict: an infrastructure failure, not the policy's."""


def parse_spec(spec: str) -> tuple[str, str]:
    if "#" not in spec:
        raise ValueError("judge= is 'URL#MODEL', e.g. http://localhost:8000/v1#Qwen/Qwen3-8B")
    url, model = spec.split("#", 1)
    return url.rstrip("/") + "/chat/completions", model


def requirements(check: dict) -> str:
    """The check's own precision requirements, in words, for the prompt."""
    out = ""
    if check.get("max_chars") is not None:
        out += f"\nIt must be at most {check['max_chars']} characters long."
    if check.get("must_not_contain"):
        out += ("\nIt must not say any of these (they belong to other records, not to what was asked): "
                + "; ".join(map(json.dumps, check["must_not_contain"])) + ".")
    return out


async def judge(spec: str, api_key: str | None, check: dict, instruction: str, answer: str,
                timeout: float = 120.0) -> tuple[bool, str]:
    """(passed, reason) of a judge check's rubric and precision requirements; JudgeFailed when
    there is no verdict to be had."""
    url, model = parse_spec(spec)
    prompt = PROMPT.format(instruction=instruction, rubric=check["rubric"], requirements=requirements(check),
                           answer=answer or "(no answer given)")
    body = {"model": model, "temperature": 0.0, "max_tokens": 400, "messages": [{"role": "user", "content": prompt}]}
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with httpx.AsyncClient(timeout=timeout) as http:
            resp = await http.post(url, json=body, headers=headers)
        resp.raise_for_status()
        content = resp.json()["choices"][0]["message"]["content"]
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as e:
        raise JudgeFailed(f"the judge at {url} failed: {type(e).__name__}: {e}") from None
    match = re.search(r"\{.*\}", content or "", re.DOTALL)
    try:
        verdict = json.loads(match.group(0)) if match else None
    except ValueError:
        verdict = None
    if not isinstance(verdict, dict) or verdict.get("verdict") not in ("pass", "fail"):
        raise JudgeFailed(f"the judge gave no verdict: {str(content)[:200]!r}")
    return verdict["verdict"] == "pass", str(verdict.get("reason", ""))[:500]
