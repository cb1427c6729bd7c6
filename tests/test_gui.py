"""Orchard/GUI-v0 on real Xvfb + Chromium + openbox in local (bubblewrap) sandboxes.

Lean on purpose: one browser env (module scope, warm resets between tasks) carries
check_env, the pixel check, the garbage actions, the crash restart and the oracle subset;
the docker test runs one MiniWoB task in scripts/build_gui_image.sh's image; the full oracle sweep (every built-in task), the random-policy rate, latency and the
8-sandbox isolation run are in scripts/bench_gui.py (docs/gui.md has the figures).
"""

from __future__ import annotations

import asyncio
import shutil

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import orchard_gym  # noqa: F401
from orchard_gym import AsyncSandboxClient
from orchard_gym._loop import LoopThread
from orchard_gym.envs.gui.env import GUIEnv
from orchard_gym.envs.gui.oracles import ORACLES
from orchard_gym.envs.gui.tasks import load_tasks
from orchard_gym.envs.rollout import run_episode

from components import needs, require
from conftest import docker_engine, gui_image_why_not
from service_helpers import short_root


def _missing() -> str | None:
    for tool in ("Xvfb", "chromium", "xdotool", "openbox", "stterm", "mousepad", "bwrap"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    try:
        from orchard_gym.envs.gui.tasks import miniwob_html

        miniwob_html()
    except ValueError as e:
        return str(e)
    return None


require("gui", _missing())
ORACLE_SUBSET = ["miniwob/click-checkboxes", "miniwob/enter-text", "miniwob/copy-paste", "miniwob/choose-list",
                 "miniwob/navigate-tree", "miniwob/use-autocomplete"]
DESKTOP_SUBSET = ["desktop/editor-replace", "desktop/settings-switch-desktop"]


def run(coro):
    return LoopThread.shared().run(coro)


@pytest.fixture(scope="module")
def root():
    import os
    import time
    from pathlib import Path

    path = Path(f"/tmp/og-gui-{os.getpid()}-{time.monotonic_ns() % 10**8}")
    path.mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def env(root):
    e = GUIEnv(backend={"type": "local", "root": str(root)}, tasks="miniwob", max_steps=40)
    yield e
    e.close()


def test_builtin_tasks_and_oracles():
    tasks = load_tasks("builtin")
    miniwob = [t for t in tasks.values() if t.kind == "miniwob"]
    desktop = [t for t in tasks.values() if t.kind == "desktop"]
    assert len({t.family for t in miniwob}) >= 30 and len(desktop) >= 10
    assert all(t.oracle in ORACLES for t in miniwob)
    assert all(t.oracle and t.checks for t in desktop)
    kinds = {c["type"] for t in desktop for c in t.checks}
    assert {"file_equals", "dir_exists", "wm_current_desktop", "wm_desktops", "answer_equals"} <= kinds


def test_check_env_clean(env):
    check_env(env, skip_render_check=True)
    assert env.observation_space["screenshot"].shape == (720, 1280, 3)


def test_check_env_on_the_default_tasks():
    """`gym.make("Orchard/GUI-v0")` as a new user makes it (MiniWoB and desktop tasks, a fresh
    sandbox per kind): reset(seed=123) twice gives the same observation (the task server's
    port, which the text's URL shows, and the editor's caret no longer vary)."""
    root = short_root("gui-ce")
    env = gym.make("Orchard/GUI-v0", backend={"type": "local", "root": str(root)})
    try:
        check_env(env.unwrapped, skip_render_check=True)
    finally:
        env.close()
        shutil.rmtree(root, ignore_errors=True)


def test_click_changes_the_screenshot_where_it_clicked(env):
    obs, _ = env.reset(seed=3, options={"task_id": "miniwob/click-checkboxes"})
    # the local backend's frames come through the daemon's shared memory file, not the socket
    assert env.display.direct and env.display.shared_frames
    boxes = run(env.display.evaluate(
        "[...document.querySelectorAll('#boxes input')].map(e => { const r = e.getBoundingClientRect();"
        "return [r.x, r.y, r.width, r.height]; })"))
    x, y, w, h = boxes[0]
    before = obs["screenshot"].astype(int)
    obs, reward, terminated, truncated, info = env.step(
        {"name": "left_click", "arguments": {"coordinate": [(x + w / 2) / 1280, (y + h / 2) / 720]}})
    assert not (terminated or truncated) and info["action_error"] is None
    changed = np.argwhere(np.abs(obs["screenshot"].astype(int) - before).sum(axis=2) > 30)
    assert len(changed) > 10, "the click changed nothing on screen"
    (y0, x0), (y1, x1) = changed.min(axis=0), changed.max(axis=0)
    # what changed is on the clicked row (the box and its label), starting at the box; the
    # box itself holds a good share of the change (its tick)
    assert y - 4 <= y0 and y1 <= y + h + 4 and x - 4 <= x0 <= x + w, (x0, y0, x1, y1, boxes[0])
    inside = ((changed[:, 1] >= x - 2) & (changed[:, 1] <= x + w + 2)).mean()
    assert inside > 0.2, (inside, x0, x1)
    checked = run(env.display.evaluate("document.querySelector('#boxes input').checked"))
    assert checked is True


def test_malformed_actions_are_observations_and_the_sandbox_lives_on(env):
    env.reset(seed=1, options={"task_id": "miniwob/click-test"})
    bad = ["not a tool call", {"name": "fly", "arguments": {}},
           {"name": "left_click", "arguments": {"coordinate": [1.5, 0.2]}},
           {"name": "left_click", "arguments": {"coordinate": "middle"}},
           {"name": "key", "arguments": {"keys": ""}},
           {"name": "goto", "arguments": {"url": "javascript:WOB_RAW_REWARD_GLOBAL=1"}},
           {"name": "goto", "arguments": {"url": "file:///etc/passwd"}},
           {"name": "tab_focus", "arguments": {"index": 7}},
           {"name": "computer_use", "arguments": {"action": "teleport"}},
           {"name": "type", "arguments": {"text": "x" * 20_000}}]
    for action in bad:
        obs, reward, terminated, truncated, info = env.step(action)
        assert info["action_error"], action
        assert obs["text"].count("Error") >= 1 and obs["screenshot"].shape == (720, 1280, 3)
        assert not terminated and not truncated and reward == 0.0
    # still alive: a real click solves the task (the page's raw reward)
    button = run(env.display.evaluate("(() => { const r = document.querySelector('#subbtn').getBoundingClientRect();"
                                      "return [r.x + r.width / 2, r.y + r.height / 2]; })()"))
    obs, reward, terminated, truncated, info = env.step(
        {"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [button[0] / 1280,
                                                                                     button[1] / 720]}})
    assert terminated and reward == 1.0 and info["report"]["raw_reward"] == 1, (terminated, reward, info)


