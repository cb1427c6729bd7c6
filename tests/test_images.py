"""Image observations end to end for policies: screenshots as OpenAI `image_url` parts, through
the `openai:` policy of `orchard eval` and the recording proxy (a real uvicorn proxy, the stub
upstream, the official openai client), in real sandboxes (Orchard/ToyColour)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io

import numpy as np
import pytest

from conftest import require_module
from orchard_gym.envs.rollout import observation_messages, run_episodes
from orchard_gym.envs.toy.colour import COLOURS, ColourEnv, square
from orchard_gym.errors import InvalidRequest
from orchard_gym.screenshots import data_url, observation_parts

Image = require_module("train", "PIL.Image")  # an independent decoder (Pillow comes with extra [train])


def decode(url: str) -> np.ndarray:
    head, _, payload = url.partition(",")
    assert head in ("data:image/png;base64", "data:image/jpeg;base64"), head
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(payload))).convert("RGB"))


def test_screenshots_become_image_url_parts():
    picture = np.random.default_rng(0).integers(0, 256, (37, 53, 3), dtype=np.uint8)
    parts = observation_parts({"screenshot": picture, "text": "Click OK · Example Domain"})
    assert parts[0] == {"type": "text", "text": "Click OK · Example Domain"}
    assert parts[1]["type"] == "image_url" and np.array_equal(decode(parts[1]["image_url"]["url"]), picture)
    grey = np.arange(12, dtype=np.uint8).reshape(3, 4)
    assert np.array_equal(decode(data_url(grey))[..., 0], grey)
    smooth = square(COLOURS["blue"], 64)
    assert np.abs(decode(data_url(smooth, "jpeg")).astype(int) - smooth).mean() < 4  # lossy, but close
    assert observation_parts("plain text") == "plain text"
    # after a tool call the text is the tool result and the picture follows as a user message
    call = {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
                                                                  "function": {"name": "bash", "arguments": "{}"}}]}
    tool, user = observation_messages(call, {"screenshot": smooth, "text": "(no output)"})
    assert tool == {"role": "tool", "tool_call_id": "c1", "content": "(no output)"}
    assert user["role"] == "user" and [p["type"] for p in user["content"]] == ["image_url"]
    [only] = observation_messages({"role": "assistant", "content": "hi"}, {"screenshot": smooth, "text": "t"})
    assert [p["type"] for p in only["content"]] == ["text", "image_url"]


@pytest.mark.parametrize("obs, words", [
    ({"screenshot": np.zeros((4, 4, 3), np.float32), "text": "x"}, "must be uint8"),
    ({"screenshot": np.zeros((4, 4, 2), np.uint8), "text": "x"}, "not shape (4, 4, 2)"),
    ({"screenshot": np.zeros((0, 4, 3), np.uint8), "text": "x"}, "not shape (0, 4, 3)"),
    ({"text": "no picture"}, "needs a 'screenshot'"),
])
def test_garbage_image_observations(obs, words):
    with pytest.raises(InvalidRequest, match=words.replace("(", r"\(").replace(")", r"\)")):
        observation_parts(obs)
    with pytest.raises(InvalidRequest, match="png or jpeg"):
        data_url(np.zeros((2, 2, 3), np.uint8), "bmp")


@pytest.fixture(scope="module")
def proxy():
    require_module("server", "fastapi")
    from orchard_gym.wrappers.proxy import ProxyConfig, RecordingProxy
    from orchard_gym.wrappers.proxy.stub import StubUpstream

    stub = StubUpstream().start()
    p = RecordingProxy(ProxyConfig(upstream=stub.url)).start_in_thread()
    yield p
    p.stop_in_thread()
    stub.stop()


def _open(proxy) -> dict:
    import httpx

    r = httpx.post(f"{proxy.url}/rollouts", json={}, headers={"Authorization": f"Bearer {proxy.admin_key}"})
    assert r.status_code == 201, r.text
    return r.json()


def _record(proxy, rollout_id: str) -> dict:
    import httpx

    return httpx.get(f"{proxy.url}/rollouts/{rollout_id}",
                     headers={"Authorization": f"Bearer {proxy.admin_key}"}).json()


def _seen(url: str) -> str:
    data = base64.b64decode(url.partition(",")[2])
    return f"image/png {len(data)}B {hashlib.sha256(data).hexdigest()[:16]}"


def test_openai_client_images_through_the_proxy(proxy):
    openai = require_module("openai", "openai")
    rollout = _open(proxy)
    client = openai.OpenAI(base_url=rollout["base_url"], api_key=rollout["token"], max_retries=0)
    urls = [data_url(square(rgb, 32)) for rgb in (COLOURS["red"], COLOURS["green"])]
    messages = [{"role": "user", "content": [{"type": "text", "text": "what is this?"},
                                             {"type": "image_url", "image_url": {"url": urls[0], "detail": "low"}},
                                             {"type": "image_url", "image_url": {"url": urls[1]}}]}]
    out = client.chat.completions.create(model="stub-image", messages=messages)
    assert out.choices[0].message.content == f"images: 2; {_seen(urls[0])}; {_seen(urls[1])}"
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="stub-image", messages=messages, stream=True) if c.choices)
    assert streamed == out.choices[0].message.content
    # the Responses API's input_image parts too
    content = [{"type": "input_text", "text": "what is this?"}, {"type": "input_image", "image_url": urls[1]}]
    response = client.responses.create(model="stub-image", input=[{"role": "user", "content": content}])
    assert response.output_text == f"images: 1; {_seen(urls[1])}"
    calls = _record(proxy, rollout["rollout_id"])["calls"]
    assert len(calls) == 3 and all(c["messages"] == messages and c["error"] is None for c in calls[:2])
    assert calls[2]["messages"] == [{"role": "user", "content": content}] and calls[2]["error"] is None


def test_openai_policy_sends_screenshots(proxy, local_root):
    """The `openai:` policy of `orchard eval` on an image env: every screenshot reaches the model."""
    from orchard_gym.client import AsyncSandboxClient
    from orchard_gym.policies import OpenAIPolicy

    rollout = _open(proxy)
    policy = OpenAIPolicy(f"{rollout['base_url']}#stub-image", api_key=rollout["token"])

    async def run():
        client = AsyncSandboxClient(backend={"type": "local", "root": str(local_root), "isolation": "none"})
        try:
            return await run_episodes(lambda c: ColourEnv(client=c, max_steps=2), policy, ["colour-green"],
                                      client=client, progress=False)
        finally:
            await client.aclose()
            await policy.aclose()

    [trajectory] = asyncio.run(run())
    assert trajectory.ok and trajectory.steps == 2, trajectory.error
    calls = _record(proxy, rollout["rollout_id"])["calls"]
    assert len(calls) == 2
    first, second = (c["messages"] for c in calls)
    url = first[1]["content"][1]["image_url"]["url"]
    assert np.array_equal(decode(url), square(COLOURS["green"], 56))
    assert calls[0]["message"]["content"] == f"images: 1; {_seen(url)}"  # the upstream got it byte for byte
    assert calls[1]["message"]["content"].startswith("images: 2; ")  # the first one and the one after step 1
    assert second[-1]["role"] == "user" and second[-1]["content"][0]["text"].startswith("Error: no action found")


def test_colour_env_is_a_clean_gymnasium_env(local_root):
    from gymnasium.utils.env_checker import check_env

    env = ColourEnv(backend={"type": "local", "root": str(local_root), "isolation": "none"})
    try:
        check_env(env, skip_render_check=True)
        obs, _ = env.reset(options={"task_id": "colour-yellow"})
        assert obs in env.observation_space and tuple(obs["screenshot"][28, 28]) == COLOURS["yellow"]
        env.step({"name": "bash", "arguments": {"command": "echo yellow > answer.txt"}})
        obs, reward, terminated, _, _ = env.step({"name": "submit", "arguments": {}})
        assert reward == 1.0 and terminated and obs in env.observation_space
    finally:
        env.close()


def test_a_garbled_screenshot_is_noted_and_ends_only_its_episode(local_root, tmp_path):
    from orchard_gym.client import AsyncSandboxClient
    from orchard_gym.envs.toy.env import ToyOraclePolicy
    from orchard_gym.screenshots import ScreenshotFiles

    class Garbled(ColourEnv):
        async def astep(self, action):
            obs, *rest = await super().astep(action)
            if self.task.task_id == "colour-red":
                obs = {**obs, "screenshot": np.zeros((2, 2), np.float64)}  # not an image
            return obs, *rest

        def first_observation(self, task):
            return {"text": "no picture"} if task.task_id == "colour-green" else super().first_observation(task)

    async def run():
        async with AsyncSandboxClient(backend={"type": "local", "root": str(local_root), "isolation": "none"}) as c:
            return await run_episodes(lambda c: Garbled(client=c), ToyOraclePolicy(), ["colour-red", "colour-blue", "colour-green"],
                                      client=c, progress=False,
                                      screenshots=ScreenshotFiles(tmp_path / "shots", tmp_path))

    bad, good, blind = asyncio.run(run())
    assert blind.error == "observation failed: a dict observation needs a 'screenshot' (an image array) next to its 'text'"
    why = "an image must be uint8, not float64"
    assert bad.error == f"observation failed: {why}" and bad.metadata["screenshot_errors"] == [
        f"turn 0: InvalidRequest: {why}"] and bad.turns[0].screenshot is None
    assert bad.metadata["screenshot"] == f"shots/colour-red-{bad.sandbox_id}/reset.png"  # the first one was fine
    assert good.ok and good.reward == 1.0 and "screenshot_errors" not in good.metadata
    assert [t.screenshot for t in good.turns] == [f"shots/colour-blue-{good.sandbox_id}/turn-00{i}.png" for i in (0, 1)]
    assert np.array_equal(np.asarray(Image.open(tmp_path / good.turns[1].screenshot)), square(COLOURS["blue"], 56))


def test_the_stub_keeps_what_it_received_bounded():
    """StubUpstream.received: the request bodies as the stub got them over HTTP (tests check a
    client's image parts with it), the newest RECEIVED only (benchmarks send thousands)."""
    import httpx

    from orchard_gym.wrappers.proxy.stub import RECEIVED, StubUpstream

    url = data_url(square(COLOURS["red"], 8))
    with StubUpstream() as stub, httpx.Client(base_url=stub.url) as http:
        assert stub.received == []
        for i in range(RECEIVED + 3):
            content = [{"type": "text", "text": f"n{i}"}, {"type": "image_url", "image_url": {"url": url}}]
            r = http.post("/chat/completions", json={"model": "stub-image", "messages": [
                {"role": "user", "content": content}]})
            assert r.json()["choices"][0]["message"]["content"] == f"images: 1; {_seen(url)}"
        received = stub.received
    assert len(received) == RECEIVED and received[0]["messages"][0]["content"][0]["text"] == "n3"
    assert received[-1]["messages"][0]["content"][1]["image_url"]["url"] == url
