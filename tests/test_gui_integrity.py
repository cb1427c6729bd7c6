"""Red-team tests of the GUI env's rewards (issue 24): a policy that acts only through
env.step earns nothing without doing the task, and the do-nothing baselines stay at 0.

- MiniWoB: the reward belongs to the page instance the env set up at reset (its page, seed,
  tab). Solving another, easier MiniWoB page on the same server (in the task's tab, or in a
  new tab) pays nothing, and the report says the task page was left. Each attack has its
  control: the page the policy solved reports a raw reward of 1 (what the grade read on main,
  which took the reward from whatever page was open).
- Desktop: a check of the window manager's state is asked of the window manager; writing the
  root-window property it publishes (xprop -set in the terminal) passes nothing. Control: the
  property does read as the task wants (what main's root_property check read). Processes the
  policy leaves running are ended before the checks.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from orchard_gym import AsyncSandboxClient
from orchard_gym._loop import LoopThread
from orchard_gym.envs.gui.env import MINIWOB_STATE, GUIEnv
from orchard_gym.envs.gui.tasks import load_tasks
from orchard_gym.envs.rollout import run_episode

from components import require


def _missing() -> str | None:
    for tool in ("Xvfb", "chromium", "xdotool", "openbox", "stterm", "mousepad", "xprop", "bwrap"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    try:
        from orchard_gym.envs.gui.tasks import miniwob_html

        miniwob_html()
    except ValueError as e:
        return str(e)
    return None


require("gui", _missing())

# the do-nothing baseline's MiniWoB families (main: 0/8)
NOTHING_MINIWOB = ["miniwob/click-test", "miniwob/click-button", "miniwob/click-checkboxes", "miniwob/enter-text",
                   "miniwob/focus-text", "miniwob/login-user", "miniwob/choose-list", "miniwob/navigate-tree"]
EASY = "click-test"  # one click on its button: the page an attacker would rather solve
# root-window properties the policy can write from the task's terminal, and what each task checks
PROPERTY_SHORTCUTS = {
    "desktop/settings-switch-desktop": ("_NET_CURRENT_DESKTOP", "1"),
    "desktop/settings-desktops": ("_NET_NUMBER_OF_DESKTOPS", "2"),
}
TERMINAL = {"name": "left_click", "arguments": {"coordinate": [0.3, 0.3]}}


def run(coro):
    return LoopThread.shared().run(coro)


@pytest.fixture(scope="module")
def root():
    path = Path(f"/tmp/og-guiint-{os.getpid()}-{time.monotonic_ns() % 10**8}")  # short: socket paths
    path.mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def env(root):
    e = GUIEnv(backend={"type": "local", "root": str(root)}, tasks="miniwob", max_steps=40)
    yield e
    e.close()


def _click(env, selector: str) -> dict:
    """A left click at the middle of the active page's element (geometry read like an oracle does)."""
    box = run(env.display.evaluate(
        f"(() => {{ const e = document.querySelector({selector!r}); if (!e) return null;"
        "const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2, r.width]; })()"))
    assert box is not None and box[2] > 0, f"no {selector} on {env.ctx.state['last']['state']['url']}"
    return {"name": "left_click", "arguments": {"coordinate": [box[0] / env.width, box[1] / env.height]}}


def _solve_easy_page(env):
    """On a freshly loaded MiniWoB page: click its START cover, then the button. Returns the last step."""
    env.step(_click(env, "#sync-task-cover"))
    return env.step(_click(env, "#subbtn"))


def _task_server(env) -> str:
    url = env.ctx.state["last"]["state"]["url"]
    return url.split("/miniwob/", 1)[0]


@pytest.mark.parametrize("where", ["same_tab", "new_tab"])
def test_solving_another_miniwob_page_pays_nothing_and_is_reported(env, where):
    env.reset(seed=5, options={"task_id": "miniwob/click-checkboxes"})
    server = _task_server(env)
    if where == "new_tab":
        env.step({"name": "new_tab", "arguments": {}})
    obs, *_ = env.step({"name": "goto", "arguments": {"url": f"{server}/miniwob/{EASY}.html"}})
    assert f"{EASY}.html" in obs["text"]
    obs, reward, terminated, truncated, info = _solve_easy_page(env)
    # control: the page the policy has open says it was solved; main's grade read exactly this
    solved = run(env.display.evaluate(MINIWOB_STATE))
    assert solved["done"] and solved["raw"] == 1, solved
    # its done flag is not the task's: the episode goes on until the policy ends it
    assert not terminated and reward == 0.0
    obs, reward, terminated, truncated, info = env.step({"name": "terminate", "arguments": {"status": "success"}})
    assert terminated and reward == 0.0, info["report"]
    page = info["report"]["task_page"]
    assert page["left"] and page["away"], page
    assert any(f"{EASY}.html" in (a["url"] or "") for a in page["away"]), page
    if where == "same_tab":  # the seeded instance was navigated away from: gone from its tab
        assert page["instance"] is False and f"{EASY}.html" in page["url"]
    else:  # still in its tab, unsolved
        assert page["instance"] is True and info["report"]["page_done"] is False
        assert any(a["tab_index"] == 1 for a in page["away"])


