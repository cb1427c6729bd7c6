"""Orchard/GUI-v0 through the trainer slots that carry images, on the real GUI image
(scripts/build_gui_image.sh) on the docker backend: TRL's `environment_factory` (content
blocks with PIL images) and OpenEnv (a PNG data URL in the observation), both driven by the
task's own oracle through the adapter's public calls. SkyRL-Gym's refusal is in
tests/test_integrations_skyrl.py."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from components import needs
from conftest import gui_image_why_not, require_module, wait_until

require_module("integrations", "openenv")
uvicorn = require_module("server", "uvicorn")

import orchard_gym  # noqa: E402, F401
from orchard_gym.envs.gui.env import DEFAULT_IMAGE  # noqa: E402
from orchard_gym.envs.gui.oracles import GUIOraclePolicy  # noqa: E402
from orchard_gym.integrations.core import EnvHub, carries_images, make_env  # noqa: E402

on_gui_image = [pytest.mark.docker, needs("docker", gui_image_why_not())]
TASK = "miniwob/click-button"
BACKEND = {"type": "docker"}
KWARGS = {"backend": BACKEND, "tasks": "miniwob", "max_steps": 10}


def drawn(screen: np.ndarray) -> bool:
    """MiniWoB's task area (top left) is drawn: the instruction bar and buttons, not one colour."""
    return screen.shape == (720, 1280, 3) and len(np.unique(screen[:210, :160].reshape(-1, 3), axis=0)) > 20


def on_the_gui_image(test):
    for mark in reversed(on_gui_image):
        test = mark(test)
    return test


def test_garbage_observations_get_clear_errors():
    from orchard_gym.errors import InvalidRequest
    from orchard_gym.integrations.core import ImagesNotCarried, observation_image, refuse_images
    from orchard_gym.integrations.openenv import OpenEnvEnv
    from orchard_gym.integrations.trl import trl_content

    assert not carries_images(object()) and not carries_images(None)
    assert observation_image("text") is None and observation_image({"text": "no screen"}) is None
    assert trl_content({"text": "no screen"}) == "no screen" and trl_content("plain") == "plain"
    with pytest.raises(InvalidRequest, match="uint8"):
        trl_content({"screenshot": np.zeros((4, 4, 3), np.float64), "text": ""})
    error = refuse_images("Orchard/GUI-v0", "a slot", "it is text only")
    assert isinstance(error, ImagesNotCarried) and "it is text only" in str(error)
    env = OpenEnvEnv.__new__(OpenEnvEnv)  # its observation decoding, without a server
    env.observation_space = None
    for bad in ("http://example.com/screen.png", "data:image/png;base64,not-a-png"):
        with pytest.raises((InvalidRequest, ValueError)):
            env._observation({"text": "x", "image": bad})


@on_the_gui_image
def test_hub_knows_which_envs_observe_images():
    assert carries_images(make_env("Orchard/GUI-v0", tasks="miniwob"))
    assert not carries_images(make_env("Orchard/Toy-v0"))
    hub = EnvHub("Orchard/GUI-v0", **KWARGS)
    try:
        assert hub.images and TASK in hub.task_ids()
        # envs made on the hub's shared client still get the GUI image its docker backend needs
        env = make_env("Orchard/GUI-v0", client=hub.client(), tasks="miniwob")
        assert env.image_for(env.get_task(TASK)) == DEFAULT_IMAGE
    finally:
        hub.close()


@on_the_gui_image
def test_trl_environment_gives_screens_as_image_blocks_and_the_oracle_earns_the_reward():
    from orchard_gym.integrations.trl import environment_factory

    factory = environment_factory("Orchard/GUI-v0", **KWARGS)
    try:
        env = factory()
        first = env.reset(task_id=TASK)  # waits for the sandbox: the first screen is part of the prompt
        assert [b["type"] for b in first] == ["image", "text"] and "Task:" in first[1]["text"]
        screen = np.asarray(first[0]["image"])
        assert drawn(screen)
        oracle = GUIOraclePolicy(env._episode.env)  # reads the page, acts only through the tool methods
        results = []
        for _ in range(8):
            action = factory.hub.run(oracle([], factory.hub.tool_schemas))
            if action["name"] == "terminate":
                break
            results.append(factory.hub.run(getattr(env, action["name"])(**action["arguments"])))
        assert results and all([b["type"] for b in r] == ["image", "text"] for r in results)
        assert not np.array_equal(np.asarray(results[-1][0]["image"]), screen)  # the click changed the screen
        assert asyncio.run(env.get_reward()) == 1.0 and not factory.errors

        idle = factory()
        assert [b["type"] for b in idle.reset(task_id=TASK)] == ["image", "text"]
        # a policy that never ends its episode: ended as it stands (terminate) and graded, not an error
        assert asyncio.run(idle.get_reward()) == 0.0 and not factory.errors
        wait_until(lambda: factory.hub.live_sandboxes() == 0, timeout=30)
    finally:
        factory.close()


@on_the_gui_image
def test_trl_gui_sandbox_that_cannot_start_is_an_error_not_a_crash():
    """TRL calls reset serially inside its step: a GUI sandbox that cannot start must not raise
    there; the rollout is errored (get_reward None, in factory.errors), as for text envs."""
    from orchard_gym.integrations.trl import environment_factory

    factory = environment_factory("Orchard/GUI-v0", **KWARGS, image="localhost/orchard/no-such-image:0")
    try:
        env = factory()
        first = env.reset(task_id=TASK)
        assert isinstance(first, str) and "could not be started" in first
        assert asyncio.run(env.get_reward()) is None
        [(task, outcome)] = factory.errors
        assert task == TASK and outcome.error_kind == "infrastructure"
    finally:
        factory.close()


@on_the_gui_image
def test_openenv_session_carries_the_screen_as_a_png_data_url():
    from openenv.core.generic_client import GenericEnvClient

    from orchard_gym.integrations.openenv import OpenEnvEnv, create_app
    from test_integrations_openenv import Server

    server = Server(create_app("Orchard/GUI-v0", max_sessions=2, **KWARGS))
    try:
        with GenericEnvClient(base_url=server.url).sync() as client:
            first = client.reset(task_id=TASK).observation
            assert first["image"].startswith("data:image/png;base64,") and "Task:" in first["text"]
            hub = server.app.state.orchard_hub
            oracle = GUIOraclePolicy(next(e.env for e in hub.episodes if e.env is not None))
            for _ in range(8):
                action = hub.run(oracle([], hub.tool_schemas))
                result = client.step({"tool": action["name"], "arguments": action["arguments"]})
                if result.done:
                    break
                assert result.observation["image"].startswith("data:image/png;base64,")
            assert result.done and result.reward == 1.0 and result.observation["error"] is None

        env = OpenEnvEnv(server.url)  # the other way round: the server's screens as an Orchard GUI env's
        try:
            obs, info = env.reset(options={"task_id": TASK})
            assert set(obs) == {"screenshot", "text"} and drawn(obs["screenshot"]) and "image" not in info
            assert env.observation_space.contains(obs)
            obs, reward, terminated, _, info = env.step({"name": "terminate", "arguments": {"status": "failure"}})
            assert terminated and reward == 0.0 and info["error"] is None and drawn(obs["screenshot"])
        finally:
            env.close()
        wait_until(lambda: server.app.state.orchard_hub.live_sandboxes() == 0, timeout=30)
    finally:
        server.close()
