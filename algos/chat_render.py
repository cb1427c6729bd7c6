"""Chat-template rendering as token ids: the prompt of an episode and each observation turn
appended after the model's own tokens (see algos/agent_rollout.py for why history is never
re-tokenised). `algos/vision.py` extends it for vision-language processors."""

from __future__ import annotations


class ChatRenderer:
    """Chat-template rendering of prompts and of observation turns, as token ids."""

    def __init__(self, tokenizer, *, render_tools: bool = True, chat_template_kwargs: dict | None = None):
        if tokenizer.chat_template is None:
            raise ValueError("the tokenizer has no chat template")
        if tokenizer.eos_token is None:
            raise ValueError("the tokenizer has no eos token (the end-of-turn token)")
        self.tokenizer = tokenizer
        self.render_tools = render_tools
        self.kwargs = dict(chat_template_kwargs or {})
        self.eos_id: int = tokenizer.eos_token_id
        self._suffix_cache: dict[tuple, tuple[str, str]] = {}

    def _render(self, messages: list[dict], **kw) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, **self.kwargs, **kw)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def prompt_ids(self, messages: list[dict], tools: list[dict] | None) -> list[int]:
        text = self._render(messages, tools=tools if self.render_tools else None, add_generation_prompt=True)
        return self.encode(text)

    def prompt(self, messages: list[dict], tools: list[dict] | None) -> tuple[list[int], list]:
        """Prompt token ids and the images in the prompt (a text renderer has none)."""
        return self.prompt_ids(messages, tools), []

    def observation(self, assistant: dict, observations: list[dict]) -> tuple[list[int], list]:
        """Tokens of the env's answer (one message, or a tool result and then a screenshot) and its images."""
        if len(observations) == 1 and not isinstance(observations[0].get("content"), list):
            return self.observation_ids(assistant, observations[0]), []
        if any(isinstance(m.get("content"), list) for m in observations):
            raise ValueError("image observations need a vision-language processor, not a tokenizer")
        return self.encode(self.observation_suffix(assistant, observations)), []

    def observation_suffix(self, assistant: dict, observations: list[dict]) -> str:
        """The template's text after the assistant's eos token: the observation messages and the
        next generation prompt (rendered as they are, no cache)."""
        dummy = [{"role": "user", "content": "x"}, _dummy_assistant(assistant)]
        before = self._render(dummy)
        after = self._render(dummy + observations, add_generation_prompt=True)
        if not after.startswith(before):
            raise ValueError("the chat template is not prefix-preserving: rendering an observation changes "
                             "the text before it, so turns cannot be appended token by token")
        cut = before.rfind(self.tokenizer.eos_token)
        return before[cut + len(self.tokenizer.eos_token):] + after[len(before):]

    def observation_ids(self, assistant: dict, observation: dict) -> list[int]:
        """Tokens that follow the assistant's end-of-turn token: the observation turn and the
        next generation prompt."""
        return self.encode(self.observation_text(assistant, observation))

    def observation_text(self, assistant: dict, observation: dict) -> str:
        # the template's text around the observation depends only on roles (and tool-call presence),
        # so it is found once per shape with a sentinel and reused
        shape = (observation["role"], bool(assistant.get("tool_calls")), observation.get("name"))
        if shape not in self._suffix_cache:
            sentinel = "\x00ORCHARD_OBSERVATION\x00"
            dummy = [{"role": "user", "content": "x"}, _dummy_assistant(assistant)]
            before = self._render(dummy)
            after = self._render(dummy + [{**observation, "content": sentinel}], add_generation_prompt=True)
            if not after.startswith(before):
                raise ValueError("the chat template is not prefix-preserving: rendering an observation changes "
                                 "the text before it, so turns cannot be appended token by token")
            cut = before.rfind(self.tokenizer.eos_token)
            if cut < 0:
                raise ValueError(f"the chat template does not end assistant turns with the eos token "
                                 f"{self.tokenizer.eos_token!r}")
            suffix = before[cut + len(self.tokenizer.eos_token):] + after[len(before):]
            if suffix.count(sentinel) != 1:
                raise ValueError("the chat template drops or repeats observation content")
            self._suffix_cache[shape] = tuple(suffix.split(sentinel))
        head, tail = self._suffix_cache[shape]
        return head + str(observation.get("content") or "") + tail


def _dummy_assistant(assistant: dict) -> dict:
    if assistant.get("tool_calls"):
        call = assistant["tool_calls"][0]
        return {"role": "assistant", "content": "", "tool_calls": [
            {"id": call.get("id", "call_0"), "type": "function",
             "function": {"name": call["function"]["name"], "arguments": {}}}]}
    return {"role": "assistant", "content": "x"}
