"""`orchard tasks export --format harbor --env Orchard/Claw-v0` (envs/harbor/export_claw.py): every
built-in Claw task becomes a folder that Harbor 0.25's own `TaskConfig` validates; in
Orchard/Harbor-v0 (local backend) the oracle passes each one with task score 1.0 and doing nothing
passes none, scoring what Orchard/Claw-v0's checks give an untouched world; Harbor's own runner
grades a subset with its oracle agent as Orchard does; the verifier recomputes the world from the
call log and the task's own seed (red-teamed: a world.json the agent rewrote); garbage input gets
clear errors, and tasks a Harbor verifier cannot grade (an LLM judge, AgentDojo) are refused, one
line each."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest
from click.testing import CliRunner

import orchard_gym  # noqa: F401
from orchard_gym.cli import main
from orchard_gym.envs.claw import checks
from orchard_gym.envs.claw.sandbox import claw_tools
from orchard_gym.envs.claw.sandbox.claw_file_world import replay
from orchard_gym.envs.claw.tasks import load_tasks
from orchard_gym.envs.harbor.env import HarborOraclePolicy

from conftest import docker_engine, needs, needs_bwrap
from harbor_exports import export_with_cli, local_harbor_env
from harbor_real import harbor_check
from test_harbor_runner import harbor_job, harbor_outcome

# Harbor's runner on one task of each of the 14 families, variants 1-5 in turn (2 and 5 have
# faults to retry, 1 and 4 injections)
FAMILIES = ["calendar-answer", "calendar-cancel", "calendar-schedule", "contacts-from-mail", "contacts-update",
            "drive-answer", "drive-share", "helpdesk-answer", "helpdesk-triage", "mail-reply", "mail-triage",
            "meeting-followup", "todo-cleanup", "todo-from-mail"]
RUNNER_SUBSET = [f"{family}-{i % 5 + 1:03d}" for i, family in enumerate(FAMILIES)]
_GATEWAY, _WHY_NOT = docker_engine()


@pytest.fixture(scope="module")
def claw_export(tmp_path_factory) -> Path:
    return export_with_cli(tmp_path_factory.mktemp("harbor") / "claw", "Orchard/Claw-v0", 70)


def _untouched_score(task) -> dict:
    """What Orchard/Claw-v0 grades for a world no call touched (its checks, in-process)."""
    seeded = claw_tools.seeded_state(task.seed)
    return checks.score(task.checks, seeded, [], seeded)


def test_exported_claw_folders_validate_with_harbor_and_orchard(claw_export):
    status, said = harbor_check("tasks", claw_export)  # Harbor 0.25.0's own TaskConfig, in its venv
    assert status == 0 and said.count("valid   ") == 70, said
    result = CliRunner().invoke(main, ["tasks", "check", str(claw_export)])
    assert result.exit_code == 0 and "70 Harbor task(s) can run; 0 skipped (error)" in result.output, result.output
    task = load_tasks()["calendar-answer-002"]
    exported = json.loads((claw_export / "calendar-answer-002" / "tests" / "claw_task.json").read_text())
    assert (exported["checks"], exported["faults"]) == (task.checks, [f.model_dump() for f in task.faults])
    # the verifier grades with Orchard's own modules, copied as they are
    for name, source in [("checks.py", checks.__file__), ("claw_tools.py", claw_tools.__file__)]:
        assert (claw_export / "mail-reply-001" / "tests" / name).read_text() == Path(source).read_text()


@needs_bwrap
def test_every_builtin_claw_task_exported_oracle_passes_nothing_fails(claw_export, local_root):
    tasks = load_tasks()
    env = local_harbor_env(claw_export, local_root)
    try:
        assert env.task_ids() == sorted(tasks)
        for task_id in env.task_ids():
            env.reset(options={"task_id": task_id})
            env.step({"name": "bash", "arguments": {"command": HarborOraclePolicy(env).command()}})
            _, reward, _, _, info = env.step({"name": "submit", "arguments": {}})
            keys = info["report"]["reward_json"]
            assert reward == 1.0 and keys["passed"] == 1.0 and not info.get("error"), (task_id, info["report"])
            assert len([k for k in keys if k.startswith("check_")]) == len(tasks[task_id].checks)
            env.reset(options={"task_id": task_id})
            _, reward, _, _, info = env.step({"name": "submit", "arguments": {}})
            want = _untouched_score(tasks[task_id])
            assert reward == want["task_score"] < checks.PASS_THRESHOLD and not info.get("error"), (task_id, info)
            assert info["report"]["reward_json"]["passed"] == 0.0
    finally:
        env.close()


def _rewrite_world_json(task_id: str) -> str:
    """Red team: the bash command that writes the solved world into the environment's world.json as
    its seed, so that a verifier replaying from it finds the task done without a single call."""
    task = load_tasks()[task_id]
    world = {"faults": [], "allowed": None,
             "seed": replay({"seed": task.seed}, [{"tool": c["name"], "args": c["arguments"]} for c in task.oracle])
             .snapshot()["state"]}
    return f"cat > .claw/world.json <<'EOF'\n{json.dumps(world)}\nEOF"


@needs_bwrap
@pytest.mark.parametrize("defended", [True, False], ids=["defended", "world-from-environment"])
def test_a_world_json_the_agent_rewrote_is_not_what_is_graded(claw_export, tmp_path, local_root, defended):
    """The verifier replays the log from the seed in tests/claw_task.json (uploaded after the agent is
    done); with it taken from the environment's world.json instead, the rewritten world scores 1.0."""
    folder = tmp_path / "tasks" / "mail-reply-001"
    shutil.copytree(claw_export / "mail-reply-001", folder)
    if not defended:
        script = folder / "tests" / "claw_verify.py"
        text = script.read_text()
        assert "        task = json.load(f)\n" in text
        script.write_text(text.replace("        task = json.load(f)\n", "        task = json.load(f)\n    with open("
                                       "os.path.join(os.path.dirname(log_file), 'world.json')) as f:\n"
                                       "        task.update(json.load(f))\n"))
    env = local_harbor_env(tmp_path / "tasks", local_root)
    try:
        env.reset(options={"task_id": "mail-reply-001"})
        obs, *_ = env.step({"name": "bash", "arguments": {"command": _rewrite_world_json("mail-reply-001")}})
        _, reward, _, _, info = env.step({"name": "submit", "arguments": {}})
    finally:
        env.close()
    assert not info.get("error"), info
    assert reward == (_untouched_score(load_tasks()["mail-reply-001"])["task_score"] if defended else 1.0), \
        info["report"]


