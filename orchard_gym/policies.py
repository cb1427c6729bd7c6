"""Policies for `orchard eval`: the env's oracle, a do-nothing baseline and any OpenAI-compatible model.

A policy is `async (messages, tools) -> action`, the contract of `envs.rollout`.
"""

from __future__ import annotations

from typing import Any

import httpx

from .endpoint import Endpoint
from .errors import EndpointBadResponse, InvalidRequest


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

    `spec` is `URL#MODEL` or `openai:URL#MODEL`, e.g. `http://localhost:8000/v1#Qwen/Qwen3-8B`
    (orchard_gym.endpoint: retries, timeouts, typed `EndpointError`s, usage into the ledger).
    A ReAct loop: the model's tool call (or a fenced bash block in plain text) is the action.
    """

    def __init__(self, spec: str, api_key: str | None = None, temperature: float = 0.0, max_tokens: int = 2048,
                 timeout: float = 300.0):
        self.endpoint = Endpoint(spec, api_key=api_key, timeout=timeout, usage_source="policy",
                                 what="an openai policy")
        self.model, self.url = self.endpoint.model, self.endpoint.spec.route("chat/completions")
        self.temperature, self.max_tokens = temperature, max_tokens

    @property
    def http(self) -> httpx.AsyncClient:
        return self.endpoint.http

    async def __call__(self, messages: list[dict], tools: list[dict]) -> Any:
        reply = await self.endpoint.chat(messages, tools=tools, tool_choice="auto", temperature=self.temperature,
                                         max_tokens=self.max_tokens)
        if reply.tool_calls:
            call = reply.tool_calls[0]
            try:
                return {"id": call.get("id"), "name": call["function"]["name"],
                        "arguments": call["function"].get("arguments") or "{}"}
            except (KeyError, TypeError, AttributeError):
                raise EndpointBadResponse(f"{self.url} answered a malformed tool call: {str(call)[:200]}",
                                          url=self.url) from None
        return reply.content

    async def aclose(self) -> None:
        await self.endpoint.aclose()

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
