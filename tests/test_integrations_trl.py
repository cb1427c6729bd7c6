"""Orchard envs in TRL's env slot: real `GRPOTrainer` steps through TRL's own tool-calling loop
(its chat template rendering of our tool methods, its response parser, its reset/get_reward
calls), on a tiny model built offline whose generation is forced to a scripted policy (a
logits processor that allows one token per position), on real local sandboxes.

The rewards TRL receives must equal what `gym.make` gives for the same actions, and no
sandbox may be left when training ends."""

from __future__ import annotations

import asyncio
import json

import gymnasium as gym
import pytest

from adapter_helpers import live_sandboxes
from conftest import require_module

torch = require_module("train", "torch")
require_module("train", "trl")

from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from orchard_gym.algos.tiny import build_tiny_model  # noqa: E402
from orchard_gym.envs.swe.tasks import load_tasks  # noqa: E402
from orchard_gym.envs.toy.env import make_tasks  # noqa: E402
from orchard_gym.integrations.trl import build_dataset, environment_factory  # noqa: E402

torch.set_num_threads(1)
TOY = make_tasks(["write"], num_tasks=2)
SWE_TASK = "semver-3.0.2"
SWE = load_tasks("builtin")[SWE_TASK]


def call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def toy_script(prompt: str, row: int) -> str:
    """Even rows solve the task then submit; odd rows write a wrong word and stop without
    submitting (so `get_reward` submits for them)."""
    task = next((t for t in TOY.values() if t.instruction in prompt), None)
    assert task is not None, prompt[-3000:]
    turn = prompt.count("<tool_response>")
    if row % 2 == 0:
        return [call("bash", command=task.solution), call("submit"), "Done."][min(turn, 2)]
    return [call("bash", command=f"echo wrong > {task.solution.split()[-1]}"), "I give up."][min(turn, 1)]


def swe_script(prompt: str, row: int) -> str:
    """Even rows apply the gold patch and submit; odd rows submit nothing."""
    turn = prompt.count("<tool_response>")
    if row % 2 == 0:
        apply = call("bash", command=f"git apply <<'EOF_PATCH'\n{SWE.patch}\nEOF_PATCH")
        return [apply, call("submit"), "Done."][min(turn, 2)]
    return [call("submit"), "Done."][min(turn, 1)]


class Forced:
    """A logits processor that lets through only the next token of each row's scripted text."""

    def __init__(self, tokenizer, input_ids, script):
        self.start = input_ids.shape[1]
        prompts = tokenizer.batch_decode(input_ids, skip_special_tokens=False)
        self.targets = [tokenizer.encode(script(p, i) + "<|im_end|>", add_special_tokens=False)
                        for i, p in enumerate(prompts)]
        self.eos = tokenizer.eos_token_id

    def __call__(self, input_ids, scores):
        k = input_ids.shape[1] - self.start
        forced = torch.full_like(scores, float("-inf"))
        for row, target in enumerate(self.targets):
            forced[row, target[k] if k < len(target) else self.eos] = 0.0
        return forced


def force(model, tokenizer, script) -> None:
    from transformers import LogitsProcessorList

    original = type(model).generate  # the class's: a test's forcing never stacks on another's

    def generate(*args, **kwargs):
        kwargs["logits_processor"] = LogitsProcessorList([Forced(tokenizer, kwargs["input_ids"], script)])
        return original(model, *args, **kwargs)

    model.generate = generate


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    corpus = [t.instruction for t in TOY.values()] + [SWE.problem_statement, SWE.patch,
                                                      call("bash", command="echo x > y.txt"), call("submit")]
    model, tokenizer = build_tiny_model(corpus, vocab_size=400, hidden_size=32, num_layers=1, intermediate_size=64,
                                        max_position_embeddings=16384)
    return model, tokenizer


def config(tmp_path, **kw) -> GRPOConfig:
    defaults = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=2,
                    max_completion_length=4096, max_steps=1, learning_rate=1e-4, logging_steps=1, report_to=[],
                    bf16=False, use_cpu=True, save_strategy="no", dataloader_num_workers=0, seed=0,
                    max_tool_calling_iterations=4, shuffle_dataset=False)
    defaults.update(kw)
    return GRPOConfig(**defaults)


