"""Multi-turn agent GRPO on TRL with real TRL steps, a tiny model built offline and real
local sandboxes: token layout, masks, sampling log-probs, advantages, dropped error
trajectories, dynamic sampling, BAR, budgets, metrics, the CLI and the plot.

Rewards come from Orchard/Toy-v0 with a scripted grade (the real check still runs in the
sandbox): per task, the n-th graded episode gets reward n % 2 and every 4th dies with an
infrastructure error, `secret-*` tasks always score 0. A random tiny model cannot solve
the tasks, so this gives every group a known reward multiset whatever it generates."""

from __future__ import annotations

import asyncio
import collections
import copy
import json
import math

import pytest

from conftest import require_module
from trainer_spy import spy

torch = require_module("train", "torch")
require_module("train", "trl")

from orchard_gym.algos.agent_rollout import ChatRenderer, SamplingParams  # noqa: E402
from orchard_gym.algos.grpo import (  # noqa: E402
    AgentGRPOArgs,
    AgentRolloutFunc,
    build_trainer,
    make_grpo_config,
)
from orchard_gym.algos.tiny import build_tiny_model, toy_corpus  # noqa: E402
from orchard_gym.envs.toy.env import ToyEnv, make_tasks  # noqa: E402
from orchard_gym.errors import SandboxFailed  # noqa: E402

torch.set_num_threads(1)
TASKS = make_tasks(["write", "secret"], num_tasks=3)
SYSTEM = "Act."


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    model, tokenizer = build_tiny_model(toy_corpus(TASKS.values(), SYSTEM), path, vocab_size=512,
                                        hidden_size=64, num_layers=2, intermediate_size=128)
    assert 50_000 < sum(p.numel() for p in model.parameters()) < 200_000
    return path, model, tokenizer


class ScriptedToy(ToyEnv):
    counts: collections.Counter = collections.Counter()
    delay: float = 0.0

    async def grade(self, ctx, task):
        reward, report = await super().grade(ctx, task)  # the real check, in the sandbox
        type(self).counts[task.task_id] += 1
        n = type(self).counts[task.task_id]
        if task.kind == "secret":
            return 0.0, report
        if n % 4 == 0:
            raise SandboxFailed("injected: the sandbox died while grading")
        return float(n % 2), report

    async def astep(self, action):
        if self.delay:
            await asyncio.sleep(self.delay)
        return await super().astep(action)


@pytest.fixture
def make_env():
    ScriptedToy.counts = collections.Counter()
    ScriptedToy.delay = 0.0

    def factory(client, max_steps, max_seconds):
        return ScriptedToy(tasks=TASKS, client=client, max_steps=max_steps, max_seconds=max_seconds)

    return factory


def agent_args(local_root, **kw) -> AgentGRPOArgs:
    defaults = dict(env_id="Orchard/Toy-v0", backend={"type": "local", "root": str(local_root)}, group_size=4,
                    prompts_per_step=2, step_budget="3", max_seconds=60, system_prompt=SYSTEM, render_tools=False,
                    sampling=SamplingParams(max_new_tokens=16, max_completion_tokens=80, linger=0.01), seed=0)
    defaults.update(kw)
    return AgentGRPOArgs(**defaults)


def segments(mask):
    """Runs of equal mask values: [(value, start, end)]."""
    out, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            out.append((mask[start], start, i))
            start = i
    return out


# ------------------------------------------------------------------ rendering
def test_turns_append_exactly_what_the_chat_template_renders(tiny):
    _, _, tok = tiny
    r = ChatRenderer(tok, render_tools=False)
    first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Create a file."}]
    call = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
    assistant = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": {"command": "ls"}}}]}
    tool = {"role": "tool", "tool_call_id": "c1", "content": "a.txt\nb.txt"}
    text_action = "I will look.\n```bash\nls\n```"
    user_obs = {"role": "user", "content": "Error: no action found."}
    ids = r.prompt_ids(first, None) + r.encode(call) + [r.eos_id]
    ids += r.observation_ids(assistant, tool) + r.encode(text_action) + [r.eos_id]
    ids += r.observation_ids({"role": "assistant", "content": text_action}, user_obs)
    expected = tok.apply_chat_template(first + [assistant, tool, {"role": "assistant", "content": text_action},
                                                user_obs], tokenize=False, add_generation_prompt=True)
    assert tok.decode(ids) == expected
    tools = [{"type": "function", "function": {"name": "bash", "description": "run", "parameters": {}}}]
    assert '"name": "bash"' in tok.decode(ChatRenderer(tok).prompt_ids(first, tools))


