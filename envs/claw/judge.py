"""The optional LLM-judge check: a free-text answer judged by any OpenAI-compatible endpoint.

    {"type": "judge", "rubric": "The answer names the two overdue invoices and their amounts.",
     "max_chars": 300, "must_not_contain": ["INV-0042"]}      # optional precision, as for `answer`

The env is given `judge="URL#MODEL"` (and `judge_api_key=`). The judge is asked for a JSON
object `{"verdict": "pass"|"fail", "reason": ...}`. The prompt carries the precision
requirements: a shotgun answer (candidates listed, records pasted) fails, and so does one that
breaks the check's `max_chars` or `must_not_contain` — which checks.py also enforces itself,
so such an answer fails without a judge call. When the endpoint fails or answers
something else, grading raises `JudgeError` (orchard_gym.errors; `JudgeFailed` is its old
name): the trajectory is marked errored (like a dead sandbox) and trainers drop it; a score is
never made up. The call goes through `orchard_gym.endpoint` (retries, timeout, the judge's
tokens into the episode's ledger as `source="judge"`).
"""

from __future__ import annotations

import json
import re

from orchard_gym.endpoint import Endpoint
from orchard_gym.endpoint import parse_spec as parse_endpoint
from orchard_gym.errors import EndpointError, JudgeError

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


JudgeFailed = JudgeError  # the old name (deprecated): one judge error for every judge


def parse_spec(spec: str) -> tuple[str, str]:
    """(chat completions URL, model) of `URL#MODEL` (deprecated: `orchard_gym.endpoint.parse_spec`)."""
    parsed = parse_endpoint(spec, what="judge=")
    return parsed.route("chat/completions"), str(parsed.model)


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
    """(passed, reason) of a judge check's rubric and precision requirements; JudgeError when
    there is no verdict to be had."""
    prompt = PROMPT.format(instruction=instruction, rubric=check["rubric"], requirements=requirements(check),
                           answer=answer or "(no answer given)")
    endpoint = Endpoint(spec, api_key=api_key, timeout=timeout, usage_source="judge", what="judge=")
    try:
        reply = await endpoint.chat([{"role": "user", "content": prompt}], temperature=0.0, max_tokens=400)
    except EndpointError as e:
        raise JudgeError(f"the judge at {endpoint.url} failed: {type(e).__name__}: {e}") from None
    finally:
        await endpoint.aclose()
    content = reply.content
    match = re.search(r"\{.*\}", content, re.DOTALL)
    try:
        verdict = json.loads(match.group(0)) if match else None
    except ValueError:
        verdict = None
    if not isinstance(verdict, dict) or verdict.get("verdict") not in ("pass", "fail"):
        raise JudgeError(f"the judge gave no verdict: {content[:200]!r}")
    return verdict["verdict"] == "pass", str(verdict.get("reason", ""))[:500]
