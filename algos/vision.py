"""Vision-language policies for agent GRPO: image observations in the token stream.

An env whose observations carry a screenshot (`{"screenshot": array, "text": str}`, the
GUI env's shape) reaches the policy as OpenAI content parts (`orchard_gym.screenshots`). For
a local vision-language model (a `transformers` processor with an image processor, e.g.
LLaVA) each image part becomes the processor's image tokens in the episode's token
sequence, and the pixels travel next to it:

    prompt_ids      = system, user(task text + <image>×N) , generation prompt
    completion_ids  = a_1  [tool result, user(<image>×N)]  a_2 ...
    env_mask        = 1..1  0 ........................ 0   1..1      (images are observations: never trained)

Generation passes the episode's images to `model.generate`; the loss pass gets them
through the `vision_images` trainer hook (algos/grpo_trainer.py), which adds `pixel_values`/`num_images` to the batch TRL
built from our `rollout_func` (TRL's own image handling only covers dataset prompts and
its tool loop).

    from orchard_gym.algos.vision import build_tiny_vlm
    model, processor = build_tiny_vlm(corpus, out_dir="runs/tiny-vlm")   # offline, ~120k parameters
"""

from __future__ import annotations

import base64
import io
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .chat_render import ChatRenderer
from .tiny import build_tokenizer, qwen2_5_chat_template

IMAGE_TOKEN = "<image>"


def vision_chat_template(image_token: str = IMAGE_TOKEN) -> str:
    """Qwen2.5's template (tools, tool calls) where a user message's content may be a list of
    parts: text parts as text, image parts (`image_url` or `image`) as `image_token`."""
    macro = ("{%- macro render_content(content) -%}{%- if content is string -%}{{- content -}}{%- else -%}"
             "{%- for part in content -%}{%- if part.type in ['image', 'image_url'] -%}" + image_token +
             "{%- elif part.text is defined -%}{{- part.text -}}{%- endif -%}{%- endfor -%}{%- endif -%}"
             "{%- endmacro -%}\n")
    template = qwen2_5_chat_template()
    user = "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    if user not in template:
        raise RuntimeError("TRL's qwen2_5 template changed: cannot patch image parts into it")
    return macro + template.replace(user, user.replace("message.content", "render_content(message.content)"))


def is_vision_processor(processing_class: Any) -> bool:
    return hasattr(processing_class, "image_processor") and hasattr(processing_class, "tokenizer")


def content_images(messages: Iterable[dict]) -> list[Any]:
    """The images of messages' `image_url` parts (base64 data URLs), in order, as PIL images."""
    from PIL import Image

    images = []
    for m in messages:
        for part in m.get("content") if isinstance(m.get("content"), list) else []:
            if isinstance(part, dict) and part.get("type") == "image_url":
                head, _, payload = str((part.get("image_url") or {}).get("url", "")).partition(",")
                if not head.startswith("data:image/") or ";base64" not in head:
                    raise ValueError("a local vision model takes images as base64 data URLs only")
                images.append(Image.open(io.BytesIO(base64.b64decode(payload))).convert("RGB"))
    return images


class VisionChatRenderer(ChatRenderer):
    """`ChatRenderer` for a processor: image parts become the processor's image tokens."""

    def __init__(self, processor, **kwargs):
        super().__init__(processor.tokenizer, **kwargs)
        self.processor = processor
        self.image_token_id = processor.tokenizer.convert_tokens_to_ids(processor.image_token)

    def expand(self, text: str, images: list) -> list[int]:
        if not images:
            return self.encode(text)
        out = self.processor(text=[text], images=images, add_special_tokens=False)
        return list(out["input_ids"][0])

    def prompt(self, messages: list[dict], tools: list[dict] | None) -> tuple[list[int], list]:
        images = content_images(messages)
        text = self._render(messages, tools=tools if self.render_tools else None, add_generation_prompt=True)
        return self.expand(text, images), images

    def observation(self, assistant: dict, observations: list[dict]) -> tuple[list[int], list]:
        images = content_images(observations)
        if not images:
            return super().observation(assistant, observations)
        return self.expand(self.observation_suffix(assistant, observations), images), images

    def pixel_values(self, images: list):
        return self.processor.image_processor(images=images, return_tensors="pt")["pixel_values"]


def make_renderer(processing_class, **kwargs) -> ChatRenderer:
    if is_vision_processor(processing_class):
        return VisionChatRenderer(processing_class, **kwargs)
    return ChatRenderer(processing_class, **kwargs)