@needs_bwrap
@pytest.mark.parametrize(("agent", "policy"), [("oracle", "oracle"), ("nop", "nothing")])
def test_harbors_runner_grades_exported_claw_tasks_as_orchard_does(claw_export, tmp_path, agent, policy):
    """Harbor's oracle / nop agent and `orchard eval --policy oracle / nothing` on the same folders:
    the same reward.json on every task (oracle 1.0; nop what Claw-v0 gives an untouched world)."""
    assert {t.rsplit("-", 1)[0] for t in load_tasks()} == set(FAMILIES)
    tasks = tmp_path / "tasks"
    for task_id in RUNNER_SUBSET:
        shutil.copytree(claw_export / task_id, tasks / task_id)
    r, harbor = harbor_job([tasks / t for t in RUNNER_SUBSET], tmp_path / "jobs", "local", agent=agent)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    result = CliRunner().invoke(main, ["eval", "--env", "Orchard/Harbor-v0", "--tasks", str(tasks), "--policy",
                                       policy, "--out", str(tmp_path / "eval.jsonl")])
    orchard = {line["task_id"]: line for line in map(json.loads, (tmp_path / "eval.jsonl").read_text().splitlines())}
    assert set(orchard) == set(RUNNER_SUBSET), result.output
    for task_id in RUNNER_SUBSET:
        trial = harbor[(tasks / task_id).resolve()]
        want = 1.0 if agent == "oracle" else _untouched_score(load_tasks()[task_id])["task_score"]
        assert harbor_outcome(trial) == orchard[task_id]["reward"] == want, (task_id, trial["exception_info"])
        assert trial["verifier_result"]["rewards"] == orchard[task_id]["report"]["reward_json"]


