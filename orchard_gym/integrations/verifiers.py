"""Orchard envs as verifiers environments (`verifiers` 0.4, its `verifiers.v1` stack).

    from orchard_gym.integrations.verifiers import load_environment
    env = load_environment("Orchard/Claw-v0", backend={"type": "local"})   # a verifiers `Env`
    # verifiers' own eval loop on it (or: vf-eval orchard-verifiers
    #   --env.taskset.env Orchard/Claw-v0 --model ... --client.base-url ...):
    #   run_eval(EvalConfig(env=env.config, model=..., client=...))

This module is verifiers' taskset plugin for every Orchard env: its taskset id is
`orchard-verifiers` (the wheel's `orchard_verifiers` re-exports this module), `env` in its config names the Orchard
env, `env_kwargs` are `gym.make` kwargs, `tasks` picks task ids (default: all). As verifiers'
own OpenEnv taskset does, the env plays the user: the model's reply is the action (parsed
as Orchard parses any text action: a `<tool_call>` block, a JSON tool call, one fenced bash
block), the tool runs in the episode's Orchard sandbox as one `env.step`, and its
observation is the next user turn, until the episode ends. An image env's (GUI's) observation
is a user turn of OpenAI content parts, its text and its screen as a PNG data URL
(`screenshots.observation_parts`): verifiers 0.4 types user content as `str | list[TextContentPart |
ImageUrlContentPart]` and hands such parts to the model as they are (its null harness relaunches
its chat program on the conversation, `message_to_wire` keeping the `image_url` parts). Images go
in user turns, not tool messages: the env plays the user here, and OpenAI's chat API takes only
text parts in a tool message. The episode's graded reward is
the trace's reward (`orchard_reward`, so verifiers' `reward` is `gym.make`'s); an episode
the model left open when verifiers' turn budget ran out is submitted, as the env's own
budget would. The metric `orchard_step_ms` is the median time of one env step as run here.
An errored episode (dead sandbox, ungradable task) records an `EnvError` on
the trace and no reward: never a 0.0 that reads as a grade.

verifiers 0.4 pins `mcp==2.0.0`, which OpenEnv 0.10 cannot share: install this extra in a
venv of its own (`scripts/install_verifiers.sh` builds `.venv-verifiers`).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Iterator
from typing import Any

import verifiers.v1 as vf
from pydantic import Field, field_validator
from verifiers.v1.harnesses.null import NullHarnessConfig

from orchard_gym.screenshots import observation_parts

from .core import EpisodeOver, shared_hub

TASKSET_ID = "orchard-verifiers"  # verifiers imports it as the top-level module `orchard_verifiers`
REWARD = "orchard_reward"
STEP_MS = "orchard_step_ms"  # metric: median ms of one env step as this adapter runs it


def tools_prompt(tool_schemas: list[dict], images: bool = False) -> str:
    """The system prompt naming the env's tools and the action format Orchard parses."""
    names = {s.get("function", s).get("name") for s in tool_schemas}  # OpenAI's {"type": "function", "function": ...}
    end = "`submit`" if "submit" in names else "`terminate`" if "terminate" in names else "the tool that ends the task"
    output = "the screen after it (an image) and the tool's output" if images else "the tool's output"
    return ("You act in a sandbox through tools. Each reply makes exactly one tool call, written as\n"
            '<tool_call>{"name": TOOL, "arguments": {...}}</tool_call>\n'
            f"and {output} comes back as the next message. Call {end} when you are done.\n"
            f"Tools (JSON schemas):\n{json.dumps(tool_schemas, indent=1)}")


def user_turn(observation: Any) -> str | list[dict]:
    """An env observation as verifiers' next user turn: its text, or for an image env a user
    message whose content is the observation's text and screen (a PNG data URL) as parts."""
    if isinstance(observation, dict):  # an image env's; one without a screen: InvalidRequest saying so
        return [{"role": "user", "content": observation_parts(observation)}]
    return observation if isinstance(observation, str) else str(observation)


async def next_user_turn(observation: Any) -> str | list[dict]:
    """`user_turn`; a screen's PNG (~70 ms at 1280x720) is encoded off the loop other episodes
    share, text turns as they are (no thread hop for them)."""
    if isinstance(observation, dict):
        return await asyncio.to_thread(user_turn, observation)
    return user_turn(observation)


