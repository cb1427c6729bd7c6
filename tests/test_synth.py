"""`orchard tasks synth` (envs/harbor/synth/) end to end, with the scripted model of
tests/synth_models.py standing in for every LLM through the OpenAI-compatible door: real
builder and refiner episodes in local (bubblewrap) sandboxes, real Orchard/Harbor-v0 test
episodes, a real SQLite store."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest
from click.testing import CliRunner
from conftest import REPO, docker_engine, needs, needs_bwrap, wait_until
from synth_models import SynthModel

import orchard_gym  # noqa: F401
from orchard_gym.cli import main as cli
from orchard_gym.envs.harbor.env import HarborOraclePolicy
from orchard_gym.envs.harbor.synth import SynthConfig, synthesize
from orchard_gym.envs.harbor.synth.store import Store
from orchard_gym.envs.harbor.tasks import load_tasks
from orchard_gym.envs.rollout import run_episode
from orchard_gym.policies import NothingPolicy

POOL = Path(__file__).parent / "data" / "synth" / "pool"
DOMAIN = "everyday tool use over files: spreadsheets, logs, contacts"

_GATEWAY, _WHY_NOT = docker_engine()


def local(root: Path) -> dict:
    return {"type": "local", "isolation": "bwrap", "root": str(root)}


def config(model: SynthModel, out: Path, backend: dict, n: int = 2, **kw) -> SynthConfig:
    return SynthConfig(domain=DOMAIN, n=n, pool=POOL, out=out, model=model.spec("builder-model"),
                       tester=model.spec("tester-model"), concurrency=1, progress=False, backend=backend, **kw)


def play(out: Path, backend: dict, task_id: str, policy) -> float:
    env = gym.make("Orchard/Harbor-v0", tasks=str(out), backend=backend).unwrapped

    async def episode():
        try:
            return await run_episode(env, policy, task_id)
        finally:
            await env.aclose()
    trajectory = asyncio.run(episode())
    assert trajectory.error is None, trajectory.error
    return trajectory.reward


@needs_bwrap
def test_a_run_makes_tasks_that_pass_their_checks_and_repairs_a_defective_build(tmp_path, local_root):
    out = tmp_path / "dataset"
    with SynthModel(defective={"errors"}) as model:
        report = asyncio.run(synthesize(config(model, out, local(local_root))))

    # propose: 5 drafted, one a repeat (refused by the store); prune: the near-duplicate and the
    # one the pruner did not pick are discarded, each with its reason
    assert report["yields"] == {"propose": [5, 4], "prune": [4, 2], "build": [2, 2], "test": [2, 2],
                                "refine": [1, 1]}
    reasons = {d["stage"]: d["reason"] for d in report["dropped"]}
    assert reasons["duplicate"] == "duplicate of #1 (refused by the store)"
    discarded = [d for d in report["dropped"] if d["stage"] == "discarded"]
    assert sorted(d["reason"] for d in discarded) == ["near-duplicate of #2", "pruner: less diverse than the kept ones"]

    # the log task was built with a verifier that rewards doing nothing: caught at test, repaired at refine
    assert report["stages"]["accepted"] == 2 and report["repaired"] == 1
    store = Store(out / "synth.sqlite")
    try:
        errors = next(t for t in store.tasks() if "app.log" in t["instruction"])
        assert errors["stage"] == "accepted" and errors["refines"] == 1
        tests = store.runs(stage="test", task=errors["id"], role="nothing")
        assert [r["reward"] for r in tests] == [1.0, 0.0]  # do-nothing passed the defective build, not the repair
        refine = store.runs(stage="refine", task=errors["id"])
        assert len(refine) == 1 and refine[0]["error"].startswith("environment:")
        # every agent run is costed: tokens from the scripted model's usage, sandboxes from the ledger
        builds = store.runs(stage="build")
        assert all(json.loads(r["ledger"])["prompt_tokens"] > 0 for r in builds)
        assert all(json.loads(r["ledger"])["sandboxes"] for r in builds)
    finally:
        store.close()
    assert report["costs"]["refine"]["model_calls"] == 2 and report["total"]["tokens"] > 0

    # the dataset: loads (orchard tasks check), the references pass and doing nothing fails in Harbor-v0
    tasks, problems = load_tasks(str(out))
    assert sorted(tasks) == sorted(a["folder"] for a in report["accepted"]) and not [
        p for p in problems if p.severity == "error"]
    for task_id in tasks:
        assert play(out, local(local_root), task_id, HarborOraclePolicy()) == 1.0
        assert play(out, local(local_root), task_id, NothingPolicy()) == 0.0
    assert json.loads((out / "synth-report.json").read_text())["stages"]["accepted"] == 2
    # every episode is kept as a trajectory: 2 builds, 3 test episodes per test (3 tests), 1 refine
    kept = [json.loads(line)["metadata"]["synth"] for line in (out / "synth-runs.jsonl").read_text().splitlines()]
    assert [k["role"] for k in kept].count("builder") == 2 and [k["role"] for k in kept].count("refiner") == 1
    assert sum(k["stage"] == "test" for k in kept) == 9

    # a second run over a finished store does nothing more
    with SynthModel() as idle:
        again = asyncio.run(synthesize(config(idle, out, local(local_root))))
        assert sum(idle.calls.values()) == 0 and again["stages"] == report["stages"]


@needs_bwrap
def test_a_task_that_never_passes_is_dropped_with_the_reason(tmp_path, local_root):
    """--require-solved with a tester that never solves anything: refined once, then dropped."""
    out = tmp_path / "dataset"
    with SynthModel(solve_as_tester=False) as model:
        report = asyncio.run(synthesize(config(model, out, local(local_root), require_solved=True,
                                               refine_budget=1, n=1)))
    assert report["kept"] == 0 and report["stages"]["dropped"] == 1
    dropped = next(d for d in report["dropped"] if d["stage"] == "dropped")
    assert dropped["reason"].startswith("failed its checks after 1 refine round(s): the tester model did not "
                                        "solve it (score 0.0)"), dropped
    assert report["yields"]["refine"] == [1, 0] and not load_tasks(str(out))[0]


@pytest.mark.docker
@needs("docker", None if _GATEWAY else _WHY_NOT)
def test_a_run_on_the_docker_backend(tmp_path):
    """Builders in containers, each task's image built from the Dockerfile its builder wrote."""
    out, backend = tmp_path / "dataset", {"type": "docker"}
    with SynthModel(defective={"errors"}) as model:
        report = asyncio.run(synthesize(config(model, out, backend)))
    assert report["kept"] == 2 and report["repaired"] == 1, report["dropped"]
    for task_id in load_tasks(str(out))[0]:
        assert play(out, backend, task_id, HarborOraclePolicy()) == 1.0
        assert play(out, backend, task_id, NothingPolicy()) == 0.0


