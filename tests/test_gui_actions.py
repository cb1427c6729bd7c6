"""The computer_use actions no oracle uses (mouse_move, middle/right/double/triple click,
left_click_drag, scroll, hscroll, go_back), each with an effect on a small local page
(tests/data/gui/actions.html, served by the sandbox's GUI daemon like a MiniWoB page) that
the test checks on the next screenshot (pixels) and in the page's DOM.

Lean: one local sandbox, one Chromium, module scope; the actions run in one order in which
none undoes another's effect (go_back, which reloads the page, comes last)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from orchard_gym._loop import LoopThread
from orchard_gym.envs.gui.env import GUIEnv
from orchard_gym.envs.gui.tasks import GUITask

from components import require

PAGE = Path(__file__).parent / "data" / "gui" / "actions.html"
W, H = 800, 600


def _missing() -> str | None:
    for tool in ("Xvfb", "chromium", "xdotool", "openbox", "bwrap"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


require("gui", _missing())


class ActionsPageEnv(GUIEnv):
    """GUIEnv whose one task is the test page: uploaded into the sandbox's workdir, served from there."""

    async def setup(self, sandbox, task):
        base = sandbox.workdir or "/workspace"
        await sandbox.upload_content(PAGE.read_bytes(), f"{base}/pages/miniwob/actions.html")
        self.miniwob_dir = f"{base}/pages"
        return await super().setup(sandbox, task)


def run(coro):
    return LoopThread.shared().run(coro)


@pytest.fixture(scope="module")
def page():
    import os

    root = Path(f"/tmp/og-guiact-{os.getpid()}-{time.monotonic_ns() % 10**8}")  # short: socket paths
    root.mkdir()
    tasks = {"test/actions": GUITask(task_id="test/actions", kind="miniwob", family="actions", oracle="none")}
    env = ActionsPageEnv(backend={"type": "local", "root": str(root)}, tasks=tasks, width=W, height=H,
                         coordinates="pixels", max_steps=50)
    obs, _ = env.reset(seed=0, options={"task_id": "test/actions"})
    assert obs["text"].startswith("Task: Exercise the actions.")
    yield env, obs
    env.close()
    shutil.rmtree(root, ignore_errors=True)


def act(env, name, **arguments):
    obs, reward, terminated, truncated, info = env.step({"name": name, "arguments": arguments})
    assert info["action_error"] is None and not (terminated or truncated), (name, obs["text"])
    return obs


def seen(env, key=None):
    value = run(env.display.evaluate("JSON.stringify(window.seen)"))
    import json

    value = json.loads(value)
    return value if key is None else value[key]


def colour(obs, x, y):
    return tuple(int(c) for c in obs["screenshot"][y, x])


def shows(env, obs, x, y, rgb, timeout=10.0) -> bool:
    """Whether the screen shows `rgb` at (x, y): on the action's own screenshot, or (a loaded host
    can grab before the page repaints; the settle timing is not what this file tests) on a later one."""
    deadline = time.monotonic() + timeout
    while colour(obs, x, y) != rgb and time.monotonic() < deadline:
        time.sleep(0.2)
        obs = {"screenshot": run(env.display.shot())[1]}
    return colour(obs, x, y) == rgb


def near(a, b, tol=2):
    return a is not None and all(abs(p - q) <= tol for p, q in zip(a, b, strict=True))


def test_pointer_actions_show_on_screen_and_in_the_dom(page):
    env, first = page
    assert shows(env, first, 80, 60, (0, 0, 255))  # the hover box, not hovered (once painted)

    obs = act(env, "mouse_move", coordinate=[80, 60])
    assert near(seen(env, "moves")[-1], (80, 60)) and shows(env, obs, 80, 60, (255, 0, 0))  # :hover repainted it

    obs = act(env, "middle_click", coordinate=[220, 60])
    assert near(seen(env, "middle"), (220, 60)) and shows(env, obs, 220, 60, (0, 200, 0))

    obs = act(env, "right_click", coordinate=[360, 60])
    assert near(seen(env, "right"), (360, 60)) and shows(env, obs, 360, 60, (200, 0, 200))

    obs = act(env, "double_click", coordinate=[500, 60])
    assert near(seen(env, "double"), (500, 60)) and shows(env, obs, 500, 60, (255, 160, 0))

    before = run(env.display.shot())[1].astype(int)
    obs = act(env, "triple_click", coordinate=[60, 252])
    state = seen(env)
    assert state["clicks"][-3:] == [1, 2, 3], state["presses"]  # one press sequence: click counts 1, 2, 3
    assert run(env.display.evaluate("window.getSelection().toString().trim()")) == "alpha beta gamma delta"
    deadline = time.monotonic() + 10
    while True:  # the selection highlight, on the paragraph's line only
        rows = np.argwhere(np.abs(obs["screenshot"].astype(int) - before).sum(axis=2) > 60)[:, 0]
        if len(rows) > 100 or time.monotonic() > deadline:
            break
        obs = {"screenshot": run(env.display.shot())[1]}
    assert len(rows) > 100 and 230 <= rows.min() and rows.max() <= 280, (len(rows), rows.min(initial=0))

    act(env, "left_click_drag", start_coordinate=[40, 150], coordinate=[400, 190])
    state = seen(env)
    # moves with the button held: at least one (Chromium coalesces mouse moves to one per frame)
    assert near(state["down"], (40, 150)) and near(state["up"], (400, 190)) and state["dragMoves"] >= 1


def settled(env, expression: str, timeout: float = 10.0):
    """The value of `expression` once it stops changing (Chromium animates wheel scrolls)."""
    deadline = time.monotonic() + timeout
    last = run(env.display.evaluate(expression))
    while time.monotonic() < deadline:
        time.sleep(0.3)
        now = run(env.display.evaluate(expression))
        if now == last:
            break
        last = now
    return last


def test_scrolls_move_the_page_by_what_the_dom_says(page):
    env, _ = page
    obs = act(env, "scroll", pixels=300, coordinate=[600, 400])
    y = int(settled(env, "window.scrollY"))
    assert y >= 100 and run(env.display.evaluate("window.scrollX")) == 0
    # the red bar at page y 500 is now at screen y 500 - scrollY; where it was is white
    assert shows(env, obs, 700, 500 - y + 5, (255, 0, 0)) and shows(env, obs, 700, 505, (255, 255, 255))

    green = (obs["screenshot"][300] == (0, 160, 0)).all(axis=1)
    assert not green.any()  # the green bar at page x 900 is right of the 800-pixel screen
    obs = act(env, "hscroll", pixels=300, coordinate=[600, 400])
    x = int(settled(env, "window.scrollX"))
    assert x >= 100 and run(env.display.evaluate("window.scrollY")) == y
    assert shows(env, obs, 900 - x + 5, 300, (0, 160, 0))  # now it is at screen x 900 - scrollX

    act(env, "scroll", pixels=-300, coordinate=[600, 400])
    assert settled(env, "window.scrollY") < y  # negative pixels scroll back up


def test_go_back_returns_to_the_previous_page(page):
    env, _ = page
    url = env.ctx.state["last"]["state"]["url"]
    obs = act(env, "goto", url=url + "?second")
    assert f"URL: {url}?second" in obs["text"]
    obs = act(env, "go_back")
    assert f"URL: {url}\n" in obs["text"]
    assert run(env.display.evaluate("location.search")) == ""
