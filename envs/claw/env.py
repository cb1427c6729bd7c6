"""Orchard/Claw-v0: everyday tool-use workflows against stateful services in the sandbox.

    import gymnasium as gym, orchard_gym
    env = gym.make("Orchard/Claw-v0", backend={"type": "local"})
    obs, info = env.reset(options={"task_id": "mail-reply-001"})
    obs, reward, term, trunc, info = env.step(
        {"name": "mail_list_messages", "arguments": {"folder": "inbox"}})
    ...
    obs, reward, term, trunc, info = env.step({"name": "submit", "arguments": {}})
    info["report"]   # task_score, passed, completion, safety, robustness, every check's verdict

At reset the sandbox gets the Claw service (mail, calendar, drive, todo, helpdesk,
contacts), seeded by the task. The policy's actions are OpenAI-style function calls of
the tools, validated against their JSON schemas (door 1); with `bash=True` it also gets a
`bash` tool, from which `claw TOOL --json '{...}'` reaches the same service (door 2, as
described in `.claw/SKILL.md`); `.claw/bin/claw-mcp` is the MCP stdio server (door 3).
The reward is the Claw-Eval task score computed from the service's signed snapshot.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema

from orchard_gym.client import AsyncSandboxInstance
from orchard_gym.endpoint import parse_spec
from orchard_gym.errors import JudgeError

from ..base import SandboxEnv
from ..tools import BashTool, SubmitTool, Tool, ToolContext, ToolError, ToolResult, clip
from . import checks
from .deploy import STATE_DIR, ClawService, ServiceError
from .judge import judge
from .sandbox import claw_tools
from .sandbox.claw_service import MAX_ARGS
from .tasks import ClawTask, load_tasks


class ClawTool(Tool):
    """One service tool as an env action (door 1): jsonschema-checked here, run by the service."""

    def __init__(self, schema: dict):
        self._schema = schema
        fn = schema["function"]
        self.name, self.description, self.parameters = fn["name"], fn["description"], fn["parameters"]
        self.validator = jsonschema.Draft202012Validator(self.parameters)

    def schema(self) -> dict:
        return self._schema

    def parse(self, arguments: dict) -> dict:
        try:
            encoded = json.dumps(arguments, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise ToolError(f"bad arguments for {self.name}: text is not valid UTF-8 (lone surrogates)") from None
        except (TypeError, ValueError) as e:
            raise ToolError(f"bad arguments for {self.name}: not JSON: {e}") from None
        if len(encoded) > MAX_ARGS:
            raise ToolError(f"bad arguments for {self.name}: {len(encoded)} bytes; the limit is {MAX_ARGS}")
        error = jsonschema.exceptions.best_match(self.validator.iter_errors(arguments))
        if error is not None:
            where = ".".join(map(str, error.absolute_path)) or "arguments"
            raise ToolError(f"bad arguments for {self.name}: {where}: {error.message}")
        return arguments

    async def run(self, ctx: ToolContext, args: dict) -> ToolResult:
        answer = await ctx.state["service"].call(self.name, args, "function")
        if not answer.get("ok"):
            raise ToolError(answer.get("error", "the tool failed"))
        return ToolResult(output=clip(json.dumps(answer["result"], indent=1, ensure_ascii=False)), exit_code=0)



def _harbor_tasks(tasks: Any) -> Any:
    """The Harbor source a Claw `tasks=` names (the old `harbor:PATH` door), else None."""
    from ..harbor.tasks import is_harbor

    if not is_harbor(tasks):
        return None
    return tasks.removeprefix("harbor:") if isinstance(tasks, str) else tasks

class ClawEnv(SandboxEnv):
    """Gymnasium env over Claw tasks. Extra kwargs: `tasks` ("builtin", a folder, a file or a
    dict), `bash` (also offer a bash tool, for the `claw` command line), `image` (the sandbox
    image on container backends; any image works, with or without Python), `judge`
    ("URL#MODEL" of an OpenAI-compatible endpoint, for tasks with judge checks)."""

    env_id = "Orchard/Claw-v0"
    forks_midway = False  # the tool server's world state lives in its process, which snapshots do not keep

    def __new__(cls, *args: Any, tasks: Any = "builtin", **kwargs: Any):
        from ..harbor.env import HarborEnv  # Harbor task folders: Orchard/Harbor-v0 (envs/harbor)

        harbor = _harbor_tasks(tasks)
        if cls is ClawEnv and harbor is not None:
            return HarborEnv(tasks=harbor, **kwargs)
        return super().__new__(cls)

    def __init__(self, *, tasks: Any = "builtin", bash: bool = False, image: str | None = None,
                 judge: str | None = None, judge_api_key: str | None = None,
                 max_steps: int = 40, exec_timeout: float = 60.0,
                 sandbox_cpu: float | None = 2.0, sandbox_memory: str | int | None = "2g", **kwargs: Any):
        self._tasks = self.tasks_from(tasks=tasks)
        self.with_bash, self.image = bash, image
        if judge is not None:
            parse_spec(judge, what="judge=")
        self.judge, self.judge_api_key = judge, judge_api_key
        # the papers' Claw sandboxes: 2 vCPU / 2 GiB (None: the backend's default)
        super().__init__(max_steps=max_steps, exec_timeout=exec_timeout, sandbox_cpu=sandbox_cpu,
                         sandbox_memory=sandbox_memory, **kwargs)

    def make_tools(self) -> list[Tool]:
        schemas = {}
        if any(not task.tool_schemas for task in self._tasks.values()):
            schemas = {name: claw_tools.schema(name) for name in claw_tools.TOOLS}
        for task in self._tasks.values():  # other worlds' tools (AgentDojo), once each
            schemas.update({t["function"]["name"]: t for t in task.tool_schemas if t["function"]["name"] not in schemas})
        tools: list[Tool] = [ClawTool(schema) for schema in schemas.values()]
        if self.with_bash:
            tools.append(BashTool())
        return tools + [SubmitTool()]

    @classmethod
    def tasks_from(cls, *, tasks: Any = "builtin", **kwargs: Any) -> dict:
        from ..harbor.env import HarborEnv

        harbor = _harbor_tasks(tasks)
        if harbor is not None:  # as __new__: Harbor task folders are Orchard/Harbor-v0's
            return HarborEnv.tasks_from(tasks=harbor, **kwargs)
        return load_tasks(tasks)

    def task_ids(self) -> list[str]:
        return sorted(self._tasks)

    def get_task(self, task_id: str) -> ClawTask:
        return self._tasks[task_id]

    def image_for(self, task: ClawTask) -> str | None:
        return self.image  # the service needs only the agent's own Python: any image will do

    async def setup(self, sandbox: AsyncSandboxInstance, task: ClawTask) -> ToolContext:
        world = {}
        if task.agentdojo:
            from .agentdojo_source import agentdojo_python

            world = {"world": task.agentdojo, "world_python": agentdojo_python(), "tools": task.tool_schemas}
        service = await ClawService.start(sandbox, task.seed, [f.model_dump() for f in task.faults], task.allowed,
                                          **world)
        path_dir = f"{service.home}/bin"
        env = {"PATH": f"{path_dir}:/usr/local/bin:/usr/bin:/bin", "CLAW_SOCKET": service.socket}
        return ToolContext(sandbox=sandbox, cwd=sandbox.workdir or "/workspace", env=env,
                           timeout=self.exec_timeout, state={"service": service})

    async def resume(self, sandbox: AsyncSandboxInstance, task: ClawTask, ctx: ToolContext) -> ToolContext:
        """A restored set-up: the service's files are there, its process is not; start it afresh."""
        await sandbox.exec(["rm", "-f", f"{sandbox.workdir or '/workspace'}/{STATE_DIR}/claw.sock"], timeout=30)
        return await self.setup(sandbox, task)

    def first_observation(self, task: ClawTask) -> str:
        how = "Use the tools to do it"
        if self.with_bash:
            how += " (or `claw TOOL --json '{...}'` in bash; `claw --list` lists them)"
        return f"{task.instruction}\n\n{how}, then call submit."

    async def grade(self, ctx: ToolContext, task: ClawTask) -> tuple[float, dict]:
        try:
            snap = await ctx.state["service"].snapshot()
        except ServiceError as e:
            # the service died or was replaced during the episode: nothing trustworthy to grade
            return 0.0, {"task_score": 0.0, "passed": False, "completion": 0.0, "safety": 0.0, "robustness": 0.0,
                         "checks": [], "service_error": str(e)}
        judged = {}
        for i, check in enumerate(task.checks):
            if check["type"] == "judge":
                if self.judge is None:
                    raise JudgeError(f"task {task.task_id} has a judge check: give the env judge='URL#MODEL'")
                answer = (snap["state"].get("answer") or {}).get("text") or ""
                if checks.imprecise(check, answer) is None:  # else the check fails as it stands: no judge needed
                    judged[i] = await judge(self.judge, self.judge_api_key, check, task.instruction, answer)
        report = checks.score(task.checks, snap["state"], snap["log"], claw_tools.seeded_state(task.seed), judged,
                              snap.get("verdicts"))
        report["hardened"] = snap.get("hardened")
        report["doors"] = {door: sum(e["door"] == door for e in snap["log"]) for door in {e["door"] for e in snap["log"]}}
        ctx.state["snapshot"] = snap
        return report["task_score"], report

    def oracle_policy(self):
        return ClawOraclePolicy()


class ClawOraclePolicy:
    """Plays the task's oracle calls in order, then submits (`orchard eval --policy oracle`)."""

    def __init__(self, env: ClawEnv | None = None, calls: list[dict] | None = None):
        self.env, self.calls = env, calls

    def bind(self, env: ClawEnv) -> ClawOraclePolicy:
        return ClawOraclePolicy(env, self.calls)

    async def __call__(self, messages: list[dict], tools: list[dict]) -> Any:
        calls = self.calls if self.calls is not None else self.env.task.oracle
        done = sum(1 for m in messages if m["role"] == "assistant")
        if done < len(calls):
            return calls[done]
        return {"name": "submit", "arguments": {}}


__all__ = ["ClawEnv", "ClawOraclePolicy", "ClawTool"]
