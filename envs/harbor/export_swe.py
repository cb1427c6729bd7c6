"""Orchard/SWE-v0 tasks (built-in style: a source archive and a pytest command) as Harbor task folders.

The folder: `environment/` holds the repository archive and a Dockerfile that unpacks it into
/app, installs the task's test requirements and commits the tree as the base (as `SWEEnv.setup`
does); `solution/` the gold patch; `tests/` the test patch, the task's grading data and the
verifier (`swe_verify.py` with `envs/swe/protected.py`, both copied as they are).
"""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path
from typing import Any

from ..swe.evaluation import GIT
from ..swe.protected import base_names

HERE = Path(__file__).parent
PROTECTED = HERE.parent / "swe" / "protected.py"
WORKDIR = "/app"
# swe_verify.py ports SWE-bench's pytest log grading only
REFUSED_PARSERS = "only pytest logs (log_parser parse_log_pytest) are graded by the exported verifier"

INSTRUCTION = """\
The repository {repo} is checked out in /app (a git repository at its base commit).
A user filed this issue:

<issue>
{problem}
</issue>

Change the non-test source files so that the issue is resolved. Python with the project's test
dependencies is on PATH (`python`, `pytest`). Your changes to the repository are then tested.
"""


def refusal(task: Any) -> str | None:
    """Why this SWE task cannot be exported, or None."""
    if task.in_image:
        return "image-based task (the repository is in a dataset's image): its eval script is not exported"
    if task.log_parser != "parse_log_pytest" or task.eval_type != "pass_and_fail":
        return REFUSED_PARSERS
    if not task.test_cmd or task.source_archive is None:
        return "no test_cmd or source archive"
    if not task.patch:
        return "no gold patch for solution/solve.sh"
    return None


def _dockerfile(task: Any, base_image: str) -> str:
    git = GIT
    lines = [f"FROM {task.image or base_image}"]
    if task.install:
        lines.append("RUN pip install " + " ".join(shlex.quote(r) for r in task.install))
    lines += [f"WORKDIR {WORKDIR}", f"ADD repo.tar.gz {WORKDIR}/"]
    lines += [f"ENV {k}={json.dumps(v)}" for k, v in sorted(task.env.items())]
    lines.append("ENV PYTHONDONTWRITEBYTECODE=1")
    # every file of the archive (-f: also what its .gitignore names) is in the base commit; the local
    # backend's Harbor folders (.harbor/) never are
    base = f"{git} init -q && echo .harbor/ >> .git/info/exclude && {git} add -A -f && {git} commit -qm base"
    lines.append(f"RUN {base}")
    for command in task.setup_commands:
        lines.append(f"RUN {command}")
    if task.setup_commands:
        lines.append(f"RUN {git} add -A -f && {git} commit -q --allow-empty -m setup")
    return "\n".join(lines) + "\n"


def export_swe_task(task: Any, folder: Path, env_id: str, base_image: str, toml_string) -> Path:
    why = refusal(task)
    if why:
        raise ValueError(f"{env_id} task {task.instance_id!r}: {why}")
    for sub in ("environment", "solution", "tests"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    shutil.copyfile(task.source_archive, folder / "environment" / "repo.tar.gz")
    (folder / "environment" / "Dockerfile").write_text(_dockerfile(task, base_image))
    (folder / "instruction.md").write_text(INSTRUCTION.format(repo=task.repo, problem=task.problem_statement.strip()))
    (folder / "solution" / "gold.patch").write_text(task.patch)
    (folder / "solution" / "solve.sh").write_text(
        f'#!/bin/bash\nset -e\ncd {WORKDIR}\ngit apply --binary --whitespace=nowarn "$(dirname "$0")/gold.patch"\n')
    (folder / "tests" / "test.patch").write_text(task.test_patch)
    shutil.copyfile(HERE / "swe_verify.py", folder / "tests" / "swe_verify.py")
    shutil.copyfile(PROTECTED, folder / "tests" / "protected.py")
    data = {"instance_id": task.instance_id, "test_cmd": task.test_cmd, "test_files": task.test_files,
            "env": task.env, "FAIL_TO_PASS": task.FAIL_TO_PASS, "PASS_TO_PASS": task.PASS_TO_PASS,
            "base": sorted(base_names(task.source_archive))}
    (folder / "tests" / "swe_task.json").write_text(json.dumps(data, indent=1))
    (folder / "tests" / "test.sh").write_text(
        f'#!/bin/bash\n# Orchard/SWE-v0 grading (swe_verify.py): no reward file when the task cannot be graded\n'
        f'cd {WORKDIR} && python3 "$(dirname "$0")/swe_verify.py" /logs/verifier\n')
    (folder / "task.toml").write_text(
        'schema_version = "1.4"\n\n[task]\nname = ' + toml_string(f"orchard/{task.instance_id}")
        + "\n\n[metadata]\nsource = " + toml_string(env_id) + "\nrepo = " + toml_string(task.repo)
        + "\n\n[agent]\ntimeout_sec = 1800.0\n\n[verifier]\ntimeout_sec = 900.0\n\n"
        '[environment]\nnetwork_mode = "no-network"\nbuild_timeout_sec = 900.0\n')
    return folder
