"""ATIF export (orchard_gym/atif.py, `orchard export --format atif`): the ATIF-v1.8 shape, and a
round trip that keeps every tool call and observation. Validation with Harbor's own models needs
Python >= 3.12 (scripts/harbor_check.py atif FILE)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from orchard_gym.atif import from_atif, to_atif
from orchard_gym.cli import main
from orchard_gym.ledger import Ledger
from orchard_gym.trajectory import Trajectory, Turn


def sample() -> Trajectory:
    turns = [
        Turn(index=0, action={"id": "call_abc", "name": "bash", "arguments": {"command": "ls"}}, tool="bash",
             arguments={"command": "ls"}, observation="a.txt\n", command="ls", exit_code=0, duration=0.25,
             messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "List the files."}]),
        Turn(index=1, action="I think I am done", observation="Error: no tool call", error="no tool call"),
        Turn(index=2, action={"name": "submit", "arguments": {}}, tool="submit", arguments={}, observation="Submitted."),
    ]
    return Trajectory(env_id="Orchard/SWE-v0", task_id="t1", sandbox_id="sb-1", turns=turns, reward=1.0,
                      report={"passed": True}, terminated=True, ended_at=turns[0].started_at + 3,
                      ledger=Ledger(prompt_tokens=120, completion_tokens=30, model_calls=2, token_source="policy"))


def test_the_atif_shape():
    atif = to_atif(sample())
    assert atif["schema_version"] == "ATIF-v1.8" and atif["agent"]["name"] == "orchard-gym"
    steps = atif["steps"]
    assert [s["step_id"] for s in steps] == [1, 2, 3, 4]
    assert steps[0] == {**steps[0], "source": "user", "message": "List the files."}
    first = steps[1]
    assert first["tool_calls"] == [{"tool_call_id": "call_abc", "function_name": "bash", "arguments": {"command": "ls"}}]
    assert first["observation"]["results"] == [{"content": "a.txt\n", "source_call_id": "call_abc"}]
    assert "tool_calls" not in steps[2] and steps[2]["message"] == "I think I am done"
    assert steps[3]["tool_calls"][0]["tool_call_id"] == "call_2"
    assert atif["final_metrics"]["total_prompt_tokens"] == 120 and atif["final_metrics"]["total_steps"] == 4
    for step in steps:  # only agent steps carry agent-only fields (ATIF's rule)
        assert step["source"] == "agent" or not {"tool_calls", "metrics", "model_name"} & set(step)


def test_a_round_trip_keeps_every_tool_call_and_observation():
    t = sample()
    back = from_atif(json.loads(json.dumps(to_atif(t))))
    assert [(u.tool, u.arguments, u.observation, u.action, u.error, u.exit_code) for u in back.turns] == \
           [(u.tool, u.arguments, u.observation, u.action, u.error, u.exit_code) for u in t.turns]
    assert (back.env_id, back.task_id, back.reward, back.report, back.terminated) == \
           (t.env_id, t.task_id, t.reward, t.report, t.terminated)
    assert back.ledger.prompt_tokens == 120


def test_orchard_export_writes_one_atif_object_a_line(tmp_path):
    runs = tmp_path / "eval.jsonl"
    runs.write_text(sample().model_dump_json() + "\n" + sample().model_dump_json() + "\n")
    result = CliRunner().invoke(main, ["export", "--format", "atif", str(runs)])
    assert result.exit_code == 0, result.output
    lines = (tmp_path / "eval.atif.jsonl").read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[0])["schema_version"] == "ATIF-v1.8"
    runs.write_text("{not json\n")
    result = CliRunner().invoke(main, ["export", str(runs)])
    assert result.exit_code == 1 and "eval.jsonl:1: not a trajectory" in result.output


def test_a_harness_run_keeps_its_chat_tool_calls_results_and_token_ids():
    def call(i, command):
        return {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": command})}}]}
    system, user = {"role": "system", "content": "s"}, {"role": "user", "content": "Fix the bug."}
    first = json.dumps({"messages": [system, user]})
    second = json.dumps({"messages": [system, user, call(0, "ls"), {"role": "tool", "tool_call_id": "c0", "content": "a.py"}]})
    t = Trajectory(env_id="Orchard/SWE-v0", task_id="t", turns=[
        Turn(index=0, action=call(0, "ls"), observation=first, messages=[system, user]),
        Turn(index=1, action=call(1, "echo done"), observation=second)])
    calls = [{"usage": {"prompt_tokens": 10, "completion_tokens": 3}, "prompt_token_ids": [1, 2],
              "completion_token_ids": [7, 8, 9], "logprobs": [{"token": "x", "logprob": -0.5}] * 3}, {"usage": {}}]
    atif = to_atif(t, "mini-swe-agent", calls)
    steps = atif["steps"]
    assert steps[0]["message"] == "Fix the bug." and atif["agent"]["name"] == "mini-swe-agent"
    assert steps[1]["tool_calls"] == [{"tool_call_id": "c0", "function_name": "bash", "arguments": {"command": "ls"}}]
    assert steps[1]["observation"]["results"] == [{"content": "a.py", "source_call_id": "c0"}]
    assert steps[1]["metrics"] == {"prompt_tokens": 10, "completion_tokens": 3, "prompt_token_ids": [1, 2],
                                   "completion_token_ids": [7, 8, 9], "logprobs": [-0.5, -0.5, -0.5]}
    back = from_atif(json.loads(json.dumps(atif)))
    assert [(u.action, u.observation, u.tool) for u in back.turns] == [(u.action, u.observation, None) for u in t.turns]
