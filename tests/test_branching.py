"""Env-level fork / reset from a snapshot / set-up snapshots, and branching rollouts whose
Monte Carlo values are checked against the closed-form success probabilities of a scripted
stochastic policy. Real local sandboxes throughout (envs/forking.py, envs/branching.py)."""

from __future__ import annotations

import asyncio
import itertools
import math

import gymnasium as gym
import pytest

from orchard_gym.algos.credit import JudgeError, MonteCarloJudge
from orchard_gym.algos.trajectory_pool import from_trajectory
from orchard_gym.algos.value import gae_targets, mc_targets
from orchard_gym.client import AsyncSandboxClient
from orchard_gym.envs.branching import BranchError, check_branching, run_trees
from orchard_gym.envs.rollout import run_episodes
from orchard_gym.envs.toy.env import ToyEnv, make_tasks
from orchard_gym.envs.toy.stochastic import StochasticProgressPolicy, progress_tasks, steps_done, success_probability
from orchard_gym.errors import OrchardError

P = [0.5, 0.3, 0.8]
NEED = 2
TASKS = {**make_tasks(["secret"], num_tasks=1), **progress_tasks(NEED)}


@pytest.fixture
async def client(local_root):
    c = AsyncSandboxClient(backend={"type": "local", "root": str(local_root)})
    yield c
    await c.aclose()


def bash(command: str) -> dict:
    return {"name": "bash", "arguments": {"command": command}}


async def out(env, command: str) -> str:
    obs, *_ = await env.astep(bash(command))
    return obs.strip()


# ------------------------------------------------------------------ the maths (no sandbox)
def test_success_probability_matches_enumeration():
    for k, done in itertools.product(range(len(P) + 1), range(3)):
        exact = 0.0
        for draws in itertools.product([0, 1], repeat=len(P) - k):
            w = math.prod(P[k + i] if d else 1 - P[k + i] for i, d in enumerate(draws))
            exact += w if done + sum(draws) >= NEED else 0.0
        assert success_probability(P, NEED, k, done) == pytest.approx(exact)
    assert success_probability(P, NEED) == pytest.approx(0.55)


@pytest.mark.parametrize("branch_at, branches, why", [
    (1, 0, "branches must be"), (1, -2, "branches must be"), (1, True, "branches must be"), (1, "4", "branches must be"),
    (-1, 2, "whole numbers >= 0"), ("1", 2, "branch_at must be"), ([], 2, "branch_at must be"),
    ([1, 1], 2, "twice"), ([0, 2.5], 2, "whole numbers"), (8, 2, "beyond the episode length"),
])
def test_branching_arguments_are_checked(branch_at, branches, why):
    with pytest.raises(BranchError, match=why):
        check_branching(branch_at, branches, max_steps=8)


def test_mc_values_become_value_targets_and_credit_curves():
    from orchard_gym.trajectory import Trajectory, Turn

    turns = [Turn(index=i, action=bash("true"), tool="bash", arguments={"command": "true"}, observation="")
             for i in range(3)]
    t = Trajectory(env_id="Orchard/Toy-v0", task_id="progress-000", turns=turns, reward=0.0, terminated=True,
                   metadata={"mc_values": {"0": 0.5, "2": 0.25}})
    entry = from_trajectory(t, policy_id="p", prompt=[{"role": "user", "content": "go"}])
    assert entry.metadata["mc_values"] == {"0": 0.5, "2": 0.25}
    gae = gae_targets([0.0, 0.0, -1.0])
    assert mc_targets(entry, gae) == [0.0, gae[1], -0.5]  # p mapped onto [-1, 1]; GAE where unmeasured
    assert MonteCarloJudge()(entry) == [0.5, 0.375, 0.25, 0.0]  # interpolated, the outcome at the end
    entry.metadata.pop("mc_values")
    with pytest.raises(JudgeError, match="no Monte Carlo values"):
        MonteCarloJudge()(entry)


