"""The env core shared by every domain: a Gymnasium Env over a sandbox.

`reset` provisions a sandbox through any backend (a backend config, an orchestrator
URL, or a shared client), runs the task's setup there and returns the task text;
`step` parses the action into a tool call, runs it, and returns the tool's output.
Episodes end on submit (`terminated`) or on a step or wall-clock budget (`truncated`).

The async methods (`areset`, `astep`, `aclose`) are the real ones; `reset`/`step`/
`close` run them on a background event loop. Use one style per env instance.

Malformed actions never raise: the observation says what was wrong and the sandbox
lives on. A sandbox that dies ends the episode as truncated with `info["error"]`, and
its trajectory is marked so trainers drop it; so does a grade whose report says the task
could not be graded (`report["error_kind"]`, see `grading_error`).

The contract with code outside the env (drivers, forking, wrappers) is public: `ctx` (the
live episode's tool context), `done`, `elapsed`, `client`/`get_client()`, `backend_name()`,
`choose_task()`, `sandbox_spec()`, `release_sandbox()`, `abort()`, `clone()`, `arestore()` and
`snapshots` (forking.SnapshotBook). A subclass customises a reset through hooks
(`before_sandbox`, `reuse_sandbox`, `on_ready`, `sandbox_size`, `image_for`), never by
rewriting `areset`. No module outside the env's own class reads its `_`-prefixed state
(tests/test_env_contract.py).
"""

from __future__ import annotations

import asyncio
import copy
import time
from abc import abstractmethod
from typing import Any, ClassVar

import gymnasium as gym
from pydantic import TypeAdapter, ValidationError

from orchard_gym._loop import LoopThread
from orchard_gym.client import AsyncSandboxClient, AsyncSandboxInstance, backend_name_for
from orchard_gym.errors import AgentUnavailable, JudgeError, OrchardError, SandboxFailed, SandboxNotFound, SandboxTimeout
from orchard_gym.ledger import charge_sandbox
from orchard_gym.models import Cpu, Memory
from orchard_gym.trajectory import Trajectory, Turn

from . import forking
from .actions import ActionError, parse_action
from .spaces import AgentAction, UnicodeText
from .tools import Tool, ToolContext, ToolError

# the episode cannot go on (or be graded): SandboxNotFound is a sandbox deleted behind the env's
# back (an operator, a reaper, a crashed node), not a request the policy can fix; JudgeError: a grader's judge
INFRA_ERRORS = (SandboxFailed, SandboxNotFound, AgentUnavailable, SandboxTimeout, JudgeError)


def grading_error(report: dict | None) -> str | None:
    """The trajectory error of a grade whose report says the task could not be graded
    (`report["error_kind"]`, e.g. SWE's broken tasks, a verifier that did not run, a page that
    could not be read): "grading: WHY". None for an ordinary grade. Such an episode is not a
    failed policy: trainers drop it and `orchard eval` counts it apart."""
    if not report or not report.get("error_kind"):
        return None
    return f"grading: {report.get('error')}"


