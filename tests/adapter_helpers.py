"""What the trainer-adapter tests share: the reward `gym.make` gives for the same actions (the
number every adapter must match), a tool call written as a model writes it, and the sandboxes
left on a backend."""

from __future__ import annotations

import asyncio
import json

import gymnasium as gym

from orchard_gym.client import AsyncSandboxClient


def as_text(call: dict) -> str:
    """A tool call as a model writes it (Qwen/Hermes style)."""
    return f"Let me act.\n<tool_call>\n{json.dumps(call)}\n</tool_call>"


def gym_reward(env_id, task_id, actions, **kwargs) -> float:
    """`gym.make`'s reward for `actions` on `task_id`; the episode must end with them."""
    env = gym.make(env_id, **kwargs)
    try:
        env.reset(options={"task_id": task_id})
        for action in actions:
            _, reward, terminated, truncated, _ = env.step(action)
        assert terminated or truncated
        return reward
    finally:
        env.close()


def live_sandboxes(backend) -> list:
    async def listing():
        async with AsyncSandboxClient(backend) as client:
            return await client.list_sandboxes()

    return asyncio.run(listing())
