"""Anthropic's Messages API as the proxy speaks it (`POST /v1/messages`, whole and as SSE),
translated to and from the chat-completions normal form of `openai_format`.

A Messages request becomes a chat request (system blocks -> one system message,
`tool_use` blocks -> `tool_calls`, `tool_result` blocks -> `tool` messages, images ->
`image_url` parts), so the upstream is any OpenAI-compatible server and the record holds
the same `(messages, tools)` prompt as the other doors. A chat completion (the upstream's
or the policy's) becomes a Messages `message` object, or, streamed, the real event
sequence: `message_start`, `ping`, `content_block_start` / `content_block_delta`
(`text_delta`, `input_json_delta`, `thinking_delta`) / `content_block_stop`,
`message_delta` (stop reason, output usage), `message_stop`; `error` when it breaks.
Pure functions and one incremental translator; no I/O here.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

from .openai_format import FormatError, content_text

MESSAGES = "messages"

# HTTP status -> Anthropic's error type (https://docs.anthropic.com/en/api/errors)
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 409: "invalid_request_error", 413: "request_too_large",
                422: "invalid_request_error", 429: "rate_limit_error", 499: "api_error", 500: "api_error",
                502: "api_error", 503: "overloaded_error", 504: "api_error", 529: "overloaded_error"}

_STOP_REASONS = {"stop": "end_turn", "tool_calls": "tool_use", "function_call": "tool_use", "length": "max_tokens",
                 "content_filter": "refusal"}


def anthropic_error(status: int, message: str) -> dict:
    """Anthropic's error shape: `{"type": "error", "error": {"type", "message"}}`."""
    type_ = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": type_, "message": message}}


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


# ---------------------------------------------------------------------------- requests
def check_messages_request(body: Any) -> dict:
    """Raise FormatError unless `body` is a plausible Messages request."""
    if not isinstance(body, dict):
        raise FormatError("the request body must be a JSON object")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise FormatError("'model' must be a non-empty string")
    if not isinstance(body.get("max_tokens"), int) or isinstance(body["max_tokens"], bool) or body["max_tokens"] < 1:
        raise FormatError("'max_tokens' must be a positive integer")
    check_prompt(body)
    if "stream" in body and not isinstance(body["stream"], bool):
        raise FormatError("'stream' must be a boolean")
    return body


def check_prompt(body: Any) -> dict:
    """The part of a request that `count_tokens` also takes: messages, system, tools."""
    if not isinstance(body, dict):
        raise FormatError("the request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise FormatError("'messages' must be a non-empty list")
    for i, m in enumerate(messages):
        # 'system' turns inside `messages`: what Claude Code 2.1 sends for its mid-conversation reminders
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant", "system"):
            got = f"role {m.get('role')!r}" if isinstance(m, dict) else type(m).__name__
            raise FormatError(f"messages[{i}] must be an object with role 'user', 'assistant' or 'system', not {got}")
        content = m.get("content")
        if not isinstance(content, (str, list)):
            raise FormatError(f"messages[{i}].content must be a string or a list of content blocks")
        if isinstance(content, list) and not all(isinstance(b, dict) and isinstance(b.get("type"), str)
                                                 for b in content):
            raise FormatError(f"messages[{i}].content: each block must be an object with a 'type'")
    system = body.get("system")
    if system is not None and not isinstance(system, (str, list)):
        raise FormatError("'system' must be a string or a list of text blocks")
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list)
                              or not all(isinstance(t, dict) and isinstance(t.get("name"), str) for t in tools)):
        raise FormatError("'tools' must be a list of objects with a 'name'")
    return body


def _system_text(system: Any) -> str:
    if isinstance(system, str):
        return system
    return "\n\n".join(b.get("text", "") for b in system or [] if isinstance(b, dict) and b.get("type") == "text")


def _image_part(block: dict) -> dict | None:
    source = block.get("source") or {}
    if source.get("type") == "base64":
        url = f"data:{source.get('media_type', 'image/png')};base64,{source.get('data', '')}"
    elif source.get("type") == "url":
        url = source.get("url", "")
    else:
        return None
    return {"type": "image_url", "image_url": {"url": url}}


