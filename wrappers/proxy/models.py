"""The recording proxy's config and control-API bodies."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .records import Mode


class ProxyConfig(BaseModel):
    """How the proxy listens and where (if anywhere) it forwards."""

    model_config = ConfigDict(extra="forbid")

    host: str = Field("127.0.0.1", description="TCP address to listen on")
    port: int = Field(0, ge=0, le=65535, description="TCP port (0: any free port)")
    uds: str | None = Field(None, description="also listen on this unix socket (model endpoints only)")
    upstream: str | None = Field(None, description="OpenAI-compatible base URL, e.g. http://localhost:8000/v1")
    upstream_api_key: str | None = Field(None, description="API key for the upstream (never the rollout token)")
    upstream_model: str | None = Field(None, description="model name sent upstream instead of the harness's")
    upstream_timeout: float = Field(600.0, gt=0, description="seconds for one upstream call")
    admin_key: str | None = Field(None, description="key of the control API (generated when absent)")
    public_url: str | None = Field(None, description="base of the URLs handed out (default http://HOST:PORT)")
    model_name: str = Field("orchard-policy", description="the model /v1/models lists in policy mode")
    policy_timeout: float | None = Field(None, gt=0, description="seconds a parked call waits for the policy")


class OpenRollout(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: Mode | None = Field(None, description="default: upstream when the proxy has one, else policy")
    metadata: dict[str, Any] = Field(default_factory=dict)
    rollout_id: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]{1,128}$")


class FinishRollout(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reward: float | None = None
    error: str | None = Field(None, min_length=1)


class Answer(BaseModel):
    model_config = ConfigDict(extra="forbid")

    message: Any = Field(description="the assistant message: text, a tool call, a list of them, or a message dict")
    usage: dict[str, Any] | None = None
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[dict[str, Any]] | None = None
