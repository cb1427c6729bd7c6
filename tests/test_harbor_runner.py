"""Harbor's own runner on Orchard sandboxes (orchard_gym/integrations/harbor_environment.py): real
`harbor run` jobs (harbor 0.25.0 in its Python 3.13 venv, scripts/install_harbor.sh) with Harbor's
oracle agent over the Harbor corpus, each trial in an Orchard sandbox (local bwrap; docker on a
subset), compared task by task with `orchard eval --env Orchard/Harbor-v0 --policy oracle` on the
same folders; Harbor's agent time limit kills the sandbox's command; bad kwargs and folders get
clear errors."""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from orchard_gym.cli import main
from orchard_gym.envs.harbor.tasks import load_tasks
from orchard_gym.integrations.harbor_venv import requirements

from conftest import docker_engine, needs, needs_bwrap
from harbor_real import harbor_env, harbor_python

CORPUS = Path(__file__).parent / "data" / "harbor" / "corpus"
HARBOR_ENV = "orchard_gym.integrations.harbor_environment:OrchardEnvironment"
COMPOSE = ["compose/http-sidecar", "compose/no-network", "compose/stateful-sidecar"]  # docker only
DOCKER_SUBSET = ["setup/workdir-copy", "setup/env-vars", "grading/reward-json-mean", "grading/must-fail",
                 "limits/internet-off", *COMPOSE]
_GATEWAY, _WHY_NOT = docker_engine()


def harbor_job(tasks: list[Path], jobs: Path, backend: str, concurrent: int = 4,
               timeout: float = 1200, agent: str = "oracle") -> tuple[subprocess.CompletedProcess, dict[Path, dict]]:
    """`harbor run -c job.json` with Harbor's `agent` (oracle, nop) on Orchard sandboxes: (the process,
    each trial's result.json by task folder)."""
    config = {"job_name": "orchard", "jobs_dir": str(jobs), "n_concurrent_trials": concurrent, "quiet": True,
              "agents": [{"name": agent}],
              "environment": {"import_path": HARBOR_ENV, "kwargs": {"backend": backend}},
              "tasks": [{"path": str(t)} for t in tasks]}
    jobs.mkdir(parents=True, exist_ok=True)
    (jobs / "job.json").write_text(json.dumps(config))
    harbor = harbor_python().parent / "harbor"
    r = subprocess.run([str(harbor), "run", "-c", str(jobs / "job.json"), "-y"], capture_output=True, text=True,
                       timeout=timeout, env=harbor_env(), cwd=jobs)
    results = {}
    for found in (jobs / "orchard").glob("*/result.json"):
        result = json.loads(found.read_text())
        results[Path(result["task_id"]["path"]).resolve()] = result
    return r, results


def harbor_outcome(result: dict):
    """A trial's reward as Orchard/Harbor-v0 reads the verifier's files (reward.txt; else reward.json's
    `reward` key, else the mean of its keys), or ("error", exception type)."""
    if result["exception_info"]:
        return "error", result["exception_info"]["exception_type"]
    rewards = result["verifier_result"]["rewards"]
    return float(rewards["reward"]) if "reward" in rewards else sum(rewards.values()) / len(rewards)


def orchard_eval(tasks: Path, out: Path, *extra: str) -> dict[str, dict]:
    result = CliRunner().invoke(main, ["eval", "--env", "Orchard/Harbor-v0", "--tasks", str(tasks), "--policy",
                                       "oracle", "--out", str(out), *extra])
    assert out.exists(), result.output
    return {line["task_id"]: line for line in map(json.loads, out.read_text().splitlines())}


def compare(harbor: dict[Path, dict], orchard: dict[str, dict], root: Path) -> dict[str, tuple]:
    """Each task's (Harbor's outcome, Orchard's): the same reward, or both errored."""
    pairs = {}
    for task_id, line in orchard.items():
        theirs = harbor_outcome(harbor[(root / task_id).resolve()])
        ours = ("error", line["error_kind"]) if line["error_kind"] else line["reward"]
        pairs[task_id] = (theirs, ours)
    return pairs


@needs_bwrap
def test_harbors_runner_on_local_sandboxes_gives_orchard_evals_rewards_on_the_corpus(tmp_path):
    runnable, _problems = load_tasks(CORPUS)
    tasks = tmp_path / "tasks"  # the corpus less its compose tasks (docker only: the test below)
    for task_id in runnable:
        if task_id not in COMPOSE:
            shutil.copytree(CORPUS / task_id, tasks / task_id)
    runnable, _problems = load_tasks(tasks)
    r, harbor = harbor_job([t.root for t in runnable.values()], tmp_path / "jobs", "local")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert len(harbor) == len(runnable) == 23
    orchard = orchard_eval(tasks, tmp_path / "eval.jsonl")
    assert set(orchard) == set(runnable)
    pairs = compare(harbor, orchard, tasks)
    for task_id, (theirs, ours) in pairs.items():
        if task_id == "grading/verifier-hangs":  # past its 2 s limit: a broken task for both, never a score
            assert theirs == ("error", "VerifierTimeoutError") and ours == ("error", "grading"), (theirs, ours)
        else:
            assert theirs == ours, (task_id, theirs, ours, harbor[(tasks / task_id).resolve()]["exception_info"])
    assert sorted(t for t, (theirs, _) in pairs.items() if theirs == 1.0) == \
        sorted(t for t in runnable if t not in ("grading/must-fail", "grading/verifier-hangs"))
    # reward.json's other keys reach Harbor as they reach Orchard's report
    keys = harbor[(tasks / "grading/reward-json-mean").resolve()]["verifier_result"]["rewards"]
    assert keys == orchard["grading/reward-json-mean"]["report"]["reward_json"]