def run_step(model, tokenizer, factories, dataset, tmp_path, script):
    """One GRPO step; returns [(trajectory, reward TRL received)] for every rollout."""
    force(model, tokenizer, script)
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=config(tmp_path), train_dataset=dataset,
                          environment_factory=factories,
                          callbacks=[f.callback() for f in (factories.values() if isinstance(factories, dict)
                                                            else [factories])])
    seen = []
    original = trainer._calculate_rewards

    def calculate(inputs, *args):
        rewards = original(inputs, *args)  # [rollouts, reward columns]; NaN where a column does not apply
        for env, row in zip(trainer.environments, rewards.nansum(dim=1).tolist(), strict=True):
            seen.append((env.trajectory, row))
        return rewards

    trainer._calculate_rewards = calculate
    trainer.train()
    return trainer, seen


def replay(env_id: str, trajectory, **env_kwargs) -> float:
    """The reward `gym.make` gives for the actions the TRL rollout took (submitting at the end, as
    `get_reward` does when the policy stopped)."""
    env = gym.make(env_id, **env_kwargs)
    try:
        env.reset(options={"task_id": trajectory.task_id})
        done, reward = False, None
        for turn in trajectory.turns:
            _, reward, terminated, truncated, _ = env.step(turn.action)
            done = terminated or truncated
        if not done:
            _, reward, *_ = env.step({"name": "submit", "arguments": {}})
        return reward
    finally:
        env.close()


def test_grpo_step_on_toy_rewards_equal_gym_make(tiny, local_root, tmp_path):
    model, tokenizer = tiny
    backend = {"type": "local", "root": str(local_root)}
    factory = environment_factory("Orchard/Toy-v0", backend=backend, tasks=TOY)
    trainer, seen = run_step(model, tokenizer, factory, factory.dataset(), tmp_path, toy_script)
    assert len(seen) == 4 and factory.errors == []
    rewards = sorted(r for _, r in seen)
    assert rewards == [0.0, 0.0, 1.0, 1.0], seen  # one solver and one failer per task
    for trajectory, reward in seen:
        assert trajectory.turns[0].tool == "bash"  # TRL's loop parsed and called our tool method
        assert replay("Orchard/Toy-v0", trajectory, backend=backend, tasks=TOY) == reward
    assert factory.hub.live_sandboxes() == 0 and live_sandboxes(backend) == []
    assert trainer.state.global_step == 1


@pytest.mark.slow
def test_mixed_run_swe_and_toy(tiny, local_root, tmp_path):
    """A dict of factories: TRL routes each row to its env by the `environment` column."""
    model, tokenizer = tiny
    backend = {"type": "local", "root": str(local_root)}
    swe = {"tasks": {SWE_TASK: SWE}, "grade_in_place": True}  # the same grading on both sides, one sandbox less
    factories = {"swe": environment_factory("Orchard/SWE-v0", backend=backend, **swe),
                 "toy": environment_factory("Orchard/Toy-v0", backend=backend, tasks=TOY)}
    dataset = build_dataset(factories, {"swe": [SWE_TASK], "toy": ["write-000"]})

    def script(prompt, row):
        return swe_script(prompt, row) if SWE.problem_statement[:60] in prompt else toy_script(prompt, row)

    _, seen = run_step(model, tokenizer, factories, dataset, tmp_path, script)
    by_env = {}
    for trajectory, reward in seen:
        by_env.setdefault(trajectory.env_id, []).append(reward)
    assert sorted(by_env["Orchard/SWE-v0"]) == [0.0, 1.0] and sorted(by_env["Orchard/Toy-v0"]) == [0.0, 1.0], seen
    for trajectory, reward in seen:
        kwargs = swe if trajectory.env_id == "Orchard/SWE-v0" else {"tasks": TOY}
        assert replay(trajectory.env_id, trajectory, backend=backend, **kwargs) == reward
    assert all(f.hub.live_sandboxes() == 0 for f in factories.values()) and live_sandboxes(backend) == []


def test_errored_episode_is_unscorable_not_zero(local_root):
    """A sandbox that dies mid-episode: `get_reward` gives None (TRL: NaN, dropped) and the
    factory records why; a task TRL names that does not exist fails loudly at reset."""
    backend = {"type": "local", "root": str(local_root)}
    factory = environment_factory("Orchard/Toy-v0", backend=backend, tasks=TOY)
    env = factory()
    env.reset(task_id="write-000")

    async def episode():
        await env.bash(command="true")
        await factory.hub.arun(env._episode.env.sandbox.delete())  # the sandbox dies under the episode
        return await env.bash(command="true"), await env.get_reward()

    observation, reward = asyncio.run(episode())
    assert reward is None, observation
    assert [task for task, _ in factory.errors] == ["write-000"] and factory.errors[0][1].error_kind
    with pytest.raises(ValueError, match="no task"):
        env.reset(task_id="nope-000")
    factory.close()
    assert live_sandboxes(backend) == []
