"""`--use-vllm server|colocate`: every turn of agent GRPO through TRL's own vLLM object.

vLLM needs a GPU, and none is here, so TRL's generation class is replaced at its public
boundary: `trl.trainer.grpo_trainer.VLLMGeneration` (the name `GRPOTrainer.__init__` builds
its `vllm_generation` from) becomes `HFBackedVLLMGeneration`, which has TRL's constructor,
`sync_weights()` and `generate(prompts, images, num_generations, profiler)` with TRL's
return shape, and generates with its own copy of the policy (as vLLM holds its own) that only
`sync_weights` updates. Everything else is real: TRL's trainer and its weight-sync schedule,
local sandboxes, BAR, the RPR judge over HTTP, the OPD teacher."""

from __future__ import annotations

import copy
import json

import pytest

from conftest import require_module
from dense_servers import JudgeStub
from toy_grading import AlternatingToy

torch = require_module("train", "torch")
require_module("train", "trl")

import trl.trainer.grpo_trainer as trl_grpo  # noqa: E402

from orchard_gym.algos import vllm_turns  # noqa: E402
from orchard_gym.algos.agent_rollout import SamplingParams  # noqa: E402
from orchard_gym.algos.grpo import AgentGRPOArgs, build_trainer, make_grpo_config  # noqa: E402
from orchard_gym.algos.pool_tokens import spans_of  # noqa: E402
from tiny_pair import student_and_teacher  # noqa: E402
from orchard_gym.envs.toy.env import make_tasks  # noqa: E402

torch.set_num_threads(1)
TASKS = make_tasks(["write"], num_tasks=2)
SYSTEM = "Act."


class HFBackedVLLMGeneration:
    """TRL 1.16's `VLLMGeneration` public surface over a Hugging Face copy of the policy."""

    instances: list = []

    def __init__(self, model, accelerator, processing_class, mode="colocate", structured_outputs_regex=None,
                 server_base_url=None, server_host="0.0.0.0", server_port=8000, server_timeout=240.0,
                 group_port=51216, tensor_parallel_size=1, gpu_memory_utilization=0.9, max_model_length=None,
                 max_num_seqs=None, enable_sleep_mode=False, model_impl="auto", trust_remote_code=False,
                 repetition_penalty=1.0, temperature=1.0, top_p=1.0, top_k=0, min_p=0.0,
                 max_completion_length=16, logprobs=0, generation_kwargs=None):
        self.model, self.accelerator, self.processing_class = model, accelerator, processing_class
        self.mode, self.server_base_url = mode, server_base_url
        self.temperature, self.top_p, self.top_k = temperature, top_p, top_k
        self.max_completion_length, self.logprobs = max_completion_length, logprobs
        self.generation_kwargs = generation_kwargs or {}
        self.engine = copy.deepcopy(model).eval()  # vLLM's own weights, loaded once at start
        if mode == "server":  # what GRPOTrainer asks the server at start (importance sampling check)
            self.vllm_client = type("Client", (), {"get_server_info": staticmethod(
                lambda: {"model_config": {"logprobs_mode": "processed_logprobs"}})})()
        self.syncs: list[float] = []  # a checksum of the weights each sync pushed
        self.calls: list[dict] = []
        type(self).instances.append(self)

    def sync_weights(self):  # TRL's non-PEFT path: every named parameter into the engine
        with torch.no_grad():
            for name, param in self.model.named_parameters():
                self.engine.get_parameter(name).copy_(param.data)
        self.syncs.append(float(sum(p.detach().double().sum() for p in self.engine.parameters())))

    def generate(self, prompts, images, num_generations, profiler=None):
        assert images is None and num_generations == 1
        in_sync = all(torch.equal(self.engine.get_parameter(n), p) for n, p in self.model.named_parameters())
        stops = list(self.generation_kwargs.get("stop_token_ids") or [self.processing_class.eos_token_id])
        pad = self.processing_class.pad_token_id
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        with torch.no_grad():
            out = self.engine.generate(input_ids=ids, attention_mask=attention, do_sample=True,
                                       temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                                       max_new_tokens=self.max_completion_length, eos_token_id=stops,
                                       pad_token_id=pad, return_dict_in_generate=True, output_scores=True)
        new = out.sequences[:, width:]
        logps = torch.log_softmax(torch.stack(out.scores, 1).float(), -1).gather(-1, new[..., None]).squeeze(-1)
        completions, logprobs = [], []
        for row, lp in zip(new.tolist(), logps.tolist(), strict=True):
            end = next((j + 1 for j, t in enumerate(row) if t in stops), len(row))  # vLLM keeps the stop token
            completions.append(row[:end])
            logprobs.append([[v] for v in lp[:end]])
        self.calls.append({"prompts": [list(p) for p in prompts], "completions": completions, "in_sync": in_sync,
                           "logprobs": logprobs, "max_tokens": self.max_completion_length, "stops": stops})
        return prompts, completions, logprobs, [[[t] for t in c] for c in completions]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model, _, tok, tpath = student_and_teacher(tmp_path_factory, TASKS, SYSTEM)
    return model, tok, tpath


