"""The OpenAI wire formats the proxy speaks: chat completions (whole and as SSE chunks)
and the Responses API, plus the conversions between them and one normal form.

The normal form of a model call is chat-style: a prompt `(messages, tools)` and an
assistant message `{"role": "assistant", "content": str | None, "tool_calls": [...]}`.
Everything the proxy records, and everything `HarnessEnv` shows a policy, is in it,
whichever endpoint the harness used. Pure functions only: no I/O here.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

# re-exported: an action as a chat message has its home in orchard_gym/chat.py
from orchard_gym.chat import FormatError as FormatError
from orchard_gym.chat import assistant_message as assistant_message

CHAT = "chat.completions"
RESPONSES = "responses"


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


# ---------------------------------------------------------------------------- requests
def prompt_of(endpoint: str, body: dict) -> tuple[list[dict], list[dict]]:
    """A request body -> (chat messages, chat-style tool schemas)."""
    if endpoint == CHAT:  # text-only part lists as one string, as the other doors give them (chat templates want str)
        messages = text_messages(body.get("messages") or [])
        return messages, list(body.get("tools") or [])
    messages: list[dict] = []
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        messages.append({"role": "system", "content": body["instructions"]})
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    for item in items or []:
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message")
        if kind == "message" or ("role" in item and kind not in ("function_call", "function_call_output")):
            messages.append({"role": item.get("role", "user"), "content": content_text(item.get("content"))})
        elif kind == "function_call":
            call = {"id": item.get("call_id") or item.get("id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments", "")}}
            last = messages[-1] if messages else None
            if last and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"),
                             "content": content_text(item.get("output"))})
    tools = []
    for tool in body.get("tools") or []:
        if isinstance(tool, dict) and tool.get("type") == "function" and "function" not in tool:
            tools.append({"type": "function", "function": {k: tool[k] for k in ("name", "description", "parameters")
                                                             if k in tool}})
        else:
            tools.append(tool)
    return messages, tools


def content_text(content: Any) -> Any:
    """A message's content as one string when it is all text parts (else as it is)."""
    if isinstance(content, list):
        texts = [p.get("text", "") for p in content if isinstance(p, dict) and "text" in p]
        if len(texts) == len(content):
            return "".join(texts)
    return content


def text_messages(messages: list) -> list:
    """The chat messages with text-only content-part lists (`[{"type": "text", "text": ...}]`,
    as OpenHands and OpenClaw send) joined into strings: what a text tokenizer's chat template
    takes (lists with images stay lists; anything not a message is left for the checks)."""
    return [{**m, "content": content_text(m["content"])} if isinstance(m, dict) and isinstance(m.get("content"), list)
            else m for m in messages]


def check_request(endpoint: str, body: Any) -> dict:
    """Raise FormatError unless `body` is a plausible request for `endpoint`."""
    if not isinstance(body, dict):
        raise FormatError("the request body must be a JSON object")
    if endpoint == CHAT:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise FormatError("'messages' must be a non-empty list")
        if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
            raise FormatError("each message must be an object with a 'role'")
    elif not isinstance(body.get("input"), (str, list)):
        raise FormatError("'input' must be a string or a list of items")
    if "tools" in body and not isinstance(body["tools"], list):
        raise FormatError("'tools' must be a list")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise FormatError("'stream' must be a boolean")
    return body


# ---------------------------------------------------------------------------- chat completions
def estimate_usage(messages: list[dict], message: dict) -> dict:
    """Rough token counts (4 characters a token) for answers that did not come with usage."""
    prompt = sum(len(json.dumps(m.get("content") or "")) for m in messages) // 4 + 1
    completion = len(json.dumps(message.get("content") or "") + json.dumps(message.get("tool_calls") or "")) // 4 + 1
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def chat_completion(message: dict, model: str, usage: dict | None = None, finish_reason: str | None = None,
                    **extra: Any) -> dict:
    """A whole `chat.completion` object around one assistant message."""
    finish = finish_reason or ("tool_calls" if message.get("tool_calls") else "stop")
    out = {"id": new_id("chatcmpl"), "object": "chat.completion", "created": int(time.time()), "model": model,
           "choices": [{"index": 0, "message": message, "finish_reason": finish,
                        "logprobs": extra.pop("logprobs", None)}],
           "usage": usage}
    out.update(extra)
    return out


