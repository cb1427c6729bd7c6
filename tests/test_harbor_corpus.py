"""The Harbor test corpus (tests/data/harbor/corpus/): every valid task's oracle passes, the
do-nothing policy passes none, a task whose solution is wrong on purpose fails, a verifier that
runs past its limit errors the episode, malformed tasks are listed with reasons while the rest
run. One env per backend plays every task (local: the Dockerfile's steps as set-up; docker: an
image built per task). The compose tasks (compose/: services beside the agent's) run on docker,
leaving no container or network behind, and local refuses each, saying why."""

from __future__ import annotations

import asyncio
import tomllib
from pathlib import Path

import gymnasium as gym
import pytest

import orchard_gym  # noqa: F401
from orchard_gym.envs.harbor.env import HarborEnv
from orchard_gym.envs.harbor.tasks import load_tasks
from orchard_gym.policies import NothingPolicy

from conftest import docker_engine, needs, needs_bwrap
from harbor_real import harbor_check

CORPUS = Path(__file__).parent / "data" / "harbor" / "corpus"
_GATEWAY, _WHY_NOT = docker_engine()
MALFORMED = {"allowlist": "allowlist", "bad-package-name": "org/name", "bad-toml": "not valid TOML",
             "gpus": "accelerators", "multi-step": "multi-step", "negative-timeout": "positive number",
             "no-dockerfile": "Dockerfile is missing", "no-instruction": "instruction.md is missing",
             "no-tests": "tests/test.sh is missing", "compose-volumes": "service 'peek' uses volumes"}
COMPOSE = ("compose/http-sidecar", "compose/no-network", "compose/stateful-sidecar")


def expected(task_id: str) -> str:
    meta = tomllib.loads((CORPUS / task_id / "task.toml").read_text()).get("metadata", {})
    return meta.get("orchard_expect", "pass")


def test_the_corpus_loads_and_lists_each_malformed_task_with_its_reason():
    tasks, problems = load_tasks(CORPUS)
    assert len(tasks) + len(MALFORMED) >= 30 and not any(t.startswith("malformed/") for t in tasks)
    errors = {Path(p.path).name: p.message for p in problems if p.severity == "error"}
    assert set(errors) == set(MALFORMED)
    for name, reason in MALFORMED.items():
        assert reason in errors[name], errors[name]
    warnings = [str(p) for p in problems if p.severity == "warning"]
    assert any("unknown key agent.max_turns" in w for w in warnings)
    assert not any("storage_mb" in w for w in warnings)  # honoured (the sandbox's disk), or warned about at reset
    r = tasks["limits/resources"].settings
    assert (r.cpus, r.memory_mb, r.storage_mb, r.internet) == (1, 512, 1024, True)
    assert tasks["limits/legacy-memory"].settings.memory_mb == 1024
    assert tasks["limits/legacy-memory"].settings.internet is False  # allow_internet = false
    assert tasks["limits/internet-off"].settings.internet is False
    assert tasks["grading/verifier-env"].settings.verifier_env == {"EXPECTED": "orchard", "EXPECTED_COUNT": "3"}


def test_every_runnable_task_validates_with_harbors_own_task_config():
    """Harbor 0.25.0's TaskConfig (its real package, in its venv: scripts/harbor_check.py): every task
    Orchard runs is a valid Harbor task; of the malformed ones Harbor itself rejects only the two
    that are not valid Harbor configs (the others are valid there, and refused by Orchard)."""
    status, said = harbor_check("tasks", CORPUS)
    verdicts = dict(line.split(None, 1)[::-1] for line in said.splitlines() if line.startswith(("valid", "INVALID")))
    verdicts = {name.split(":")[0].split("  (")[0]: verdict for name, verdict in verdicts.items()}
    runnable, _ = load_tasks(CORPUS)
    assert len(verdicts) == len(runnable) + len(MALFORMED) >= 20 + len(MALFORMED), said
    assert status == 1 and {n for n, v in verdicts.items() if v == "INVALID"} == \
        {"malformed/bad-toml", "malformed/bad-package-name"}, said
    assert all(verdicts[task_id] == "valid" for task_id in runnable), said


def play(env: HarborEnv, policy, task_id: str) -> tuple[float, HarborEnv]:
    obs, info = env.reset(options={"task_id": task_id})
    policy = policy.bind(env) if hasattr(policy, "bind") else policy
    messages, tools = [{"role": "user", "content": obs}], info["tools"]
    for _ in range(3):
        action = asyncio.run(policy(messages, tools))
        obs, reward, term, trunc, info = env.step(action)
        messages.append({"role": "assistant", "content": str(action)})
        if term or trunc:
            return reward, env
    raise AssertionError(f"{task_id}: the episode did not end")