def test_tabs_navigation_and_the_browser_restart(env):
    env.reset(seed=2, options={"task_id": "miniwob/click-test"})
    url = env.ctx.state["last"]["state"]["url"]
    obs, *_ = env.step({"name": "new_tab", "arguments": {}})
    assert "Tab: 1 of 2" in obs["text"] and "URL: about:blank" in obs["text"]
    obs, *_ = env.step({"name": "tab_focus", "arguments": {"index": 0}})
    assert f"URL: {url}" in obs["text"]
    pids = run(env.display.request({"op": "pids"}))[0]["pids"]
    run(env.sandbox.exec(["kill", "-9", str(pids["chromium"])], timeout=30))  # a crash, mid-episode
    obs, reward, terminated, truncated, info = env.step({"name": "wait", "arguments": {"seconds": 0.2}})
    assert "restarted" in obs["text"] and not truncated
    assert env.trajectory.metadata["browser_restarts"]
    assert "click-test.html" in obs["text"]  # back on the task page, the episode goes on


@pytest.mark.parametrize("task_id", ORACLE_SUBSET)
def test_oracle_solves(env, task_id):
    trajectory = run(run_episode(env, env.oracle_policy(), task_id, seed=7))
    assert trajectory.error is None and trajectory.reward == 1.0, trajectory.report


@pytest.mark.parametrize("task_id", DESKTOP_SUBSET)
def test_desktop_oracle_and_a_do_nothing_policy(root, task_id):
    """Each desktop case is a new sandbox (Xvfb, openbox, the programs); the do-nothing run,
    which only shows the checks can fail, is done once (the first task) to keep CI short."""
    seen: list[str] = []

    async def both():
        async with AsyncSandboxClient({"type": "local", "root": str(root)}) as client:
            env = GUIEnv(client=client, tasks="desktop")
            try:
                solved = await run_episode(env, env.oracle_policy(), task_id, seed=0)

                async def give_up(messages, tools):
                    seen.append(repr(messages))  # what the policy sees: the text names the window
                    return {"name": "terminate", "arguments": {"status": "success"}}

                unsolved = await run_episode(env, give_up, task_id, seed=0) if task_id == DESKTOP_SUBSET[0] else None
            finally:
                await env.aclose()
        return solved, unsolved

    solved, unsolved = run(both())
    assert solved.error is None and solved.reward == 1.0, solved.report
    if unsolved is not None:  # the editor's title names the file, never the sandbox's host folder
        assert "Title: draft.txt - Mousepad" in seen[0] and str(root) not in seen[0], seen[0][:2000]
    if unsolved is not None:
        assert unsolved.reward == 0.0 and not all(c["passed"] for c in unsolved.report["checks"])