def run_cli(args: list[str], root: Path) -> subprocess.Popen:
    env = {**os.environ, "ORCHARD_LOCAL_ROOT": str(root)}
    code = "import sys; from orchard_gym.cli import main; sys.argv = ['orchard', *sys.argv[1:]]; main()"
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def stage_of(store: Path, needle: str) -> str | None:
    if not store.exists():
        return None
    with sqlite3.connect(store) as db:
        row = db.execute("SELECT stage FROM tasks WHERE instruction LIKE ?", (f"%{needle}%",)).fetchone()
    return row[0] if row else None


@needs_bwrap
def test_a_killed_run_continues_where_it_stopped(tmp_path, local_root):
    out = tmp_path / "dataset"
    with SynthModel(hold="errors") as model:
        args = ["tasks", "synth", "--domain", DOMAIN, "--n", "2", "--pool", str(POOL), "--out", str(out),
                "--model", model.spec(), "--concurrency", "1"]
        first = run_cli(args, local_root)
        try:  # the expenses task is accepted, the log task's builder is mid-request: kill the run there
            wait_until(lambda: model.held.is_set() and stage_of(out / "synth.sqlite", "expenses") == "accepted"
                       or first.poll() is not None, timeout=240)
            assert first.poll() is None, first.communicate()[0]
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait()
        assert stage_of(out / "synth.sqlite", "app.log") == "selected"
        model.release()
        builds_before = model.calls[("builder", "expenses")]

        second = run_cli(args, local_root)
        output = second.communicate(timeout=300)[0]
        assert second.returncode == 0, output
    assert "2 task(s) kept of 5 proposed" in output
    assert model.calls[("builder", "expenses")] == builds_before  # the accepted task was not built again
    by_role = {role: sum(n for (r, _), n in model.calls.items() if r == role) for role in ("proposer", "pruner")}
    assert by_role == {"proposer": 1, "pruner": 1}  # nor proposed or pruned again
    assert stage_of(out / "synth.sqlite", "app.log") == "accepted"
    assert len(load_tasks(str(out))[0]) == 2