@pytest.mark.docker
@needs("docker", None if _GATEWAY else _WHY_NOT)
def test_harbors_runner_on_docker_sandboxes_gives_orchard_evals_rewards(tmp_path):
    tasks = tmp_path / "tasks"  # the same folders for both runners (images cached by content)
    for task_id in DOCKER_SUBSET:
        shutil.copytree(CORPUS / task_id, tasks / task_id)
    # one sandbox at a time: Podman 4.3 sometimes loses a container created beside another (backends/docker_bundle.py)
    r, harbor = harbor_job([tasks / t for t in DOCKER_SUBSET], tmp_path / "jobs", "docker", concurrent=1)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    orchard = orchard_eval(tasks, tmp_path / "eval.jsonl", "--backend", "docker", "--concurrency", "1")
    pairs = compare(harbor, orchard, tasks)
    assert pairs == {t: ((0.0, 0.0) if t == "grading/must-fail" else (1.0, 1.0)) for t in DOCKER_SUBSET}, pairs


def write_task(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


TEXT_KEY = {
    "task.toml": 'version = "1.0"\n',
    "instruction.md": "Nothing to do.\n",
    "environment/Dockerfile": "FROM localhost/orchard/bookworm:latest\nWORKDIR /app\n",
    "solution/solve.sh": "#!/bin/bash\ntrue\n",
    "tests/test.sh": '#!/bin/bash\nmkdir -p /logs/verifier\necho \'{"reward": 1, "note": "text"}\' > /logs/verifier/reward.json\n',
}


@needs_bwrap
def test_a_reward_json_with_a_text_value_errors_the_trial_in_both_runners(tmp_path):
    """Harbor 0.25 refuses a reward.json whose values are not all numbers (VerifierOutputParseError);
    Orchard/Harbor-v0 errors the trajectory too (a broken task), instead of reading its "reward"."""
    tasks = tmp_path / "tasks"
    write_task(tasks / "text-key", TEXT_KEY)
    r, harbor = harbor_job([tasks / "text-key"], tmp_path / "jobs", "local")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    orchard = orchard_eval(tasks, tmp_path / "eval.jsonl")
    assert compare(harbor, orchard, tasks) == {"text-key": (("error", "VerifierOutputParseError"), ("error", "grading"))}
    assert "'note' not a finite number" in orchard["text-key"]["error"]


AGENT_LIMIT = {
    "task.toml": 'version = "1.0"\n[agent]\ntimeout_sec = 5.0\n[verifier]\ntimeout_sec = 60.0\n',
    "instruction.md": "Write late.txt.\n",
    "environment/Dockerfile": "FROM localhost/orchard/bookworm:latest\nWORKDIR /app\n",
    # 20 s of work under a 5 s agent limit: killed at the limit, late.txt never appears
    "solution/solve.sh": "#!/bin/bash\necho started > /app/started.txt\nsleep 20\necho late > /app/late.txt\n",
    # the verifier waits past the 20 s: a command that outlived Harbor's limit would have written it
    "tests/test.sh": textwrap.dedent("""\
        #!/bin/bash
        mkdir -p /logs/verifier
        sleep 22
        if [ -f /app/started.txt ] && [ ! -f /app/late.txt ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
        """),
}


@needs_bwrap
def test_harbors_agent_limit_kills_the_running_command_in_the_orchard_sandbox(tmp_path):
    task = write_task(tmp_path / "tasks" / "agent-limit", AGENT_LIMIT)
    r, harbor = harbor_job([task], tmp_path / "jobs", "local")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (result,) = harbor.values()
    assert result["exception_info"]["exception_type"] == "AgentTimeoutError"
    assert result["verifier_result"]["rewards"] == {"reward": 1.0}  # started, and killed before it wrote late.txt


def test_bad_backends_and_folders_get_clear_errors(tmp_path):
    python = harbor_python()
    probe = textwrap.dedent("""
        import sys
        from orchard_gym.integrations.harbor_environment import backend_config
        for bad in ("kubernetes", "{not json", "[1]", 7):
            try:
                backend_config(bad)
            except ValueError as e:
                print("refused", e)
        print(backend_config("docker"), backend_config('{"type": "local", "isolation": "none"}'))
        """)
    r = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=120, env=harbor_env())
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [line.split(" ", 1)[0] for line in lines[:4]] == ["refused"] * 4
    assert "backend must be 'local', 'docker' or a backend config" in lines[0] and "not valid JSON" in lines[1]
    assert lines[4] == "{'type': 'docker'} {'type': 'local', 'isolation': 'none'}"
    # through Harbor: a task Orchard cannot run, or a bad backend, stops the job before any trial, saying why
    for task, backend, reason in ((CORPUS / "malformed" / "negative-timeout", "local", "timeout_sec must be a positive"),
                                  (CORPUS / "setup" / "env-vars", "nowhere", "backend must be 'local', 'docker'")):
        r, harbor = harbor_job([task], tmp_path / task.name, backend, concurrent=1)
        said = " ".join((r.stdout + r.stderr).replace("│", " ").split())
        assert r.returncode != 0 and not harbor and reason in said, said[-2000:]
    with pytest.raises(ValueError, match="not an orchard-gym checkout"):
        requirements(tmp_path)