def chat_chunks(completion: dict) -> Iterator[dict]:
    """A whole chat completion -> the `chat.completion.chunk` objects that stream it."""
    base = {"id": completion["id"], "object": "chat.completion.chunk", "created": completion["created"],
            "model": completion["model"]}
    choice = completion["choices"][0]
    message = choice["message"]

    def chunk(delta: dict, finish=None, **more) -> dict:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}], **more}

    yield chunk({"role": "assistant", "content": ""})
    content = message.get("content")
    if isinstance(content, list):
        content = content_text(content)
    if content:
        yield chunk({"content": content})
    for i, call in enumerate(message.get("tool_calls") or []):
        yield chunk({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                     "function": {"name": call["function"]["name"], "arguments": ""}}]})
        yield chunk({"tool_calls": [{"index": i, "function": {"arguments": call["function"]["arguments"]}}]})
    yield chunk({}, choice.get("finish_reason") or "stop")
    if completion.get("usage"):
        yield {**base, "choices": [], "usage": completion["usage"]}


class ChatStreamAssembler:
    """Feeds on `chat.completion.chunk` objects; `result()` is the whole completion."""

    def __init__(self) -> None:
        self.meta: dict = {}
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, dict] = {}
        self.finish_reason: str | None = None
        self.usage: dict | None = None
        self.logprobs: list[dict] = []
        self.token_ids: list[int] = []
        self.prompt_token_ids: list[int] | None = None
        self.chunks = 0

    def feed(self, chunk: dict) -> None:
        if not isinstance(chunk, dict):
            raise FormatError("a stream chunk must be a JSON object")
        self.chunks += 1
        for key in ("id", "created", "model", "system_fingerprint"):
            if key in chunk and key not in self.meta:
                self.meta[key] = chunk[key]
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        if chunk.get("prompt_token_ids"):
            self.prompt_token_ids = list(chunk["prompt_token_ids"])
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                self.content.append(delta["content"])
            for key in ("reasoning_content", "reasoning"):
                if isinstance(delta.get(key), str):
                    self.reasoning.append(delta[key])
            for call in delta.get("tool_calls") or []:
                slot = self.calls.setdefault(call.get("index", 0), {"id": None, "type": "function",
                                                                    "function": {"name": "", "arguments": ""}})
                if call.get("id"):
                    slot["id"] = call["id"]
                fn = call.get("function") or {}
                if fn.get("name"):
                    slot["function"]["name"] += fn["name"]
                if fn.get("arguments"):
                    slot["function"]["arguments"] += fn["arguments"]
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
            if (choice.get("logprobs") or {}).get("content"):
                self.logprobs.extend(choice["logprobs"]["content"])
            if choice.get("token_ids"):
                self.token_ids.extend(choice["token_ids"])

    def result(self) -> dict:
        message: dict = {"role": "assistant", "content": "".join(self.content) or None}
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning)
        if self.calls:
            message["tool_calls"] = [self.calls[i] for i in sorted(self.calls)]
        choice = {"index": 0, "message": message, "finish_reason": self.finish_reason,
                  "logprobs": {"content": self.logprobs} if self.logprobs else None}
        if self.token_ids:
            choice["token_ids"] = self.token_ids
        out = {"id": self.meta.get("id", new_id("chatcmpl")), "object": "chat.completion",
               "created": self.meta.get("created", int(time.time())), "model": self.meta.get("model", ""),
               "choices": [choice], "usage": self.usage}
        if self.prompt_token_ids is not None:
            out["prompt_token_ids"] = self.prompt_token_ids
        return out


def check_chat_completion(data: Any) -> dict:
    if not isinstance(data, dict) or not isinstance(data.get("choices"), list) or not data["choices"]:
        raise FormatError("not a chat completion: no 'choices'")
    message = data["choices"][0].get("message") if isinstance(data["choices"][0], dict) else None
    if not isinstance(message, dict):
        raise FormatError("not a chat completion: choices[0] has no 'message'")
    return data


def tokens_of(completion: dict) -> dict:
    """What a completion says about tokens: prompt/completion token ids and logprobs
    (vLLM's `prompt_token_ids` and `choices[0].token_ids`; OpenAI's `logprobs.content`)."""
    choice = (completion.get("choices") or [{}])[0]
    logprobs = (choice.get("logprobs") or {}).get("content") if isinstance(choice.get("logprobs"), dict) else None
    return {"prompt_token_ids": completion.get("prompt_token_ids") or choice.get("prompt_token_ids"),
            "completion_token_ids": choice.get("token_ids"),
            "logprobs": logprobs or None}


