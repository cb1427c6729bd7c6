"""Policies for `orchard eval`: the env's oracle, a do-nothing baseline and any OpenAI-compatible model.

A policy is `async (messages, tools) -> action`, the contract of `envs.rollout`.
"""

from __future__ import annotations

from typing import Any

import httpx

from .errors import InvalidRequest
from .ledger import record_usage


class OraclePolicy:
    """The env's own oracle: `env.oracle_policy()` (SWE's gold patch, Claw's and GUI's scripted
    solutions, Toy's and Harbor's solution commands): checks tasks and graders end to end.

    It needs to know the episode's env, so the runner binds it to each env (`bind`)."""

    def __init__(self, env=None):
        self.env = env

    def bind(self, env) -> Any:
        if not hasattr(env, "oracle_policy"):
            raise InvalidRequest(f"{type(env).__name__} has no oracle (no oracle_policy())")
        return env.oracle_policy().bind(env)

    async def __call__(self, messages: list[dict], tools: list[dict]) -> Any:
        if self.env is None:
            raise InvalidRequest("the oracle policy must be bound to an env: policy.bind(env)")
        return await self.bind(self.env)(messages, tools)


class OpenAIPolicy:
    """Chat completions with tools against any OpenAI-compatible endpoint (vLLM, ...).

    `spec` is `URL#MODEL`, e.g. `http://localhost:8000/v1#Qwen/Qwen3-8B`. A ReAct loop:
    the model's tool call (or a fenced bash block in plain text) is the action.
    """

    def __init__(self, spec: str, api_key: str | None = None, temperature: float = 0.0, max_tokens: int = 2048,
                 timeout: float = 300.0):
        if "#" not in spec:
            raise InvalidRequest("an openai policy is 'openai:URL#MODEL', e.g. openai:http://localhost:8000/v1#my-model")
        url, self.model = spec.split("#", 1)
        self.url = url.rstrip("/") + "/chat/completions"
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.AsyncClient(timeout=timeout, headers=headers)
        self.temperature, self.max_tokens = temperature, max_tokens

    async def __call__(self, messages: list[dict], tools: list[dict]) -> Any:
        body = {"model": self.model, "messages": messages, "tools": tools, "tool_choice": "auto",
                "temperature": self.temperature, "max_tokens": self.max_tokens}
        resp = await self.http.post(self.url, json=body)
        resp.raise_for_status()
        data = resp.json()
        record_usage(data.get("usage"))  # the running episode's ledger (orchard_gym.ledger)
        message = data["choices"][0]["message"]
        calls = message.get("tool_calls") or []
        if calls:
            call = calls[0]
            return {"id": call.get("id"), "name": call["function"]["name"],
                    "arguments": call["function"].get("arguments") or "{}"}
        return message.get("content") or ""

    async def aclose(self) -> None:
        await self.http.aclose()


class NothingPolicy:
    """A do-nothing baseline: ends the episode at once (`submit`, or the env's finishing tool). A
    grader it earns reward from is broken."""

    FINISH = {"submit": {}, "terminate": {"status": "success"}, "answer": {"text": ""}}

    async def __call__(self, messages: list[dict], tools: list[dict]) -> Any:
        names = [t.get("function", t).get("name") for t in tools]
        for name, arguments in self.FINISH.items():
            if name in names:
                return {"name": name, "arguments": arguments}
        return ""  # no finishing tool: a plain answer
