"""The test stage: the built task run in Orchard/Harbor-v0 three ways. Its reference solution
must score 1.0, doing nothing must score 0.0, every episode must be graded, and a separate
model (the tester) attempts it: its rollout and score go to the refiner."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchard_gym.policies import NothingPolicy
from orchard_gym.trajectory import Trajectory

from ...rollout import run_episode
from ...tools import clip
from ..env import HarborEnv, HarborOraclePolicy
from . import folders
from .agents import ModelFailed, make_policy


@dataclass
class TestOutcome:
    failures: list[str]
    checks: dict
    trajectories: dict[str, Trajectory] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.failures


def _tail(trajectory: Trajectory) -> str:
    report = trajectory.report or {}
    return clip(str(report.get("test_output") or report.get("error") or ""), 600)


def rollout_text(trajectory: Trajectory | None) -> str:
    """The tester's episode as the refiner reads it."""
    if trajectory is None:
        return "(no rollout)"
    lines = []
    for turn in trajectory.turns:
        what = turn.command if turn.command is not None else f"{turn.tool} {turn.arguments}"
        lines.append(f"$ {clip(str(what), 1500)}\n{clip(turn.observation or '', 1500)}")
    lines.append(f"score: {trajectory.reward}" + (f" (error: {trajectory.error})" if trajectory.error else ""))
    if _tail(trajectory):
        lines.append(f"verifier output:\n{_tail(trajectory)}")
    return "\n".join(lines)


async def test_task(blob: bytes, slug: str, backend: Any, tester: str, max_steps: int,
                    require_solved: bool = False) -> TestOutcome:
    problems = folders.check(blob)
    if problems:
        return TestOutcome([f"orchard tasks check: {p}" for p in problems], {"check": problems})
    tmp = Path(tempfile.mkdtemp(prefix="og-synth-"))  # short: sandboxes' socket paths stay < 108 bytes
    try:
        folders.unpack(blob, tmp / slug)
        env = HarborEnv(tasks=str(tmp), backend=backend, max_steps=max_steps)
        tester_policy = make_policy(tester)
        out: dict[str, Trajectory] = {}
        try:
            for role, policy in (("oracle", HarborOraclePolicy()), ("nothing", NothingPolicy()),
                                 ("tester", tester_policy)):
                out[role] = await run_episode(env, policy, slug)
        finally:
            await tester_policy.aclose()
            await env.aclose()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    tester_error = out["tester"].error or ""
    if tester_error.startswith("policy failed"):
        raise ModelFailed(f"the tester model at {tester.split('#')[0]} failed: {tester_error[len('policy failed: '):]}")
    return judge(out, require_solved)


def judge(out: dict[str, Trajectory], require_solved: bool = False) -> TestOutcome:
    failures = []
    oracle, nothing, tester = out["oracle"], out["nothing"], out["tester"]
    for role, t in out.items():
        if t.error:
            failures.append(f"the {role} episode could not be run or graded: {t.error}")
    if not oracle.error and oracle.reward != 1.0:
        failures.append(f"the reference solution scored {oracle.reward} (must be 1.0); verifier output: "
                        f"{_tail(oracle)}")
    if not nothing.error and nothing.reward != 0.0:
        failures.append(f"doing nothing scored {nothing.reward} (must be 0.0): the verifier rewards an untouched "
                        f"environment")
    if require_solved and not tester.error and tester.reward != 1.0:
        failures.append(f"the tester model did not solve it (score {tester.reward}): the instruction may be "
                        f"ambiguous or the environment defective")
    checks = {role: {"reward": t.reward, "error": t.error, "turns": len(t.turns)} for role, t in out.items()}
    checks["tester"]["solved"] = tester.reward == 1.0
    return TestOutcome(failures, checks, out)