def test_desktop_screenshots_do_not_depend_on_when_they_are_taken(root):
    """The editor's caret does not blink (GTK settings in the daemon's config home): what a
    reset shows is the same whenever the frame is grabbed, so check_env's reset(seed=123)
    twice gives equal observations on the default tasks (a blinking caret differed in 18 pixels)."""
    env = GUIEnv(backend={"type": "local", "root": str(root)}, tasks="desktop")
    try:
        obs, _ = env.reset(seed=0, options={"task_id": "desktop/editor-append"})
        first = obs["screenshot"].copy()
        for seconds in (0.3, 0.35, 0.4, 0.45, 0.5, 0.55):  # a GTK caret blinks every 0.6 s
            obs, *_ = env.step({"name": "wait", "arguments": {"time": seconds}})
            assert np.array_equal(obs["screenshot"], first), f"the screen changed after {seconds} s of waiting"
    finally:
        env.close()


def test_step_budget_truncates(env):
    budget = env.max_steps  # the module's env (a warm reset), with a budget of 2 for this episode
    env.max_steps = 2
    try:
        env.reset(seed=0, options={"task_id": "miniwob/click-test"})
        env.step({"name": "mouse_move", "arguments": {"coordinate": [0.9, 0.9]}})
        obs, reward, terminated, truncated, info = env.step({"name": "wait", "arguments": {"seconds": 0}})
        assert truncated and not terminated and "step budget of 2" in info["truncation"]
    finally:
        env.max_steps = budget


def test_bad_configuration_is_refused():
    for kwargs in ({"coordinates": "inches"}, {"width": 10}, {"settle": -1}, {"tasks": "/no/such/tasks"},
                   {"render_mode": "human"}):
        with pytest.raises(gym.error.Error):
            GUIEnv(backend={"type": "local"}, **kwargs)
    with pytest.raises(ValueError):
        load_tasks({"x": {"task_id": "x", "kind": "desktop", "oracle": [], "checks": [{"type": "vibes"}]}})


def test_make_vec_async_shares_screenshots(root):
    envs = gym.make_vec("Orchard/GUI-v0", num_envs=2, vectorization_mode="async",
                        backend={"type": "local", "root": str(root)}, tasks="miniwob")
    try:
        obs, infos = envs.reset(seed=[0, 1], options={"task_id": "miniwob/click-test"})
        assert obs["screenshot"].shape == (2, 720, 1280, 3) and obs["screenshot"].dtype == np.uint8
        assert all(t.startswith("Task: Click the button") for t in obs["text"])
        obs, rewards, terminated, truncated, infos = envs.step(["garbage", "garbage"])
        assert obs["screenshot"].mean() > 10 and not terminated.any()
        # two sandboxes, two displays: each shows its own page (different seeds place the button apart)
        assert not np.array_equal(obs["screenshot"][0], obs["screenshot"][1])
    finally:
        envs.close()


def test_the_image_follows_the_backend():
    from orchard_gym.envs.gui.env import DEFAULT_IMAGE

    task = load_tasks("miniwob")["miniwob/click-button"]
    assert GUIEnv(backend={"type": "local"}, tasks="miniwob").image_for(task) is None
    assert GUIEnv(backend={"type": "docker"}, tasks="miniwob").image_for(task) == DEFAULT_IMAGE
    assert GUIEnv(backend={"type": "docker"}, tasks="miniwob", image="x/y:z").image_for(task) == "x/y:z"


@pytest.mark.docker
@needs("docker", docker_engine()[1] or None)
def test_a_shared_docker_client_gets_the_default_image():
    """The bug: given a shared `client=` (as `orchard eval` and the rollout drivers give one) the
    env read the backend off its own `backend=` kwarg only, found none, and started the GUI task
    on the backend's bare image. The backend is now read off the client."""
    from orchard_gym.envs.gui.env import DEFAULT_IMAGE

    task = load_tasks("miniwob")["miniwob/click-button"]

    async def images():
        async with AsyncSandboxClient({"type": "docker"}) as docker_client, \
                AsyncSandboxClient({"type": "local"}) as local_client:
            return (GUIEnv(client=docker_client, tasks="miniwob").image_for(task),
                    GUIEnv(client=local_client, tasks="miniwob").image_for(task),
                    GUIEnv(client=docker_client, tasks="miniwob", image="x/y:z").image_for(task))

    assert asyncio.run(images()) == (DEFAULT_IMAGE, None, "x/y:z")


