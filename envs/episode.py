"""One episode with an async policy: its chat messages, and the loop of policy turns and env steps.

The policy sees the conversation so far; its action (text or a tool-call dict) is appended
as the assistant's turn and the env's observation as the reply, so a chat model can be
plugged in directly. `play` goes on from any point of a conversation (the branching and
GRPO drivers fork it); `envs/rollout.py` runs many episodes concurrently.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from orchard_gym import chat, ledger
from orchard_gym.errors import InvalidRequest
from orchard_gym.screenshots import is_image_observation, observation_parts, observation_text
from orchard_gym.trajectory import Trajectory

from .base import SandboxEnv

Policy = Callable[[list[dict], list[dict]], Awaitable[Any]]
# (trajectory, turn index or -1 for the first observation, image array) -> what to keep in the trajectory
# (a path relative to the trajectories file, or a data URL); see orchard_gym.screenshots.ScreenshotFiles
ScreenshotSink = Callable[[Trajectory, int, Any], str]
SYSTEM_PROMPT = ("You are an autonomous agent working in a sandbox. Act with the tools you are given, one call "
                 "per turn, and call submit when you are done.")


def assistant_message(action: Any) -> dict:
    """The chat message that stands for an action (orchard_gym.chat); an action that is no chat
    message at all (the env answers it with what was wrong) stands as its text."""
    if isinstance(action, list):  # not one action (the env refuses it): never several calls to answer
        return {"role": "assistant", "content": repr(action)}
    try:
        return chat.assistant_message(action)
    except chat.FormatError:
        return {"role": "assistant", "content": repr(action)}


def observation_message(assistant: dict, observation: str) -> dict:
    calls = assistant.get("tool_calls")
    if calls:
        return {"role": "tool", "tool_call_id": calls[0]["id"], "content": observation}
    return {"role": "user", "content": observation}


def observation_messages(assistant: dict, observation: Any) -> list[dict]:
    """The env's answer as chat messages. An image observation (`{"screenshot", "text"}`) comes as
    OpenAI content parts; after a tool call its text is the tool result and the image follows in a
    user message (chat APIs take images from users only)."""
    if not is_image_observation(observation):
        return [observation_message(assistant, observation_text(observation))]
    parts = observation_parts(observation)
    if not assistant.get("tool_calls"):
        return [{"role": "user", "content": parts}]
    return [observation_message(assistant, observation_text(observation)),
            {"role": "user", "content": [p for p in parts if p["type"] != "text"]}]


def first_messages(observation: Any, system_prompt: str = SYSTEM_PROMPT) -> list[dict]:
    """The conversation an episode starts from: the system prompt and the task (the first observation)."""
    return [{"role": "system", "content": system_prompt}, {"role": "user", "content": observation_parts(observation)}]


def _keep(screenshots: ScreenshotSink, trajectory: Trajectory, index: int, obs: dict) -> str | None:
    """A screenshot kept for the record; one that cannot be kept is noted, the episode goes on."""
    try:
        return screenshots(trajectory, index, obs.get("screenshot"))
    except Exception as e:  # a record-keeping failure must not end the episode
        trajectory.metadata.setdefault("screenshot_errors", []).append(f"turn {index}: {type(e).__name__}: {e}")
        return None


async def run_episode(env: SandboxEnv, policy: Policy, task_id: str | None = None, *, seed: int | None = None,
                      record_messages: bool = False, system_prompt: str = SYSTEM_PROMPT,
                      screenshots: ScreenshotSink | None = None) -> Trajectory:
    """One episode from reset to the end; infrastructure failures end up in `trajectory.error`."""
    started = time.time()  # a failed reset's episode lasted from here (not from its record's creation)
    try:
        obs, info = await env.areset(seed=seed, options={"task_id": task_id} if task_id else None)
    except Exception as e:  # could not even start: a failed trajectory, never a crash of the batch
        return Trajectory(env_id=env.env_id, task_id=task_id or "?", error=f"reset failed: {type(e).__name__}: {e}",
                          started_at=started, ended_at=time.time())
    env.trajectory.metadata.setdefault("task", observation_text(obs)[:4000])  # what `orchard view` shows as the task
    if screenshots is not None and is_image_observation(obs):
        env.trajectory.metadata["screenshot"] = _keep(screenshots, env.trajectory, -1, obs)
    try:
        messages = first_messages(obs, system_prompt)
    except InvalidRequest as e:
        env.trajectory.error, env.trajectory.ended_at = f"observation failed: {e}", time.time()
        return env.trajectory
    return await play(env, policy, messages, info["tools"], record_messages=record_messages, screenshots=screenshots)


async def play(env: SandboxEnv, policy: Policy, messages: list[dict], tools: list[dict], *,
               record_messages: bool = False, screenshots: ScreenshotSink | None = None,
               stop_at: int | None = None, bind: bool = True) -> Trajectory:
    """Go on with a reset env from the conversation `messages` (extended in place) until the episode
    ends, or until `stop_at` turns are done (then the env is left live, e.g. to fork it). `bind=False`:
    the policy is bound to this env already (a later call of the same episode)."""
    if bind and hasattr(policy, "bind"):  # a policy that needs the env itself (e.g. the oracle)
        policy = policy.bind(env)
    bound = ledger.bind(ledger.ledger_of(env.trajectory))  # the policy's record_tokens() land in this episode
    try:
        return await _turns(env, policy, messages, tools, record_messages, screenshots, stop_at)
    finally:
        ledger.unbind(bound)


async def _turns(env: SandboxEnv, policy: Policy, messages: list[dict], tools: list[dict], record_messages: bool,
                 screenshots: ScreenshotSink | None, stop_at: int | None) -> Trajectory:
    done = env.done
    while not done and (stop_at is None or len(env.trajectory.turns) < stop_at):
        try:
            action = await policy(messages, tools)
        except Exception as e:
            env.trajectory.error = f"policy failed: {type(e).__name__}: {e}"
            env.trajectory.ended_at = time.time()
            break
        prompt = list(messages) if record_messages else None
        obs, reward, terminated, truncated, info = await env.astep(action)
        if prompt is not None:
            env.trajectory.turns[-1].messages = prompt
        turn = env.trajectory.turns[-1] if env.trajectory.turns else None
        if screenshots is not None and turn is not None and turn.screenshot is None and is_image_observation(obs):
            turn.screenshot = _keep(screenshots, env.trajectory, turn.index, obs)
        assistant = assistant_message(action)
        try:
            messages += [assistant, *observation_messages(assistant, obs)]
        except InvalidRequest as e:  # the env answered with something no policy can be shown
            env.trajectory.error = f"observation failed: {e}"
            env.trajectory.ended_at = time.time()
            break
        done = terminated or truncated
    return env.trajectory
