"""Vision-language agent GRPO: real TRL steps of a tiny LLaVA built offline, on an env whose
observations are screenshots (Orchard/ToyColour: the answer is the colour of a square),
in real local sandboxes. Image tokens are observation tokens: never in the loss; the
images reach both generation and the loss pass (the vision tower is trained).

Rewards are scripted as in test_train_grpo (the real check still runs in the sandbox): per
task the n-th graded episode scores n % 2, so every group carries signal."""

from __future__ import annotations

import collections
import copy

import numpy as np
import pytest

from conftest import require_module
from trainer_spy import spy

torch = require_module("train", "torch")
require_module("train", "trl")
require_module("train", "PIL")

from orchard_gym.algos.agent_rollout import ChatRenderer, SamplingParams  # noqa: E402
from orchard_gym.algos.grpo import AgentGRPOArgs, build_trainer, make_grpo_config  # noqa: E402
from orchard_gym.algos.tiny import toy_corpus  # noqa: E402
from orchard_gym.algos.vision import VisionChatRenderer, build_tiny_vlm, load_policy, vision_images  # noqa: E402
from orchard_gym.envs.rollout import observation_messages  # noqa: E402
from orchard_gym.envs.toy.colour import COLOURS, ColourEnv, colour_tasks, square  # noqa: E402
from orchard_gym.screenshots import observation_parts  # noqa: E402

torch.set_num_threads(1)
SYSTEM = "Act."
TOKENS_PER_IMAGE = 16  # 28x28 pixels in 7x7 patches


@pytest.fixture(scope="module")
def tiny_vlm(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-vlm")
    corpus = toy_corpus(colour_tasks().values(), SYSTEM) + list(COLOURS) * 3
    model, processor = build_tiny_vlm(corpus, path, vocab_size=400)
    assert 50_000 < sum(p.numel() for p in model.parameters()) < 300_000
    return path, model, processor


class ScriptedColour(ColourEnv):
    counts: collections.Counter = collections.Counter()

    async def grade(self, ctx, task):
        _, report = await super().grade(ctx, task)  # the real check, in the sandbox
        type(self).counts[task.task_id] += 1
        return float(type(self).counts[task.task_id] % 2), report


def make_env(client, max_steps, max_seconds):
    return ScriptedColour(client=client, max_steps=max_steps, max_seconds=max_seconds)


def test_images_become_image_tokens_and_load_back(tiny_vlm):
    path, _, processor = tiny_vlm
    renderer = VisionChatRenderer(processor, render_tools=False)
    red = {"screenshot": square(COLOURS["red"], 56), "text": "Which colour?"}
    ids, images = renderer.prompt([{"role": "system", "content": SYSTEM},
                                   {"role": "user", "content": observation_parts(red)}], None)
    assert len(images) == 1 and ids.count(renderer.image_token_id) == TOKENS_PER_IMAGE
    assert np.asarray(images[0]).shape == (56, 56, 3) and tuple(np.asarray(images[0])[28, 28]) == COLOURS["red"]
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]}
    obs, images = renderer.observation(call, observation_messages(call, {**red, "text": "(no output)"}))
    text = processor.tokenizer.decode(obs)
    assert text.startswith("\n<|im_start|>user\n<tool_response>\n(no output)\n</tool_response><|im_end|>\n"
                           "<|im_start|>user\n<image>") and text.endswith("<|im_start|>assistant\n")
    assert obs.count(renderer.image_token_id) == TOKENS_PER_IMAGE and len(images) == 1
    # a text-only renderer refuses pictures instead of dropping them; a VLM takes data URLs only
    with pytest.raises(ValueError, match="need a vision-language processor"):
        ChatRenderer(processor.tokenizer).observation(call, observation_messages(call, red))
    with pytest.raises(ValueError, match="base64 data URLs only"):
        renderer.observation(call, [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}])
    loaded_processor, loaded = load_policy(str(path))  # a saved VLM folder loads as processor + VLM
    assert type(loaded).__name__ == "LlavaForConditionalGeneration"
    assert loaded_processor.tokenizer.convert_tokens_to_ids("<image>") == renderer.image_token_id


def test_vlm_grpo_steps_images_masked_and_trained(tiny_vlm, local_root, tmp_path):
    _, model, processor = tiny_vlm
    model = copy.deepcopy(model)
    ScriptedColour.counts = collections.Counter()
    args = AgentGRPOArgs(env_id="Orchard/ToyColour-v0", backend={"type": "local", "root": str(local_root)},
                         group_size=2, prompts_per_step=2, step_budget="2", max_seconds=60, system_prompt=SYSTEM,
                         render_tools=False, dynamic_sampling=False,
                         sampling=SamplingParams(max_new_tokens=12, max_completion_tokens=240, linger=0.01))
    config = make_grpo_config(tmp_path, args, steps=2, learning_rate=1e-2)
    trainer, rollout = build_trainer(model, processor, args, config, make_env=make_env,
                                     task_ids=["colour-red", "colour-blue"])
    assert trainer.batch_hooks == [vision_images]  # the one agent trainer, with the images hook
    vision_calls = collections.Counter()
    captured = spy(trainer, lambda out: (out, [s for slot in rollout.last_slots for s in slot.samples]))
    model.model.vision_tower.register_forward_hook(
        lambda *_: vision_calls.update(["loss" if torch.is_grad_enabled() else "generate"]))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    try:
        trainer.train()
    finally:
        rollout.close()
    assert len(captured) == 2 and trainer.state.global_step == 2
    image_id = processor.tokenizer.convert_tokens_to_ids("<image>")
    for out, samples in captured:
        assert len(samples) == 4 and all(s.ok for s in samples)
        loss_mask = out["completion_mask"] * out["tool_mask"]
        sequence = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
        for i, s in enumerate(samples):
            assert s.turns >= 1 and len(s.images) >= 1  # the task's picture, then one per observation kept
            assert (sequence[i] == image_id).sum() == TOKENS_PER_IMAGE * len(s.images) == out["num_images"][i] * 16
            completion = torch.tensor(s.completion_ids)
            assert not loss_mask[i][: len(completion)][completion == image_id].any()  # images never in the loss
            assert s.prompt_ids.count(image_id) == TOKENS_PER_IMAGE  # the task's picture, in the prompt
            assert sum(s.env_mask) > 0 and loss_mask[i].sum() == sum(s.env_mask)  # only generated tokens train
        assert out["pixel_values"].shape == (sum(out["num_images"]), 3, 28, 28)
    # some pictures came as observations after an action: inside the completion, masked out
    assert any(s.completion_ids.count(image_id) for _, samples in captured for s in samples)
    assert vision_calls["generate"] > 0 and vision_calls["loss"] > 0  # pixels in generation and in the loss
    changed = {n.split(".")[1] for n, p in model.named_parameters() if not torch.equal(before[n], p)}
    assert {"vision_tower", "language_model", "multi_modal_projector"} <= changed