# ------------------------------------------------------------------ rollouts
def test_rollout_tokens_masks_and_logprobs(tiny, make_env, local_root):
    _, model, tok = tiny
    args = agent_args(local_root, dynamic_sampling=False)
    rollout = AgentRolloutFunc(args, tok, make_env=make_env, task_ids=list(TASKS))
    rollout._model = model
    try:
        out = rollout.rollout(["write-000", "write-001"], max_steps=3)
    finally:
        rollout.close()
    assert len(out["prompt_ids"]) == 8 and out["task_id"] == ["write-000"] * 4 + ["write-001"] * 4
    samples = [s for slot in rollout.last_slots for s in slot.samples]
    for i, s in enumerate(samples):
        n = len(out["completion_ids"][i])
        assert len(out["env_mask"][i]) == n == len(out["logprobs"][i]) > 0
        assert out["prompt_ids"][i] == s.prompt_ids
        assert tok.decode(s.prompt_ids).endswith("Then call submit.<|im_end|>\n<|im_start|>assistant\n")
        if not s.ok:  # the injected infrastructure error: nothing trained, no reward
            assert s.trajectory.error and "injected" in s.excluded
            assert set(out["env_mask"][i]) == {0} and out["env_reward"][i] is None
            continue
        assert out["env_reward"][i] == s.trajectory.reward and out["env_mask"][i] == s.env_mask
        segs = segments(s.env_mask)
        actions = [seg for seg in segs if seg[0] == 1]
        observations = [seg for seg in segs if seg[0] == 0]
        model_turns = s.turns - int(s.context_exhausted)
        assert len(actions) == model_turns and segs[0][0] == 1 and segs[-1][0] == 1
        assert len(observations) == model_turns - 1
        for (_, a, b), turn in zip(observations, s.trajectory.turns, strict=False):
            text = tok.decode(s.completion_ids[a:b])
            assert turn.observation in text and text.endswith("<|im_start|>assistant\n")
            assert "<|im_start|>" not in tok.decode(s.completion_ids[segs[0][1]:segs[0][2]])
    assert [s.ok for s in samples].count(False) == 2  # the 4th of each task's 4 episodes
    for s in samples:  # the cost ledger: the trainer's own token counts, the sandbox's cgroup CPU
        ledger = s.trajectory.ledger
        assert ledger.token_source == "trainer" and ledger.completion_tokens == sum(s.action_mask) > 0
        assert ledger.model_calls == len([seg for seg in segments(s.action_mask) if seg[0] == 1])
        assert ledger.prompt_tokens >= ledger.model_calls * len(s.prompt_ids)
        assert len(ledger.sandboxes) == 1 and ledger.sandbox_seconds > 0
    assert sorted(out["env_reward"][:4], key=str) == sorted([1.0, 0.0, 1.0, None], key=str)
    # the sampling log-probs are the model's own over exactly these tokens (no re-tokenisation drift)
    checked = 0
    for s in samples:
        ids = torch.tensor([s.prompt_ids + s.completion_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(s.prompt_ids) - 1:-1].float()
        logps = torch.log_softmax(logits, -1).gather(-1, torch.tensor(s.completion_ids)[:, None]).squeeze(-1)
        mask = torch.tensor(s.action_mask).bool()
        assert s.env_mask == (s.action_mask if s.ok else [0] * len(s.action_mask))
        got = torch.tensor(s.logprobs)
        assert torch.allclose(got[mask], logps[mask], atol=2e-4), (got[mask] - logps[mask]).abs().max()
        assert (got[~mask] == 0).all()
        checked += int(mask.sum())
    assert checked > 50


def test_wall_clock_budget_excludes_and_aborts(tiny, make_env, local_root):
    _, model, tok = tiny
    rollout = AgentRolloutFunc(agent_args(local_root), tok, make_env=make_env, task_ids=list(TASKS))
    rollout._model = model
    runner = rollout.runner

    async def both():
        over = await runner.run("write-000", max_steps=3, max_seconds=0.001)  # cut by the env after step 1
        ScriptedToy.delay = 5.0
        runner.grace = 0.3
        aborted = await runner.run("write-001", max_steps=3, max_seconds=0.2)  # hangs: aborted by the runner
        await runner.aclose()
        return over, aborted

    from orchard_gym._loop import LoopThread

    over, aborted = LoopThread.shared().run(both())
    assert over.trajectory.truncated and over.trajectory.error is None and over.turns == 1
    assert "wall-clock" in over.excluded and over.reward is None and set(over.env_mask) == {0}
    assert aborted.trajectory.error.startswith("aborted") and aborted.reward is None and aborted.seconds < 3


def test_context_budget_ends_the_episode_with_submit(tiny, make_env, local_root):
    _, model, tok = tiny
    args = agent_args(local_root, sampling=SamplingParams(max_new_tokens=16, max_completion_tokens=20, linger=0.01))
    rollout = AgentRolloutFunc(args, tok, make_env=make_env, task_ids=list(TASKS))
    rollout._model = model
    try:
        out = rollout.rollout(["write-002"], max_steps=5)
    finally:
        rollout.close()
    for s in rollout.last_slots[0].samples:
        assert s.context_exhausted and s.trajectory.turns[-1].tool == "submit"
        assert s.trajectory.terminated or "injected" in s.trajectory.error  # every 4th dies while grading
        assert len(s.completion_ids) <= 20 and s.action_mask[-1] == 1  # trailing observation trimmed
    assert all(len(c) <= 20 for c in out["completion_ids"])


# ------------------------------------------------------------------ real TRL steps
def expected_advantages(rewards):
    ok = [r for r in rewards if r is not None]
    mean = sum(ok) / len(ok)
    std = math.sqrt(sum((r - mean) ** 2 for r in ok) / (len(ok) - 1))
    return [0.0 if r is None else (r - mean) / (std + 1e-4) for r in rewards]


def test_grpo_step_advantages_masks_and_loss(tiny, make_env, local_root, tmp_path):
    _, model, tok = tiny
    model = copy.deepcopy(model)
    args = agent_args(local_root)
    config = make_grpo_config(tmp_path, args, steps=1, learning_rate=1e-2)
    assert (config.epsilon, config.epsilon_high, config.beta, config.loss_type) == (0.2, 0.28, 0.0, "dapo")
    assert config.entropy_coef == 0.0 and config.num_generations == 4 and config.scale_rewards == "group"
    trainer, rollout = build_trainer(model, tok, args, config, make_env=make_env,
                                     task_ids=["write-000", "secret-001"], metrics_path=tmp_path / "m.jsonl")
    captured = spy(trainer, lambda out: (out, rollout.last_slots))  # TRL's batch and our slots
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    try:
        trainer.train()
    finally:
        rollout.close()
    out, slots = captured[0]
    assert len(slots) == 2 and all(slot.trained for slot in slots)
    # the secret-* slot (all rewards 0) was replaced by a write-* task: dynamic sampling
    assert {slot.samples[0].task_id.split("-")[0] for slot in slots} == {"write"}
    replaced = [slot for slot in slots if len(slot.attempts) > 1]
    assert replaced and replaced[0].attempts[0][0] == "secret-001" and not replaced[0].attempts[0][1].informative
    samples = [s for slot in slots for s in slot.samples]
    rewards = [s.reward for s in samples]
    want = [a for slot in slots for a in expected_advantages([s.reward for s in slot.samples])]
    got = out["advantages"].tolist()
    assert got == pytest.approx(want, abs=1e-5)
    assert any(r is None for r in rewards) and any(a > 0 for a in got) and any(a < 0 for a in got)
    loss_mask = (out["completion_mask"] * out["tool_mask"]).tolist()
    for i, s in enumerate(samples):
        n = len(s.completion_ids)
        assert loss_mask[i][:n] == (s.env_mask if s.ok else [0] * n) and not any(loss_mask[i][n:])
        assert out["completion_ids"][i][:n].tolist() == s.completion_ids
        if not s.ok:
            assert got[i] == 0.0 and sum(loss_mask[i]) == 0  # errored: no loss at all, not a negative reward
    # the loss is the dapo token-level sum over the batch (no per-trajectory 1/T): -sum(A * mask) / sum(mask)
    mask = out["completion_mask"] * out["tool_mask"]
    manual = -(out["advantages"][:, None] * mask).sum() / mask.sum()
    with torch.no_grad():
        loss = trainer.compute_loss(trainer.model, out)
    assert float(loss) == pytest.approx(float(manual), abs=1e-5)
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())
    row = json.loads((tmp_path / "m.jsonl").read_text().splitlines()[0])
    for key in ("rollout/success_rate", "rollout/informative_share", "rollout/rollouts_per_prompt",
                "tokens_per_second", "rollout/episode_turns", "loss", "rollout/errors"):
        assert key in row, key
    assert row["rollout/groups"] == 3 and row["rollout/informative_share"] == pytest.approx(2 / 3)
    assert row["rollout/errors"] == 2 and row["rollout/step_budget"] == 3  # one per write-000 group


