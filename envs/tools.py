"""Tools an env offers: each with OpenAI-style JSON schema and an async `run`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchard_gym.client import AsyncSandboxInstance

MAX_OBSERVATION = 20_000  # characters of tool output shown to the policy


class ToolError(ValueError):
    """Bad arguments or a refused operation: the message becomes the observation."""


@dataclass
class ToolContext:
    """What a tool needs: the sandbox, where to run, and the env's per-episode state."""

    sandbox: AsyncSandboxInstance
    cwd: str
    env: dict[str, str] = field(default_factory=dict)
    timeout: float = 180.0
    state: dict[str, Any] = field(default_factory=dict)


class ToolResult(BaseModel):
    output: str
    command: str | list[str] | None = None
    exit_code: int | None = None
    duration: float = 0.0
    submitted: bool = False


class Tool(ABC):
    name: ClassVar[str]
    description: ClassVar[str]
    Args: ClassVar[type[BaseModel]]

    def schema(self) -> dict:
        params = self.Args.model_json_schema()
        params.pop("title", None)
        for prop in params.get("properties", {}).values():
            prop.pop("title", None)
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": params}}

    def parse(self, arguments: dict) -> BaseModel:
        try:
            return self.Args.model_validate(arguments)
        except ValidationError as e:
            problems = "; ".join(
                f"{'.'.join(map(str, err['loc'])) or 'arguments'}: {err['msg']}" for err in e.errors()
            )
            raise ToolError(f"bad arguments for {self.name}: {problems}") from None

    @abstractmethod
    async def run(self, ctx: ToolContext, args: BaseModel) -> ToolResult: ...


def clip(text: str, limit: int = MAX_OBSERVATION) -> str:
    """Keep the head and the tail of long output, saying how much was cut."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - limit} characters cut ...]\n{text[-half:]}"


class BashArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    command: str = Field(description="the bash command to run")
    timeout: float | None = Field(None, gt=0, le=3600, description="seconds before it is killed")


class BashTool(Tool):
    name = "bash"
    description = ("Run a bash command in the sandbox (in the repository folder) and see its output. "
                   "State does not persist between calls: cd and export apply to one command only.")
    Args = BashArgs

    async def run(self, ctx: ToolContext, args: BashArgs) -> ToolResult:
        if not args.command.strip():
            raise ToolError("the command is empty")
        result = await ctx.sandbox.exec(args.command, timeout=args.timeout or ctx.timeout, cwd=ctx.cwd, env=ctx.env)
        output = result.stdout + result.stderr
        notes = []
        if result.timed_out:
            notes.append(f"[timed out after {args.timeout or ctx.timeout:.0f}s and was killed]")
        if result.truncated:
            notes.append("[output truncated]")
        if result.exit_code:
            notes.append(f"[exit code {result.exit_code}]")
        text = clip(output) + ("\n" if output and not output.endswith("\n") and notes else "") + " ".join(notes)
        return ToolResult(output=text or "(no output)", command=args.command, exit_code=result.exit_code,
                          duration=result.duration or 0.0)


class SubmitArgs(BaseModel):
    model_config = ConfigDict(extra="ignore")


class SubmitTool(Tool):
    name = "submit"
    description = "Submit your work and end the episode. Call it once the task is done."
    Args = SubmitArgs

    async def run(self, ctx: ToolContext, args: SubmitArgs) -> ToolResult:
        return ToolResult(output="Submitted.", submitted=True)
