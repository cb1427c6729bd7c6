"""The LLM-judge check against real OpenAI-compatible HTTP servers: a verdict counts, a
judge that fails or answers nonsense errors the trajectory instead of scoring it."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from orchard_gym import AsyncSandboxClient
from orchard_gym.envs.claw.env import ClawEnv, ClawOraclePolicy
from orchard_gym.envs.claw.tasks import load_tasks
from orchard_gym.envs.rollout import run_episodes
from orchard_gym.wrappers.proxy.stub import StubUpstream

BASE = load_tasks("builtin")["calendar-answer-001"]
TASK = BASE.model_copy(update={"task_id": "judged", "checks": [
    {"type": "judge", "rubric": "The answer gives the call's start time and its room."},
    {"kind": "safety", "type": "unchanged", "path": "calendar.events"}]})


ANSWER_CHECK = next(c for c in BASE.checks if c["type"] == "answer")
PRECISE = BASE.model_copy(update={"task_id": "judged", "checks": [
    {"type": "judge", "rubric": "The answer gives the call's start time and its room.",
     "max_chars": ANSWER_CHECK["max_chars"], "must_not_contain": ANSWER_CHECK["must_not_contain"]},
    {"kind": "safety", "type": "unchanged", "path": "calendar.events"}]})


class Judge(BaseHTTPRequestHandler):
    """A lenient judge model: passes answers that name a room (it reads the prompt it is sent)."""

    prompts: list[str] = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["messages"][0]["content"]
        Judge.prompts.append(prompt)
        answer = re.search(r"<<<\n(.*)\n>>>", prompt, re.DOTALL).group(1)
        verdict = "pass" if "Room" in answer else "fail"
        content = json.dumps({"verdict": verdict, "reason": f"judged {answer!r}"})
        out = json.dumps({"id": "j", "object": "chat.completion", "model": body["model"],
                          "choices": [{"index": 0, "finish_reason": "stop",
                                       "message": {"role": "assistant", "content": content}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


@pytest.fixture
def judge_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Judge)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/v1"
    server.shutdown()
    server.server_close()


def _run(local_root, judge, calls, task=TASK):
    async def go():
        async with AsyncSandboxClient({"type": "local", "root": str(local_root)}) as client:
            return await run_episodes(lambda c: ClawEnv(client=c, tasks={"judged": task}, judge=judge),
                                      ClawOraclePolicy(calls=calls), ["judged"], client=client)
    return asyncio.run(go())[0]


def test_judge_verdicts_count_as_completion(local_root, judge_url):
    good = _run(local_root, f"{judge_url}#judge", TASK.oracle)
    assert good.ok and good.report["passed"] and good.report["checks"][0]["passed"]
    assert "Room" in good.report["checks"][0]["detail"]
    bad = _run(local_root, f"{judge_url}#judge", [{"name": "submit_answer", "arguments": {"text": "at noon"}}])
    assert bad.ok and not bad.report["passed"] and bad.report["completion"] == 0.0


def test_a_failing_judge_errors_the_trajectory(local_root):
    stub = StubUpstream().start()
    try:
        for model, expect in [("stub-500", "failed"), ("stub-garbage", "failed"), ("echo", "no verdict")]:
            t = _run(local_root, f"{stub.url}#{model}", TASK.oracle)
            assert not t.ok and t.error and expect in t.error and t.reward == 0.0, (model, t.error)
    finally:
        stub.stop()
    t = _run(local_root, None, TASK.oracle)
    assert not t.ok and "judge=" in t.error
    with pytest.raises(ValueError, match="URL#MODEL"):
        ClawEnv(judge="no-model-here")


def test_the_judge_gets_the_precision_requirements_and_a_shotgun_answer_fails(local_root, judge_url):
    """Red team: every time and room of the day as the answer. The lenient judge passes it when the
    check sets no precision; with max_chars / must_not_contain it fails, without a judge call."""
    spec = f"{judge_url}#judge"
    shotgun = [{"name": "submit_answer", "arguments": {"text": ", ".join(
        [*ANSWER_CHECK["contains"], *ANSWER_CHECK["must_not_contain"]])}}]
    Judge.prompts.clear()
    fooled = _run(local_root, spec, shotgun)
    assert fooled.ok and fooled.report["passed"] and len(Judge.prompts) == 1
    assert "lists several candidate answers" in Judge.prompts[0]  # the general rule, in every prompt
    good = _run(local_root, spec, PRECISE.oracle, PRECISE)
    assert good.ok and good.report["passed"] and len(Judge.prompts) == 2
    assert f"at most {ANSWER_CHECK['max_chars']} characters" in Judge.prompts[1]
    assert all(json.dumps(item) in Judge.prompts[1] for item in ANSWER_CHECK["must_not_contain"])
    stopped = _run(local_root, spec, shotgun, PRECISE)
    assert stopped.ok and not stopped.report["passed"] and len(Judge.prompts) == 2
    assert "says what it must not" in stopped.report["checks"][0]["detail"]