def _parts(content: Any) -> list[dict]:
    """Anthropic content (text, image, other blocks) -> chat content parts."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    parts = []
    for block in content or []:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text":
            parts.append({"type": "text", "text": block.get("text", "")})
        elif block.get("type") == "image" and (image := _image_part(block)) is not None:
            parts.append(image)
        elif block.get("type") == "document" and (block.get("source") or {}).get("type") == "text":
            parts.append({"type": "text", "text": block["source"].get("data", "")})
    return parts


def _content_of(parts: list[dict]) -> str | list[dict]:
    """Text-only parts collapse to one string (what most chat servers expect)."""
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def prompt_of_messages(body: dict) -> tuple[list[dict], list[dict]]:
    """A Messages request -> (chat messages, chat-style tool schemas)."""
    out: list[dict] = []
    if system := _system_text(body.get("system")):
        out.append({"role": "system", "content": system})
    for m in body.get("messages") or []:
        content = m.get("content")
        if m.get("role") == "assistant":
            blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
            texts = [b.get("text", "") for b in blocks if b.get("type") == "text"]
            thinking = [b.get("thinking", "") for b in blocks if b.get("type") == "thinking"]
            calls = [{"id": b.get("id"), "type": "function",
                      "function": {"name": b.get("name"), "arguments": json.dumps(b.get("input", {}))}}
                     for b in blocks if b.get("type") in ("tool_use", "server_tool_use")]
            message: dict = {"role": "assistant", "content": "".join(texts) or None}
            if calls:
                message["tool_calls"] = calls
            if thinking:
                message["reasoning_content"] = "".join(thinking)
            out.append(message)
            continue
        role = "system" if m.get("role") == "system" else "user"
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        # tool results first (they answer the previous assistant turn), then the rest as one user message
        for b in content:
            if b.get("type") == "tool_result":
                result = b.get("content")
                text = result if isinstance(result, str) else _content_of(_parts(result))
                out.append({"role": "tool", "tool_call_id": b.get("tool_use_id"),
                            "content": text if text != [] else ""})
        rest = _parts([b for b in content if b.get("type") != "tool_result"])
        if rest:
            out.append({"role": role, "content": _content_of(rest)})
    tools = [{"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
                                               "parameters": t.get("input_schema") or {"type": "object"}}}
             for t in body.get("tools") or [] if isinstance(t, dict) and "name" in t]
    return out, tools


def chat_request(body: dict) -> dict:
    """A Messages request -> the chat-completions request sent upstream."""
    messages, tools = prompt_of_messages(body)
    out: dict[str, Any] = {"model": body["model"], "messages": messages, "max_tokens": body["max_tokens"]}
    for key in ("temperature", "top_p", "top_k"):
        if body.get(key) is not None:
            out[key] = body[key]
    if body.get("stop_sequences"):
        out["stop"] = body["stop_sequences"]
    if tools:
        out["tools"] = tools
        choice = body.get("tool_choice") or {}
        kind = choice.get("type") if isinstance(choice, dict) else None
        if kind == "any":
            out["tool_choice"] = "required"
        elif kind == "tool":
            out["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
        elif kind in ("auto", "none"):
            out["tool_choice"] = kind
        if isinstance(choice, dict) and choice.get("disable_parallel_tool_use"):
            out["parallel_tool_calls"] = False
    if body.get("stream"):
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    return out


def estimate_input_tokens(body: dict) -> int:
    """Rough prompt size (4 characters a token), what `count_tokens` answers."""
    messages, tools = prompt_of_messages(body)
    return len(json.dumps(messages)) // 4 + len(json.dumps(tools)) // 4 + 1


# ---------------------------------------------------------------------------- answers
def stop_reason_of(finish_reason: str | None, message: dict) -> str:
    if message.get("tool_calls"):
        return "tool_use"
    return _STOP_REASONS.get(finish_reason or "stop", "end_turn")


def _tool_input(arguments: Any) -> dict:
    if isinstance(arguments, dict):
        return arguments
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {"arguments": arguments}  # never drop what the model said


def _usage(usage: dict | None) -> dict:
    usage = usage or {}
    return {"input_tokens": int(usage.get("prompt_tokens") or 0), "output_tokens": int(usage.get("completion_tokens") or 0),
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


def messages_object(message: dict, model: str, usage: dict | None = None, finish_reason: str | None = None) -> dict:
    """An assistant message (chat normal form) -> a whole Messages `message` object."""
    content: list[dict] = []
    if message.get("reasoning_content"):
        content.append({"type": "thinking", "thinking": message["reasoning_content"], "signature": ""})
    text = content_text(message.get("content"))
    if isinstance(text, str) and text:
        content.append({"type": "text", "text": text})
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        content.append({"type": "tool_use", "id": call.get("id") or _id("toolu"), "name": fn.get("name"),
                        "input": _tool_input(fn.get("arguments"))})
    return {"id": _id("msg"), "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": stop_reason_of(finish_reason, message), "stop_sequence": None, "usage": _usage(usage)}


def messages_object_of_chat(completion: dict, model: str) -> dict:
    choice = completion["choices"][0]
    return messages_object(choice["message"], model, completion.get("usage"), choice.get("finish_reason"))


def message_events(msg: dict) -> Iterator[tuple[str, dict]]:
    """A whole `message` object -> the (event, data) pairs that stream it."""
    yield "message_start", {"type": "message_start", "message": {
        **msg, "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {**msg["usage"], "output_tokens": 0}}}
    yield "ping", {"type": "ping"}
    for i, block in enumerate(msg["content"]):
        if block["type"] == "text":
            yield "content_block_start", {"type": "content_block_start", "index": i,
                                          "content_block": {"type": "text", "text": ""}}
            yield "content_block_delta", {"type": "content_block_delta", "index": i,
                                          "delta": {"type": "text_delta", "text": block["text"]}}
        elif block["type"] == "thinking":
            yield "content_block_start", {"type": "content_block_start", "index": i,
                                          "content_block": {"type": "thinking", "thinking": "", "signature": ""}}
            yield "content_block_delta", {"type": "content_block_delta", "index": i,
                                          "delta": {"type": "thinking_delta", "thinking": block["thinking"]}}
        elif block["type"] == "tool_use":
            yield "content_block_start", {"type": "content_block_start", "index": i,
                                          "content_block": {**block, "input": {}}}
            yield "content_block_delta", {"type": "content_block_delta", "index": i,
                                          "delta": {"type": "input_json_delta",
                                                    "partial_json": json.dumps(block["input"])}}
        yield "content_block_stop", {"type": "content_block_stop", "index": i}
    yield "message_delta", {"type": "message_delta",
                            "delta": {"stop_reason": msg["stop_reason"], "stop_sequence": msg["stop_sequence"]},
                            "usage": {"output_tokens": msg["usage"]["output_tokens"]}}
    yield "message_stop", {"type": "message_stop"}


class ChatToMessagesStream:
    """Turns an upstream's `chat.completion.chunk`s into Messages stream events as they
    come: `feed(chunk)` returns the events that chunk makes, `finish()` the closing ones."""

    def __init__(self, model: str):
        self.model = model
        self.started = False
        self.index = -1
        self.kind: str | None = None        # the open block: "text" | "thinking" | "tool:<chat index>"
        self.finish_reason: str | None = None
        self.usage: dict | None = None
        self.saw_tool = False
        self.pending: list[tuple[str, dict]] = []  # made by feed(), not yet sent (the proxy's relay drains it)

    def _start(self) -> list[tuple[str, dict]]:
        if self.started:
            return []
        self.started = True
        msg = {"id": _id("msg"), "type": "message", "role": "assistant", "model": self.model, "content": [],
               "stop_reason": None, "stop_sequence": None, "usage": _usage(None)}
        return [("message_start", {"type": "message_start", "message": msg}), ("ping", {"type": "ping"})]

    def _open(self, kind: str, block: dict) -> list[tuple[str, dict]]:
        events = self._close()
        self.index += 1
        self.kind = kind
        events.append(("content_block_start", {"type": "content_block_start", "index": self.index,
                                               "content_block": block}))
        return events

    def _close(self) -> list[tuple[str, dict]]:
        if self.kind is None:
            return []
        self.kind = None
        return [("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def _delta(self, delta: dict) -> tuple[str, dict]:
        return "content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta}

    def feed(self, chunk: dict) -> list[tuple[str, dict]]:
        events = self._start()
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            for key in ("reasoning_content", "reasoning"):
                if isinstance(delta.get(key), str) and delta[key]:
                    if self.kind != "thinking":
                        events += self._open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
                    events.append(self._delta({"type": "thinking_delta", "thinking": delta[key]}))
            if isinstance(delta.get("content"), str) and delta["content"]:
                if self.kind != "text":
                    events += self._open("text", {"type": "text", "text": ""})
                events.append(self._delta({"type": "text_delta", "text": delta["content"]}))
            for call in delta.get("tool_calls") or []:
                kind = f"tool:{call.get('index', 0)}"
                fn = call.get("function") or {}
                if self.kind != kind:
                    self.saw_tool = True
                    events += self._open(kind, {"type": "tool_use", "id": call.get("id") or _id("toolu"),
                                                "name": fn.get("name") or "", "input": {}})
                if fn.get("arguments"):
                    events.append(self._delta({"type": "input_json_delta", "partial_json": fn["arguments"]}))
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return events

    def finish(self) -> list[tuple[str, dict]]:
        events = self._start() + self._close()
        stop = "tool_use" if self.saw_tool else _STOP_REASONS.get(self.finish_reason or "stop", "end_turn")
        events.append(("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                                         "usage": {"output_tokens": _usage(self.usage)["output_tokens"]}}))
        events.append(("message_stop", {"type": "message_stop"}))
        return events


def sse_event(event: str, data: dict) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()