def test_uninformative_groups_without_replacement_are_not_trained(tiny, make_env, local_root, tmp_path):
    _, model, tok = tiny
    for dynamic, resamples in ((True, 0), (False, 2)):
        args = agent_args(local_root, dynamic_sampling=dynamic, max_resamples=resamples)
        rollout = AgentRolloutFunc(args, tok, make_env=make_env, task_ids=["secret-000"])
        rollout._model = model
        try:
            out = rollout.rollout(["secret-000"], max_steps=2)
        finally:
            rollout.close()
        assert out["task_id"] == ["secret-000"] * 4 and len(rollout.last_slots[0].attempts) == 1
        if dynamic:  # dropped: masked and unscored
            assert out["env_reward"] == [None] * 4 and all(set(m) == {0} for m in out["env_mask"])
        else:  # plain GRPO keeps the group; its advantages are all zero
            assert out["env_reward"] == [0.0] * 4 and all(1 in m for m in out["env_mask"])


def test_bar_keeps_a_short_group_and_masks_the_padding(tiny, make_env, local_root):
    from orchard_gym.algos.bar import BARConfig

    _, model, tok = tiny
    args = agent_args(local_root, algo="bar", dynamic_sampling=False,
                      bar=BARConfig(group_size=4, stride=4, max_rollouts=4, on_exhausted="keep"))
    rollout = AgentRolloutFunc(args, tok, make_env=make_env, task_ids=["write-000"])
    rollout._model = model
    try:
        out = rollout.rollout(["write-000"], max_steps=2)
    finally:
        rollout.close()
    slot = rollout.last_slots[0]
    # rewards 1, 0, 1 and one error: the budget (4) is spent with 3 usable rollouts; kept, padded with 1
    assert slot.trained and slot.padding == 1 and slot.outcome.spent == 4
    assert sorted(out["env_reward"][:3]) == [0.0, 1.0, 1.0]  # who gets which: the order of grading
    assert out["env_reward"][3] is None and set(out["env_mask"][3]) == {0}
    assert all(1 in m for m in out["env_mask"][:3])