# ------------------------------------------------------------------ env-level fork and snapshots
async def test_fork_copies_state_and_forks_are_independent(client):
    env = ToyEnv(tasks=TASKS, client=client)
    try:
        await env.areset(options={"task_id": "progress-000"})
        await env.astep(bash("echo before > kept.txt"))
        forks = await env.afork(2)
        try:
            for f in forks:  # files from before the fork, a copy of the trajectory, a sandbox of its own
                assert await out(f, "cat kept.txt") == "before"
                assert f.trajectory is not env.trajectory and f.sandbox.sandbox_id != env.sandbox.sandbox_id
                assert [t.action for t in f.trajectory.turns[:1]] == [env.trajectory.turns[0].action]
            await forks[0].astep(bash("echo mine > only0.txt"))
            assert "No such file" in await out(forks[1], "cat only0.txt")
            assert "No such file" in await out(env, "cat only0.txt")
            assert len(env.trajectory.turns) == 2 and len(forks[1].trajectory.turns) == 3
            await env.aclose()  # the parent goes; the forks live on
            assert await out(forks[0], "cat only0.txt kept.txt") == "mine\nbefore"
            *_, reward, terminated, _, _ = await forks[0].astep({"name": "submit", "arguments": {}})
            assert terminated
        finally:
            for f in forks:
                await f.aclose()
    finally:
        await env.aclose()


async def test_reset_from_snapshot_and_bad_refs(client):
    env = ToyEnv(tasks=TASKS, client=client)
    other = ToyEnv(tasks=TASKS, client=client)
    try:
        with pytest.raises(gym.error.Error, match="call reset"):
            await env.afork(1)  # never reset
        await env.areset(options={"task_id": "secret-000"})
        await env.astep(bash("echo one > a.txt"))
        snap = await env.asnapshot()
        await env.astep(bash("echo two > a.txt"))
        obs, info = await other.areset(options={"snapshot": snap})
        assert info["snapshot_id"] == snap.snapshot_id and len(other.trajectory.turns) == 1
        assert await out(other, "cat a.txt") == "one"
        for bad in (0, 1.5, True, "x"):
            with pytest.raises(gym.error.Error, match="whole number"):
                await env.afork(bad)
        for ref in ("snap-0123456789abcdef", {"snapshot_id": snap.snapshot_id}, 7):
            with pytest.raises(gym.error.Error, match="must be an EnvSnapshot"):
                await other.areset(options={"snapshot": ref})
        assert await out(other, "cat a.txt") == "one"  # a refused reset loses nothing
        with pytest.raises(gym.error.Error, match="not of this ColourEnv"):
            from orchard_gym.envs.toy.colour import ColourEnv

            await ColourEnv(client=client).areset(options={"snapshot": snap})
        await env.astep({"name": "submit", "arguments": {}})
        with pytest.raises(gym.error.Error, match="episode is over"):
            await env.afork(1)
        await env.aclose()
        await other.aclose()
        assert snap.deleted  # the last holder let go: deleted from the backend
        with pytest.raises(gym.error.Error, match="was deleted"):
            await other.areset(options={"snapshot": snap})
        with pytest.raises(gym.error.Error, match="call reset"):
            await env.afork(1)  # a closed env
    finally:
        await env.aclose()
        await other.aclose()


async def test_reset_as_restore_reuses_the_setup(client):
    env = ToyEnv(tasks=TASKS, client=client, snapshot_setup=True)
    task = TASKS["secret-000"]
    try:
        for attempt in range(2):
            await env.areset(options={"task_id": "secret-000"})
            assert ("restored_setup" in env.trajectory.metadata) == (attempt == 1)
            assert (await out(env, "cat answer.txt 2>&1")).startswith("cat:")  # a fresh episode: no answer yet
            await env.astep(bash(task.solution))
            _, reward, terminated, _, _ = await env.astep({"name": "submit", "arguments": {}})
            assert terminated and reward == 1.0
        await client.delete_snapshot(env.trajectory.metadata["restored_setup"])  # swept behind the env's back
        with pytest.raises(OrchardError, match="snap-"):
            await env.areset(options={"task_id": "secret-000"})
        await env.areset(options={"task_id": "secret-000"})  # set up afresh (and snapshotted again)
        assert "restored_setup" not in env.trajectory.metadata
        await env.astep(bash(task.solution))
        assert (await env.astep({"name": "submit", "arguments": {}}))[1] == 1.0
    finally:
        await env.aclose()
    assert not await client.list_snapshots()


