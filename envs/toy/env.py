"""Orchard/Toy-v0: short file tasks in a real sandbox, graded by a command run there.

A task family for learning demos, benchmarks and tests of training loops: the
correct solution is one short shell command, so a tiny model can learn it, but the
episode is real (a sandbox is provisioned, the policy acts with `bash` and `submit`,
and a check command decides the reward). Kinds:

- `write`:  "Create a file named lark.txt that contains the word plum."
            solved by `echo plum > lark.txt`;
- `secret`: "The file notes/fig.txt holds a secret word. Write that word into answer.txt."
            solved by `cp notes/fig.txt answer.txt` (or `cat`, then `echo`);
- `count`:  "Count the lines of data/owl.txt and write the number into answer.txt."
            solved by `wc -l < data/owl.txt > answer.txt`.

    import gymnasium as gym, orchard_gym
    env = gym.make("Orchard/Toy-v0", backend={"type": "local"}, kinds=["write"], num_tasks=20)
    obs, info = env.reset(options={"task_id": "write-003"})
    env.step({"name": "bash", "arguments": {"command": env.unwrapped.task.solution}})
    obs, reward, terminated, truncated, info = env.step({"name": "submit", "arguments": {}})
    assert reward == 1.0

Reward: 1.0 when the check command exits 0 in the sandbox at the end of the
episode, else 0.0. `info["report"]` holds the check and its output.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field

from orchard_gym.client import AsyncSandboxInstance

from ..base import SandboxEnv
from ..tools import BashTool, SubmitTool, Tool, ToolContext

Kind = Literal["write", "secret", "count"]
KINDS: tuple[Kind, ...] = ("write", "secret", "count")
NAMES = ["lark", "fern", "moss", "reed", "wren", "kite", "pine", "dune", "opal", "iris", "jade", "onyx"]
WORDS = ["plum", "pear", "lime", "kiwi", "fig", "date", "sage", "mint", "rose", "teal", "gold", "ruby"]
DIRS = ["notes", "data", "docs", "tmp"]


class ToyTask(BaseModel):
    """One task: what the policy is told, what is put in the sandbox, how it is checked."""

    task_id: str
    kind: Kind
    instruction: str
    files: dict[str, str] = Field(default_factory=dict, description="relative path -> content, written at reset")
    check: str = Field(description="shell command run at the end; exit code 0 means solved")
    solution: str = Field(description="one command that solves the task (for SFT data and scripted policies)")
    answer: str = ""


def make_tasks(kinds: Sequence[str] = KINDS, num_tasks: int = 24, seed: int = 0,
               variety: int = len(NAMES)) -> dict[str, ToyTask]:
    """`num_tasks` tasks of each kind, the same for the same seed; file names and words are drawn
    from the first `variety` entries of NAMES and WORDS (fewer: easier to guess)."""
    if not 1 <= variety <= len(NAMES):
        raise ValueError(f"variety must be between 1 and {len(NAMES)}")
    tasks: dict[str, ToyTask] = {}
    for kind in kinds:
        if kind not in KINDS:
            raise ValueError(f"unknown toy task kind {kind!r}; choose from {KINDS}")
        rng = random.Random(f"{seed}-{kind}")
        for i in range(num_tasks):
            task_id = f"{kind}-{i:03d}"
            tasks[task_id] = _make_task(kind, task_id, rng, variety)
    return tasks


def _make_task(kind: str, task_id: str, rng: random.Random, variety: int) -> ToyTask:
    name, word = rng.choice(NAMES[:variety]), rng.choice(WORDS[:variety])
    if kind == "write":
        path = f"{name}.txt"
        return ToyTask(task_id=task_id, kind="write", answer=word,
                       instruction=f"Create a file named {path} that contains the word {word}.",
                       check=f'test "$(cat -- {path} 2>/dev/null)" = {word}', solution=f"echo {word} > {path}")
    path = f"{rng.choice(DIRS[:min(variety, len(DIRS))])}/{name}.txt"
    if kind == "secret":
        return ToyTask(task_id=task_id, kind="secret", answer=word, files={path: word + "\n"},
                       instruction=f"The file {path} holds a secret word. Write that word into answer.txt.",
                       check=f'test "$(cat answer.txt 2>/dev/null)" = {word}', solution=f"cp {path} answer.txt")
    lines = rng.randint(2, 9)
    content = "".join(f"{rng.choice(WORDS)}\n" for _ in range(lines))
    return ToyTask(task_id=task_id, kind="count", answer=str(lines), files={path: content},
                   instruction=f"Count the lines of {path} and write the number into answer.txt.",
                   check=f'test "$(tr -d " " < answer.txt 2>/dev/null)" = {lines}',
                   solution=f"wc -l < {path} > answer.txt")


class ToyEnv(SandboxEnv):
    """Gymnasium env over toy file tasks (see module docstring). Extra kwargs: `kinds`
    (which task kinds), `num_tasks` (per kind), `seed` (which tasks), `variety` (how many
    file names and words are drawn from), or `tasks` (a dict)."""

    env_id = "Orchard/Toy-v0"

    def __init__(self, *, kinds: Sequence[str] = KINDS, num_tasks: int = 24, seed: int = 0,
                 variety: int = len(NAMES), tasks: dict[str, ToyTask] | None = None, max_steps: int = 8,
                 exec_timeout: float = 30.0, **kwargs: Any):
        # ToyEnv's own reading of these kwargs (a subclass, e.g. ColourEnv, passes its tasks in)
        self._tasks = ToyEnv.tasks_from(kinds=kinds, num_tasks=num_tasks, seed=seed, variety=variety, tasks=tasks)
        super().__init__(max_steps=max_steps, exec_timeout=exec_timeout, **kwargs)

    def make_tools(self) -> list[Tool]:
        return [BashTool(), SubmitTool()]

    @classmethod
    def tasks_from(cls, *, kinds: Sequence[str] = KINDS, num_tasks: int = 24, seed: int = 0, variety: int = len(NAMES),
                   tasks: dict[str, ToyTask] | str | None = None, **_: Any) -> dict[str, ToyTask]:
        if tasks == "builtin":  # what `orchard eval --tasks` passes by default
            tasks = None
        elif tasks is not None and not isinstance(tasks, dict):
            raise ValueError("Toy tasks are a dict of task id -> ToyTask (or 'builtin')")
        return tasks if tasks is not None else make_tasks(kinds, num_tasks, seed, variety)

    def task_ids(self) -> list[str]:
        return sorted(self._tasks)

    def get_task(self, task_id: str) -> ToyTask:
        return self._tasks[task_id]

    def image_for(self, task: ToyTask) -> str | None:
        return None  # any image with a POSIX shell will do; the backend's default

    async def setup(self, sandbox: AsyncSandboxInstance, task: ToyTask) -> ToolContext:
        base = sandbox.workdir or "/workspace"
        for path, content in task.files.items():
            await sandbox.upload_content(content.encode(), f"{base}/{path}")
        return ToolContext(sandbox=sandbox, cwd=base, timeout=self.exec_timeout)

    def first_observation(self, task: ToyTask) -> str:
        return f"{task.instruction} Then call submit."

    async def grade(self, ctx: ToolContext, task: ToyTask) -> tuple[float, dict]:
        r = await ctx.sandbox.exec(task.check, cwd=ctx.cwd, timeout=30)
        passed = r.exit_code == 0
        return (1.0 if passed else 0.0), {"passed": passed, "check": task.check, "exit_code": r.exit_code,
                                          "output": (r.stdout + r.stderr)[-500:], "reward": 1.0 if passed else 0.0}

    def oracle_policy(self) -> ToyOraclePolicy:
        return ToyOraclePolicy()


class ToyOraclePolicy:
    """Runs the task's one-command solution, then submits (`orchard eval --policy oracle`)."""

    def __init__(self, env: ToyEnv | None = None):
        self.env = env

    def bind(self, env: ToyEnv) -> ToyOraclePolicy:
        return ToyOraclePolicy(env)

    async def __call__(self, messages: list[dict], tools: list[dict]) -> Any:
        if not any(m["role"] == "assistant" for m in messages):
            return {"name": "bash", "arguments": {"command": self.env.task.solution}}
        return {"name": "submit", "arguments": {}}


def oracle_messages(task: ToyTask, system_prompt: str | None = None) -> list[dict]:
    """The conversation of an episode solved by the oracle (one command, then submit), in
    OpenAI chat format with tool calls: SFT data for warm starts."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages += [
        {"role": "user", "content": f"{task.instruction} Then call submit."},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "bash", "arguments": {"command": task.solution}}}]},
        {"role": "tool", "name": "bash", "content": "(no output)"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "submit", "arguments": {}}}]},
    ]
    return messages


__all__ = ["KINDS", "ToyEnv", "ToyTask", "make_tasks", "oracle_messages"]