class OrchardConfig(vf.TasksetConfig):
    env: str = "Orchard/Toy-v0"
    """The Orchard env id (`Orchard/SWE-v0`, `Orchard/Claw-v0`, ...)."""
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    """`gym.make` kwargs (backend, max_steps, tasks, ...); equal kwargs share one sandbox client."""
    tasks: list[str] | None = None
    """Task ids to load (default: every task of the env)."""

    @field_validator("env")
    @classmethod
    def _known_env(cls, env: str) -> str:
        from orchard_gym.registration import ENVS

        if env == "Orchard/OpenEnv-v0":
            raise ValueError("Orchard/OpenEnv-v0 is a client of another OpenEnv server, with no tasks to load: "
                             "serve that env to verifiers directly")
        if env not in ENVS:
            raise ValueError(f"{env!r} is no Orchard env (known: {sorted(e for e in ENVS if e != 'Orchard/OpenEnv-v0')})")
        return env


class OrchardData(vf.TaskData):
    env: str
    env_kwargs: dict[str, Any]
    task_id: str


class OrchardTask(vf.Task[OrchardData]):
    @property
    def key(self) -> str:
        return f"{self.data.env}:{self.data.task_id}"


class OrchardTaskset(vf.Taskset[OrchardTask, OrchardConfig]):
    def load(self) -> Iterator[OrchardTask]:
        hub = shared_hub(self.config.env, self.config.env_kwargs)
        ids = [hub.check_task(t) for t in self.config.tasks] if self.config.tasks is not None else hub.task_ids()
        system = tools_prompt(hub.tool_schemas, images=hub.images)
        for task_id in ids:  # prompt=None: the env opens the exchange with reset's observation
            yield OrchardTask(OrchardData(id=task_id, name=task_id, prompt=None, system_prompt=system,
                                          env=self.config.env, env_kwargs=self.config.env_kwargs, task_id=task_id),
                              self.config.task)


class OrchardEnvConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig(harness=NullHarnessConfig(id="null"), runtime=vf.SubprocessConfig())
    """The policy's seat: verifiers' plain chat harness (it runs no code; the tools run in
    Orchard's sandboxes), in a local subprocess."""


class OrchardEnv(vf.Env[OrchardEnvConfig]):
    """One Orchard episode per verifiers episode, through `orchard_gym.integrations.core`."""

    async def run(self, task: OrchardTask, agents: vf.Agents) -> None:
        data = task.data
        hub = shared_hub(data.env, data.env_kwargs)
        episode = hub.episode()
        try:
            observation = await hub.arun(episode.start(data.task_id))
            async with agents.agent.interaction(task) as interaction:
                segment = await interaction.turn(await next_user_turn(observation))
                step_seconds = []
                while not segment.terminated:
                    started = time.perf_counter()
                    try:
                        observation, *_ = await hub.arun(episode.step(segment.last_reply))
                    except EpisodeOver:
                        break
                    step_seconds.append(time.perf_counter() - started)
                    if episode.done:
                        break
                    segment = await interaction.turn(await next_user_turn(observation))
                outcome = await hub.arun(episode.finish())  # submits an episode the model left open
            if step_seconds:  # the env's share of each turn (scripts/bench_integrations.py)
                interaction.trace.record_metric(STEP_MS, statistics.median(step_seconds) * 1000)
            if outcome.error is not None:
                interaction.trace.record_error(vf.EnvError(f"{outcome.error_kind}: {outcome.error}"))
            else:
                interaction.trace.record_reward(REWARD, float(outcome.reward))
        finally:
            await hub.arun(episode.release())


def load_environment(env_id: str, *, tasks: list[str] | None = None, agent: vf.AgentConfig | None = None,
                     **env_kwargs: Any) -> OrchardEnv:
    """The verifiers `Env` for the Orchard env `env_id` (`gym.make` kwargs in `env_kwargs`);
    `env.config` is what verifiers' `EvalConfig(env=...)` takes."""
    if not isinstance(env_id, str):
        raise TypeError(f"env_id must be an Orchard env id string, not {type(env_id).__name__}")
    config = OrchardEnvConfig(taskset=OrchardConfig(id=TASKSET_ID, env=env_id, env_kwargs=env_kwargs, tasks=tasks),
                              **({"agent": agent} if agent is not None else {}))
    return vf.load_environment(config)


__all__ = ["OrchardEnv", "OrchardTaskset", "load_environment", "tools_prompt", "user_turn"]
