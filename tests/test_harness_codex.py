"""The real Codex CLI (npm @openai/codex, pinned, installed by scripts/install_harnesses.sh)
as a gym env: unchanged, configured through its own $CODEX_HOME/config.toml with the
recording proxy as its Responses-API model provider (streaming), in a local sandbox with
no network (it reaches the proxy through the unix-socket relay only). Our scripted policy
plays its model: the gold patch through its own shell tool (`exec_command`), then a
final answer; a do-nothing policy answers at once. Every model call is recorded."""

from __future__ import annotations

import json
import shutil

import gymnasium as gym
import pytest

from conftest import require, require_module

require_module("server", "fastapi")
require("harnesses", None if shutil.which("npm") and shutil.which("node") else "node/npm are not installed")

import orchard_gym  # noqa: E402,F401
from orchard_gym.envs.swe.tasks import load_tasks  # noqa: E402
from orchard_gym.wrappers.harness import get_harness  # noqa: E402

TASK = "semver-3.0.2"
GOLD = load_tasks("builtin")[TASK].patch
APPLY_PATCH = "apply_patch <<'EOF'\n*** Begin Patch\n*** Add File: NOTES_codex.txt\n+fixed by codex\n*** End Patch\nEOF"


def gold_via_shell() -> dict:
    cmd = f"git apply <<'ORCHARD_EOF'\n{GOLD}\nORCHARD_EOF\necho applied-$?"
    return {"role": "assistant", "content": None,
            "tool_calls": [{"name": "exec_command", "arguments": {"cmd": cmd}}]}


def make(backend: dict, **kw) -> gym.Env:
    return gym.make("Orchard/SWE-v0", harness="codex", backend=backend, max_seconds=600, **kw)


def check_first_request(obs: str, info: dict) -> None:
    request = json.loads(obs)
    assert info["endpoint"] == "responses" and info["request"]["stream"] is True
    assert info["request"]["model"] == "orchard-policy"
    names = [t.get("function", {}).get("name") for t in request["tools"]]
    assert "exec_command" in names, names
    text = json.dumps(request["messages"])
    assert "Codex" in text and "Version.replace()" in text  # its own system prompt, our task text


def run_solved(env) -> None:
    obs, info = env.reset(options={"task_id": TASK})
    check_first_request(obs, info)
    obs, reward, terminated, truncated, info = env.step(gold_via_shell())
    assert not (terminated or truncated), info
    last = json.loads(obs)["messages"][-1]
    assert last["role"] == "tool" and "applied-0" in last["content"], last
    # codex's own apply_patch (its patch format, which it intercepts from its shell tool)
    obs, reward, terminated, truncated, info = env.step({"name": "exec_command", "arguments": {"cmd": APPLY_PATCH}})
    last = json.loads(obs)["messages"][-1]
    assert "Success. Updated the following files" in last["content"] and "A NOTES_codex.txt" in last["content"], last
    obs, reward, terminated, truncated, info = env.step("The fix is applied.")
    assert (reward, terminated, truncated) == (1.0, True, False), info
    assert info["report"]["status"] == "RESOLVED_FULL" and info["harness_exit_code"] == 0
    record = env.unwrapped.record
    assert record.status == "finished" and len(record.calls) == 3 and all(c.ok for c in record.calls)
    assert all(c.endpoint == "responses" and c.stream for c in record.calls)
    assert record.calls[0].response["output"][0]["type"] == "function_call"  # what codex was sent back
    items = record.calls[1].request["input"]
    assert any(i.get("type") == "function_call_output" for i in items)  # codex's own context for call 2
    assert [s.reward for s in env.unwrapped.samples()] == [1.0, 1.0, 1.0]


def run_do_nothing(env) -> None:
    obs, info = env.reset(options={"task_id": TASK})
    obs, reward, terminated, truncated, info = env.step("I will not change anything.")
    assert (reward, terminated, truncated) == (0.0, True, False), info
    assert "error" not in info and info["harness_exit_code"] == 0
    record = env.unwrapped.record
    assert record.status == "finished" and record.reward == 0.0 and len(record.calls) == 1
    assert [s.reward for s in env.unwrapped.samples()] == [0.0]


@pytest.mark.timeout(900)
def test_codex_solves_and_fails_a_task_locally(local_root):
    env = make({"type": "local", "root": str(local_root)})
    try:
        run_solved(env)
        run_do_nothing(env)  # same env, a new episode
    finally:
        env.close()


def test_codex_harness_is_pinned_data():
    h = get_harness("codex")
    assert h.npm == ["@openai/codex@0.171.0"] and h.task_input == "stdin"
    files = h.rendered_files("/w/.orchard-harness", None, "/npm", "my-model")
    config = files["codex/config.toml"]
    assert 'model = "my-model"' in config and 'base_url = "@ORCHARD_BASE_URL@"' in config
    assert 'wire_api = "responses"' in config
    script = h.launch_script("/w/.orchard-harness", "/npm")
    assert "/w/.orchard-harness/templates/0" in script and '< "$ORCHARD_TASK_FILE"' in script


def test_harness_data_is_validated_and_found_by_name():
    from orchard_gym.wrappers.harness import Harness, all_harnesses
    from orchard_gym.wrappers.harness.env import HarnessEnv

    assert {"codex", "mini-swe-agent"} <= set(all_harnesses())
    for bad, match in [({"npm": ["@openai/codex"]}, "not pinned"), ({"npm": ["@openai/codex@^0.171.0"]}, "not pinned"),
                       ({"npm": ["left-pad@latest"]}, "not pinned"), ({"files": {"../escape": "x"}}, "relative"),
                       ({"files": {"/etc/passwd": "x"}}, "relative"), ({"model_url_env": {"NOT A NAME": "{root}"}},
                                                                          "variable name"),
                       ({"task_input": "carrier-pigeon"}, "task_input"), ({"command": ""}, "command"),
                       ({"surprise": 1}, "surprise")]:
        with pytest.raises(ValueError, match=match):
            Harness.model_validate({"name": "x", "command": "true", **bad})
    for bad in ("no-such-harness", 42, None):
        with pytest.raises(ValueError, match="unknown harness"):
            get_harness(bad)
    # model-URL variables are set from the URL the sandbox sees, quoted
    h = Harness(name="x", command="true", model_url_env={"ANTHROPIC_BASE_URL": "{root}", "ODD": "a b {base_url}"})
    script = h.launch_script("/h")
    assert "export ANTHROPIC_BASE_URL=''\"$ORCHARD_MODEL_ROOT\"''" in script
    assert "export ODD='a b '\"$OPENAI_BASE_URL\"''" in script
    # harness= works for the Claw env too (registration wraps any env id)
    env = gym.make("Orchard/Claw-v0", harness="codex", bash=True, backend={"type": "local"})
    assert isinstance(env.unwrapped, HarnessEnv) and env.unwrapped.harness.name == "codex"
    env.close()
