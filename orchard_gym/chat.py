"""An agent's action as an OpenAI chat message: text, a tool call, a list of them, or a whole
assistant message. One definition for the env's episode runner (envs/episode.py), the recording
proxy (wrappers/proxy/openai_format.py) and the trainers (algos/)."""

from __future__ import annotations

import json
import uuid
from typing import Any


class FormatError(ValueError):
    """A request, a response or an action that does not have the expected shape."""


def assistant_message(action: Any) -> dict:
    """An action -> the assistant message it stands for.

    Accepted: text; a full assistant message `{"role": "assistant", "content", "tool_calls"}`;
    one tool call `{"name", "arguments"}` (arguments a dict or a JSON string), also as
    `{"type": "function", "function": {...}}`; or a list of tool calls.
    """
    if isinstance(action, str):
        return {"role": "assistant", "content": action}
    if isinstance(action, list):
        if not action:
            raise FormatError("an empty list is not an action; give text or at least one tool call")
        return {"role": "assistant", "content": None, "tool_calls": [tool_call(c) for c in action]}
    if not isinstance(action, dict):
        raise FormatError(f"an action is text, a tool call or an assistant message, not {type(action).__name__}")
    if "role" in action or "tool_calls" in action or ("content" in action and "name" not in action):
        if action.get("role", "assistant") != "assistant":
            raise FormatError(f"the action must be an assistant message, not role {action.get('role')!r}")
        content = action.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise FormatError("the message's content must be a string, a list of parts or null")
        calls = action.get("tool_calls") or []
        if not isinstance(calls, list):
            raise FormatError("tool_calls must be a list")
        if content is None and not calls:
            raise FormatError("the assistant message has neither content nor tool_calls")
        message = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = [tool_call(c) for c in calls]
        for key in ("reasoning_content", "reasoning"):
            if isinstance(action.get(key), str):
                message[key] = action[key]
        return message
    return {"role": "assistant", "content": None, "tool_calls": [tool_call(action)]}


def tool_call(call: Any) -> dict:
    """One tool call in the OpenAI shape (`id`, `type`, `function` with JSON-string arguments)."""
    if not isinstance(call, dict):
        raise FormatError(f"a tool call is a dict, not {type(call).__name__}")
    fn = call.get("function", call)
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise FormatError("a tool call needs a function name: {'name': ..., 'arguments': {...}}")
    args = fn.get("arguments", {})
    if isinstance(args, dict):
        args = json.dumps(args)
    elif not isinstance(args, str):
        raise FormatError("tool call arguments must be a dict or a JSON string")
    return {"id": call.get("id") or f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": fn["name"], "arguments": args}}
