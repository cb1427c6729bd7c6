"""A Hugging Face chat model on this machine, greedy: the local stand-in for a chat endpoint.

The credit judge (`algos/credit.py`) and the RPR judge (`algos/rpr.py`) both use it when given
a model folder instead of `URL#MODEL` (orchard_gym.endpoint):

    chat = LocalChat("runs/tiny", max_tokens=64)
    text = chat.generate([{"role": "user", "content": "hi"}])      # blocking
    text = await chat.complete([{"role": "user", "content": "hi"}])  # one generate at a time, off the loop
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from orchard_gym._loop import run_in_thread


class LocalChat:
    def __init__(self, path: str | Path, *, max_tokens: int = 512, what: str = "judge"):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(path))
            self.model = AutoModelForCausalLM.from_pretrained(str(path))
        except (OSError, ValueError) as e:
            raise ValueError(f"cannot load the {what} model {str(path)!r}: {e}") from None
        self.model.eval()
        self.max_tokens = max_tokens
        self._lock = asyncio.Lock()

    def generate(self, messages: list[dict]) -> str:
        import torch

        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                                 return_dict=True)
        with torch.no_grad():
            out = self.model.generate(**ids, max_new_tokens=self.max_tokens, do_sample=False,
                                      pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id)
        return self.tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)

    async def complete(self, messages: list[dict]) -> str:
        async with self._lock:  # one generate at a time on this machine
            return await run_in_thread(self.generate, messages)

    async def aclose(self) -> None:
        return None
