"""Orchard envs as OpenEnv servers, and OpenEnv servers as Gymnasium envs (`openenv` 0.10).

Serve (or `orchard serve-env Orchard/Claw-v0 --port 8010`):

    from orchard_gym.integrations.openenv import create_app
    app = create_app("Orchard/Claw-v0", backend={"type": "local"}, max_sessions=8, session_timeout=600)
    # uvicorn.run(app, port=8010): OpenEnv's /reset /step /state /schema /health /ws

Drive it with OpenEnv's own client:

    from openenv.core.generic_client import GenericEnvClient
    with GenericEnvClient(base_url="http://127.0.0.1:8010").sync() as env:
        first = env.reset(task_id="mail-reply-001")        # observation: text, tools, task_id
        result = env.step({"tool": "mail_list_messages", "arguments": {}})
        result = env.step({"tool": "submit", "arguments": {}})
        result.reward, result.done                          # the env's graded reward, True

The env's tools are MCP tools too (`/mcp` tools/list, tools/call; OpenEnv's `MCPToolClient`):

    from openenv.core.mcp_client import MCPToolClient
    with MCPToolClient(base_url="http://127.0.0.1:8010").sync() as env:
        env.reset(task_id="mail-reply-001")                 # the task's text: observation.metadata["text"]
        env.list_tools()                                    # the env's tools: names, descriptions, schemas
        env.call_tool("submit")["reward"]                   # a call's result is the step's observation

The app is built by OpenEnv's own `create_app`: each WebSocket session gets its own env
instance (one sandbox, provisioned at `reset`, deleted when the session ends), sessions are
capped at `max_sessions` and idle ones reaped after `session_timeout` seconds by OpenEnv's
reaper. All sessions share one sandbox client (`EnvHub`). An episode that errored (the
sandbox died, the task could not be graded) ends with `reward=None` and `error` set in the
observation: never a silent 0.0.

The other way, `gym.make("Orchard/OpenEnv-v0", url=...)` is a Gymnasium env over any OpenEnv
server (text observations; dict actions as that server's schema says; for Orchard servers a
tool call `{"name": ..., "arguments": ...}` or `{"tool": ..., "arguments": ...}`).

Image envs (GUI): an observation is JSON, so the screen travels as a PNG data URL in the
observation's `image` field (`text` holds the env's text), at reset and after every step;
`Orchard/OpenEnv-v0` over such a server gives `{"screenshot": array, "text": str}`
observations, as the GUI env itself does.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import gymnasium as gym
import numpy as np
from openenv.core.env_server.http_server import create_app as openenv_create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.types import Action, ConcurrencyConfig, EnvironmentMetadata, Observation, State
from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from orchard_gym.envs.spaces import AgentAction, UnicodeText
from orchard_gym.envs.tools import ToolError
from orchard_gym.screenshots import data_url, image_arrays

from .core import EnvHub, Episode, EpisodeOver, observation_image, observation_text
from .openenv_mcp import Refused, no_tools, tools_server


class OrchardAction(Action):
    """One tool call."""

    tool: str = Field(description="the tool's name (see the reset observation's `tools`)")
    arguments: dict[str, Any] = Field(default_factory=dict, description="the tool's arguments")

    @model_validator(mode="before")
    @classmethod
    def _not_mcp(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("type") in ("call_tool", "list_tools"):
            raise PydanticCustomError("mcp_action", "MCP actions go to /mcp (JSON-RPC tools/list and tools/call "
                                      "with the session_id: OpenEnv's MCPToolClient.list_tools / call_tool); "
                                      "a step is {tool, arguments}")
        return data


class OrchardObservation(Observation):
    text: str = Field("", description="the env's observation: the task at reset, the tool's output after a step")
    task_id: str | None = None
    tools: list[dict] = Field(default_factory=list, description="OpenAI-style tool schemas (at reset)")
    action_error: str | None = Field(None, description="why the action was refused (the episode goes on)")
    error: str | None = Field(None, description="why the episode errored: its reward is not a grade")
    report: dict = Field(default_factory=dict, description="the grader's report (at the end)")
    image: str | None = Field(None, description="image envs (GUI): the screen as a data:image/png;base64 URL")


class OrchardState(State):
    task_id: str | None = None
    done: bool = False


class OrchardEnvironment(MCPEnvironment):
    """One OpenEnv session: one Orchard episode (a sandbox from reset to close). Its tools are
    also MCP tools (`/mcp` tools/list, tools/call), run as steps of this session's episode."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, hub: EnvHub):
        self.hub = hub
        self.episode: Episode | None = None  # made at the first reset: a session never reset holds nothing
        self._state = OrchardState()
        self._stepping = asyncio.Lock()  # one step at a time, whichever door (/ws, /mcp) it comes through
        server = tools_server(hub.env_id, getattr(hub.probe, "tool_schemas", None) or [], self._mcp_call)
        if server is None:  # no tools: OpenEnv's /mcp answers "does not support MCP"
            Environment.__init__(self)
            self.mcp_server = self.mcp_client = None
        else:
            super().__init__(server)

    @asynccontextmanager
    async def mcp_session(self) -> AsyncIterator[Any]:
        if self.mcp_client is None:  # an env without tools: nothing to hold open
            yield None
            return
        async with super().mcp_session() as client:
            yield client

    async def reset_async(self, seed: int | None = None, episode_id: str | None = None,
                          task_id: str | None = None, **kwargs: Any) -> OrchardObservation:
        if task_id is not None:
            self.hub.check_task(task_id)
        if self.episode is None:
            self.episode = self.hub.episode()
        episode = self.episode
        async with self._stepping:
            obs = await self.hub.arun(episode.start(task_id, seed))
        task = episode.env.trajectory.task_id
        self._state = OrchardState(episode_id=episode_id or uuid.uuid4().hex, step_count=0, task_id=task)
        content = _content(obs)
        # OpenEnv's MCPToolClient reads an observation with `tools` as a tool listing and keeps only its
        # metadata: the task's text is there too for it
        return OrchardObservation(**content, task_id=task, tools=self.hub.tool_schemas,
                                  metadata={"task_id": task, "text": content["text"]})

    async def step_async(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        if isinstance(action, OrchardAction):
            return await self._step({"name": action.tool, "arguments": action.arguments})
        if self.mcp_client is None:  # a list_tools / call_tool action (HTTP /step) on an env without tools
            return OrchardObservation(text=no_tools(self.hub.env_id), action_error=no_tools(self.hub.env_id))
        return await super().step_async(action, timeout_s=timeout_s, **kwargs)

    async def _step(self, call: dict) -> OrchardObservation:
        async with self._stepping:
            return await self._step_now(call)

    async def _step_now(self, call: dict) -> OrchardObservation:
        """One step of this session's episode (the one place both doors end up; under `_stepping`)."""
        episode = self.episode
        if episode is None:
            return OrchardObservation(text="no episode: reset first", action_error="no episode: reset first")
        try:
            seen, reward, terminated, truncated, info = await self.hub.arun(episode.step(call))
        except EpisodeOver as e:
            outcome = episode.outcome
            self._state.done = True
            return OrchardObservation(text=str(e), task_id=self._state.task_id, done=True, reward=None,
                                      error=outcome.error if outcome else str(e))
        self._state.step_count += 1
        done = terminated or truncated
        obs = OrchardObservation(**_content(seen), task_id=self._state.task_id, done=done,
                                 action_error=info.get("action_error"))
        if done:
            outcome = episode.outcome
            assert outcome is not None  # Episode.step sets it when the step ends the episode
            self._state.done = True
            obs.reward, obs.error, obs.report = outcome.reward, outcome.error, _jsonable(outcome.report)
        return obs

    async def _mcp_call(self, tool: str, arguments: dict) -> dict:
        """An MCP tools/call as a step; what is not a step (no episode yet, the episode over, arguments
        the tool's own `parse` refuses) is refused and changes nothing."""
        try:
            self.hub.probe.tools[tool].parse(arguments)
        except ToolError as e:
            raise Refused(str(e)) from None
        async with self._stepping:  # checked where no other call can end the episode meanwhile
            if self.episode is None or self._state.task_id is None:
                raise Refused(f"no episode in this session yet: reset first (then call {tool})")
            if self.episode.done:
                raise Refused("the episode is over: no more tool calls (reset for a new one)")
            obs = await self._step_now({"name": tool, "arguments": arguments})
        return obs.model_dump(exclude={"tools", "metadata"})

    def _step_impl(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        return self.hub.run(self.step_async(action))

    def reset(self, seed: int | None = None, episode_id: str | None = None, task_id: str | None = None,
              **kwargs: Any) -> OrchardObservation:
        return self.hub.run(self.reset_async(seed, episode_id, task_id))

    @property
    def state(self) -> OrchardState:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(name=self.hub.env_id, description=(self.hub.probe.__doc__ or "").strip()[:500])

    def close(self) -> None:
        episode, self.episode = self.episode, None
        if episode is not None:
            self.hub.run(episode.release())
            self.hub.forget(episode)
        super().close()


def _content(obs: Any) -> dict:
    """An env observation as the observation's `text` and (image envs) `image` fields."""
    image = observation_image(obs)
    return {"text": observation_text(obs), "image": data_url(image) if image is not None else None}


def _jsonable(report: dict) -> dict:
    return json.loads(json.dumps(report, default=str))


def create_app(env_id: str, *, max_sessions: int = 8, session_timeout: float | None = 600.0, **env_kwargs: Any):
    """OpenEnv's FastAPI app over `env_id` (env_kwargs as `gym.make` takes them)."""
    hub = EnvHub(env_id, **env_kwargs)
    app = openenv_create_app(lambda: OrchardEnvironment(hub), OrchardAction, OrchardObservation,
                             env_name=env_id.replace("/", "-"), state_cls=OrchardState,
                             concurrency_config=ConcurrencyConfig(max_concurrent_envs=max_sessions,
                                                                  session_timeout=session_timeout))
    app.state.orchard_hub = hub
    app.router.on_shutdown.append(lambda: hub.submit(hub.aclose()))  # scheduled on the hub's loop at once
    return app


def serve(env_id: str, *, host: str = "127.0.0.1", port: int = 8010, **kwargs: Any) -> None:
    import uvicorn

    uvicorn.run(create_app(env_id, **kwargs), host=host, port=port)


class OpenEnvEnv(gym.Env):
    """Gymnasium env over an OpenEnv server at `url` (OpenEnv's own sync client, one session)."""

    metadata = {"render_modes": []}

    def __init__(self, url: str, observation_max_length: int = 1_000_000):
        from openenv.core.generic_client import GenericEnvClient

        self.url = url
        self.client = GenericEnvClient(base_url=url).sync()
        self.observation_space = UnicodeText(observation_max_length)
        self.action_space = AgentAction(1_000_000)
        self._connected = False

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        if not self._connected:
            self.client.connect()
            self._connected = True
        kwargs = dict(options or {})
        if seed is not None:
            kwargs["seed"] = seed
        result = self.client.reset(**kwargs)
        obs = result.observation
        return self._observation(obs), {k: v for k, v in obs.items() if k not in ("text", "image")}

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict]:
        if isinstance(action, dict) and "name" in action and "tool" not in action:  # OpenAI-style tool call
            fn = action.get("function", action)
            args = fn.get("arguments") or {}
            action = {"tool": fn["name"], "arguments": json.loads(args) if isinstance(args, str) else args}
        result = self.client.step(action)
        obs = dict(result.observation)
        info = {k: v for k, v in obs.items() if k not in ("text", "image")}
        reward = result.reward
        if result.done and reward is None:  # an errored episode: no grade, said in info
            info.setdefault("error", "the server gave no reward")
        return self._observation(obs), float(reward or 0.0), bool(result.done), False, info

    def _observation(self, obs: dict) -> Any:
        """The server's observation as this env returns it: its text, or with an `image` (an Orchard
        image env's screen) the `{"screenshot": array, "text": str}` an Orchard image env returns (the
        observation space becomes that Dict when the first screen arrives)."""
        if not isinstance(obs.get("image"), str):
            return _text(obs)
        [screen] = image_arrays([{"type": "image_url", "image_url": {"url": obs["image"]}}])
        if not isinstance(self.observation_space, gym.spaces.Dict):
            self.observation_space = gym.spaces.Dict({
                "screenshot": gym.spaces.Box(0, 255, screen.shape, np.uint8), "text": self.observation_space})
        return {"screenshot": screen, "text": _text(obs)}

    def close(self) -> None:
        if self._connected:
            self.client.close()
            self._connected = False


def _text(obs: dict) -> str:
    return obs["text"] if isinstance(obs.get("text"), str) else json.dumps(obs)


__all__ = ["OpenEnvEnv", "OrchardAction", "OrchardEnvironment", "OrchardObservation", "create_app", "serve"]
