"""Turning what a policy emits into a tool call, or a message saying what was wrong.

Accepted forms (what harnesses emit):
- an OpenAI-style tool call, as a dict or a JSON string:
  `{"name": "bash", "arguments": {"command": "ls"}}`, `arguments` possibly a JSON string,
  or wrapped as `{"type": "function", "function": {...}, "id": ...}`;
- a Hermes/Qwen-style `<tool_call>{...}</tool_call>` in text;
- text with exactly one fenced bash block (mini-swe-agent style), run with the `bash` tool.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

FENCE_RE = re.compile(r"```(?:bash|sh|shell|console)?[ \t]*\n(.*?)```", re.DOTALL)
TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


class ActionError(ValueError):
    """The action could not be turned into a tool call; the message is the observation."""


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str | None = None


def parse_action(action: Any, tools: list[str], shell_tool: str = "bash") -> ToolCall:
    """Parse `action` into a call of one of `tools`; raise ActionError with a helpful message."""
    if isinstance(action, dict):
        call = _from_dict(action)
    elif isinstance(action, str):
        call = _from_text(action, shell_tool)
    else:
        raise ActionError(f"unsupported action type {type(action).__name__}: give text or a tool-call dict")
    if call.name not in tools:
        raise ActionError(f"unknown tool {call.name!r}; available tools: {', '.join(tools)}")
    return call


def tool_call_text(name: str, arguments: dict | str) -> str:
    """A tool call as Hermes/Qwen chat templates write it (what `TOOL_CALL_RE` reads back)."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return f'<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'


def tagged_tool_calls(text: str) -> tuple[list[ToolCall], str]:
    """Every well-formed `<tool_call>{"name": ..., "arguments": ...}</tool_call>` block of `text` as a
    call (malformed ones are passed over), and the text without the blocks: a chat model's turn that
    may hold several calls (a harness's model call), where `parse_action` takes exactly one."""
    calls = []
    for raw in TOOL_CALL_RE.findall(text):
        try:
            obj = json.loads(raw)
            if isinstance(obj, dict):
                calls.append(_from_dict(obj))
        except (ValueError, ActionError):
            continue
    return calls, (TOOL_CALL_RE.sub("", text).strip() if calls else text)


def _from_dict(d: dict) -> ToolCall:
    call_id = d.get("id") if isinstance(d.get("id"), str) else None
    if isinstance(d.get("function"), dict):
        d = d["function"]
    name = d.get("name")
    if not isinstance(name, str) or not name:
        raise ActionError('a tool call needs a "name" string, e.g. {"name": "bash", "arguments": {"command": "ls"}}')
    args = d.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            raise ActionError(f"the arguments of {name!r} are not valid JSON: {e}") from None
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise ActionError(f"the arguments of {name!r} must be a JSON object, not {type(args).__name__}")
    return ToolCall(name, args, call_id)


def _from_text(text: str, shell_tool: str) -> ToolCall:
    stripped = text.strip()
    tagged = TOOL_CALL_RE.findall(stripped)
    if tagged:
        if len(tagged) > 1:
            raise ActionError(f"found {len(tagged)} <tool_call> blocks; give exactly one per step")
        stripped = tagged[0]
    if stripped.startswith("{"):
        try:
            obj = json.loads(stripped)
        except json.JSONDecodeError as e:
            raise ActionError(f"the action looks like JSON but does not parse: {e}") from None
        if not isinstance(obj, dict):
            raise ActionError("a JSON action must be an object")
        return _from_dict(obj)
    blocks = FENCE_RE.findall(text)
    if len(blocks) == 1:
        command = blocks[0].strip()
        if not command:
            raise ActionError("the ```bash block is empty")
        return ToolCall(shell_tool, {"command": command})
    if len(blocks) > 1:
        raise ActionError(f"found {len(blocks)} ```bash blocks; give exactly one command block per step")
    raise ActionError(
        "no action found. Give a tool call such as "
        '{"name": "bash", "arguments": {"command": "ls"}}, or exactly one ```bash ... ``` block.'
    )
