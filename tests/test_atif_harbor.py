"""ATIF exports of real runs (a SWE run, a Claw run, a harness run) validate with Harbor's own
`harbor.models.trajectories.Trajectory` (harbor 0.25.0 in its Python 3.13 venv, through
scripts/harbor_check.py), and read back with every tool call and observation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import require_module

require_module("server", "fastapi")

from harbor_real import harbor_check  # noqa: E402
from harness_scripts import react  # noqa: E402
from orchard_gym.atif import from_atif  # noqa: E402
from orchard_gym.cli import main  # noqa: E402
from orchard_gym.trajectory import Trajectory  # noqa: E402
from orchard_gym.wrappers.harness.eval import evaluate_harnesses, policy_from_spec  # noqa: E402

SWE_TASK = "semver-3.0.2"


def eval_run(out: Path, local_root: Path, *args: str) -> Path:
    result = CliRunner().invoke(main, ["eval", "--policy", "oracle", "--out", str(out), *args],
                                env={"ORCHARD_LOCAL_ROOT": str(local_root)})
    assert result.exit_code == 0, result.output
    return out


def runs(local_root: Path, folder: Path) -> dict[str, Path]:
    harness = folder / "harness.jsonl"
    evaluate_harnesses([react().model_copy(update={"name": "react-plain", "finish": "DONE"})], "Orchard/SWE-v0",
                       [SWE_TASK], policy_from_spec("oracle"), backend={"type": "local", "root": str(local_root)},
                       concurrency=1, max_steps=5, max_seconds=300, out=harness, progress=False)
    return {"swe": eval_run(folder / "swe.jsonl", local_root, "--env", "Orchard/SWE-v0", "--task-id", SWE_TASK),
            "claw": eval_run(folder / "claw.jsonl", local_root, "--env", "Orchard/Claw-v0", "--task-id", "mail-reply-002"),
            "harness": harness}


def turns(t: Trajectory) -> list[tuple]:
    return [(u.tool, u.arguments, u.action, u.observation, u.error) for u in t.turns]


@pytest.mark.timeout(900)
def test_real_swe_claw_and_harness_runs_export_to_atif_that_harbors_models_accept(local_root, tmp_path):
    for kind, jsonl in runs(local_root, tmp_path).items():
        result = CliRunner().invoke(main, ["export", "--format", "atif", str(jsonl)])
        assert result.exit_code == 0, result.output
        atif = jsonl.with_suffix(".atif.jsonl")
        status, said = harbor_check("atif", atif)  # Harbor's own pydantic models, in Harbor's venv
        assert status == 0 and said.count("valid   line") == len(atif.read_text().splitlines()) >= 1, (kind, said)
        for line, exported in zip(jsonl.read_text().splitlines(), atif.read_text().splitlines(), strict=True):
            data = json.loads(line)
            original = Trajectory.model_validate(data.get("trajectory", data))
            assert original.reward == 1.0 and len(original.turns) >= 1, (kind, original.reward)
            back = from_atif(json.loads(exported))
            if kind == "harness":  # a harness's turn is its chat message: every tool call kept inside it
                assert [(u.action, u.observation) for u in back.turns] == \
                       [(u.action, u.observation) for u in original.turns], kind
            else:
                assert turns(back) == turns(original), kind
            assert (back.env_id, back.task_id, back.reward) == (original.env_id, original.task_id, original.reward)
