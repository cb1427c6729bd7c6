"""An Orchard env's tools as MCP tools of one OpenEnv session (FastMCP, as OpenEnv's `MCPEnvironment`).

Each session gets its own FastMCP server whose tools are the env's own (name, description and
JSON schema from `env.tool_schemas`, the one place they are defined) and whose calls run as steps
of that session's episode only: a session holds no handle on another session's sandbox.

A call's result is the step's observation, as `/ws` steps return it: the text as MCP text
content, and as structured content the whole observation (`text`, `done`, `reward`, `error`,
`action_error`, `report`, `image`), so `MCPToolClient.call_tool(...)` gets the reward of the call
that ended the episode. Calls that are not steps (an unknown tool, arguments the tool's own
`parse` refuses, a call before `reset` or after the end) are MCP errors and change nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastmcp import FastMCP
from fastmcp.tools import Tool as MCPTool
from fastmcp.tools.base import ToolResult
from mcp.types import TextContent

Call = Callable[[str, dict], Awaitable[dict]]  # (tool, arguments) -> the step's observation, as JSON


class Refused(ValueError):
    """A tool call that was not run (nothing changed): an MCP error result with this message."""


class EpisodeTool(MCPTool):
    """One env tool; `run` hands the call to its session's episode."""

    call: Callable[[str, dict], Awaitable[dict]]

    async def run(self, arguments: dict[str, Any]) -> ToolResult:
        try:
            observation = await self.call(self.name, arguments)
        except Refused as e:
            return ToolResult(content=[TextContent(type="text", text=str(e))], is_error=True)
        return ToolResult(content=[TextContent(type="text", text=observation.get("text") or "")],
                          structured_content=observation)


def tools_server(env_id: str, tool_schemas: list[dict], call: Call) -> FastMCP | None:
    """A FastMCP server with one tool per OpenAI-style schema, each run by `call`; None without tools."""
    if not tool_schemas:
        return None
    server: FastMCP = FastMCP(env_id)
    for schema in tool_schemas:
        fn = schema["function"]
        server.add_tool(EpisodeTool(name=fn["name"], description=fn.get("description", ""),
                                    parameters=fn.get("parameters") or {"type": "object", "properties": {}},
                                    call=call))
    return server


def no_tools(env_id: str) -> str:
    return (f"{env_id} has no tools (its actions are not tool calls), so it has no MCP tools: "
            "step it with its own actions over /ws")


__all__ = ["EpisodeTool", "Refused", "no_tools", "tools_server"]
