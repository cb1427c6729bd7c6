"""Tiny chat models built offline: a byte-level BPE trained on the fly and a randomly
initialised Qwen2 (or Llama) of ~100k parameters, with Qwen2.5's chat template (one
TRL recognises: it has a training variant with generation markers for assistant-only
SFT loss and a response parser for tool calls).

For tests, demos and benchmarks of training loops where no model hub is reachable:

    from orchard_gym.algos.tiny import build_tiny_model
    model, tokenizer = build_tiny_model(["texts the tokenizer is trained on", ...], out_dir="runs/tiny")
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def qwen2_5_chat_template() -> str:
    """TRL's copy of Qwen2.5's chat template (renders tool calls as <tool_call>{json}</tool_call>)."""
    import trl

    return (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()


def build_tokenizer(corpus: Iterable[str], vocab_size: int = 512):
    """A byte-level BPE trained on `corpus`, as a transformers fast tokenizer with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(list(corpus), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                        clean_up_tokenization_spaces=False)
    tokenizer.chat_template = qwen2_5_chat_template()
    return tokenizer


def build_model(tokenizer, *, arch: str = "qwen2", hidden_size: int = 64, num_layers: int = 2,
                num_heads: int = 4, num_kv_heads: int = 2, intermediate_size: int = 128,
                max_position_embeddings: int = 2048, seed: int = 0):
    """A randomly initialised causal LM sized for `tokenizer` (about 100k parameters by default)."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cls_config, cls_model = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}[arch]
    config = cls_config(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=intermediate_size,
                        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
                        max_position_embeddings=max_position_embeddings, tie_word_embeddings=True,
                        bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                        attention_dropout=0.0)
    model = cls_model(config)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id, do_sample=True)
    return model


def build_tiny_model(corpus: Iterable[str], out_dir: str | Path | None = None, *, vocab_size: int = 512,
                     **model_kwargs):
    """Tokenizer + model; saved to `out_dir` (loadable with AutoModelForCausalLM/AutoTokenizer) if given."""
    tokenizer = build_tokenizer(corpus, vocab_size=vocab_size)
    model = build_model(tokenizer, **model_kwargs)
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        model.save_pretrained(str(out_dir))
        tokenizer.save_pretrained(str(out_dir))
    return model, tokenizer


def toy_corpus(tasks, system_prompt: str | None = None, tools: list[dict] | None = None) -> list[str]:
    """Texts to train a tokenizer for Orchard/Toy-v0 episodes: rendered oracle conversations,
    the tool schemas and typical observations."""
    import json

    from orchard_gym.envs.actions import tool_call_text
    from orchard_gym.envs.toy.env import oracle_messages

    tokenizer_free = []
    for task in tasks:
        messages = oracle_messages(task, system_prompt)
        for m in messages:
            if m.get("content"):
                tokenizer_free.append(m["content"])
            for call in m.get("tool_calls") or []:
                fn = call["function"]
                tokenizer_free.append(tool_call_text(fn["name"], fn["arguments"]))
    tokenizer_free += [json.dumps(t) for t in tools or []]
    tokenizer_free += ["<|im_start|>system\n", "<|im_start|>user\n", "<|im_start|>assistant\n",
                       "<tool_response>\n(no output)\n</tool_response>", "Error: no action found.",
                       "Submitted.", "[exit code 1]", "No such file or directory"]
    return tokenizer_free * 3
