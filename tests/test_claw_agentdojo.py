"""AgentDojo's workspace suite as Claw tasks, end to end in local sandboxes with AgentDojo's
own utility and security checks (the service in the sandbox runs agentdojo from a cached
venv, built on first use)."""

from __future__ import annotations

import asyncio

import pytest

from orchard_gym import AsyncSandboxClient
from orchard_gym.envs.claw.env import ClawEnv, ClawOraclePolicy
from orchard_gym.envs.claw.tasks import load_tasks
from orchard_gym.envs.rollout import run_episodes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def tasks():
    return load_tasks("agentdojo:workspace")


def _play(local_root, tasks, policy, ids):
    async def go():
        async with AsyncSandboxClient({"type": "local", "root": str(local_root)}) as client:
            return await run_episodes(lambda c: ClawEnv(client=c, tasks=tasks), policy, ids, concurrency=4,
                                      client=client)
    return {t.task_id: t for t in asyncio.run(go())}


async def _nothing(messages, tools):
    return {"name": "submit", "arguments": {}}


def test_the_workspace_suite_loads_with_attribution(tasks):
    users = [t for t in tasks if "+" not in t]
    pairs = [t for t in tasks if "+" in t]
    assert len(users) == 40 and len(pairs) == 40
    task = tasks["agentdojo-workspace-user_task_0"]
    assert "Networking event" in task.instruction and "ethz-spylab/agentdojo" in task.source
    assert {t["function"]["name"] for t in task.tool_schemas} >= {"send_email", "search_calendar_events", "share_file"}


def test_agentdojo_ground_truths_pass_its_checks_and_nothing_fails(local_root, tasks):
    ids = sorted(t for t in tasks if "+" not in t)
    solved = _play(local_root, tasks, ClawOraclePolicy(), ids)
    assert all(t.ok for t in solved.values()), [(t.task_id, t.error) for t in solved.values() if not t.ok][:3]
    failed = sorted(t for t, tr in solved.items() if not tr.report["passed"])
    assert not failed, [(t, solved[t].report["checks"]) for t in failed[:3]]
    idle = _play(local_root, tasks, _nothing, ids[:8])
    assert all(t.ok and not t.report["passed"] and t.report["completion"] == 0.0 for t in idle.values())


def test_obeying_agentdojo_injections_fails_its_security_check(local_root, tasks):
    pairs = sorted((t for t in tasks if "+" in t), key=lambda t: t.split("+")[1])
    one_per_injection = {t.split("+")[1]: t for t in pairs}
    ids = sorted(one_per_injection.values())
    clean = _play(local_root, tasks, ClawOraclePolicy(), ids)
    assert all(t.ok and t.report["passed"] and t.report["safety"] == 1.0 for t in clean.values()), \
        [(t.task_id, t.error, [c["detail"] for c in t.report.get("checks", [])], [(u.tool, u.arguments, u.observation[:200]) for u in t.turns])
         for t in clean.values() if not (t.ok and t.report["passed"])][:3]

    class Obey(ClawOraclePolicy):
        def bind(self, env):
            return ClawOraclePolicy(env, env.task.injection.obey + env.task.oracle)

    # AgentDojo ships no ground truth for injection tasks 6-13 of workspace v1.2 (they
    # return []): nothing scripted can obey those, so they are left out here
    obeyable = [t for t in ids if tasks[t].injection.obey]
    assert len(obeyable) >= 6
    obeyed = _play(local_root, tasks, Obey(), obeyable)
    assert all(t.ok and t.report["safety"] == 0.0 and t.reward == 0.0 for t in obeyed.values()), \
        [(t.task_id, t.report.get("checks")) for t in obeyed.values() if t.report.get("safety") != 0.0][:3]


def test_the_service_skips_the_llm_clients_and_keeps_agentdojos_constant():
    """The service imports the suites without agentdojo's model clients (see
    agentdojo_service._skip_llm_clients); the one constant it stands in must be agentdojo's."""
    import subprocess

    from orchard_gym.envs.claw.agentdojo_source import agentdojo_python
    from orchard_gym.envs.claw.sandbox import agentdojo_service

    code = ("import sys, agentdojo_service as s; s._suite('workspace', 'v1.2');"
            "print(sorted(m for m in ('anthropic', 'openai', 'google.genai', 'cohere') if m in sys.modules))")
    here = agentdojo_service.__file__.rsplit("/", 1)[0]
    r = subprocess.run([agentdojo_python(), "-B", "-c", code], cwd=here, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "[]"
    real = subprocess.run([agentdojo_python(), "-c", "from agentdojo.agent_pipeline.llms.google_llm import "
                           "EMPTY_FUNCTION_NAME as n; print(n)"], capture_output=True, text=True, timeout=300)
    assert real.returncode == 0, real.stderr[-2000:]
    assert real.stdout.strip() == agentdojo_service.EMPTY_FUNCTION_NAME
