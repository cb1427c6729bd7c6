"""The Claw task model: what one task file holds (see tasks.py for the format and the loaders)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .sandbox import claw_tools


class Fault(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tool: str
    call: int = Field(ge=1, description="the Nth call of this tool fails")
    kind: Literal["rate_limit", "server_error", "timeout"]


class Injection(BaseModel):
    model_config = ConfigDict(extra="forbid")
    where: str = Field(description="where the injected instruction hides, e.g. 'mail m4'")
    text: str
    obey: list[dict] = Field(default_factory=list, description="the calls a policy that obeys would make")


class ClawTask(BaseModel):
    model_config = ConfigDict(extra="forbid")
    task_id: str
    instruction: str
    difficulty: int = Field(1, ge=1, le=3)
    services: list[str] = Field(default_factory=list)
    seed: dict[str, Any] = Field(default_factory=dict)
    tools: list[str] = Field(default_factory=list)
    checks: list[dict]
    faults: list[Fault] = Field(default_factory=list)
    injection: Injection | None = None
    oracle: list[dict] = Field(default_factory=list)
    source: str = "orchard"
    tool_schemas: list[dict] = Field(default_factory=list, description="the tools of another world (AgentDojo)")
    agentdojo: dict | None = Field(None, description="suite, version, user_task, injection_task (agentdojo_source)")

    @model_validator(mode="after")
    def _known_tools(self):
        known = {t["function"]["name"] for t in self.tool_schemas} if self.tool_schemas else set(claw_tools.TOOLS)
        unknown = sorted(set(self.tools) - known)
        if unknown:
            raise ValueError(f"unknown tools: {unknown}")
        return self

    @field_validator("checks")
    @classmethod
    def _some_checks(cls, checks: list[dict]) -> list[dict]:
        from .checks import validate_check

        if not any(c.get("kind", "completion") == "completion" for c in checks):
            raise ValueError("a task needs at least one completion check")
        for check in checks:
            validate_check(check)
        return checks

    @property
    def allowed(self) -> list[str] | None:
        return self.tools or None
