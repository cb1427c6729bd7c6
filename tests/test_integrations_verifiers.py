"""Orchard envs as verifiers 0.4 environments, run by verifiers' own eval loop (`vf-eval`) in
.venv-verifiers (verifiers pins mcp==2.0.0, OpenEnv needs mcp<2: scripts/install_verifiers.sh)
against the stub model playing scripted transcripts: whole Claw-v0 and SWE-v0 episodes get the
rewards `gym.make` gives for the same actions; oracle 1.0, do-nothing 0.0; errors are no zeros."""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading

import gymnasium as gym
import pytest

from adapter_helpers import as_text, gym_reward, live_sandboxes
from conftest import require, wait_until

import orchard_gym  # noqa: F401
from orchard_gym.client import AsyncSandboxClient
from orchard_gym.envs.swe.tasks import load_tasks
from orchard_gym.integrations.verifiers_run import VENV, toml_value, venv_missing, vf_eval
from orchard_gym.wrappers.proxy.stub import StubUpstream, create_stub_app

pytestmark = pytest.mark.timeout(900)

CLAW_TASK = "calendar-answer-001"
SWE_TASK = "semver-3.0.2"
SUBMIT = {"name": "submit", "arguments": {}}


CLAW_ORACLE = gym.make("Orchard/Claw-v0").unwrapped.get_task(CLAW_TASK).oracle + [SUBMIT]
SWE_GOLD = [{"name": "bash", "arguments": {"command": f"git apply <<'EOF_PATCH'\n{load_tasks('builtin')[SWE_TASK].patch}"
                                                      "\nEOF_PATCH"}}, SUBMIT]
SCRIPTS = {"claw-oracle": CLAW_ORACLE, "do-nothing": [SUBMIT], "swe-gold": SWE_GOLD}


@pytest.fixture(scope="module")
def stub():
    require("verifiers", venv_missing())
    with StubUpstream(scripts={name: [as_text(c) for c in calls] for name, calls in SCRIPTS.items()}) as server:
        yield server


def test_claw_oracle_and_do_nothing_in_verifiers_own_loop(stub, local_root, tmp_path):
    backend = {"type": "local", "root": str(local_root)}
    rewards = []
    for model in ("claw-oracle", "do-nothing"):
        [episode] = vf_eval("Orchard/Claw-v0", model=model, base_url=stub.url, tasks=[CLAW_TASK],
                            env_kwargs={"backend": backend}, out_dir=tmp_path)
        assert episode.error is None and episode.task_id == CLAW_TASK
        assert episode.turns == len(SCRIPTS[model])  # one model turn per env step, none after the end
        assert episode.reward == gym_reward("Orchard/Claw-v0", CLAW_TASK, SCRIPTS[model], backend=backend)
        rewards.append(episode.reward)
    # Claw's do-nothing grade is 0.2, not 0.0: its safety part scores an agent that did no harm
    assert rewards[0] == 1.0 > rewards[1]
    assert live_sandboxes(backend) == []


def test_swe_gold_patch_and_do_nothing_in_verifiers_own_loop(stub, local_root, tmp_path):
    backend = {"type": "local", "root": str(local_root)}
    kwargs = {"backend": backend, "grade_in_place": True}
    for model, expected in (("swe-gold", 1.0), ("do-nothing", 0.0)):
        [episode] = vf_eval("Orchard/SWE-v0", model=model, base_url=stub.url, tasks=[SWE_TASK], env_kwargs=kwargs,
                            out_dir=tmp_path)
        assert episode.error is None
        assert episode.reward == expected == gym_reward("Orchard/SWE-v0", SWE_TASK, SCRIPTS[model], **kwargs)
    assert live_sandboxes(backend) == []


def test_an_unprovisionable_episode_is_an_error_not_a_zero(stub, tmp_path):
    # the remote backend at a port nothing listens on: the sandbox cannot be created
    kwargs = {"base_url": "http://127.0.0.1:9", "api_key": "k"}
    [episode] = vf_eval("Orchard/Claw-v0", model="do-nothing", base_url=stub.url, tasks=[CLAW_TASK],
                        env_kwargs=kwargs, out_dir=tmp_path)
    assert episode.reward is None and episode.error, episode


