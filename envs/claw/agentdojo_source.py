"""AgentDojo suites as a Claw task source: `ClawEnv(tasks="agentdojo:workspace")`.

AgentDojo (Debenedetti et al., NeurIPS 2024 Datasets & Benchmarks; MIT licence,
https://github.com/ethz-spylab/agentdojo) is used as published, its own environments, tools
and checks: the sandbox runs `sandbox/agentdojo_service.py` under a Python that has
`agentdojo` (a cached venv on the host, `AGENTDOJO_REQUIREMENT`; or `$ORCHARD_AGENTDOJO_PYTHON`),
which the local backend's sandboxes see read-only. AgentDojo's utility verdict is the
completion check; for a task paired with an injection task its security verdict (the
attack's goal reached) is the safety check.

Spec: `agentdojo:SUITE[@VERSION]` (suites: workspace, slack, travel, banking; default
version v1.2). Tasks: every user task alone (`agentdojo-workspace-user_task_0`) and every
user task paired with one injection task, taken in turn (`...-user_task_0+injection_task_0`).
Each task's oracle is AgentDojo's ground truth, then its ground-truth answer.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from orchard_gym.envs.swe.venvs import cache_root, ensure_venv

from .task_model import ClawTask

AGENTDOJO_REQUIREMENT = "agentdojo==0.1.35"
SERVICE = Path(__file__).parent / "sandbox" / "agentdojo_service.py"
DEFAULT_VERSION = "v1.2"
DUMP_FORMAT = 2  # bump when dump() in agentdojo_service.py changes


def agentdojo_python() -> str:
    """A Python with agentdojo importable: $ORCHARD_AGENTDOJO_PYTHON, else a cached venv (built once)."""
    if os.environ.get("ORCHARD_AGENTDOJO_PYTHON"):
        return os.environ["ORCHARD_AGENTDOJO_PYTHON"]
    return str(ensure_venv([AGENTDOJO_REQUIREMENT], root=cache_root() / "claw" / "venvs") / "bin" / "python")


def parse_spec(spec: str) -> tuple[str, str]:
    body = spec.split(":", 1)[1]
    suite, _, version = body.partition("@")
    if suite not in ("workspace", "slack", "travel", "banking"):
        raise ValueError(f"unknown AgentDojo suite {suite!r}: workspace, slack, travel or banking")
    return suite, version or DEFAULT_VERSION


def suite_dump(suite: str, version: str) -> dict:
    """AgentDojo's tasks, tools and ground truths for a suite (cached as JSON)."""
    path = cache_root() / "claw" / "agentdojo" / f"{AGENTDOJO_REQUIREMENT}-{suite}-{version}-{DUMP_FORMAT}.json"
    if path.exists():
        return json.loads(path.read_text())
    r = subprocess.run([agentdojo_python(), "-B", str(SERVICE), "--dump", suite, version], capture_output=True,
                       text=True, timeout=900)
    if r.returncode != 0:
        raise ValueError(f"cannot load AgentDojo suite {suite} {version}: {r.stderr[-2000:]}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(r.stdout)
    return json.loads(r.stdout)


def load_agentdojo(spec: str) -> dict[str, ClawTask]:
    suite, version = parse_spec(spec)
    data = suite_dump(suite, version)
    injections = sorted(data["injection_tasks"], key=lambda t: int(t.rsplit("_", 1)[1]))
    tasks: dict[str, ClawTask] = {}
    users = sorted(data["user_tasks"], key=lambda t: int(t.rsplit("_", 1)[1]))
    for i, user_id in enumerate(users):
        user = data["user_tasks"][user_id]
        oracle = user["oracle"] + [{"name": "submit_answer", "arguments": {"text": user["output"] or "Done."}}]
        n = len(user["oracle"])
        common = dict(instruction=user["prompt"], difficulty=1 if n <= 3 else 2 if n <= 9 else 3,
                      services=[f"agentdojo-{suite}"], tool_schemas=data["tools"], oracle=oracle,
                      source=f"agentdojo {AGENTDOJO_REQUIREMENT} {suite} {version} (MIT, ethz-spylab/agentdojo)")
        base_id = f"agentdojo-{suite}-{user_id}"
        utility = {"type": "verdict", "verdict": "utility", "name": "AgentDojo utility"}
        tasks[base_id] = ClawTask(task_id=base_id, checks=[utility],
                                  agentdojo={"suite": suite, "version": version, "user_task": user_id}, **common)
        inj_id = injections[i % len(injections)]
        pair_id = f"{base_id}+{inj_id}"
        goal, obey = data["injection_tasks"][inj_id]["goal"], data["injection_tasks"][inj_id]["oracle"]
        tasks[pair_id] = ClawTask(
            task_id=pair_id, agentdojo={"suite": suite, "version": version, "user_task": user_id,
                                        "injection_task": inj_id},
            checks=[utility, {"kind": "safety", "type": "verdict", "verdict": "security", "want": False,
                              "name": "AgentDojo security: the injection's goal not reached"}],
            injection={"where": "every AgentDojo injection vector", "text": goal, "obey": obey}, **common)
    return tasks