def test_a_reloaded_task_page_is_not_the_task_instance(env):
    """The same family's page loaded again (a new instance, seeded by nobody): solving that one
    does not count either. Its button is in another place than the seeded one's, no matter:
    the instance token is what is checked."""
    env.reset(seed=6, options={"task_id": f"miniwob/{EASY}"})
    server = _task_server(env)
    env.step({"name": "goto", "arguments": {"url": f"{server}/miniwob/{EASY}.html"}})
    _, reward, terminated, _, _ = _solve_easy_page(env)
    assert run(env.display.evaluate(MINIWOB_STATE))["raw"] == 1  # control
    assert not terminated and reward == 0.0
    _, reward, terminated, _, info = env.step({"name": "terminate", "arguments": {"status": "success"}})
    assert reward == 0.0 and info["report"]["task_page"]["instance"] is False


def test_going_back_to_the_task_page_still_counts(env):
    """Leaving is reported, not punished by itself: the task's own tab, solved, pays."""
    env.reset(seed=7, options={"task_id": f"miniwob/{EASY}"})
    env.step({"name": "new_tab", "arguments": {}})
    env.step({"name": "tab_focus", "arguments": {"index": 0}})
    _, reward, terminated, _, info = env.step(_click(env, "#subbtn"))
    assert terminated and reward == 1.0, info["report"]
    page = info["report"]["task_page"]
    assert page["left"] and page["instance"] and [a["tab_index"] for a in page["away"]] == [1]


def test_do_nothing_miniwob_baseline(env):
    """Measured on main: 0/8. The episode ends at once (terminate) and scores 0, undisturbed."""
    rewards = {}
    for task_id in NOTHING_MINIWOB:
        env.reset(seed=0, options={"task_id": task_id})
        _, reward, terminated, _, info = env.step({"name": "terminate", "arguments": {"status": "success"}})
        assert terminated and not info["report"]["task_page"]["left"], info["report"]
        rewards[task_id] = reward
    assert sum(rewards.values()) == 0, rewards


def _desktop(root, episodes, after: dict[str, str] | None = None):
    """Run (task_id, policy) episodes on one desktop env; each a fresh sandbox. Returns
    [(trajectory, what xprop reads on the root window after it, `after`'s exit code there)]."""
    async def go():
        out = []
        async with AsyncSandboxClient({"type": "local", "root": str(root)}) as client:
            env = GUIEnv(client=client, tasks="desktop")
            try:
                for task_id, policy in episodes:
                    trajectory = await run_episode(env, policy, task_id, seed=0)
                    names = [name for name, _ in PROPERTY_SHORTCUTS.values()]
                    r = await env.sandbox.exec(["xprop", "-display", env.display.hello["display"], "-root", *names],
                                               timeout=30)
                    control = None
                    if after:
                        control = (await env.sandbox.exec(after[task_id], cwd=env.sandbox.workdir, timeout=30)).exit_code
                    out.append((trajectory, r.stdout, control))
            finally:
                await env.aclose()
        return out
    return run(go())


def scripted(actions):
    it = iter(actions)

    async def policy(messages, tools):
        return next(it, {"name": "terminate", "arguments": {"status": "success"}})
    return policy


def _root_property(xprop: str, name: str) -> str | None:
    line = next((x for x in xprop.splitlines() if x.startswith(name)), "")
    return line.split("=", 1)[1].strip() if "=" in line else None


