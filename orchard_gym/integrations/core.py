"""The one adapter core every trainer integration drives: an Orchard env episode as calls.

Other ecosystems (TRL's `environment_factory`, OpenEnv, verifiers, SkyRL-Gym) want an env
as "start a task, call a tool, get the reward". `Episode` gives exactly that over a
registered Orchard env, through its public async API only (`areset`, `astep`, `aclose`):
no rollout logic lives here, so an adapter's rewards are `gym.make`'s by construction.

    hub = EnvHub("Orchard/Toy-v0", backend={"type": "local"})
    episode = hub.episode()
    text = hub.run(episode.start("write-003"))
    hub.run(episode.call("bash", {"command": "echo plum > lark.txt"}))
    outcome = hub.run(episode.finish())      # submits if the policy did not; grades
    assert outcome.reward == 1.0 and outcome.error is None
    hub.close()                              # releases every sandbox, closes the shared client

Observations are the env's own: text, or for image envs (GUI) a dict with a `screenshot`
array next to its `text`. `hub.images` says which; an adapter whose slot carries images
turns them into its own content with `observation_text` / `observation_image`, and one whose
slot cannot carry them refuses the env with `refuse_images` (its reason in the message).

Every episode of a hub shares one sandbox client (its warm pools, its connection), and
runs on the package's background event loop, so sync callers (TRL's `reset`) and async
ones (TRL's tool loop, OpenEnv's server) can both use it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import gymnasium as gym

from orchard_gym._loop import LoopThread
from orchard_gym.client import AsyncSandboxClient
from orchard_gym.screenshots import IMAGE_KEYS, observation_text

__all__ = ["EnvHub", "Episode", "EpisodeOver", "ImagesNotCarried", "Outcome", "carries_images", "make_env",
           "observation_image", "observation_text", "refuse_images"]

T = TypeVar("T")
CLIENT_KWARGS = ("backend", "base_url", "api_key", "pool")  # what the shared client is built from


@dataclass
class Outcome:
    """How an episode ended. `error` is set when the reward is not a grade (the sandbox died,
    the task could not be graded): trainers must drop the episode, never count it as 0.0."""

    reward: float | None
    error: str | None = None
    error_kind: str | None = None  # "infrastructure" or "grading"
    report: dict = field(default_factory=dict)
    steps: int = 0


class EpisodeOver(RuntimeError):
    """A tool was called after the episode ended."""


class ImagesNotCarried(gym.error.Error):
    """An image env (GUI) offered to a slot whose observations are text only."""


def carries_images(env: Any) -> bool:
    """Whether `env`'s observations carry an image (a Dict space with a `screenshot`)."""
    space = getattr(env, "observation_space", None)
    return isinstance(space, gym.spaces.Dict) and any(k in space.spaces for k in IMAGE_KEYS)


def observation_image(obs: Any) -> Any | None:
    """The image array of an observation (an image env's `screenshot`), else None."""
    if isinstance(obs, dict):
        return next((obs[k] for k in IMAGE_KEYS if obs.get(k) is not None), None)
    return None


def refuse_images(env_id: str, slot: str, why: str) -> ImagesNotCarried:
    """The error an adapter raises for an image env its slot cannot carry."""
    return ImagesNotCarried(f"{env_id} observes screenshots, and {slot} cannot carry them: {why}. "
                            "Use a slot that carries images (TRL's environment_factory with a vision-language "
                            "model, OpenEnv, verifiers) or orchard train grpo (docs/integrations.md)")


def make_env(env_id: str, **kwargs: Any) -> Any:
    """The unwrapped Orchard env behind `env_id` (registered ids, as `gym.make` builds them)."""
    import orchard_gym  # noqa: F401  (registers the ids)

    return gym.make(env_id, **kwargs).unwrapped