@pytest.mark.parametrize("args,message", [
    (["--n", "0"], "0 is not in the range x>=1"),
    (["--pool", "/nonexistent/pool"], "does not exist"),
    (["--pool", __file__], "is not a folder"),
    (["--model", "localhost:8000"], "--model must be URL#MODEL"),
    (["--tester", "ftp://x#m"], "--tester must be URL#MODEL"),
    (["--concurrency", "0"], "0 is not in the range"),
    (["--domain", "  "], "--domain is empty"),
])
def test_bad_flags_are_refused_clearly(args, message, tmp_path):
    base = {"--domain": DOMAIN, "--n": "2", "--pool": str(POOL), "--out": str(tmp_path / "o"),
            "--model": "http://127.0.0.1:9/v1#m"}
    base.update(dict(zip(args[::2], args[1::2])))
    result = CliRunner().invoke(cli, ["tasks", "synth", *[x for kv in base.items() for x in kv]])
    assert result.exit_code == 2 and message in result.output, result.output
    assert "Traceback" not in result.output


def test_an_unreachable_model_and_malformed_answers_are_clear_errors(tmp_path):
    args = ["tasks", "synth", "--domain", DOMAIN, "--n", "1", "--pool", str(POOL), "--out", str(tmp_path / "o")]
    result = CliRunner().invoke(cli, [*args, "--model", "http://127.0.0.1:9/v1#m"])  # port 9: nothing listens
    said = result.output.split("\r")[-1]
    assert result.exit_code == 1 and "the model at http://127.0.0.1:9/v1 (m) failed: EndpointUnreachable" in said, said
    assert "ConnectError" in said and "Traceback" not in result.output, said
    assert "run the same command again to continue" in result.output

    with SynthModel() as model:
        model.malformed = {"proposer"}
        result = CliRunner().invoke(cli, [*args, "--model", model.spec()])
        assert result.exit_code == 1, result.output
        assert "malformed: no proposer gave a usable instruction: no propose call and no JSON object" in result.output

        model.malformed = {"pruner"}  # 4 candidates for 2 places: the pruner must choose
        two = ["tasks", "synth", "--domain", DOMAIN, "--n", "2", "--pool", str(POOL), "--out", str(tmp_path / "p")]
        result = CliRunner().invoke(cli, [*two, "--model", model.spec()])
        assert result.exit_code == 1 and "malformed: no select call and no JSON object" in result.output
        store = Store(tmp_path / "p" / "synth.sqlite")
        # the near-duplicate went before the pruner was asked; the rest wait for the next run's prune
        assert (store.counts()["proposed"], store.counts()["discarded"], store.get_meta("pruned")) == (3, 1, None)
        store.close()

    # a store made for another domain is not continued by mistake
    result = CliRunner().invoke(cli, ["tasks", "synth", "--domain", "something else", *args[4:],
                                      "--model", "http://127.0.0.1:9/v1#m"])
    assert result.exit_code == 2 and "continues a run for the domain" in result.output


@needs_bwrap
def test_redteam_a_builder_cannot_link_host_files_into_the_dataset(tmp_path, local_root):
    """A builder whose task folder links to a host file (the oracle and the verifier upload what
    solution/ and tests/ hold, reading through links): the folder is refused when it leaves the
    sandbox, so the host file never reaches the dataset. With `filter="data"` removed from
    folders.unpack, the dataset's solve.sh is the host's secret."""
    from orchard_gym.envs.harbor.synth import folders
    from orchard_gym.envs.harbor.synth.workshop import Job, WorkshopEnv
    from synth_models import task_files, write_command

    secret = tmp_path / "host-secret.sh"
    secret.write_text("echo the host's secret\n")
    command = write_command(task_files("expenses", False)) + f"\nln -sf {secret} task/solution/solve.sh"
    env = WorkshopEnv(job=Job(prompt="build"), backend=local(local_root))

    async def builder(messages, tools):
        turn = sum(m["role"] == "assistant" for m in messages)
        return {"name": "bash", "arguments": {"command": command}} if turn == 0 else {"name": "submit", "arguments": {}}

    async def episode():
        try:
            return await run_episode(env, builder, "job")
        finally:
            await env.aclose()
    trajectory = asyncio.run(episode())
    assert trajectory.error is None and env.result is not None
    problems = folders.check(env.result)
    assert problems and "cannot be unpacked" in problems[0] and trajectory.reward == 0.0, problems
    with pytest.raises(ValueError, match="cannot be unpacked"):
        folders.unpack(env.result, tmp_path / "dataset" / "t0001")
    assert not (tmp_path / "dataset" / "t0001" / "solution" / "solve.sh").exists()