@pytest.fixture
def fake_vllm(monkeypatch):
    HFBackedVLLMGeneration.instances = []
    monkeypatch.setattr(trl_grpo, "VLLMGeneration", HFBackedVLLMGeneration)
    monkeypatch.setattr(vllm_turns, "vllm_available", lambda: True)
    return HFBackedVLLMGeneration


def make_env(client, max_steps, max_seconds):
    return AlternatingToy(tasks=TASKS, client=client, max_steps=max_steps, max_seconds=max_seconds)


def agent_args(local_root, **kw) -> AgentGRPOArgs:
    defaults = dict(env_id="Orchard/Toy-v0", backend={"type": "local", "root": str(local_root)}, group_size=2,
                    prompts_per_step=1, step_budget="2", max_seconds=60, system_prompt=SYSTEM, render_tools=False,
                    dynamic_sampling=False, seed=0,
                    sampling=SamplingParams(max_new_tokens=10, max_completion_tokens=60, linger=0.01))
    defaults.update(kw)
    return AgentGRPOArgs(**defaults)


def train_with_fake(args, tiny, tmp_path, steps):
    model, tok, _ = tiny
    model = copy.deepcopy(model)
    config = make_grpo_config(tmp_path, args, steps=steps, learning_rate=1e-2)
    assert config.use_vllm and config.vllm_mode == args.use_vllm
    AlternatingToy.counts.clear()
    trainer, rollout = build_trainer(model, tok, args, config, make_env=make_env, task_ids=["write-000"],
                                     metrics_path=tmp_path / "m.jsonl")
    batches = []
    rollout_call = rollout.rollout

    def recording(*a, **kw):
        out = rollout_call(*a, **kw)
        batches.append(([r for slot in rollout.last_slots for _, o in slot.attempts for r in o.rollouts],
                        copy.deepcopy(out), rollout.runner.generator.calls))
        return out

    rollout.rollout = recording
    try:
        trainer.train()
    finally:
        rollout.close()
    rows = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    return trainer, rollout, batches, rows


def check_every_turn_went_through_vllm(fake, batches, steps):
    """Every action segment of every episode is what a vLLM call returned for exactly that context;
    TRL synced the weights once per step before its rollout, and each call saw synced weights."""
    assert len(fake.syncs) == steps and len(set(fake.syncs)) == steps  # the weights moved between steps
    assert fake.calls and all(c["in_sync"] for c in fake.calls)
    answered = {}
    for call in fake.calls:
        for prompt, completion, lp in zip(call["prompts"], call["completions"], call["logprobs"], strict=True):
            answered.setdefault(tuple(prompt), []).append((completion, [v[0] for v in lp], call["max_tokens"]))
    assert sum(calls for _, _, calls in batches) == len(fake.calls)  # the generator's calls are the fake's
    turns = 0
    for samples, _, _ in batches:
        for s in samples:
            for start, end in spans_of(s.action_mask):
                context = tuple(s.prompt_ids + s.completion_ids[:start])
                options = [(c[:cap], lp[:cap]) for c, lp, cap in answered.get(context, [])]
                assert (s.completion_ids[start:end], s.logprobs[start:end]) in [
                    (c[: end - start], lp[: end - start]) for c, lp in options], "a turn vLLM did not generate"
                turns += 1
    assert turns == sum(len(c["prompts"]) for c in fake.calls) > 0  # one call's row per turn, none other