class EnvHub:
    """Episodes of one env id that share a sandbox client; `close()` releases them all."""

    def __init__(self, env_id: str, **env_kwargs: Any):
        if "client" in env_kwargs:
            raise gym.error.Error("EnvHub makes the shared client; give backend=/base_url=/pool= instead of client=")
        self.env_id = env_id
        self.client_kwargs = {k: env_kwargs.pop(k) for k in CLIENT_KWARGS if k in env_kwargs}
        self.env_kwargs = env_kwargs
        self._client: AsyncSandboxClient | None = None
        self._lock = threading.Lock()
        self.episodes: list[Episode] = []
        self.probe = make_env(env_id, **env_kwargs)  # tool schemas and tasks, without a sandbox
        self.closed = False

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return LoopThread.shared().loop

    @property
    def images(self) -> bool:
        """Whether this env's observations carry screenshots (GUI)."""
        return carries_images(self.probe)

    @property
    def tool_schemas(self) -> list[dict]:
        return self.probe.tool_schemas

    def task_ids(self) -> list[str]:
        return self.probe.task_ids()

    def prompt(self, task_id: str) -> str:
        """The task's first observation, as `reset` returns it (no sandbox needed)."""
        return self.probe.first_observation(self.probe.get_task(self.check_task(task_id)))

    def check_task(self, task_id: str) -> str:
        if task_id not in self.probe.task_ids():
            ids = self.probe.task_ids()
            raise ValueError(f"{self.env_id} has no task {task_id!r} ({len(ids)} tasks, e.g. {ids[:3]})")
        return task_id

    def client(self) -> AsyncSandboxClient:
        with self._lock:
            if self.closed:
                raise RuntimeError(f"the {self.env_id} hub is closed")
            if self._client is None:
                self._client = AsyncSandboxClient(**self.client_kwargs)
            return self._client

    def episode(self) -> Episode:
        episode = Episode(self)
        with self._lock:
            self.episodes.append(episode)
        return episode

    def forget(self, episode: Episode) -> None:
        """Drop a released episode from the hub (a long-lived server's ended sessions)."""
        with self._lock:
            if episode in self.episodes:
                self.episodes.remove(episode)

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule `coro` on the shared loop; a future any thread can wait on."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return LoopThread.shared().run(coro, timeout)

    async def arun(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await `coro` from another event loop (a trainer's own): it runs on the shared loop."""
        return await asyncio.wrap_future(self.submit(coro))

    async def aclose(self) -> None:
        with self._lock:
            episodes, self.closed = list(self.episodes), True
        await asyncio.gather(*(e.release() for e in episodes), return_exceptions=True)
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    def close(self) -> None:
        """Release every sandbox of every episode and close the shared client (idempotent)."""
        if not self.closed or self._client is not None:
            self.run(self.aclose())

    def live_sandboxes(self) -> int:
        return sum(e.env is not None and e.env.sandbox is not None for e in self.episodes)


_HUBS: dict[str, EnvHub] = {}
_HUBS_LOCK = threading.Lock()


def shared_hub(env_id: str, env_kwargs: dict) -> EnvHub:
    """One hub (one sandbox client) per env id and configuration in this process."""
    key = json.dumps([env_id, env_kwargs], sort_keys=True, default=str)
    with _HUBS_LOCK:
        if key not in _HUBS or _HUBS[key].closed:
            _HUBS[key] = EnvHub(env_id, **env_kwargs)
        return _HUBS[key]


class Episode:
    """One env instance driven by calls; reusable: `start` again releases the last sandbox."""

    def __init__(self, hub: EnvHub):
        self.hub = hub
        self.env: Any = None
        self.outcome: Outcome | None = None
        self._started: asyncio.Future | None = None

    async def start(self, task_id: str | None = None, seed: int | None = None) -> Any:
        """Provision the task's sandbox and set it up; returns the first observation (text, or an
        image env's {"screenshot", "text"} dict)."""
        if self.env is None:
            self.env = make_env(self.hub.env_id, client=self.hub.client(), **self.hub.env_kwargs)
        self.outcome = None
        options = {"task_id": task_id} if task_id is not None else None
        observation, _ = await self.env.areset(seed=seed, options=options)
        return observation

    def start_soon(self, task_id: str | None = None, seed: int | None = None) -> None:
        """`start` in the background (sync callers that must not wait, e.g. TRL's serial `reset`);
        the next `call`/`finish` waits for it and reports its failure."""
        self._started = self.hub.submit(self.start(task_id, seed))

    async def first_observation(self) -> Any:
        """The first observation of a `start_soon`, once the sandbox is up; EpisodeOver (and the
        episode errored, never scored) if it could not be started."""
        started = self._started
        await self._ready()
        if started is None:
            raise EpisodeOver("no episode was started")
        return started.result()

    async def _ready(self) -> None:
        started, self._started = self._started, None
        if started is not None:
            try:
                await asyncio.wrap_future(started)
            except Exception as e:  # provisioning failed: the episode is errored, not scored
                self.outcome = Outcome(None, f"{type(e).__name__}: {e}", "infrastructure")
                raise EpisodeOver(f"The sandbox could not be started: {self.outcome.error}") from None
        if self.outcome is not None and self.outcome.error:
            raise EpisodeOver(f"The sandbox could not be started: {self.outcome.error}")

    @property
    def done(self) -> bool:
        return self.outcome is not None or (self.env is not None and self.env.trajectory is not None
                                            and self.env.trajectory.ended_at is not None)

    async def call(self, tool: str, arguments: dict | None = None) -> Any:
        """Run one tool call as an env step; returns the observation (errors in words)."""
        return (await self.step({"name": tool, "arguments": arguments or {}}))[0]

    async def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        """`env.astep(action)`; after the end of the episode: EpisodeOver."""
        await self._ready()
        if self.env is None or self.env.trajectory is None:
            raise EpisodeOver("no episode was started")
        if self.done:
            raise EpisodeOver("The episode is over: no more tool calls.")
        try:
            result = await self.env.astep(action)
        except Exception as e:  # what the env did not turn into an observation (e.g. the sandbox vanished)
            self.outcome = Outcome(None, f"{type(e).__name__}: {e}", "infrastructure",
                                   steps=len(self.env.trajectory.turns))
            raise EpisodeOver(f"The episode failed: {self.outcome.error}") from None
        if result[2] or result[3]:
            self.outcome = outcome_of(self.env, result[1])
        return result

    async def finish(self) -> Outcome:
        """The episode's outcome; an unfinished episode is submitted (and so graded) first."""
        try:
            await self._ready()
        except EpisodeOver:
            return self.outcome
        if self.outcome is None:
            if self.env is None or self.env.trajectory is None:
                raise EpisodeOver("no episode was started")
            if "submit" in self.env.tools:
                await self.step({"name": "submit", "arguments": {}})
            elif "terminate" in self.env.tools:  # GUI's end of an episode, as it stands (then graded)
                await self.step({"name": "terminate", "arguments": {"status": "failure"}})
            else:  # no way to end it early: the env's own budget decides
                raise EpisodeOver(f"{self.hub.env_id} has no submit tool; the episode is still running")
        return self.outcome

    async def release(self) -> None:
        """Delete the sandbox (the env stays, for the next `start`)."""
        started, self._started = self._started, None
        if started is not None:
            try:
                await asyncio.wrap_future(started)
            except Exception:
                pass
        if self.env is not None:
            await self.env.aclose()


def outcome_of(env: Any, reward: float) -> Outcome:
    """The Outcome of an ended episode, from its trajectory (where the env marks errors)."""
    t = env.trajectory
    if t.error is not None:
        return Outcome(None, t.error, t.error_kind or "infrastructure", dict(t.report or {}), len(t.turns))
    return Outcome(float(reward), None, None, dict(t.report or {}), len(t.turns))