def sweep(backend: dict):
    env = gym.make("Orchard/Harbor-v0", tasks=str(CORPUS), backend=backend).unwrapped
    results = {}
    try:
        for task_id in env.task_ids():
            if task_id in COMPOSE and env.backend_name() == "local":  # docker only, said at reset
                with pytest.raises(gym.error.Error, match="docker-compose.yaml .* docker backend only"):
                    env.reset(options={"task_id": task_id})
                continue
            for name, policy in (("oracle", env.oracle_policy()), ("nothing", NothingPolicy())):
                reward, _ = play(env, policy, task_id)
                results[task_id, name] = (reward, env.trajectory.error_kind, env.trajectory.error)
    finally:
        env.close()
    for task_id in {t for t, _ in results}:
        oracle, nothing = results[task_id, "oracle"], results[task_id, "nothing"]
        want = expected(task_id)
        if want == "error":  # the verifier ran past its limit: a broken task, not a score
            assert oracle[1] == nothing[1] == "grading", (task_id, oracle, nothing)
            continue
        assert oracle[2] is None and nothing[2] is None, (task_id, oracle, nothing)
        assert oracle[0] == (1.0 if want == "pass" else 0.0), (task_id, oracle)
        assert nothing[0] == 0.0, (task_id, nothing)
    return results


@needs_bwrap
def test_oracle_passes_every_valid_task_and_nothing_none_on_local(local_root):
    results = sweep({"type": "local", "isolation": "bwrap", "root": str(local_root)})
    assert len(results) == 2 * 23 and not {t for t, _ in results} & set(COMPOSE)


@pytest.mark.docker
@needs("docker", None if _GATEWAY else _WHY_NOT)
def test_oracle_passes_every_valid_task_and_nothing_none_on_docker():
    import docker

    from orchard_gym.backends.owners import owner_identity

    results = sweep({"type": "docker"})
    assert len(results) == 2 * (23 + len(COMPOSE)) and all((t, "oracle") in results for t in COMPOSE)
    api = docker.from_env().api  # the env closed: its sandboxes' services and networks went with them
    mine = [f"orchard-gym.owner={owner_identity()}"]
    assert api.containers(all=True, filters={"label": [*mine, "orchard-gym.role=service"]}) == []
    assert api.networks(filters={"label": [*mine, "orchard-gym.role=network"]}) == []


@needs_bwrap
def test_resources_and_network_become_the_sandbox_settings(local_root, caplog):
    from orchard_gym._loop import LoopThread

    with caplog.at_level("WARNING", logger="orchard_gym.harbor"):
        env = gym.make("Orchard/Harbor-v0", tasks=str(CORPUS),
                       backend={"type": "local", "isolation": "bwrap", "root": str(local_root)}).unwrapped
    logged = caplog.text
    assert "skipped" in logged and "malformed/gpus" in logged  # one line per skipped task
    assert "caveat" in logged and "unknown key agent.max_turns" in logged
    try:
        env.reset(options={"task_id": "limits/resources"})
        limits = LoopThread.shared().run(env.sandbox.resources())
        assert env.sandbox_size(env.task) == {"block_network": False, "cpu": 1, "memory": 512 * 1024 * 1024,
                                              "disk": 1024 * 1024 * 1024}  # storage_mb = 1024
        text = str(limits)
        assert "536870912" in text or "512" in text, limits
        assert limits["sizes"]["workdir_bytes"] == 1024 * 1024 * 1024, limits
    finally:
        env.close()


@needs_bwrap
def test_network_off_blocks_a_task_that_asks_for_the_internet(local_root):
    backend = {"type": "local", "isolation": "bwrap", "root": str(local_root)}
    env = gym.make("Orchard/Harbor-v0", tasks=str(CORPUS / "limits" / "internet-on"), backend=backend,
                   network="off").unwrapped
    try:  # the task's verifier wants a default route: with the network off, the oracle fails
        assert play(env, env.oracle_policy(), "internet-on")[0] == 0.0 and env.trajectory.ok
    finally:
        env.close()
    with pytest.raises(gym.error.Error, match="network must be"):
        gym.make("Orchard/Harbor-v0", tasks=str(CORPUS / "limits" / "internet-on"), network="maybe")