def test_a_sandbox_dying_mid_episode_is_an_error_not_a_zero(stub, local_root, tmp_path):
    # the model answers (no tool call) only when released; while it thinks, the sandbox is deleted
    # from outside; the answer's step ends the episode (max_steps=1) and grading finds the sandbox
    # dead: the trace gets an EnvError and no reward (recording a 0.0 would read as a grade)
    backend = {"type": "local", "root": str(local_root)}
    result: dict = {}
    run = threading.Thread(target=lambda: result.update(episodes=vf_eval(
        "Orchard/Claw-v0", model="stub-held", base_url=stub.url, tasks=[CLAW_TASK],
        env_kwargs={"backend": backend, "max_steps": 1}, out_dir=tmp_path)))
    run.start()
    try:
        # the model was asked: the task's set-up is done, and its answer waits for release()
        asked = lambda: any(body.get("model") == "stub-held" for body in stub.received)
        assert wait_until(lambda: asked() or not run.is_alive(), 300) and asked(), "the model was never asked"
        live = live_sandboxes(backend)
        assert len(live) == 1, live

        async def kill():
            async with AsyncSandboxClient(backend) as client:
                await client.delete_sandbox(live[0].sandbox_id)

        asyncio.run(kill())
    finally:
        stub.release()
    run.join(600)
    [episode] = result["episodes"]
    assert episode.turns == 1, episode  # the exchange ran: the failure is the episode's, not the start's
    assert episode.reward is None and episode.error.startswith("EnvError: infrastructure: SandboxFailed"), episode
    assert live_sandboxes(backend) == []


def test_a_model_that_never_acts_is_graded_when_the_step_budget_ends(stub, local_root, tmp_path):
    # "stub" echoes the observation: no tool call, each reply an observation saying so, until
    # the env's max_steps truncates the episode and grades it
    backend = {"type": "local", "root": str(local_root)}
    [episode] = vf_eval("Orchard/Claw-v0", model="stub", base_url=stub.url, tasks=[CLAW_TASK],
                        env_kwargs={"backend": backend, "max_steps": 3}, out_dir=tmp_path)
    assert episode.error is None and episode.turns == 3
    assert episode.reward == gym_reward("Orchard/Claw-v0", CLAW_TASK, [SUBMIT], backend=backend)  # nothing done
    assert live_sandboxes(backend) == []


def test_garbage_input_is_a_clear_error(stub):
    probe = """
import json
from orchard_gym.integrations.verifiers import load_environment
out = []
for args, kwargs in ((123,), {}), (("Orchard/Nope-v0",), {}), (("Orchard/OpenEnv-v0",), {}), \
        (("Orchard/Claw-v0",), {"tasks": ["no-such-task"]}):
    try:
        env = load_environment(*args, **kwargs)
        list(env.taskset)
        out.append("no error")
    except Exception as e:
        out.append(f"{type(e).__name__}: {e}")
print(json.dumps(out))
"""
    run = subprocess.run([str(VENV / "bin" / "python"), "-c", probe], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    errors = json.loads(run.stdout.strip().splitlines()[-1])
    assert errors[0].startswith("TypeError: env_id must be an Orchard env id string")
    assert "'Orchard/Nope-v0' is no Orchard env (known: [" in errors[1]
    assert "Orchard/OpenEnv-v0 is a client of another OpenEnv server" in errors[2]  # GUI: test_integrations_verifiers_gui.py
    assert errors[3].startswith("ValueError: Orchard/Claw-v0 has no task 'no-such-task'")
    with pytest.raises(TypeError, match="cannot write"):
        toml_value(object())
    with pytest.raises(TypeError, match="lists of reply strings"):
        create_stub_app({"oracle": "not a list"})
