"""Vision-language agent GRPO on Orchard/GUI-v0: real TRL steps of a tiny LLaVA built offline,
on two MiniWoB++ tasks in real local sandboxes (Xvfb + Chromium), under the seed's step-budget
curriculum in its "B0,B1" form: "4,8", 4 steps per episode in the first half of training, 8 after
(scripts/demo_gui_grpo.py runs the seed's "15,30" through `orchard train grpo`; this is the lean
version of it).

Every screenshot becomes image tokens; image tokens and every other observation token are
out of the loss (only generated tokens train). The untrained policy never solves a task, so
rewards are scripted as in test_train_vlm (the page's real reward is still read): per task
the n-th graded episode scores n % 2, so every group carries signal. The display is 320x240
to keep the screenshots cheap (MiniWoB's task area is 160x210)."""

from __future__ import annotations

import collections
import json
import shutil


from conftest import require_module
from trainer_spy import spy
from components import require

torch = require_module("train", "torch")
require_module("train", "trl")
require_module("train", "PIL")
require("gui", next((f"{t} is not installed" for t in ("Xvfb", "chromium", "xdotool", "openbox", "bwrap")
                     if shutil.which(t) is None), None))

from orchard_gym.algos.agent_rollout import SamplingParams  # noqa: E402
from orchard_gym.algos.grpo import AgentGRPOArgs, build_trainer, make_grpo_config  # noqa: E402
from orchard_gym.algos.vision import build_tiny_vlm, gui_corpus, vision_images  # noqa: E402
from orchard_gym.envs.gui.env import GUIEnv  # noqa: E402

torch.set_num_threads(1)
SYSTEM = "Act."
TASKS = ["miniwob/click-test", "miniwob/click-button"]
TOKENS_PER_IMAGE = 16  # 28x28 pixels in 7x7 patches


class ScriptedGUI(GUIEnv):
    counts: collections.Counter = collections.Counter()
    reports: list = []

    async def grade(self, ctx, task):
        raw, report = await super().grade(ctx, task)  # the page's own reward, read from the page
        type(self).reports.append(report)
        type(self).counts[task.task_id] += 1
        return float(type(self).counts[task.task_id] % 2), report


def make_env(client, max_steps, max_seconds):
    return ScriptedGUI(client=client, tasks="miniwob", width=320, height=240, max_steps=max_steps,
                       max_seconds=max_seconds)


def test_vlm_grpo_on_gui_with_the_step_budget_curriculum(local_root, tmp_path):
    model, processor = build_tiny_vlm(gui_corpus(SYSTEM), vocab_size=1000)
    ScriptedGUI.counts, ScriptedGUI.reports = collections.Counter(), []
    args = AgentGRPOArgs(env_id="Orchard/GUI-v0", backend={"type": "local", "root": str(local_root)},
                         group_size=2, prompts_per_step=1, step_budget="4,8", max_seconds=300,
                         system_prompt=SYSTEM, render_tools=False, dynamic_sampling=False,
                         sampling=SamplingParams(max_new_tokens=6, max_completion_tokens=2000, linger=0.01))
    config = make_grpo_config(tmp_path, args, steps=2, learning_rate=1e-2)
    trainer, rollout = build_trainer(model, processor, args, config, make_env=make_env, task_ids=TASKS,
                                     metrics_path=tmp_path / "metrics.jsonl")
    assert trainer.batch_hooks == [vision_images]  # the one agent trainer, with the images hook
    captured = spy(trainer, lambda out: (out, [s for slot in rollout.last_slots for s in slot.samples]))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    try:
        trainer.train()
    finally:
        rollout.close()
    assert len(captured) == 2 and trainer.state.global_step == 2
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout/step_budget"] for r in rows] == [4, 8]  # the curriculum: 4, then 8
    image_id = processor.tokenizer.convert_tokens_to_ids("<image>")
    for (out, samples), budget in zip(captured, (4, 8), strict=True):
        loss_mask = out["completion_mask"] * out["tool_mask"]
        sequence = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
        for i, s in enumerate(samples):
            assert s.ok and s.task_id in TASKS, s.excluded
            # the untrained policy never terminates: the budget ends every episode, at exactly its length
            assert s.trajectory.truncated and s.turns == budget, (s.turns, s.trajectory.report)
            assert s.trajectory.report["page_done"] is False  # graded from the page: it never ended its episode
            # one screenshot at the start, one after every action kept in the sequence
            assert len(s.images) >= budget
            assert (sequence[i] == image_id).sum() == TOKENS_PER_IMAGE * len(s.images) == \
                TOKENS_PER_IMAGE * out["num_images"][i]
            completion = torch.tensor(s.completion_ids)
            generated = torch.tensor(s.env_mask, dtype=loss_mask.dtype)
            # the loss sees exactly the generated tokens: no image token, no observation token
            assert torch.equal(loss_mask[i][: len(completion)], generated) and loss_mask[i][len(completion):].sum() == 0
            assert not generated[completion == image_id].any() and (generated == 0).sum() > 0
        assert out["pixel_values"].shape == (sum(out["num_images"]), 3, 28, 28)
    assert len(ScriptedGUI.reports) == 4 and all(r["raw_reward"] == 0 for r in ScriptedGUI.reports)
    changed = {n.split(".")[1] for n, p in model.named_parameters() if not torch.equal(before[n], p)}
    assert {"vision_tower", "language_model", "multi_modal_projector"} <= changed