# ---------------------------------------------------------------------------- Responses API
def responses_object(message: dict, model: str, usage: dict | None = None, request: dict | None = None) -> dict:
    """An assistant message -> a completed Responses API `response` object."""
    output: list[dict] = []
    if message.get("reasoning_content"):
        output.append({"type": "reasoning", "id": new_id("rs"), "summary": [],
                       "content": [{"type": "reasoning_text", "text": message["reasoning_content"]}]})
    content = content_text(message.get("content"))
    if content:
        output.append({"type": "message", "id": new_id("msg"), "role": "assistant", "status": "completed",
                       "content": [{"type": "output_text", "text": content, "annotations": []}]})
    for call in message.get("tool_calls") or []:
        output.append({"type": "function_call", "id": new_id("fc"), "call_id": call["id"], "status": "completed",
                       "name": call["function"]["name"], "arguments": call["function"]["arguments"]})
    usage = usage or {}
    request = request or {}
    return {"id": new_id("resp"), "object": "response", "created_at": int(time.time()), "status": "completed",
            "model": model, "output": output, "parallel_tool_calls": request.get("parallel_tool_calls", True),
            "tool_choice": request.get("tool_choice", "auto"), "tools": request.get("tools", []),
            "temperature": request.get("temperature"), "top_p": request.get("top_p"), "error": None,
            "incomplete_details": None, "instructions": request.get("instructions"), "metadata": {},
            "usage": {"input_tokens": usage.get("prompt_tokens", 0), "output_tokens": usage.get("completion_tokens", 0),
                      "total_tokens": usage.get("total_tokens", 0),
                      "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}}


def response_events(response: dict) -> Iterator[dict]:
    """A completed Responses object -> the server-sent events that stream it."""
    seq = iter(range(1_000_000))
    pending = {**response, "status": "in_progress", "output": []}
    yield {"type": "response.created", "sequence_number": next(seq), "response": pending}
    yield {"type": "response.in_progress", "sequence_number": next(seq), "response": pending}
    for i, item in enumerate(response["output"]):
        if item["type"] == "message":
            yield {"type": "response.output_item.added", "sequence_number": next(seq), "output_index": i,
                   "item": {**item, "status": "in_progress", "content": []}}
            part = item["content"][0]
            yield {"type": "response.content_part.added", "sequence_number": next(seq), "item_id": item["id"],
                   "output_index": i, "content_index": 0, "part": {**part, "text": ""}}
            yield {"type": "response.output_text.delta", "sequence_number": next(seq), "item_id": item["id"],
                   "output_index": i, "content_index": 0, "delta": part["text"], "logprobs": []}
            yield {"type": "response.output_text.done", "sequence_number": next(seq), "item_id": item["id"],
                   "output_index": i, "content_index": 0, "text": part["text"], "logprobs": []}
            yield {"type": "response.content_part.done", "sequence_number": next(seq), "item_id": item["id"],
                   "output_index": i, "content_index": 0, "part": part}
        elif item["type"] == "function_call":
            yield {"type": "response.output_item.added", "sequence_number": next(seq), "output_index": i,
                   "item": {**item, "status": "in_progress", "arguments": ""}}
            yield {"type": "response.function_call_arguments.delta", "sequence_number": next(seq),
                   "item_id": item["id"], "output_index": i, "delta": item["arguments"]}
            yield {"type": "response.function_call_arguments.done", "sequence_number": next(seq),
                   "item_id": item["id"], "output_index": i, "arguments": item["arguments"], "name": item["name"]}
        else:
            yield {"type": "response.output_item.added", "sequence_number": next(seq), "output_index": i, "item": item}
        yield {"type": "response.output_item.done", "sequence_number": next(seq), "output_index": i, "item": item}
    yield {"type": "response.completed", "sequence_number": next(seq), "response": response}


def message_of_response(response: dict) -> dict:
    """A Responses object -> the assistant message in normal form."""
    texts, calls, reasoning = [], [], []
    for item in response.get("output") or []:
        if not isinstance(item, dict):
            continue
        if item.get("type") == "message":
            texts.append(content_text(item.get("content")) or "")
        elif item.get("type") == "function_call":
            calls.append({"id": item.get("call_id") or item.get("id"), "type": "function",
                          "function": {"name": item.get("name"), "arguments": item.get("arguments", "")}})
        elif item.get("type") == "reasoning":
            reasoning += [c.get("text", "") for c in item.get("content") or [] if isinstance(c, dict)]
    message: dict = {"role": "assistant", "content": "".join(t for t in texts if isinstance(t, str)) or None}
    if calls:
        message["tool_calls"] = calls
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    return message


def check_response(data: Any) -> dict:
    if not isinstance(data, dict) or data.get("object") != "response" or not isinstance(data.get("output"), list):
        raise FormatError("not a Responses API object: no 'output' list")
    return data


def usage_of_response(response: dict) -> dict | None:
    u = response.get("usage")
    if not isinstance(u, dict):
        return None
    return {"prompt_tokens": u.get("input_tokens", 0), "completion_tokens": u.get("output_tokens", 0),
            "total_tokens": u.get("total_tokens", 0)}


def sse(data: dict | str, event: str | None = None) -> bytes:
    body = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return (f"event: {event}\n" if event else "").encode() + f"data: {body}\n\n".encode()


def error_body(message: str, type_: str = "invalid_request_error", code: str | None = None, **extra: Any) -> dict:
    """OpenAI's error shape: `{"error": {"message", "type", "code", ...}}`."""
    return {"error": {"message": message, "type": type_, "code": code, "param": None, **extra}}
