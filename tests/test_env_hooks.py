"""The env core's hooks and public contract (envs/base.py), on real local sandboxes: a domain env
customises a reset through `before_sandbox` / `reuse_sandbox` / `on_ready` / `task_size`, never by
rewriting `areset`; a grade that says the task could not be graded marks the trajectory (one
mapping for every env); render modes come from `metadata`; `backend_name()` says which backend
the env is on however it was given one."""

from __future__ import annotations

import asyncio

import gymnasium as gym
import pytest

import orchard_gym
from orchard_gym._loop import LoopThread
from orchard_gym.client import AsyncSandboxClient, backend_name_for
from orchard_gym.envs.base import grading_error
from orchard_gym.envs.toy.env import ToyEnv

SOLVE = {"name": "submit", "arguments": {}}


class HookedToy(ToyEnv):
    """Every hook used: the calls are recorded in order."""

    metadata = {"render_modes": ["ansi", "rgb_array"]}

    def __init__(self, **kwargs):
        self.calls: list[tuple] = []
        super().__init__(**kwargs)

    def task_size(self, task):
        return {"cpu": 0.5} if task.kind == "count" else {}

    async def before_sandbox(self, task):
        self.calls.append(("before_sandbox", task.task_id, self.sandbox is None, self.backend_name()))

    async def reuse_sandbox(self, task):
        if task.kind != "write" or not isinstance(self.task, type(task)) or self.task.kind != "write":
            return None
        await self.sandbox.exec("rm -f *.txt", cwd=self.ctx.cwd, timeout=30)  # set up afresh in place
        return self.ctx

    def on_ready(self, ctx, task):
        self.calls.append(("on_ready", task.task_id, ctx is self.ctx))


class UngradableToy(ToyEnv):
    async def grade(self, ctx, task):
        return 0.0, {"error_kind": "grading", "error": "the checker is broken"}


@pytest.fixture
def backend(local_root):
    return {"type": "local", "root": str(local_root)}


def test_hooks_run_in_order_and_a_warm_reset_keeps_the_sandbox(backend):
    env = HookedToy(backend=backend, kinds=("write", "count"), num_tasks=2)
    try:
        env.reset(options={"task_id": "write-000"})
        first = env.sandbox.sandbox_id
        assert env.calls == [("before_sandbox", "write-000", True, "local"), ("on_ready", "write-000", True)]
        env.step({"name": "bash", "arguments": {"command": f"echo x > {env.task.solution.split()[-1]}"}})
        obs, info = env.reset(options={"task_id": "write-001"})  # reuse_sandbox says yes
        assert env.sandbox.sandbox_id == first == info["sandbox_id"] and env.trajectory.metadata["warm_reset"]
        assert env.trajectory.task_id == "write-001" and env.trajectory.turns == [] and not env.done
        assert ".txt" not in env.step({"name": "bash", "arguments": {"command": "ls"}})[0]  # set up afresh in place
        env.reset(options={"task_id": "count-000"})  # reuse_sandbox says no: a fresh sandbox of the task's size
        assert env.sandbox.sandbox_id != first and env.sandbox.record.cpu == 0.5
        assert env.sandbox_spec(env.task) == {"image": None, "cpu": 0.5}
        assert [c[0] for c in env.calls] == ["before_sandbox", "on_ready"] * 3
    finally:
        env.close()


def test_the_task_size_wins_over_the_envs(backend):
    env = HookedToy(backend=backend, kinds=("write", "count"), num_tasks=1, sandbox_cpu=2, sandbox_memory="256m")
    try:
        assert env.sandbox_size(env.get_task("write-000")) == {"cpu": 2, "memory": "256m"}
        assert env.sandbox_size(env.get_task("count-000")) == {"cpu": 0.5, "memory": "256m"}
    finally:
        env.close()


def test_a_grade_that_cannot_be_made_marks_the_trajectory(backend):
    env = UngradableToy(backend=backend, num_tasks=1)
    try:
        env.reset(seed=0)
        obs, reward, terminated, truncated, info = env.step(SOLVE)
        assert terminated and reward == 0.0
        assert info["error"] == env.trajectory.error == "grading: the checker is broken"
        assert env.trajectory.error_kind == "grading" and not env.trajectory.ok and env.done
    finally:
        env.close()


def test_grading_error_reads_only_a_report_that_says_so():
    assert grading_error({"error_kind": "grading", "error": "x"}) == "grading: x"
    for report in (None, {}, {"error": "x"}, {"error_kind": None}, {"error_kind": ""}):
        assert grading_error(report) is None


def test_done_release_and_abort_are_public(backend):
    env = ToyEnv(backend=backend, num_tasks=1)
    try:
        assert not env.done and env.ctx is None
        env.reset(seed=0)
        box = env.sandbox
        obs, reward, terminated, truncated, info = LoopThread.shared().run(env.abort("timeout: too slow"))
        assert (reward, terminated, truncated) == (0.0, False, True) and info["error"] == "timeout: too slow"
        assert env.done and env.sandbox is None and env.ctx is None and env.trajectory.error == "timeout: too slow"
        with pytest.raises(orchard_gym.errors.SandboxNotFound):
            LoopThread.shared().run(box.exec("true"))
        env.reset(seed=1)
        LoopThread.shared().run(env.release_sandbox())
        assert env.sandbox is None and not env.done  # released, not ended: the driver decides
    finally:
        env.close()


def test_render_modes_come_from_metadata(backend):
    assert HookedToy(backend=backend, render_mode="rgb_array").render_mode == "rgb_array"
    with pytest.raises(gym.error.Error, match=r"one of \['ansi'\]"):
        ToyEnv(backend=backend, render_mode="rgb_array")
    for mode in ("human", 3, ""):
        with pytest.raises(gym.error.Error):
            ToyEnv(backend=backend, render_mode=mode)


@pytest.mark.parametrize("kwargs", [{"sandbox_cpu": "lots"}, {"sandbox_cpu": -1}, {"sandbox_cpu": True},
                                    {"sandbox_memory": "much"}, {"sandbox_memory": [1]}, {"sandbox_memory": 0}])
def test_garbage_sizes_are_refused(backend, kwargs):
    with pytest.raises(gym.error.Error, match="sandbox_"):
        ToyEnv(backend=backend, **kwargs)


def test_backend_name_however_the_backend_is_given(backend, monkeypatch):
    monkeypatch.delenv("ORCHARD_BASE_URL", raising=False)
    assert ToyEnv(backend=backend).backend_name() == "local"
    assert ToyEnv().backend_name() == "local"  # the client's default
    assert ToyEnv(base_url="http://127.0.0.1:1").backend_name() is None  # an orchestrator: not known here

    async def shared():
        async with AsyncSandboxClient(backend) as client:
            env = ToyEnv(client=client)
            return env.backend_name(), ToyEnv(backend=client.backend).backend_name()

    assert asyncio.run(shared()) == ("local", "local")
    monkeypatch.setenv("ORCHARD_BASE_URL", "http://127.0.0.1:1")
    assert ToyEnv().backend_name() is None  # as the client would: the orchestrator in the environment


@pytest.mark.parametrize("spec", [{"type": "nope"}, 42, "floppy", {"root": 3}])
def test_backend_name_of_garbage_is_none_and_the_client_says_why(spec):
    assert backend_name_for(spec) is None
    with pytest.raises(orchard_gym.errors.InvalidRequest):
        AsyncSandboxClient(spec)
