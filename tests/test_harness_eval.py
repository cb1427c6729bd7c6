"""Harness evaluation: the same tasks through several harnesses, one table, every run's
trajectory and recorded calls in the JSONL; the CLI's bad input. Real harness processes
(the stdlib ReAct harness, as two named harnesses) in real local sandboxes."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from conftest import require_module

require_module("server", "fastapi")

from harness_scripts import react  # noqa: E402
from orchard_gym.cli import main  # noqa: E402
from orchard_gym.wrappers.harness.eval import (evaluate_harnesses, evaluate_matrix, format_matrix, format_table,  # noqa: E402
                                               policy_from_spec, summary_table)

TASK = "semver-3.0.2"


def harnesses():
    plain = react().model_copy(update={"name": "react-plain", "finish": "DONE"})
    stream = react("stream").model_copy(update={"name": "react-stream", "finish": "DONE"})
    return [plain, stream]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("policy, resolved", [("oracle", 1), ("nothing", 0)])
def test_eval_compares_harnesses_on_the_same_tasks(local_root, tmp_path, policy, resolved):
    out = tmp_path / "runs.jsonl"
    runs = evaluate_harnesses(harnesses(), "Orchard/SWE-v0", [TASK], policy_from_spec(policy),
                              backend={"type": "local", "root": str(local_root)}, concurrency=2, max_steps=5,
                              max_seconds=300, out=out, progress=False)
    assert [(r.harness, r.task_id, r.error) for r in runs] == [("react-plain", TASK, None), ("react-stream", TASK, None)]
    assert [r.resolved for r in runs] == [bool(resolved)] * 2
    table = summary_table(runs)
    assert [(row["harness"], row["runs"], row["resolved"], row["resolve_rate"]) for row in table] == [
        ("react-plain", 1, resolved, float(resolved)), ("react-stream", 1, resolved, float(resolved))]
    text = format_table(runs)
    assert "react-plain" in text and f"{resolved}/1" in text.splitlines()[-1]
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(line["harness"] for line in lines) == ["react-plain", "react-stream"]
    for line in lines:
        calls = line["record"]["calls"]
        assert len(calls) == (2 if policy == "oracle" else 1) and all(c["response"] and c["request"] for c in calls)
        assert line["trajectory"]["task_id"] == TASK and line["reward"] == float(resolved)
        streamed = line["harness"] == "react-stream"
        assert all(c["stream"] is streamed for c in calls)
        ledger = line["trajectory"]["ledger"]  # the cost ledger: the proxy's tokens, task + grader sandboxes
        assert ledger["model_calls"] == len(calls) and ledger["token_source"] == "proxy"
        assert ledger["prompt_tokens"] == sum(c["usage"]["prompt_tokens"] for c in calls)
        # the task's sandbox, the grader's and the tamper check's verdict run's (made ready beside the
        # graded run; its tests run only when resolved)
        assert len(ledger["sandboxes"]) == 3 and ledger["sandboxes"][0]["wall_seconds"] > 0


@pytest.mark.timeout(900)
def test_the_cross_harness_matrix_names_each_policy_and_what_it_was_trained_on(local_root, tmp_path):
    """`orchard eval --harness a,b --policies good=...,bad=... --train-harness good=a`: every named
    policy through every harness on the same task; the table is trained-on x evaluated-on, and the
    labels travel with the JSONL lines, the trajectories and the pool entries made from them."""
    from orchard_gym.algos.trajectory_pool import from_trajectory
    from orchard_gym.trajectory import Trajectory

    out = tmp_path / "matrix.jsonl"
    runs = evaluate_matrix(harnesses(), "Orchard/SWE-v0", [TASK],
                           {"good": policy_from_spec("oracle"), "bad": policy_from_spec("nothing")},
                           train_harness={"good": "react-plain"}, backend={"type": "local", "root": str(local_root)},
                           concurrency=2, max_steps=5, max_seconds=300, out=out, progress=False)
    assert [(r.policy, r.harness, r.resolved, r.error) for r in runs] == [
        ("good", "react-plain", True, None), ("good", "react-stream", True, None),
        ("bad", "react-plain", False, None), ("bad", "react-stream", False, None)]
    table = format_matrix(runs).splitlines()
    assert table[0].split()[:3] == ["policy", "trained", "on"] and table[0].split()[3:] == ["react-plain", "react-stream"]
    assert table[1].split() == ["good", "react-plain", "1/1", "100%", "1/1", "100%"]
    assert table[2].split() == ["bad", "-", "0/1", "0%", "0/1", "0%"]
    lines = [json.loads(line) for line in out.read_text().splitlines()]  # both policies' runs, none overwritten
    assert sorted((line["policy"], line["harness"], line["train_harness"]) for line in lines) == [
        ("bad", "react-plain", None), ("bad", "react-stream", None),
        ("good", "react-plain", "react-plain"), ("good", "react-stream", "react-plain")]
    good = Trajectory.model_validate(next(line["trajectory"] for line in lines if line["policy"] == "good"))
    assert good.metadata["policy"] == "good" and good.metadata["train_harness"] == "react-plain"
    entry = from_trajectory(good, policy_id="good")
    assert entry.metadata["train_harness"] == "react-plain" and entry.metadata["harness"] in ("react-plain",
                                                                                             "react-stream")
    with pytest.raises(ValueError, match="names no policy"):
        evaluate_matrix(harnesses(), "Orchard/SWE-v0", [TASK], {"good": policy_from_spec("oracle")},
                        train_harness={"other": "react-plain"}, progress=False)


def test_eval_harness_cli_rejects_bad_input():
    runner = CliRunner()
    for argv, message in [
        (["eval", "--harness", "no-such-harness"], "unknown harness"),
        (["eval", "--harness", "codex,codex"], "named twice"),
        (["eval", "--harness", ","], "unknown harness"),
        (["eval", "--harness", "codex", "--policy", "gpt"], "unknown policy"),
        (["eval", "--harness", "codex", "--policy", "openai:nourl"], "unknown policy"),
        (["eval", "--harness", "codex", "--task-id", "no-such-task"], "unknown task ids"),
        (["train", "grpo", "--model", "x", "--harness", "no-such-harness"], "unknown harness"),
        (["eval", "--policies", "a=oracle"], "need --harness"),
        (["eval", "--harness", "codex", "--train-harness", "a=codex"], "give --policies too"),
        (["eval", "--harness", "codex", "--policies", "a"], "is not NAME=VALUE"),
        (["eval", "--harness", "codex", "--policies", "a=oracle,a=nothing"], "named twice"),
        (["eval", "--harness", "codex", "--policies", ","], "nothing given"),
        (["eval", "--harness", "codex", "--policies", "a=gpt"], "a: unknown policy"),
        (["eval", "--harness", "codex", "--policies", "a=oracle", "--train-harness", "b=codex"], "names no policy"),
        (["eval", "--harness", "codex", "--policies", "a=oracle", "--train-harness", "a=nope"], "unknown harness"),
    ]:
        result = runner.invoke(main, argv)
        assert result.exit_code != 0 and message in result.output, (argv, result.output)