# ---------------------------------------------------------------------------- the trainer
def vision_images(trainer, output: dict) -> dict:
    """Trainer hook (algos/grpo_trainer.py): hands the loss pass the images of our episodes."""
    images = getattr(trainer.rollout_func, "last_images", None) or []
    if any(images):
        if "old_per_token_logps" in output or "ref_per_token_logps" in output:
            raise ValueError("vision GRPO computes log-probs only in the loss pass: keep num_iterations=1, "
                             "beta=0 and steps_per_generation == gradient_accumulation_steps")
        if len(images) != output["prompt_ids"].size(0):
            raise RuntimeError(f"{len(images)} image lists for {output['prompt_ids'].size(0)} episodes")
        flat = [image for row in images for image in row]
        pixels = trainer.processing_class.image_processor(images=flat, return_tensors="pt")["pixel_values"]
        output["pixel_values"] = pixels.to(trainer.accelerator.device, trainer.model.dtype)
        output["num_images"] = [len(row) for row in images]
    return output


def vision_trainer_class():
    """Deprecated: the agent trainer with the vision hook alone (see algos/grpo_trainer.py)."""
    from .grpo_trainer import trainer_with

    return trainer_with(vision_images)


def load_policy(path: str):
    """(processing class, model) of a saved policy: a processor and an image-text-to-text model
    for a vision-language folder, else a tokenizer and a causal LM."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(path)
    if getattr(config, "vision_config", None) is not None:
        from transformers import AutoModelForImageTextToText, AutoProcessor

        return AutoProcessor.from_pretrained(path), AutoModelForImageTextToText.from_pretrained(path)
    return AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)


# ---------------------------------------------------------------------------- a tiny VLM, offline
def build_tiny_vlm(corpus: Iterable[str], out_dir: str | Path | None = None, *, vocab_size: int = 512,
                   image_size: int = 28, patch_size: int = 7, hidden_size: int = 64, vision_hidden: int = 32,
                   num_layers: int = 2, max_positions: int = 4096, seed: int = 0):
    """A randomly initialised LLaVA (CLIP vision tower of one layer, a Qwen2 text model of
    ~100k parameters) and its processor, built from configs: no download. Each image is
    resized to `image_size` and becomes (image_size / patch_size)² image tokens."""
    import torch
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        GenerationConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
        Qwen2Config,
    )

    tokenizer = build_tokenizer(corpus, vocab_size=vocab_size)
    tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    tokenizer.chat_template = vision_chat_template()
    image_id = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    image_processor = CLIPImageProcessor(size={"height": image_size, "width": image_size}, do_center_crop=False,
                                         crop_size={"height": image_size, "width": image_size})
    processor = LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=patch_size,
                               vision_feature_select_strategy="default", num_additional_image_tokens=1,
                               chat_template=tokenizer.chat_template)
    torch.manual_seed(seed)
    config = LlavaConfig(
        text_config=Qwen2Config(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                                num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                                max_position_embeddings=max_positions, tie_word_embeddings=True, bos_token_id=None,
                                eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id),
        vision_config=CLIPVisionConfig(hidden_size=vision_hidden, intermediate_size=2 * vision_hidden,
                                       num_hidden_layers=1, num_attention_heads=2, image_size=image_size,
                                       patch_size=patch_size),
        image_token_index=image_id, vision_feature_select_strategy="default", vision_feature_layer=-1,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True)
    model = LlavaForConditionalGeneration(config)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id, do_sample=True)
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        model.save_pretrained(str(out_dir))
        processor.save_pretrained(str(out_dir))
    return model, processor


def gui_corpus(system_prompt: str | None = None) -> list[str]:
    """Texts to train a tiny VLM's tokenizer for Orchard/GUI-v0 episodes: the shape of its
    observation texts (task, URL, tab, title, action results and errors) and its tool calls,
    so those come out as a few tokens each instead of one per byte."""

    from orchard_gym.envs.actions import ActionError, parse_action, tool_call_text
    from orchard_gym.envs.gui.tools import SPECS

    try:
        parse_action("?", [name for name, _, _ in SPECS])
        unparsed = ""
    except ActionError as e:  # what the env answers to text that is no tool call
        unparsed = f"Error: {e}"
    head = ("Task: Click on the \"submit\" button.\nURL: http://127.0.0.1:34567/miniwob/click-button.html\n"
            "Tab: 0 of 1\nTitle: Click Button Task\n\n")
    texts = [system_prompt or "", "<|im_start|>system\n", "<|im_start|>user\n", "<|im_start|>assistant\n",
             head + "The task has started. Act with the computer_use tools; end with terminate or answer.",
             head + unparsed, head.replace("Button", "Test").replace("click-button", "click-test"),
             "left_click at 12,34 (pixels).", "Typed 5 characters."] + [head + unparsed] * 5
    for name, description, _ in SPECS:
        texts += [description, tool_call_text(name, {"coordinate": [0.5, 0.5]})]
    return texts * 3
