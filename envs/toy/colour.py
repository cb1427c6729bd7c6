"""A toy env with image observations: the right answer is in the picture only.

Each observation is `{"screenshot": (H, W, 3) uint8, "text": str}`, the shape of the GUI
env's: the screenshot is a square of one colour, the text says "write the colour's name
into answer.txt". The episode runs in a real sandbox like Orchard/Toy-v0 (bash, submit;
a check command grades it), so it exercises the image path of policies and trainers
(OpenAI `image_url` parts, vision-language GRPO, `orchard view`: `orchard eval` keeps each
screenshot as a PNG next to the trajectories) in seconds.

    from orchard_gym.envs.toy.colour import ColourEnv
    env = ColourEnv(backend={"type": "local"})
    obs, info = env.reset(options={"task_id": "colour-red"})    # obs["screenshot"].shape == (56, 56, 3)
    env.step({"name": "bash", "arguments": {"command": "echo red > answer.txt"}})
    obs, reward, terminated, truncated, info = env.step({"name": "submit", "arguments": {}})   # reward 1.0
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

from ..spaces import UnicodeText
from .env import ToyEnv, ToyTask

COLOURS = {"red": (220, 30, 30), "green": (30, 180, 60), "blue": (30, 60, 220), "yellow": (235, 210, 40)}
INSTRUCTION = "Which colour is the square in the picture? Write its name into answer.txt."


def colour_tasks(colours: dict[str, tuple[int, int, int]] = COLOURS) -> dict[str, ToyTask]:
    return {f"colour-{name}": ToyTask(task_id=f"colour-{name}", kind="write", answer=name, instruction=INSTRUCTION,
                                      check=f'test "$(tr -d " \\n" < answer.txt 2>/dev/null)" = {name}',
                                      solution=f"echo {name} > answer.txt")
            for name in colours}


def square(rgb: tuple[int, int, int], size: int) -> np.ndarray:
    """A `size`×`size` picture: a coloured square on white, with a white margin."""
    image = np.full((size, size, 3), 255, np.uint8)
    m = size // 8
    image[m:size - m, m:size - m] = rgb
    return image


class ColourEnv(ToyEnv):
    """Toy tasks whose answer is the colour of the square in the observation's screenshot."""

    env_id = "Orchard/ToyColour-v0"

    def __init__(self, *, size: int = 56, colours: dict[str, tuple[int, int, int]] | None = None,
                 max_steps: int = 4, **kwargs: Any):
        self.colours = dict(colours or COLOURS)
        self.size = size
        kwargs.pop("tasks", None)
        super().__init__(tasks=self.tasks_from(colours=self.colours), max_steps=max_steps, **kwargs)
        self.observation_space = spaces.Dict({"screenshot": spaces.Box(0, 255, (size, size, 3), np.uint8),
                                              "text": UnicodeText(self.observation_space.max_length)})

    @classmethod
    def tasks_from(cls, *, colours: dict[str, tuple[int, int, int]] | None = None, **_: Any) -> dict:
        return colour_tasks(dict(colours or COLOURS))

    def _picture(self) -> np.ndarray:
        return square(self.colours[self.task.answer], self.size)

    def first_observation(self, task: ToyTask) -> dict:
        return {"screenshot": self._picture(), "text": f"{task.instruction} Then call submit."}

    async def astep(self, action: Any):
        text, reward, terminated, truncated, info = await super().astep(action)
        return {"screenshot": self._picture(), "text": text}, reward, terminated, truncated, info
