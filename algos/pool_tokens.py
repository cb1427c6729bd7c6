"""Pool entries as token sequences, in the layout of `agent_rollout` (one rollout path).

    ids          = prompt  a_0 o_0  a_1 o_1 ... a_{T-1}
    action_mask  = 0..0    1..1 0..0 1..1 0..0 ... 1..1       (1: a token the policy generated)
    spans        = [(start, end) of each a_t]                 (one decision step per assistant turn)

The state s_t before action a_t ends at token `spans[t][0] - 1`; the state after the last
action ends at the last token. Entries that carry the token ids of a training run are
used as recorded when the tokenizer is the same (same fingerprint); otherwise the
conversation is rendered with `ChatRenderer`, exactly as an episode would have been
built turn by turn: the assistant turn's text plus the end-of-turn token, then the
observation turn and the next generation prompt.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .chat_render import ChatRenderer
from .trajectory_pool import PoolEntry, tokenizer_fingerprint


@dataclass
class EntryTokens:
    ids: list[int]
    action_mask: list[int]
    spans: list[tuple[int, int]]

    def state_ends(self) -> list[int]:
        """Token index of the last token of s_0 .. s_T (s_T: after the last action)."""
        return [start - 1 for start, _ in self.spans] + [len(self.ids) - 1]


def spans_of(mask) -> list[tuple[int, int]]:
    """Maximal runs [i, j) of true values (of an action mask: one per assistant turn)."""
    out, start = [], None
    for i, m in enumerate(list(mask) + [0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    return out


def _plain_args(message: dict) -> dict:
    """Tool-call arguments as objects (chat templates serialise them themselves)."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    fixed = []
    for c in calls:
        fn = dict(c["function"])
        if isinstance(fn.get("arguments"), str):
            try:
                fn["arguments"] = json.loads(fn["arguments"]) if fn["arguments"].strip() else {}
            except json.JSONDecodeError:
                pass  # rendered as the string it is
        fixed.append({**c, "function": fn})
    return {**message, "tool_calls": fixed}


class EntryTokenizer:
    """Renders pool entries (and proxy calls) into ids and masks with one tokenizer."""

    def __init__(self, tokenizer, *, render_tools: bool = False, chat_template_kwargs: dict | None = None):
        self.renderer = ChatRenderer(tokenizer, render_tools=render_tools, chat_template_kwargs=chat_template_kwargs)
        self.tokenizer = tokenizer
        self.fingerprint = tokenizer_fingerprint(tokenizer)
        self._head: str | None = None

    def assistant_ids(self, message: dict) -> list[int]:
        """The tokens the model generates for this assistant message, its end-of-turn token included."""
        r = self.renderer
        dummy = [{"role": "user", "content": "x"}]
        head = r._render(dummy, add_generation_prompt=True)
        full = r._render(dummy + [_plain_args(message)])
        if not full.startswith(head):
            raise ValueError("the chat template is not prefix-preserving around an assistant turn")
        body = full[len(head):]
        cut = body.rfind(self.tokenizer.eos_token)
        if cut < 0:
            raise ValueError("the chat template does not end assistant turns with the eos token")
        return r.encode(body[:cut]) + [r.eos_id]

    def prompt_ids(self, messages: list[dict], tools: list[dict] | None) -> list[int]:
        return self.renderer.prompt_ids(messages, tools or None)

    def __call__(self, entry: PoolEntry) -> EntryTokens:
        if entry.prompt_ids is not None and entry.completion_ids is not None and entry.action_mask is not None \
                and entry.tokenizer == self.fingerprint:
            mask = [0] * len(entry.prompt_ids) + list(entry.action_mask)
            return EntryTokens(list(entry.prompt_ids) + list(entry.completion_ids), mask, spans_of(mask))
        messages = entry.messages
        first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), len(messages))
        ids = self.prompt_ids(messages[:first], entry.tools)
        mask = [0] * len(ids)
        last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
        i = first
        while i < len(messages):
            m = messages[i]
            if m.get("role") != "assistant":
                raise ValueError(f"entry {entry.entry_id}: message {i} is {m.get('role')!r} where an assistant "
                                 "turn was expected (turns alternate: action, observation)")
            a = self.assistant_ids(m)
            ids += a
            mask += [1] * len(a)
            if i < last:  # the observation and the next generation prompt; a trailing one carries nothing
                if i + 1 >= len(messages):
                    break
                o = self.renderer.observation_ids(_plain_args(m), messages[i + 1])
                ids += o
                mask += [0] * len(o)
            i += 2
        return EntryTokens(ids, mask, spans_of(mask))

    def call_ids(self, call: dict) -> tuple[list[int], list[int]]:
        """(prompt ids, response ids) of one recorded proxy call, rendered from its messages with
        this tokenizer (recorded token ids belong to the upstream's tokenizer)."""
        prompt = self.prompt_ids(call["messages"], call.get("tools"))
        return prompt, self.assistant_ids(call["message"])