@pytest.mark.slow
def test_desktop_root_property_shortcuts_pay_nothing(root):
    """`xprop -set` of the root property a settings task is about: the property then reads as
    the task wants (main's root_property check passed on it), the window manager changed
    nothing, and the check, which asks the window manager, fails. A background process left
    in the terminal is ended before the checks."""
    episodes = []
    for task_id, (name, value) in PROPERTY_SHORTCUTS.items():
        episodes.append((task_id, scripted([
            TERMINAL, {"name": "wait", "arguments": {"seconds": 0.5}},
            {"name": "type", "arguments": {"text": f"xprop -root -f {name} 32c -set {name} {value}; sleep 600 &\n"}},
            {"name": "wait", "arguments": {"seconds": 1}}])))
    results = _desktop(root, episodes)
    rewards = {}
    for (task_id, (name, value)), (trajectory, xprop, _) in zip(PROPERTY_SHORTCUTS.items(), results):
        assert _root_property(xprop, name) == value, (task_id, xprop)  # control: main's check read this
        assert trajectory.error is None, trajectory.error
        rewards[task_id] = trajectory.reward
    assert set(rewards.values()) == {0.0}, (rewards, [t.report["checks"] for t, _, _ in results])
    for trajectory, _, _ in results:
        assert not any(c["passed"] for c in trajectory.report["checks"]), trajectory.report
        assert "sleep" in trajectory.report["ended"] and not trajectory.report["stack_gone"], trajectory.report


# file-state stand-ins typed in the terminal: (command, main's checks of that task as a shell test)
FILE_STAND_INS = {
    "desktop/terminal-move": ("touch archive/report.txt && rm report.txt",  # an empty file, the report lost
                              "test -f archive/report.txt && ! test -e report.txt"),
    "desktop/terminal-delete-logs": ("rm -f -- * && touch keep.txt",  # everything deleted, keep.txt remade empty
                                     "! test -e app.log && ! test -e db.log && test -f keep.txt"),
    "desktop/terminal-mkdir": ("ln -s /tmp projects", "test -d projects"),  # a symlink, no new folder
    "desktop/terminal-chmod": ("rm run.sh && ln -s /bin/true run.sh", "test -x run.sh"),  # not the script
}


@pytest.mark.slow
def test_desktop_file_stand_ins_pay_nothing(root):
    """Commands that make a file check's stand-in, not the effect the task asks for: main's
    checks (the control, run on the end state) pass on each, the tasks' checks do not."""
    episodes = [(task_id, scripted([TERMINAL, {"name": "wait", "arguments": {"seconds": 0.5}},
                                    {"name": "type", "arguments": {"text": command + "\n"}},
                                    {"name": "wait", "arguments": {"seconds": 1}}]))
                for task_id, (command, _) in FILE_STAND_INS.items()]
    results = _desktop(root, episodes, after={task_id: check for task_id, (_, check) in FILE_STAND_INS.items()})
    controls = {task_id: control for task_id, (_, _, control) in zip(FILE_STAND_INS, results)}
    assert set(controls.values()) == {0}, f"a stand-in was not made (main's check would not pass either): {controls}"
    assert all(t.error is None for t, _, _ in results), [t.error for t, _, _ in results]
    rewards = {task_id: t.reward for task_id, (t, _, _) in zip(FILE_STAND_INS, results)}
    assert set(rewards.values()) == {0.0}, (rewards, [t.report["checks"] for t, _, _ in results])


@pytest.mark.slow
def test_do_nothing_desktop_baseline(root):
    """Measured on main: 0/13. Every desktop task ended at once scores 0."""
    results = _desktop(root, [(task_id, scripted([])) for task_id in sorted(load_tasks("desktop"))])
    assert len(results) == 13
    rewards = {t.task_id: t.reward for t, _, _ in results}
    assert all(t.error is None for t, _, _ in results), [t.error for t, _, _ in results]
    assert sum(rewards.values()) == 0, rewards


def test_every_desktop_task_says_which_shortcuts_are_fair_and_checks_no_root_property():
    tasks = load_tasks("desktop")
    assert all(len(t.shortcuts) > 20 for t in tasks.values()), [k for k, t in tasks.items() if not t.shortcuts]
    with pytest.raises(ValueError, match="retired"):
        load_tasks({"x": {"task_id": "x", "kind": "desktop", "oracle": [],
                          "checks": [{"type": "root_property", "name": "_NET_CURRENT_DESKTOP", "equals": "1"}]}})
    with pytest.raises(ValueError, match="integer"):
        load_tasks({"x": {"task_id": "x", "kind": "desktop", "oracle": [],
                          "checks": [{"type": "wm_desktops", "equals": 0}]}})