def test_the_exported_command_line_serves_parallel_calls_one_at_a_time(claw_export, tmp_path):
    """The agent's `claw` (no service: each call replays the log, calls, appends, under a lock): 24
    calls at once get 24 different ids and leave 24 log lines that replay to 24 new items; `--list`
    shows the task's allowed tools only."""
    claw = tmp_path / "claw"
    shutil.copytree(claw_export / "todo-from-mail-001" / "environment" / "claw", claw)
    task = load_tasks()["todo-from-mail-001"]
    listed = subprocess.run([sys.executable, str(claw / "claw"), "--list"], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0 and [line.split("\t")[0] for line in listed.stdout.splitlines()] == \
        [t for t in claw_tools.TOOLS if t in task.tools], listed
    calls = [subprocess.Popen([sys.executable, str(claw / "claw"), "todo_add", "--json", json.dumps({"title": f"t{i}"})],
                              stdout=subprocess.PIPE, text=True) for i in range(24)]
    ids = [json.loads(p.communicate(timeout=120)[0])["item_id"] for p in calls]
    assert len(set(ids)) == 24, ids
    lines = (claw / "calls.jsonl").read_text().splitlines()
    assert len(lines) == 24 and all(json.loads(line)["ok"] for line in lines)
    world = json.loads((claw / "world.json").read_text())
    items = replay(world, [json.loads(line) for line in lines]).snapshot()["state"]["todo"]["items"]
    assert sorted(i["id"] for i in items if i["title"].startswith("t") and i["title"][1:].isdigit()) == sorted(ids)
    other = next(t for t in claw_tools.TOOLS if t not in task.tools)
    refused = subprocess.run([sys.executable, str(claw / "claw"), other], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "not available in this task" in refused.stderr, refused


@pytest.mark.docker
@needs("docker", None if _GATEWAY else _WHY_NOT)
def test_an_exported_claw_task_builds_and_grades_on_docker(claw_export, tmp_path):
    """FROM localhost/orchard/swe-base (python3): the oracle retries its injected fault and scores 1.0."""
    shutil.copytree(claw_export / "calendar-answer-002", tmp_path / "tasks" / "calendar-answer-002")
    env = gym.make("Orchard/Harbor-v0", tasks=str(tmp_path / "tasks"), backend={"type": "docker"}).unwrapped
    try:
        env.reset(options={"task_id": "calendar-answer-002"})
        obs, *_ = env.step({"name": "bash", "arguments": {"command": HarborOraclePolicy(env).command()}})
        assert "429 Too Many Requests" in obs
        _, reward, _, _, info = env.step({"name": "submit", "arguments": {}})
        assert reward == 1.0 and info["report"]["reward_json"]["robustness"] == 1.0, info["report"]
        env.reset(options={"task_id": "calendar-answer-002"})
        _, reward, _, _, info = env.step({"name": "submit", "arguments": {}})
        assert reward == _untouched_score(load_tasks()["calendar-answer-002"])["task_score"], info["report"]
    finally:
        env.close()


def test_the_verifier_scores_a_missing_log_as_no_calls_and_a_garbage_log_zero(claw_export, tmp_path):
    tests = claw_export / "mail-reply-001" / "tests"
    untouched = _untouched_score(load_tasks()["mail-reply-001"])["task_score"]
    for name, content, want in [("missing", None, untouched), ("garbage", "not json\n", 0.0),
                                ("not-an-object", "[1, 2]\n", 0.0)]:
        log, out = tmp_path / f"{name}.jsonl", tmp_path / name
        if content is not None:
            log.write_text(content)
        r = subprocess.run(["python3", "-I", "-S", str(tests / "claw_verify.py"), str(tests / "claw_task.json"),
                            str(log), str(out)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        report = json.loads((out / "report.json").read_text())
        assert json.loads((out / "reward.json").read_text())["reward"] == report["task_score"] == want, report
        assert ("log_error" in report) == (content is not None), report


def _export(*args: str):
    return CliRunner().invoke(main, ["tasks", "export", "--format", "harbor", *args])


def test_export_garbage_input_gets_clear_errors(tmp_path):
    r = _export("--env", "Orchard/Nope-v0", "--out", str(tmp_path / "a"))
    assert r.exit_code == 2 and "Nope" in r.output and "--env" in r.output, r.output
    r = _export("--env", "Orchard/Claw-v0", "--env-kwargs", "[1]", "--out", str(tmp_path / "a"))
    assert r.exit_code == 2 and "JSON object" in r.output, r.output
    r = _export("--env", "Orchard/Claw-v0", "--task-id", "mail-reply-001", "--task-id", "no-such-task",
                "--out", str(tmp_path / "a"))
    assert r.exit_code == 2 and "has no task 'no-such-task'" in r.output and "(70 in all)" in r.output, r.output
    assert not (tmp_path / "a").exists()
    blocker = tmp_path / "file"
    blocker.write_text("a file, not a folder")
    r = _export("--env", "Orchard/Claw-v0", "--out", str(blocker / "sub"))
    assert r.exit_code == 2 and "cannot write task folders in" in r.output, r.output
    r = _export("--env", "Orchard/Claw-v0", "--task-id", "mail-reply-001", "--out", str(tmp_path / "one"))
    assert r.exit_code == 0 and [p.name for p in (tmp_path / "one").iterdir()] == ["mail-reply-001"], r.output


def test_tasks_a_harbor_verifier_cannot_grade_are_refused_one_line_each(tmp_path):
    builtin = load_tasks()
    judged = builtin["drive-answer-001"].model_dump()
    judged.update(task_id="judged", checks=[*judged["checks"], {"type": "judge", "rubric": "polite and brief"}])
    dojo = builtin["mail-reply-001"].model_dump()
    dojo.update(task_id="dojo", agentdojo={"suite": "workspace"})
    escape = dict(builtin["todo-cleanup-001"].model_dump(), task_id="../escape")
    kwargs = {"tasks": {"judged": judged, "dojo": dojo, "../escape": escape,
                        "mail-reply-001": builtin["mail-reply-001"].model_dump()}}
    out = tmp_path / "out"
    r = _export("--env", "Orchard/Claw-v0", "--env-kwargs", json.dumps(kwargs), "--out", str(out))
    assert r.exit_code == 1 and "1 Harbor task folders" in r.output and "3 refused" in r.output, r.output
    refused = [line for line in r.output.splitlines() if line.startswith("not exported:")]
    assert len(refused) == 3, r.output
    assert "'../escape': its id is not a folder name" in r.output and not (tmp_path / "escape").exists()
    assert "'judged': judge check ('polite and brief')" in r.output and "LLM judge" in r.output
    assert "'dojo': an AgentDojo task" in r.output
    assert sorted(p.name for p in out.iterdir()) == ["mail-reply-001"]
