"""Loopback servers for the dense-signal tests and demos (OPD teacher, RPR judge).

`TeacherServer(model, tokenizer)`: a real Hugging Face model behind vLLM's completions API
shape for prompt log-probs: POST /v1/completions with `"prompt": [ids]` or `[[ids], ...]`,
`"prompt_logprobs": 0` answers one choice per prompt whose `prompt_logprobs` is
`[None, {"<id>": {"logprob": ..., "rank": ..., "decoded_token": ...}}, ...]`, as vLLM does.
`fail_every=N` answers every N-th request with HTTP 500 (teacher failures).

`JudgeStub()`: an OpenAI-compatible chat endpoint whose verdicts are scripted by a marker
in the transcript it is sent: `JUDGE:score=0.8` (every criterion that score),
`JUDGE:malformed-once` (prose first, then a valid verdict on the retry), `JUDGE:malformed`
(always prose), `JUDGE:range` (a score of 7), `JUDGE:refuse` (an OpenAI refusal),
`JUDGE:slow` (answers after 30 s: a timeout), no marker: score 0.5; `refuse_every=N`
refuses every N-th request. Requests are kept
in `.requests` so tests can check what the judge saw.
"""

from __future__ import annotations

import asyncio
import json
import re

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from orchard_gym.wrappers.proxy import ProxyConfig, RecordingProxy


class _Served:
    app: Starlette

    def __init__(self):
        self._runner = RecordingProxy(ProxyConfig(host="127.0.0.1", port=0))
        self._runner.app = self.app

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._runner.port}/v1"

    def start(self):
        self._runner.start_in_thread()
        return self

    def stop(self) -> None:
        self._runner.stop_in_thread()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class TeacherServer(_Served):
    def __init__(self, model, tokenizer, *, name: str = "teacher", fail_every: int = 0):
        self.model, self.tokenizer, self.name, self.fail_every = model, tokenizer, name, fail_every
        self.requests = 0
        self.prompts = 0
        self.app = Starlette(routes=[Route("/v1/completions", self.completions, methods=["POST"]),
                                     Route("/v1/models", self.models, methods=["GET"])])
        super().__init__()

    async def models(self, request: Request):
        return JSONResponse({"object": "list", "data": [{"id": self.name, "object": "model"}]})

    def _score(self, ids: list[int]) -> list:
        import torch

        with torch.no_grad():
            logits = self.model(torch.tensor([ids])).logits[0].float()
        logps = torch.log_softmax(logits, -1)
        out: list = [None]
        for j in range(1, len(ids)):
            row = logps[j - 1]
            tok = ids[j]
            out.append({str(tok): {"logprob": float(row[tok]), "rank": int((row > row[tok]).sum()) + 1,
                                   "decoded_token": self.tokenizer.decode([tok])}})
        return out

    async def completions(self, request: Request):
        self.requests += 1
        number = self.requests  # before any await: concurrent requests must not shift which one fails
        body = await request.json()
        if body.get("model") != self.name:
            return JSONResponse({"error": {"message": f"model {body.get('model')!r} not served"}}, status_code=404)
        if self.fail_every and number % self.fail_every == 0:
            return JSONResponse({"error": {"message": "injected failure"}}, status_code=500)
        prompt = body.get("prompt")
        prompts = prompt if prompt and isinstance(prompt[0], list) else [prompt]
        if not all(isinstance(p, list) and p and all(isinstance(t, int) for t in p) for p in prompts):
            return JSONResponse({"error": {"message": "prompt must be token ids"}}, status_code=400)
        self.prompts += len(prompts)
        want = body.get("prompt_logprobs") is not None
        choices = []
        for i, ids in enumerate(prompts):
            scored = await asyncio.to_thread(self._score, ids) if want else None
            choices.append({"index": i, "text": "", "finish_reason": "length", "logprobs": None,
                            "prompt_logprobs": scored})
        return JSONResponse({"id": "cmpl-teacher", "object": "text_completion", "model": self.name,
                             "choices": choices})


MARK = re.compile(r"JUDGE:([a-z-]+)(?:=([0-9.]+))?")


class JudgeStub(_Served):
    def __init__(self, *, slow_seconds: float = 30.0, refuse_every: int = 0):
        self.slow_seconds = slow_seconds
        self.refuse_every = refuse_every  # every N-th request is refused (demo of dropped samples)
        self.requests: list[dict] = []
        self.app = Starlette(routes=[Route("/v1/chat/completions", self.chat, methods=["POST"])])
        super().__init__()

    @staticmethod
    def _ids(text: str) -> list[str]:
        return re.findall(r"^- ([a-z][a-z0-9_]*) \(weight", text, re.M)

    async def chat(self, request: Request):
        body = await request.json()
        self.requests.append(body)
        user = next(m["content"] for m in body["messages"] if m["role"] == "user")
        retry = sum(1 for m in body["messages"] if m["role"] == "assistant") > 0
        m = MARK.search(user)
        kind, value = (m.group(1), m.group(2)) if m else ("score", "0.5")
        ids = self._ids(user)
        if kind == "slow":
            await asyncio.sleep(self.slow_seconds)
        if kind == "refuse" or (self.refuse_every and len(self.requests) % self.refuse_every == 0):
            return self._answer(None, refusal="I can't help with grading this.")
        if kind == "malformed" or (kind == "malformed-once" and not retry):
            return self._answer("Looks good to me, I'd give it a high score.")
        score = 7.0 if kind == "range" else float(value or 0.75 if kind == "malformed-once" else value or 0.5)
        verdict = {"criteria": [{"id": i, "score": score, "reason": "scripted"} for i in ids]}
        return self._answer(json.dumps(verdict))

    @staticmethod
    def _answer(content, refusal=None):
        return JSONResponse({"id": "chat-judge", "object": "chat.completion", "model": "judge", "choices": [
            {"index": 0, "finish_reason": "stop",
             "message": {"role": "assistant", "content": content, "refusal": refusal}}]})


def hand_logprobs(model, ids: list[int], start: int) -> list[float]:
    """log p(ids[j] | ids[:j]) for j >= start, one prefix at a time (no batching, no padding): the
    independent computation the OPD tests compare the trainer's signal with."""
    import torch

    out = []
    with torch.no_grad():
        for j in range(start, len(ids)):
            logits = model(torch.tensor([ids[:j]])).logits[0, -1].double()
            out.append(float(logits[ids[j]] - torch.logsumexp(logits, -1)))
    return out
