"""Orchard/GUI-v0 through verifiers 0.4's own eval loop (`vf-eval` in .venv-verifiers), on the
real GUI image (scripts/build_gui_image.sh) on the docker backend, against the stub model
playing scripted transcripts: each screen reaches the model as an OpenAI `image_url` part (a
PNG data URL) in a user turn, and the task's oracle scores 1.0 and doing nothing 0.0, the
rewards `gym.make` gives for the same actions."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import uuid

import gymnasium as gym
import numpy as np
import pytest

from adapter_helpers import as_text, gym_reward, live_sandboxes
from components import needs
from conftest import gui_image_why_not, require

import orchard_gym  # noqa: F401
from orchard_gym.integrations.verifiers_run import VENV, venv_missing, vf_eval
from orchard_gym.wrappers.proxy.stub import StubUpstream

pytestmark = [pytest.mark.timeout(900), pytest.mark.docker, needs("docker", gui_image_why_not())]

TASK = "desktop/editor-append"  # mousepad on notes.txt; its oracle is fixed key/type actions (no page to read)
TERMINATE = {"name": "terminate", "arguments": {"status": "success"}}
ORACLE = gym.make("Orchard/GUI-v0", tasks="desktop").unwrapped.get_task(TASK).oracle + [TERMINATE]
DO_NOTHING = [{"name": "terminate", "arguments": {"status": "failure"}}]
# a malformed action first (coordinate is no point): an observation saying so, then the oracle
MALFORMED = '<tool_call>{"name": "left_click", "arguments": {"coordinate": "nowhere"}}</tool_call>'
SCRIPTS = {"gui-oracle": [as_text(c) for c in ORACLE], "gui-do-nothing": [as_text(c) for c in DO_NOTHING],
           "gui-malformed-then-oracle": [MALFORMED] + [as_text(c) for c in ORACLE]}


@pytest.fixture(scope="module")
def stub():
    require("verifiers", venv_missing())
    with StubUpstream(scripts=SCRIPTS) as server:
        yield server


@pytest.fixture
def kwargs():
    # an owner of its own: the docker engine is shared, so "no sandbox left" counts only this test's
    backend = {"type": "docker", "owner": f"vf-gui-{uuid.uuid4().hex[:10]}"}
    return {"backend": backend, "tasks": "desktop", "max_steps": 10}


def png_screen(part: dict) -> np.ndarray:
    """An `image_url` part's PNG data URL, decoded."""
    from PIL import Image

    head, _, payload = part["image_url"]["url"].partition(",")
    assert head == "data:image/png;base64", head
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(payload))).convert("RGB"))


def last_request(stub, model: str) -> dict:
    return [body for body in stub.received if body.get("model") == model][-1]


def user_turns(body: dict) -> list[list[dict]]:
    """The content of each user message the model was sent (the env's observations)."""
    users = [m["content"] for m in body["messages"] if m["role"] == "user"]
    assert all(isinstance(c, list) for c in users), users  # content parts, not a flattened string
    return users


def test_gui_oracle_scores_1_and_doing_nothing_0_and_the_model_sees_the_screens(stub, kwargs, tmp_path):
    rewards = {}
    for model, actions in (("gui-oracle", ORACLE), ("gui-do-nothing", DO_NOTHING)):
        [episode] = vf_eval("Orchard/GUI-v0", model=model, base_url=stub.url, tasks=[TASK], env_kwargs=kwargs,
                            out_dir=tmp_path)
        assert episode.error is None and episode.task_id == TASK, episode
        assert episode.turns == len(actions)  # one model turn per env step, none after the end
        rewards[model] = episode.reward
        assert episode.reward == gym_reward("Orchard/GUI-v0", TASK, actions, **kwargs)
    assert rewards == {"gui-oracle": 1.0, "gui-do-nothing": 0.0}

    # what the model was really sent, as the stub received it over HTTP
    body = last_request(stub, "gui-oracle")
    system = body["messages"][0]
    assert system["role"] == "system" and "`terminate`" in system["content"] and "an image" in system["content"]
    users = user_turns(body)
    assert len(users) == len(ORACLE)  # the first screen and one after each action but the last (terminate)
    screens = []
    for content in users:
        assert [p["type"] for p in content] == ["text", "image_url"], content
        assert content[0]["text"].startswith("Task: notes.txt is open in the text editor.")
        screen = png_screen(content[1])
        assert screen.shape == (720, 1280, 3) and len(np.unique(screen.reshape(-1, 3), axis=0)) > 20  # drawn
        screens.append(screen)
    assert "Title: notes.txt - Mousepad" in users[0][0]["text"]
    assert "Typed 9 characters" in users[2][0]["text"] and "*notes.txt" in users[2][0]["text"]
    assert not np.array_equal(screens[0], screens[2])  # the typed line is on the screen the model got
    # the do-nothing episode's one request: the first screen of a fresh sandbox
    [first] = user_turns(last_request(stub, "gui-do-nothing"))
    assert first[1]["type"] == "image_url" and png_screen(first[1]).shape == (720, 1280, 3)
    assert live_sandboxes(kwargs["backend"]) == []


def test_a_malformed_action_is_an_observation_saying_so_with_the_screen(stub, kwargs, tmp_path):
    [episode] = vf_eval("Orchard/GUI-v0", model="gui-malformed-then-oracle", base_url=stub.url, tasks=[TASK],
                        env_kwargs=kwargs, out_dir=tmp_path)
    assert episode.error is None and episode.reward == 1.0 and episode.turns == len(ORACLE) + 1
    users = user_turns(last_request(stub, "gui-malformed-then-oracle"))
    said = users[1][0]["text"]
    assert "Error: bad arguments for left_click: coordinate" in said, said
    assert users[1][1]["type"] == "image_url" and png_screen(users[1][1]).shape == (720, 1280, 3)
    assert live_sandboxes(kwargs["backend"]) == []


def test_gui_garbage_input_is_a_clear_error():
    require("verifiers", venv_missing())
    probe = """
import json
from orchard_gym.integrations.verifiers import load_environment, user_turn
out = []
for args, kwargs in ((("Orchard/GUI-v0",), {"tasks": ["desktop/no-such-task"]}), (("Orchard/OpenEnv-v0",), {}),
                     (("Orchard/GUI-v0",), {"tasks": "desktop/editor-append"})):
    try:
        env = load_environment(*args, **kwargs)
        list(env.taskset)
        out.append("no error")
    except Exception as e:
        out.append(f"{type(e).__name__}: {e}")
try:
    user_turn({"text": "a dict with no screen"})
    out.append("no error")
except Exception as e:
    out.append(f"{type(e).__name__}: {e}")
env = load_environment("Orchard/GUI-v0", tasks=["desktop/editor-append"])
[task] = list(env.taskset)
out.append(task.data.system_prompt)
print(json.dumps(out))
"""
    run = subprocess.run([str(VENV / "bin" / "python"), "-c", probe], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    *errors, system = json.loads(run.stdout.strip().splitlines()[-1])
    assert errors[0].startswith("ValueError: Orchard/GUI-v0 has no task 'desktop/no-such-task'"), errors[0]
    assert "Orchard/OpenEnv-v0 is a client of another OpenEnv server" in errors[1], errors[1]
    assert errors[2].startswith("ValidationError") and "tasks\n  Input should be a valid list" in errors[2], errors[2]
    assert "a dict observation needs a 'screenshot'" in errors[3], errors[3]
    assert "left_click" in system and "Call `terminate` when you are done" in system
