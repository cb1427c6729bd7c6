"""Orchard/Claw-v0 tasks as Harbor task folders (`orchard tasks export --format harbor --env Orchard/Claw-v0`).

    environment/Dockerfile        FROM an image with python3; COPY claw/ /app/.claw/
    environment/claw/             the agent's tools: `claw` (Claw-v0's command line, claw_cli.py, over
                                  claw_file_world.py: the world in files), the tools' modules, SKILL.md,
                                  world.json (the task's seed, faults, allowed tools); calls.jsonl, the
                                  call log, is written by the calls
    instruction.md                the task's instruction and how to call the tools
    solution/solve.sh             the task's oracle calls through `claw`
    tests/test.sh                 runs claw_verify.py: the log replayed from tests/claw_task.json (the
                                  seed, faults, allowed tools and checks) through tests/' own copy of
                                  the tools, graded by checks.py (copied as it is) -> reward.json

Refused, with the reason: tasks whose checks need what a Harbor verifier cannot have (an LLM
judge) and AgentDojo tasks (their world is agentdojo's, with verdicts it computes).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path
from typing import Any

from ..claw import checks
from ..claw.deploy import skill_markdown
from ..claw.sandbox import claw_tools

BASE_IMAGE = "localhost/orchard/swe-base:latest"  # the tools need python3 (bookworm's minbase has none)
SANDBOX = Path(claw_tools.__file__).parent
TOOL_MODULES = ["claw_tools.py", "claw_service.py", "claw_wire.py", "claw_file_world.py"]
CLAW = "/app/.claw/claw"

LAUNCHER = '''\
#!/usr/bin/env python3
"""`claw`: this task's tools (Orchard/Claw-v0's command line, over the world in this folder)."""
import os
import sys

sys.path.append(os.path.dirname(os.path.realpath(__file__)))
import claw_cli  # noqa: E402
import claw_file_world  # noqa: E402

sys.exit(claw_cli.main(sys.argv[1:], wire=claw_file_world))
'''

HOW = """\

## The tools

The tools are on the command line: `{claw} TOOL --json '{{...}}'` prints the result as JSON
(exit 0), or `error: ...` on stderr (exit 1: fix the call, or retry if the service said to).
`{claw} --list` lists the tools, `{claw} --schema TOOL` prints a tool's arguments, and
`/app/.claw/SKILL.md` describes them all. For example:

    {claw} {example}

Every call is recorded in /app/.claw/calls.jsonl and your work is graded from that record:
change the world only through the tools.
"""


def refusal(task: Any) -> str | None:
    """Why this Claw task cannot be a Harbor folder, or None."""
    if not re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9._-]*", task.task_id):
        return "its id is not a folder name (letters, digits, '.', '_', '-'; not starting with '.')"
    if task.tool_schemas or task.agentdojo:
        return "an AgentDojo task: its world and verdicts are agentdojo's (a Python package), not Orchard's tools"
    judged = [c for c in task.checks if c["type"] in ("judge", "verdict")]
    if judged:
        what = judged[0].get("rubric") or judged[0].get("verdict")
        return (f"{judged[0]['type']} check ({what!r}): it needs an LLM judge or a world's verdict, which a Harbor "
                "verifier cannot have")
    return None


def export_claw_task(task: Any, folder: Path, env_id: str, base_image: str | None, toml_string) -> Path:
    why = refusal(task)
    if why:
        raise ValueError(f"{env_id} task {task.task_id!r}: {why}")
    claw = folder / "environment" / "claw"
    for sub in (claw, folder / "solution", folder / "tests"):
        sub.mkdir(parents=True, exist_ok=True)
    world = {"seed": task.seed, "faults": [f.model_dump() for f in task.faults], "allowed": task.allowed}
    for name in (*TOOL_MODULES, "claw_cli.py"):
        shutil.copyfile(SANDBOX / name, claw / name)
    (claw / "world.json").write_text(json.dumps(world, indent=1))
    (claw / "claw").write_text(LAUNCHER)
    (claw / "claw").chmod(0o755)
    tools = [claw_tools.schema(n) for n in claw_tools.TOOLS if not task.allowed or n in task.allowed]
    (claw / "SKILL.md").write_text(skill_markdown(tools, CLAW))
    (folder / "environment" / "Dockerfile").write_text(
        f"FROM {base_image or BASE_IMAGE}\nWORKDIR /app\nCOPY claw/ /app/.claw/\nRUN chmod 755 /app/.claw/claw\n")
    bare = [t["function"]["name"] for t in tools if not t["function"]["parameters"].get("required")]
    example = f"{bare[0]} --json '{{}}'" if bare else "--list"
    (folder / "instruction.md").write_text(task.instruction.strip() + "\n" + HOW.format(claw=CLAW, example=example))
    calls = "".join(f"{CLAW} {shlex.quote(c['name'])} --json {shlex.quote(json.dumps(c.get('arguments', {})))} "
                    "|| true\n" for c in task.oracle)  # a failed call (an injected fault) is retried by the next
    (folder / "solution" / "solve.sh").write_text(f"#!/bin/bash\n# the task's oracle calls\ncd /app\n{calls}")
    for name in TOOL_MODULES:
        shutil.copyfile(SANDBOX / name, folder / "tests" / name)
    shutil.copyfile(Path(checks.__file__), folder / "tests" / "checks.py")
    shutil.copyfile(Path(__file__).parent / "claw_verify.py", folder / "tests" / "claw_verify.py")
    (folder / "tests" / "claw_task.json").write_text(json.dumps({"task_id": task.task_id, **world,
                                                                 "checks": task.checks}, indent=1))
    (folder / "tests" / "test.sh").write_text(
        "#!/bin/bash\n# Orchard/Claw-v0's checks over the world the call log leads to (claw_verify.py)\n"
        "python3 -I -S /tests/claw_verify.py /tests/claw_task.json /app/.claw/calls.jsonl /logs/verifier\n")
    name = re.sub(r"[^a-zA-Z0-9._-]+", "-", task.task_id)
    (folder / "task.toml").write_text(
        'schema_version = "1.4"\n\n[task]\nname = ' + toml_string(f"orchard/claw-{name}")
        + "\n\n[metadata]\nsource = " + toml_string(env_id) + f"\ndifficulty = {task.difficulty}"
        + "\n\n[agent]\ntimeout_sec = 600.0\n\n[verifier]\ntimeout_sec = 120.0\n\n"
        '[environment]\nnetwork_mode = "no-network"\n')
    return folder