class SandboxEnv(gym.Env):
    """Base class: subclasses name their tools, load tasks, set up and grade."""

    metadata: ClassVar[dict] = {"render_modes": ["ansi"]}
    env_id: ClassVar[str] = "Orchard/Sandbox-v0"
    # False where episode state lives in processes a filesystem snapshot loses: fork right after reset only
    forks_midway: ClassVar[bool] = True
    per_episode_attrs: ClassVar[tuple[str, ...]] = ()  # attributes a fork must not share (live services)

    def __init__(self, *, backend: Any = None, base_url: str | None = None, api_key: str | None = None,
                 client: AsyncSandboxClient | None = None, max_steps: int = 50, max_seconds: float | None = None,
                 exec_timeout: float = 180.0, render_mode: str | None = None,
                 observation_max_length: int = 100_000, track_fingerprint: bool = True, pool: Any = None,
                 snapshot_setup: bool = False, sandbox_cpu: float | None = None,
                 sandbox_memory: str | int | None = None):
        modes = list(self.metadata.get("render_modes", []))
        if render_mode is not None and render_mode not in modes:
            raise gym.error.Error(f"render_mode must be None or one of {modes}, not {render_mode!r}")
        if max_steps < 1:
            raise gym.error.Error("max_steps must be at least 1")
        for name, value, kind in (("sandbox_cpu", sandbox_cpu, Cpu), ("sandbox_memory", sandbox_memory, Memory)):
            try:
                if isinstance(value, bool):
                    raise gym.error.Error(f"{name} must be None or a size, not {value!r}")
                if value is not None:
                    TypeAdapter(kind).validate_python(value)
            except ValidationError as e:
                raise gym.error.Error(f"{name} must be None or a size ({e.errors()[0]['msg']}), not {value!r}") from None
        self.render_mode = render_mode
        self.max_steps, self.max_seconds, self.exec_timeout = max_steps, max_seconds, exec_timeout
        self.track_fingerprint = track_fingerprint
        # the env's sandbox size (None: the backend's default); a task's own size wins (`sandbox_size`)
        self.sandbox_cpu, self.sandbox_memory = sandbox_cpu, sandbox_memory
        self.snapshot_setup = snapshot_setup  # reset as restore: snapshot each task's set-up once (envs/forking.py)
        self.observation_space = UnicodeText(observation_max_length)
        self.action_space = AgentAction(1_000_000)
        if pool is not None:  # warm pools of the client this env makes (orchard_gym.pool)
            if client is not None:
                raise gym.error.Error("pool= configures the client the env makes; give it to your client instead")
            from orchard_gym.pool import parse_pools

            try:
                parse_pools(pool)
            except ValueError as e:  # InvalidRequest: a bad pool spec, said before anything starts
                raise gym.error.Error(str(e)) from None
        self._client_args = self.client_kwargs({"backend": backend, "base_url": base_url, "api_key": api_key,
                                                "pool": pool})
        self._client, self._owns_client = client, client is None
        self.tools: dict[str, Tool] = {t.name: t for t in self.make_tools()}
        self.sandbox: AsyncSandboxInstance | None = None
        self.task: Any = None
        self.trajectory: Trajectory | None = None
        self.ctx: ToolContext | None = None  # the live episode's tool context (None: no live sandbox)
        self.snapshots = forking.SnapshotBook()  # the snapshots this env holds (envs/forking.py)
        self._deleting: asyncio.Future | None = None  # the last episode's sandbox, being deleted (a reset)
        self._started = 0.0
        self._done = False
        self._last_obs: Any = ""

    # ------------------------------------------------------------------ subclass hooks
    @abstractmethod
    def make_tools(self) -> list[Tool]: ...

    @abstractmethod
    def task_ids(self) -> list[str]: ...

    @classmethod
    def tasks_from(cls, **env_kwargs: Any) -> dict[str, Any]:
        """The tasks by id that an env made with these kwargs would have, read from the task source
        they name (`tasks=`, `split=`, ...): no env, sandbox or backend is made, kwargs the source
        does not read are ignored. A domain env overrides it (and its `__init__` uses it)."""
        raise NotImplementedError(f"{cls.__name__} cannot read its tasks without an env")

    @classmethod
    def list_task_ids(cls, **env_kwargs: Any) -> list[str]:
        """The task ids of `tasks_from(**env_kwargs)`, sorted as `task_ids()` gives them."""
        return sorted(cls.tasks_from(**env_kwargs))

    @abstractmethod
    def get_task(self, task_id: str) -> Any: ...

    @abstractmethod
    async def setup(self, sandbox: AsyncSandboxInstance, task: Any) -> ToolContext:
        """Prepare the sandbox for `task`; return the context tools run in."""

    @abstractmethod
    def first_observation(self, task: Any) -> str: ...

    @abstractmethod
    async def grade(self, ctx: ToolContext, task: Any) -> tuple[float, dict]:
        """Score the episode's end state: (reward, report)."""

    def client_kwargs(self, kwargs: dict) -> dict:
        """The kwargs of a sandbox client for this env's tasks (the one it makes, or one that
        `orchard eval` shares between episodes); an env whose tasks need a backend setting adds it."""
        return kwargs

    def image_for(self, task: Any) -> str | None:
        return getattr(task, "image", None)

    def task_size(self, task: Any) -> dict:
        """What the task itself asks of its sandbox (`cpu`, `memory`, `block_network`, as
        `create_sandbox` takes them): a domain whose tasks declare it overrides this (Harbor's
        task.toml). Default: nothing."""
        return {}

    def sandbox_size(self, task: Any) -> dict:
        """`cpu`/`memory` (and `block_network`) of the task's sandbox: the env's `sandbox_cpu`/
        `sandbox_memory`, overridden by what the task asks (`task_size`)."""
        size = {k: v for k, v in (("cpu", self.sandbox_cpu), ("memory", self.sandbox_memory)) if v is not None}
        return {**size, **self.task_size(task)}

    def sandbox_spec(self, task: Any) -> dict:
        """The `create_sandbox` kwargs of the task's sandbox: its image and size (every sandbox an
        env or a wrapper makes for a task comes from here)."""
        return {"image": self.image_for(task), **self.sandbox_size(task)}

    async def before_sandbox(self, task: Any) -> None:
        """Pre-sandbox hook of a reset (not of a restore from a snapshot): runs once the task is
        chosen and the client made, before a sandbox is made or reused (e.g. Harbor builds the
        task's image, sets budgets from the task). `self.task` is still the last episode's."""

    async def reuse_sandbox(self, task: Any) -> ToolContext | None:
        """The tool context of `task` on the live sandbox of the last episode, or None to start a
        fresh sandbox (the default). An env whose set-up can be redone in place (GUI: reload the
        page) returns one; `self.task` is still the last episode's."""
        return None

    def on_ready(self, ctx: ToolContext, task: Any) -> None:
        """Called when the episode is ready to play (after set-up, reuse or restore), before the
        first observation. Default: nothing (Harbor starts the agent's clock here)."""

    async def fingerprint(self, ctx: ToolContext) -> str | None:
        """A cheap hash of the working tree after a step (None when not tracked)."""
        return None

    async def resume(self, sandbox: AsyncSandboxInstance, task: Any, ctx: ToolContext) -> ToolContext:
        """The tool context on a sandbox restored from a snapshot whose context was `ctx`. Processes are
        not kept by snapshots: an env with services restarts them here. Default: `ctx` on the new sandbox."""
        return forking.default_resume(sandbox, ctx)

    # ------------------------------------------------------------------ helpers
    @property
    def tool_schemas(self) -> list[dict]:
        return [t.schema() for t in self.tools.values()]

    @property
    def done(self) -> bool:
        """The episode is over (ended, failed or aborted): reset before stepping again."""
        return self._done

    @property
    def elapsed(self) -> float:
        """Seconds of the episode's wall-clock budget used so far."""
        return time.monotonic() - self._started

    def restart_clock(self) -> None:
        """The episode's wall-clock budget starts now."""
        self._started = time.monotonic()

    @property
    def client(self) -> AsyncSandboxClient | None:
        """The sandbox client: the one given, or the one this env made (None before it needed one)."""
        return self._client

    async def get_client(self) -> AsyncSandboxClient:
        """The sandbox client, made on first use from the env's backend/base_url/pool kwargs."""
        if self._client is None:
            self._client = AsyncSandboxClient(**self._client_args)
        return self._client

    def backend_name(self) -> str | None:
        """Which backend this env's sandboxes run on: "local", "docker", "kubernetes" (the
        in-process backend's name, whether the env was given a backend config, a backend object
        or a shared `client=`), None on an orchestrator (remote: not known here). Read off the
        client when there is one, else off the kwargs the env will make it with."""
        if self._client is not None:
            return getattr(self._client, "backend_name", None)
        return backend_name_for(self._client_args.get("backend"), self._client_args.get("base_url"))

    def choose_task(self, options: dict | None) -> str:
        """The task id of a reset: `options["task_id"]`, else one drawn from the env's seeded generator."""
        ids = self.task_ids()
        if options and options.get("task_id") is not None:
            task_id = options["task_id"]
            if task_id not in ids:
                raise gym.error.Error(f"unknown task_id {task_id!r}; this env has {len(ids)} tasks, e.g. {ids[:3]}")
            return task_id
        if not ids:
            raise gym.error.Error("this env has no tasks")
        return ids[int(self.np_random.integers(0, len(ids)))]

    def _info(self, **extra) -> dict:
        # step infos hold only what the same seed and actions reproduce (check_env asserts it);
        # timings and ids live in `self.trajectory`
        info = {"task_id": getattr(self.trajectory, "task_id", None),
                "step": len(self.trajectory.turns) if self.trajectory else 0}
        info.update(extra)
        return info

    def _out_of_budget(self) -> str | None:
        if len(self.trajectory.turns) >= self.max_steps:
            return f"step budget of {self.max_steps} used up"
        if self.max_seconds is not None and self.elapsed >= self.max_seconds:
            return f"wall-clock budget of {self.max_seconds:.0f}s used up"
        return None

    # ------------------------------------------------------------------ async API
    async def areset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        if options and options.get("snapshot") is not None:
            return await self.arestore(options["snapshot"], seed)
        super().reset(seed=seed)
        task_id = self.choose_task(options)
        task = self.get_task(task_id)
        client = await self.get_client()
        await self.before_sandbox(task)
        ctx = await self.reuse_sandbox(task) if self.sandbox is not None else None
        if ctx is not None:  # a warm reset: the same sandbox, set up again for `task`
            self.task, self._done = task, False
            self.trajectory = Trajectory(env_id=self.env_id, task_id=task_id, sandbox_id=self.sandbox.sandbox_id)
            self.trajectory.metadata["warm_reset"] = True
            self._started, self.ctx = time.monotonic(), ctx
        else:
            await self.release_sandbox(background=True)  # the last episode's sandbox goes while this one starts
            self.task = task
            self.trajectory = Trajectory(env_id=self.env_id, task_id=task_id)
            self._started, self._done = time.monotonic(), False
            self.sandbox = await client.create_sandbox(**self.sandbox_spec(task),
                                                       **forking.setup_snapshot_kwargs(self, task_id))
            self.trajectory.sandbox_id = self.sandbox.sandbox_id
            try:
                self.ctx = await forking.setup_or_resume(self, task_id)
            except BaseException:
                await self.release_sandbox()
                raise
        self.on_ready(self.ctx, task)
        self._last_obs = self.first_observation(task)
        return self._last_obs, self._info(tools=self.tool_schemas, sandbox_id=self.sandbox.sandbox_id)

    async def arestore(self, snap: Any, seed: int | None = None) -> tuple[Any, dict]:
        """Reset into a snapshot's state (what `reset(options={"snapshot": snap})` does): a new
        sandbox from it, the trajectory so far, the budget used."""
        snap = forking.check_snapshot(self, snap)
        gym.Env.reset(self, seed=seed)
        await self.release_sandbox()
        client = await self.get_client()
        self.snapshots.use(snap)
        self.task = snap.task
        self.trajectory = snap.trajectory.model_copy(deep=True)
        self.trajectory.metadata["restored_from"] = snap.snapshot_id
        self._started, self._done = time.monotonic() - snap.elapsed, False
        self.sandbox = await client.create_sandbox(from_snapshot=snap.snapshot_id, **snap.size)  # the snapshot's image
        self.trajectory.sandbox_id = self.sandbox.sandbox_id
        try:
            self.ctx = await self.resume(self.sandbox, self.task, snap.ctx)
        except BaseException:
            await self.release_sandbox()
            raise
        self.on_ready(self.ctx, self.task)
        turns = self.trajectory.turns
        self._last_obs = turns[-1].observation if turns else self.first_observation(self.task)
        return self._last_obs, self._info(tools=self.tool_schemas, sandbox_id=self.sandbox.sandbox_id,
                                          snapshot_id=snap.snapshot_id)

    async def astep(self, action: Any) -> tuple[str, float, bool, bool, dict]:
        if self.trajectory is None or self.ctx is None:
            raise gym.error.ResetNeeded("call reset() before step()")
        if self._done:
            raise gym.error.ResetNeeded("the episode is over; call reset()")
        turn = Turn(index=len(self.trajectory.turns), action=action)
        terminated = truncated = False
        reward, extra = 0.0, {}
        try:
            call = parse_action(action, list(self.tools))
            tool = self.tools[call.name]
            turn.tool, turn.arguments = call.name, call.arguments
            result = await tool.run(self.ctx, tool.parse(call.arguments))
            turn.observation, turn.command = result.output, result.command
            turn.exit_code, turn.duration = result.exit_code, result.duration
            terminated = result.submitted
            if not terminated and self.track_fingerprint:
                turn.fingerprint = await self.fingerprint(self.ctx)
        except (ActionError, ToolError) as e:
            turn.error = str(e)
            turn.observation = f"Error: {e}"
        except INFRA_ERRORS as e:
            return self._fail(turn, e)
        except OrchardError as e:  # the agent refused the request: tell the policy, carry on
            turn.error = str(e)
            turn.observation = f"Error: {e}"
        self.trajectory.turns.append(turn)
        if not terminated:
            reason = self._out_of_budget()
            truncated = reason is not None
            if truncated:
                extra["truncation"] = reason
        if terminated or truncated:
            try:
                reward, report = await self.grade(self.ctx, self.task)
            except INFRA_ERRORS as e:
                return self._fail(turn, e, appended=True)
            self._finish(reward, report, terminated, truncated)
            extra.update(report=report)
            error = grading_error(report)
            if error is not None and self.trajectory.error is None:  # the task, not the policy, failed
                self.trajectory.error, self.trajectory.error_kind = error, report["error_kind"]
                extra["error"] = error
        self._last_obs = turn.observation
        info = self._info(exit_code=turn.exit_code, fingerprint=turn.fingerprint, action_error=turn.error, **extra)
        return turn.observation, reward, terminated, truncated, info

    def _fail(self, turn: Turn, error: Exception, appended: bool = False):
        message = f"{type(error).__name__}: {error}"
        turn.error = message
        turn.observation = turn.observation or f"The sandbox failed: {message}"
        if not appended:
            self.trajectory.turns.append(turn)
        self.trajectory.error = message
        self._finish(0.0, {}, terminated=False, truncated=True)
        self._last_obs = turn.observation
        return turn.observation, 0.0, False, True, self._info(error=message)

    def _finish(self, reward: float, report: dict, terminated: bool, truncated: bool) -> None:
        self._done = True
        self.trajectory.reward, self.trajectory.report = reward, report
        self.trajectory.terminated, self.trajectory.truncated = terminated, truncated
        self.trajectory.ended_at = time.time()

    async def release_sandbox(self, background: bool = False) -> None:
        """Delete the episode's sandbox (its usage charged to the trajectory) and let go of the
        snapshot it was restored from; the env's own snapshots live until `close`. `background`
        (a reset): the usage is read now, the removal (a delete's slow part: killing, unmounting,
        freeing its disk) goes on while the next episode starts, and is awaited by the next
        release or close, so at most one is in flight per env."""
        sandbox, self.sandbox, self.ctx = self.sandbox, None, None
        pending, self._deleting = self._deleting, None
        if pending is not None:
            await pending
        if sandbox is not None:
            if background:
                await sandbox.collect_usage()
                self._deleting = asyncio.ensure_future(_delete_quietly(sandbox))
            else:
                await _delete_quietly(sandbox)
            charge_sandbox(self.trajectory, sandbox)  # its usage, read by delete(), into the episode's ledger
        await forking.release_all(self, closing=False)

    async def abort(self, reason: str) -> tuple[Any, float, bool, bool, dict]:
        """End the episode now as an error (what a wall-clock timeout does): the trajectory is
        marked with `reason` and the sandbox, with everything running in it, deleted. Returns
        the final step tuple (truncated, reward 0.0, `info["error"]`)."""
        if self.trajectory is not None and self.trajectory.error is None:
            self.trajectory.error = reason
            self._finish(0.0, {}, terminated=False, truncated=True)
        await self.release_sandbox()
        return self._last_obs, 0.0, False, True, self._info(error=reason)

    def clone(self) -> SandboxEnv:
        """A new env of the same class and settings with no episode, sharing the client (it
        closes with the last env that shares it) and a copy of the random generator."""
        child = copy.copy(self)
        child.snapshots = forking.SnapshotBook()
        child._deleting = None  # the parent's last sandbox, still being deleted, is the parent's
        child.sandbox, child.ctx, child.trajectory, child.task = None, None, None, None
        if self._owns_client and self._client is not None:
            forking.add_user(self._client)
        for name in self.per_episode_attrs:
            setattr(child, name, None)
        child._np_random = copy.deepcopy(self._np_random)
        child.tools = dict(self.tools)
        return child

    async def asnapshot(self) -> forking.EnvSnapshot:
        """Snapshot the episode's state now; `reset(options={"snapshot": snap})` continues from it."""
        return await forking.take_snapshot(self)

    async def afork(self, n: int) -> list[SandboxEnv]:
        """`n` envs continuing from this state, each with a copy of the trajectory so far (close them)."""
        return await forking.fork(self, n)

    async def aclose(self) -> None:
        await self.release_sandbox()
        await forking.release_all(self, closing=True)
        if self._owns_client and self._client is not None:
            if forking.last_user(self._client):  # forks share the client of the env they came from
                await self._client.aclose()
            self._client = None

    # ------------------------------------------------------------------ sync API
    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        return LoopThread.shared().run(self.areset(seed=seed, options=options))

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict]:
        return LoopThread.shared().run(self.astep(action))

    def snapshot(self) -> forking.EnvSnapshot:
        return LoopThread.shared().run(self.asnapshot())

    def fork(self, n: int) -> list[SandboxEnv]:
        return LoopThread.shared().run(self.afork(n))

    def close(self) -> None:
        if self.sandbox is not None or self._client is not None or self.snapshots.holds_any():
            LoopThread.shared().run(self.aclose())

    def render(self) -> str | None:
        if self.render_mode == "ansi":
            return self._last_obs
        return None


async def _delete_quietly(sandbox) -> None:
    try:
        await sandbox.delete()
    except OrchardError:
        pass  # already gone