def test_colocate_bar_and_rpr_two_steps(tiny, fake_vllm, local_root, tmp_path):
    """BAR groups and the RPR judge with every turn from TRL's (replaced) colocated vLLM."""
    with JudgeStub(slow_seconds=2.5) as judge:
        args = agent_args(local_root, algo="bar", use_vllm="colocate",
                          bar={"group_size": 2, "stride": 2, "max_rollouts": 4},
                          rpr={"judge": f"{judge.url}#judge", "combine": "sum:0.5"})
        trainer, rollout, batches, rows = train_with_fake(args, tiny, tmp_path, steps=2)
    [fake] = fake_vllm.instances
    assert fake is trainer.vllm_generation and fake.mode == "colocate"
    check_every_turn_went_through_vllm(fake, batches, steps=2)
    # the turn's cap and the stop ids were set on TRL's object for every call
    assert {c["max_tokens"] for c in fake.calls} <= set(range(1, 11)) and 10 in {c["max_tokens"] for c in fake.calls}
    assert all(c["stops"] == rollout.runner.generator.stop_ids for c in fake.calls)
    for (samples, out, _), row in zip(batches, rows, strict=True):
        assert row["rollout/generate_calls"] > 0 and row["rpr/judged"] == 2 and row["rpr/dropped"] == 0
        assert row["rollout/rollouts_per_prompt"] >= 2  # BAR's stride
        trained = [s for s in samples if s.ok][:2]
        assert sorted(s.trajectory.reward for s in trained) == [0.0, 1.0]  # a balanced BAR group
        assert out["env_reward"] == [pytest.approx(r + 0.5 * 0.5) for r in (s.trajectory.reward for s in trained)]


def test_server_grpo_and_opd_step(tiny, fake_vllm, local_root, tmp_path):
    """Fixed groups with OPD's per-token teacher term; server mode, its URL handed to TRL."""
    _, _, teacher = tiny
    args = agent_args(local_root, use_vllm="server", vllm_server_url="http://127.0.0.1:8123",
                      opd={"teacher": str(teacher), "batch_size": 2})
    trainer, rollout, batches, rows = train_with_fake(args, tiny, tmp_path, steps=1)
    [fake] = fake_vllm.instances
    assert fake.mode == "server" and fake.server_base_url == "http://127.0.0.1:8123"
    check_every_turn_went_through_vllm(fake, batches, steps=1)
    _, out, _ = batches[0]
    assert "opd_signal" in out and rows[0]["opd/scored"] == 2 and rows[0]["opd/kl"] is not None
    assert any(abs(v) > 1e-4 for row in out["opd_signal"] for v in row)  # a different teacher: a real signal


# ------------------------------------------------------------------ refusals (vllm is not installed here)
@pytest.mark.parametrize("bad, why", [({"use_vllm": "gpu"}, "'server' or 'colocate'"),
                                      ({"use_vllm": True}, "'server' or 'colocate'"),
                                      ({"vllm_server_url": "http://x"}, "needs use_vllm='server'"),
                                      ({"use_vllm": "colocate", "vllm_server_url": "http://x"}, "needs use_vllm")])
def test_use_vllm_garbage(local_root, bad, why):
    with pytest.raises(ValueError, match=why):
        agent_args(local_root, **bad)


def test_use_vllm_without_vllm_installed_is_a_clear_error(tiny, local_root, tmp_path):
    from click.testing import CliRunner

    from orchard_gym.cli import main

    if vllm_turns.vllm_available():
        pytest.skip("vllm is installed on this machine: the refusal cannot happen")
    with pytest.raises(vllm_turns.VLLMUnavailable, match="vllm package is not installed"):
        agent_args(local_root, use_vllm="server")
    _, tok, teacher = tiny
    result = CliRunner().invoke(main, ["train", "grpo", "--model", str(teacher), "--use-vllm", "colocate",
                                       "--out", str(tmp_path / "run")])
    assert result.exit_code == 2 and "vllm package is not installed" in result.output, result.output
    assert "Traceback" not in result.output and not (tmp_path / "run").exists()
    bad = CliRunner().invoke(main, ["train", "grpo", "--model", str(teacher), "--use-vllm", "tpu"])
    assert bad.exit_code == 2 and "'tpu' is not one of" in bad.output


def test_use_vllm_refuses_harness_and_vision_policies(tiny, fake_vllm, local_root):
    from orchard_gym.algos.harness_grpo import HarnessGRPOArgs

    with pytest.raises(ValueError, match="does not combine with --harness"):
        HarnessGRPOArgs(env_id="Orchard/Toy-v0", use_vllm="colocate")
    _, tok, _ = tiny
    with pytest.raises(ValueError, match="vision-language"):
        vllm_turns.VLLMTurnGenerator(lambda: None, tok, SamplingParams(), vision=object())