def test_bar_grpo_step_with_curriculum_and_plot(tiny, make_env, local_root, tmp_path):
    from orchard_gym.algos.bar import BARConfig
    from orchard_gym.algos.plot import plot_run

    _, model, tok = tiny
    model = copy.deepcopy(model)
    args = agent_args(local_root, algo="bar", prompts_per_step=1, step_budget="2,3@1",
                      bar=BARConfig(group_size=4, stride=2, max_rollouts=8, low=0.25, high=0.75))
    config = make_grpo_config(tmp_path, args, steps=2, learning_rate=1e-2)
    trainer, rollout = build_trainer(model, tok, args, config, make_env=make_env, task_ids=["write-000"],
                                     metrics_path=tmp_path / "metrics.jsonl")
    captured = spy(trainer, lambda out: (out, rollout.last_slots))  # TRL's batch and our slots
    try:
        trainer.train()
    finally:
        rollout.close()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout/step_budget"] for r in rows] == [2, 3]
    # the task's n-th graded episode: 1,0,1,E,1,0 | 1,E,1,0,1,E, in strides of 2. Step 1: after 6 rollouts
    # 3 positives and 2 negatives are usable and the balanced group is 2 + 2. Step 2: after 6, 3 + 1 usable,
    # and with at most one negative the group must be 3 + 1 (still inside [0.25, 0.75]).
    for (out, slots), row, positives in zip(captured, rows, (2, 3), strict=True):
        assert row["rollout/rollouts_per_prompt"] == 6 and row["rollout/informative_share"] == 1.0
        slot = slots[0]
        assert slot.outcome.spent == 6 and slot.outcome.positives == positives and all(s.ok for s in slot.samples)
        want = expected_advantages([s.reward for s in slot.samples])
        assert out["advantages"].tolist() == pytest.approx(want, abs=1e-5)
        assert sorted(s.reward for s in slot.samples) == [0.0] * (4 - positives) + [1.0] * positives
    assert [r["rollout/errors"] for r in rows] == [1, 2]
    png = plot_run(tmp_path)
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_train_grpo_and_plot(tiny, local_root, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from orchard_gym.cli import main

    path, _, _ = tiny
    monkeypatch.setenv("ORCHARD_LOCAL_ROOT", str(local_root))
    run_dir = tmp_path / "run"
    result = CliRunner().invoke(main, [
        "train", "grpo", "--env", "Orchard/Toy-v0", "--env-kwargs", '{"kinds": ["write"], "num_tasks": 2}',
        "--model", str(path), "--algo", "bar", "--steps", "1", "--group-size", "2", "--prompts-per-step", "1",
        "--bar-stride", "2", "--bar-max-rollouts", "4", "--bar-low", "0.5", "--bar-high", "0.5",
        "--max-new-tokens", "8", "--max-completion-tokens", "24", "--step-budget", "2", "--max-resamples", "0",
        "--system-prompt", SYSTEM, "--no-render-tools", "--out", str(run_dir), "--price-1k-tokens", "1"],
        catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "rollout/rollouts_per_prompt" in result.output and (run_dir / "final" / "config.json").exists()
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["rollout/rollouts_per_prompt"] == 4  # nothing solved: budget spent
    # the ledger of the 4 rollouts spent, priced per 1k tokens
    assert rows[0]["ledger/sandboxes"] == 4 and rows[0]["ledger/tokens"] > 0
    assert rows[0]["ledger/cost"] == pytest.approx(rows[0]["ledger/tokens"] / 1000)
    assert rows[0]["ledger/informative_groups_per_cost"] == 0.0 and rows[0]["ledger/cpu_seconds"] > 0
    assert (run_dir / "curves.png").exists()
    view = CliRunner().invoke(main, ["view", str(run_dir / "trajectories.jsonl")])  # the step's episodes
    assert view.exit_code == 0 and 'id="ep2"' in open(view.output.strip()).read(), view.output
    again = CliRunner().invoke(main, ["plot", str(run_dir), "--out", str(tmp_path / "c.png")])
    assert again.exit_code == 0 and (tmp_path / "c.png").exists()
    bad = CliRunner().invoke(main, ["train", "grpo", "--model", str(path), "--step-budget", "30@5"])
    assert bad.exit_code != 0 and "step budget" in bad.output


# ------------------------------------------------------------------ groups forked at turn K (algos/branch_rollout.py)
class BashOnlyToy(ToyEnv):
    """No submit tool: every episode runs its whole step budget, so the root always reaches turn K."""

    def make_tools(self):
        from orchard_gym.envs.tools import BashTool

        return [BashTool()]


def test_branched_groups_share_the_prefix_and_train_only_after_it(tiny, local_root):
    _, model, tok = tiny
    args = agent_args(local_root, group_size=3, prompts_per_step=1, dynamic_sampling=False, branch_at=1,
                      sampling=SamplingParams(max_new_tokens=12, max_completion_tokens=2000, linger=0.01))
    rollout = AgentRolloutFunc(args, tok, task_ids=["write-000"], make_env=lambda c, s, t: BashOnlyToy(
        tasks=TASKS, client=c, max_steps=s, max_seconds=t))
    rollout._model = model
    try:
        out = rollout.rollout(["write-000"], max_steps=3)
    finally:
        rollout.close()
    samples = rollout.last_slots[0].samples
    assert len(samples) == 3 and all(s.ok for s in samples), [s.excluded for s in samples]
    first = samples[0].trajectory.turns[0].action
    for s, mask in zip(samples, out["env_mask"], strict=True):
        assert s.trajectory.steps == 3 and s.trajectory.turns[0].action == first  # the root's turn 0
        assert s.trajectory.metadata["branch"]["at"] == 1
        actions = [seg for seg in segments(s.action_mask) if seg[0] == 1]
        assert len(actions) == 3
        assert set(mask[actions[0][1]:actions[0][2]]) == {0}  # the shared turn: no loss
        assert all(set(mask[a:b]) == {1} for _, a, b in actions[1:])  # the forked turns train
        assert s.completion_ids[:actions[1][1]] == samples[0].completion_ids[:actions[1][1]]
    for bad in ({"branch_at": -1}, {"branch_at": 1, "algo": "bar"}, {"branch_at": True}):
        with pytest.raises(ValueError, match="branch_at is a turn"):
            agent_args(local_root, **bad)