# ------------------------------------------------------------------ branching rollouts
G = 6
# near-certain steps where the state matters: a fork that lost the root's lines would score ~0
# where the analytic value is ~1 (and 1 exactly once `need` lines are written)
P_TEST = [0.95, 0.95, 0.05]


def within_sampling_error(successes: int, n: int, p: float, z: float = 3.5) -> bool:
    """|successes - n p| within z binomial standard deviations (+1/2 for discreteness)."""
    return abs(successes - n * p) <= z * math.sqrt(n * p * (1 - p)) + 0.5


async def test_branching_monte_carlo_values_match_the_analytic_ones(client):
    def make(c):
        return ToyEnv(tasks=TASKS, client=c)

    [tree] = await run_trees(make, StochasticProgressPolicy(P_TEST, seed=3), ["progress-000"], branch_at=[0, 1, 2],
                             branches=G, client=client, concurrency=4, progress=False)
    assert tree.root.ok and tree.root.terminated and len(tree.root.turns) == len(P_TEST) + 1
    assert sorted(tree.points) == [0, 1, 2]
    for k, point in tree.points.items():
        assert point.samples == G and len(point.trajectories) == G
        for i, t in enumerate(point.trajectories):  # the root's prefix, then the continuation's own turns
            assert t.metadata["branch"] == {"tree": tree.tree_id, "seq": 0, "at": k, "index": i}
            assert [x.action for x in t.turns[:k]] == [x.action for x in tree.root.turns[:k]]
            assert len(t.turns) == len(P_TEST) + 1 and t.ok
        p = success_probability(P_TEST, NEED, k, steps_done(tree.root.turns, k))
        assert within_sampling_error(point.successes, point.samples, p), (k, point.successes, p)
        assert tree.root.turns[k].mc_value == point.value == point.successes / G
        assert tree.root.metadata["mc_values"][str(k)] == point.value
    assert tree.values()[:3] == [tree.points[k].value for k in range(3)]
    assert tree.values()[-1] == (1.0 if tree.root.reward > 0 else 0.0)
    assert not within_sampling_error(0, G, success_probability(P_TEST, NEED, 1, 1))  # the check has teeth


async def test_run_episodes_branches_and_refuses_impossible_branch_points(client):
    def make(c):
        return ToyEnv(tasks=TASKS, client=c, max_steps=4)

    flat = await run_episodes(make, StochasticProgressPolicy(P), ["progress-000"], client=client, progress=False,
                              branch_at=1, branches=2)
    assert len(flat) == 3 and flat[0].metadata["branch"]["at"] is None
    assert [t.metadata["branch"]["at"] for t in flat[1:]] == [1, 1]
    assert flat[0].metadata["mc_samples"] == {"1": 2}
    with pytest.raises(BranchError, match="beyond the episode length"):
        await run_episodes(make, StochasticProgressPolicy(P), ["progress-000"], client=client, progress=False,
                           branch_at=4, branches=2)
    with pytest.raises(BranchError, match="branches must be"):
        await run_episodes(make, StochasticProgressPolicy(P), ["progress-000"], client=client, progress=False,
                           branch_at=1, branches=0)
    assert not await asyncio.wait_for(client.list_sandboxes(), 30)  # nothing left behind
    assert not await asyncio.wait_for(client.list_snapshots(), 30)


def test_orchard_eval_branches(local_root, tmp_path):
    import json
    import os
    import subprocess
    import sys

    def orchard(*args):
        return subprocess.run([sys.executable, "-m", "orchard_gym.cli", "eval", "--env", "Orchard/Toy-v0",
                               "--env-kwargs", '{"kinds": ["write"], "num_tasks": 1}', "--policy", "oracle",
                               "--max-steps", "4", *args], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "ORCHARD_LOCAL_ROOT": str(local_root)})

    out = tmp_path / "tree.jsonl"
    r = orchard("--branch-at", "1", "--branches", "2", "--out", str(out))
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["metadata"]["branch"]["at"] for row in rows] == [None, 1, 1]
    assert rows[0]["metadata"]["mc_values"] == {"1": 1.0} and rows[0]["turns"][1]["mc_value"] == 1.0  # the oracle
    r = orchard("--branch-at", "4", "--out", str(tmp_path / "no.jsonl"))
    assert r.returncode == 2 and "beyond the episode length" in r.stderr and "Traceback" not in r.stderr