@pytest.mark.docker
@needs("docker", gui_image_why_not())
def test_docker_miniwob_screenshot_and_oracle():
    """The GUI image on the docker backend: the daemon runs on the agent bundle's Python, the
    host reaches it through the relay (frames downloaded), the page is drawn, the oracle wins."""
    e = gym.make("Orchard/GUI-v0", backend={"type": "docker"}, tasks="miniwob", max_steps=20)
    env = e.unwrapped
    try:
        obs, info = e.reset(seed=0, options={"task_id": "miniwob/click-button"})
        assert env.sandbox.record.backend == "docker" and not env.display.direct
        shot = obs["screenshot"]
        assert shot.shape == (720, 1280, 3) and shot.dtype == np.uint8
        # MiniWoB's 160x210 task area at the top left: the instruction bar and buttons, not one colour
        assert len(np.unique(shot[:210, :160].reshape(-1, 3), axis=0)) > 20, "the screenshot is blank"
        trajectory = run(run_episode(env, env.oracle_policy(), "miniwob/click-button", seed=7))
        assert trajectory.error is None and trajectory.reward == 1.0, trajectory.report
    finally:
        e.close()


def test_the_terminal_readiness_probe_sees_a_shell_wait_for_input():
    """The desktop start-up's probe (procwatch.foreground_shells / waiting_for_input, which
    gui_daemon uses) on a real bash in a real pty: ready at its prompt, not ready while a
    command runs in the foreground."""
    import os
    import subprocess
    import sys
    import time

    from orchard_gym.envs.gui.sandbox import procwatch

    def until(predicate, timeout=30.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(0.05)
        return predicate()

    # pty.spawn: bash on a new pty (its controlling tty), our pipe copied to it as the keyboard
    proc = subprocess.Popen([sys.executable, "-c", "import pty; pty.spawn(['bash', '--noprofile', '--norc'])"],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, env={**os.environ, "PS1": "$ "})
    try:
        shells = until(lambda: procwatch.foreground_shells(proc.pid))
        assert len(shells) == 1 and open(f"/proc/{shells[0]}/comm").read().strip() == "bash"
        assert until(lambda: procwatch.waiting_for_input(shells[0]))
        proc.stdin.write(b"sleep 30\n")
        proc.stdin.flush()
        busy = until(lambda: [p for p in procwatch.foreground_shells(proc.pid) if p != shells[0]])
        assert open(f"/proc/{busy[0]}/comm").read().strip() == "sleep"
        assert not procwatch.waiting_for_input(busy[0])  # sleeping, but not for input
    finally:
        shells = locals().get("shells") or []
        for pid in [*procwatch.foreground_shells(proc.pid), *shells]:  # the sleep and bash, then pty.spawn
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        proc.kill()
        proc.wait(timeout=30)


@pytest.mark.docker
@needs("docker", gui_image_why_not())
def test_docker_desktop_task_solved_by_the_oracle():
    """A desktop task (mousepad on openbox, no browser) in the GUI image on docker: the file
    starts as the task laid it out, the oracle edits and saves it through the screen, and the
    host-side check reads the end state through the agent."""
    from orchard_gym.envs.gui.env import DEFAULT_IMAGE

    async def episode():
        async with AsyncSandboxClient({"type": "docker"}) as client:
            env = GUIEnv(client=client, tasks="desktop", image=DEFAULT_IMAGE, render_mode="rgb_array")
            oracle = env.oracle_policy().bind(env)
            seen_before = []

            async def first_look_then_oracle(messages, tools):
                if not seen_before:  # before any action: the file as laid out, a real window on screen
                    home = env.sandbox.workdir or "/workspace"
                    seen_before.append((await env.sandbox.download_content(f"{home}/draft.txt"), env.display.direct,
                                        env.render().copy()))
                return await oracle(messages, tools)

            try:
                trajectory = await run_episode(env, first_look_then_oracle, "desktop/editor-replace", seed=0)
            finally:
                await env.aclose()
        return trajectory, seen_before[0]

    trajectory, (before, direct, frame) = run(episode())
    assert before == b"first draft\nwith typos\n" and not direct  # the relay: the host cannot reach the socket
    assert frame.shape == (720, 1280, 3) and len(np.unique(frame[:200, :400].reshape(-1, 3), axis=0)) > 20
    assert trajectory.error is None and trajectory.reward == 1.0, trajectory.report
    assert trajectory.report["checks"] == [{"type": "file_equals", "path": "draft.txt", "passed": True,
                                            "seen": "Final version"}]
