"""Orchard/GUI-v0: browser and desktop use on a private X display in the sandbox.

    import gymnasium as gym, orchard_gym
    env = gym.make("Orchard/GUI-v0", backend={"type": "local"})
    obs, info = env.reset(seed=0, options={"task_id": "miniwob/click-button"})
    obs["screenshot"]            # (720, 1280, 3) uint8, what the display shows
    obs["text"]                  # the instruction, the page's URL and title (or the window's), the last result
    obs, reward, terminated, truncated, info = env.step(
        {"name": "left_click", "arguments": {"coordinate": [0.05, 0.12]}})

At reset the sandbox gets Xvfb, openbox and either a real Chromium window on a MiniWoB++
page served on its loopback (browser tasks) or the task's desktop programs (xterm,
mousepad, pcmanfm). Actions are the computer_use tools (tools.py); the episode ends on
`terminate`/`answer`, when the MiniWoB page ends its episode, or on a step or wall-clock
budget. MiniWoB's reward is the page's raw reward (WOB_RAW_REWARD_GLOBAL, without the
time decay); a desktop task's comes from checks the host runs on the end state.
"""

from __future__ import annotations

import json
import os
import secrets
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from orchard_gym.client import AsyncSandboxInstance
from orchard_gym.errors import OrchardError, SandboxFailed

from ..base import SandboxEnv
from ..spaces import UnicodeText
from ..tools import Tool, ToolContext
from . import tools as gui_tools
from .display import Display, DisplayError, TaskTabGone
from .tasks import GUITask, load_tasks, shared_miniwob_html
from .verify import verify

MINIWOB_STATE = ("({instance: true, raw: WOB_RAW_REWARD_GLOBAL, reward: WOB_REWARD_GLOBAL, done: WOB_DONE_GLOBAL, "
                 "reason: WOB_REWARD_REASON == null ? null : String(WOB_REWARD_REASON)})")
# The episode's own page instance carries a random token that only the env's set-up script
# writes (into the page it seeded, in the tab it chose). Another page on the same server (goto,
# a new tab, a reload: a fresh, unseeded instance) lacks it, so its reward and its done flag
# never count; the grade reads the task's tab, not whichever the policy has open.
INSTANCE = "window.__orchardInstance"


def miniwob_state(token: str) -> str:
    """JS: MiniWoB's reward state of the episode's own page instance; {instance: false} elsewhere."""
    return f"(({INSTANCE} === {json.dumps(token)}) ? {MINIWOB_STATE} : ({{instance: false, url: location.href}}))"


def miniwob_done(token: str) -> str:
    """JS: the episode's own page instance has ended its episode."""
    return f"({INSTANCE} === {json.dumps(token)} && WOB_DONE_GLOBAL)"


# built by scripts/build_gui_image.sh (its ORCHARD_GUI_IMAGE overrides both)
DEFAULT_IMAGE = os.environ.get("ORCHARD_GUI_IMAGE") or "localhost/orchard/gui:latest"


class GUIEnv(SandboxEnv):
    """Extra kwargs: `tasks` ("builtin", "miniwob", "desktop", a folder, a file, a dict),
    `width`/`height` of the display, `coordinates` ("normalized" or "pixels"), `settle`
    ("frame": wait until the browser painted; seconds; 0: grab at once), `reuse_browser`
    (a browser task after a browser task reloads the page in the same sandbox instead of
    starting a new one), `image` (container backends: an image with the GUI stack; by default
    on a docker/kubernetes `backend` the one scripts/build_gui_image.sh builds), `miniwob_dir` (where the sandbox finds MiniWoB's html/)."""

    env_id = "Orchard/GUI-v0"
    forks_midway = False  # the page's state lives in the browser process, which snapshots do not keep
    per_episode_attrs = ("display",)
    metadata = {"render_modes": ["ansi", "rgb_array"]}

    def __init__(self, *, tasks: Any = "builtin", width: int = 1280, height: int = 720,
                 coordinates: str = "normalized", settle: str | float = "frame", reuse_browser: bool = True,
                 image: str | None = None, miniwob_dir: str | None = None, max_steps: int = 30,
                 **kwargs: Any):
        if coordinates not in ("normalized", "pixels"):
            raise gym.error.Error(f"coordinates must be 'normalized' or 'pixels', not {coordinates!r}")
        if not (64 <= int(width) <= 7680 and 64 <= int(height) <= 4320):
            raise gym.error.Error(f"display size {width}x{height} is out of range (64..7680 x 64..4320)")
        if not (settle == "frame" or (isinstance(settle, (int, float)) and 0 <= settle <= 5)):
            raise gym.error.Error(f"settle must be 'frame' or seconds in [0, 5], not {settle!r}")
        try:
            self._tasks = self.tasks_from(tasks=tasks)
        except ValueError as e:
            raise gym.error.Error(str(e)) from None
        self.width, self.height = int(width), int(height)
        self.coordinates, self.settle, self.reuse_browser = coordinates, settle, reuse_browser
        self.image, self.miniwob_dir = image, miniwob_dir
        super().__init__(max_steps=max_steps, **kwargs)
        self.text_space = UnicodeText(20_000)
        self.observation_space = spaces.Dict({
            "screenshot": spaces.Box(0, 255, (self.height, self.width, 3), np.uint8),
            "text": self.text_space})
        self.display: Display | None = None
        self._frame = np.zeros((self.height, self.width, 3), np.uint8)
        self._handed_out: np.ndarray | None = None
        self._instruction = ""
        self._instance = ""  # the MiniWoB page instance's token (miniwob_state)

    # ------------------------------------------------------------------ hooks
    def make_tools(self) -> list[Tool]:
        return gui_tools.make_tools()

    @classmethod
    def tasks_from(cls, *, tasks: Any = "builtin", **_: Any) -> dict[str, GUITask]:
        return load_tasks(tasks)

    def task_ids(self) -> list[str]:
        return sorted(self._tasks)

    def get_task(self, task_id: str) -> GUITask:
        return self._tasks[task_id]

    def image_for(self, task: GUITask) -> str | None:
        if self.image:
            return self.image
        # container backends need the GUI stack in the image; the local backend runs the host's
        return DEFAULT_IMAGE if self.backend_name() in ("docker", "kubernetes") else None

    def _miniwob_dir(self, sandbox: AsyncSandboxInstance) -> str:
        if self.miniwob_dir:
            return self.miniwob_dir
        if sandbox.record.backend == "local":
            return str(shared_miniwob_html())  # a copy in the host's cache, visible read-only in the sandbox
        return "/opt/orchard/miniwob/html"  # where scripts/build_gui_image.sh puts it

    def _page_config(self, task: GUITask) -> dict:
        seed = int(self.np_random.integers(0, 2**31 - 1))
        self._instance = secrets.token_hex(16)  # a new one per episode: no earlier page counts either
        # the env's set-up, not the policy's: seed the generator, lift the page's 10 s limit,
        # hide the running score (it ticks every second), mark the instance, start the episode
        setup = (f"Math.seedrandom({seed}); core.EPISODE_MAX_TIME = {int(task.episode_seconds * 1000)};"
                 "var _r = document.getElementById('reward-display'); if (_r) _r.style.display = 'none';"
                 f"{INSTANCE} = {json.dumps(self._instance)}; core.startEpisodeReal(); true")
        return {"start_url": f"/miniwob/{task.family}.html", "page_setup": setup,
                "done_expr": miniwob_done(self._instance)}

    async def setup(self, sandbox: AsyncSandboxInstance, task: GUITask) -> ToolContext:
        config: dict = {"width": self.width, "height": self.height}
        if task.kind == "miniwob":
            config.update(mode="browser", serve_dir=self._miniwob_dir(sandbox), **self._page_config(task))
        else:
            base = sandbox.workdir or "/workspace"
            for path, content in task.files.items():
                await sandbox.upload_content(content.encode(), f"{base}/{path}",
                                             mode=0o755 if path in task.executable else None)
            config.update(mode="desktop", apps=task.apps)
        self.display = await Display.start(sandbox, config)
        return await self._context(sandbox, task)

    async def _context(self, sandbox: AsyncSandboxInstance, task: GUITask) -> ToolContext:
        head, frame = await self.display.shot(self.settle)
        if not head.get("ok") or frame is None:
            raise DisplayError(head.get("error", "no first screenshot"))
        self._frame = frame
        if task.kind == "miniwob":
            self._instruction = await self.display.evaluate("core.getUtterance()")
        else:
            self._instruction = task.instruction
        state = {"display": self.display, "size": (self.width, self.height), "coordinates": self.coordinates,
                 "settle": self.settle, "last": head, "frame": self._frame, "instance": self._instance}
        return ToolContext(sandbox=sandbox, cwd=sandbox.workdir or "/workspace", timeout=self.exec_timeout,
                           state=state)

    def first_observation(self, task: GUITask) -> str:
        return "The task has started. Act with the computer_use tools; end with terminate or answer."

    async def grade(self, ctx: ToolContext, task: GUITask) -> tuple[float, dict]:
        report: dict = {"status": ctx.state.get("status"), "answer": ctx.state.get("answer"),
                        "browser_restarts": ctx.state.get("crashes", [])}
        if task.kind == "miniwob":
            return await self._grade_miniwob(ctx, report)
        try:
            passed, end = await verify(ctx.sandbox, task.checks, ctx.state.get("answer"), self.display)
        except SandboxFailed as e:  # a helper that did not run: the end state was not read
            return 0.0, {**report, "error_kind": "grading", "error": f"the checks could not run: {e}"}
        report.update(checks=passed, ended=end.get("ended", []), stack_gone=end.get("stack_gone", []))
        score = sum(c["passed"] for c in passed) / len(passed)
        return (1.0 if score == 1.0 else 0.0), {**report, "score": score}

    async def _grade_miniwob(self, ctx: ToolContext, report: dict) -> tuple[float, dict]:
        """The raw reward of the episode's own page instance, read in the task's tab; every
        step that showed another page or tab is in report["task_page"]["left"]."""
        away = ctx.state.get("away", [])
        report["task_page"] = where = {"left": bool(away), "away": away[:20], "instance": True}
        try:
            page = await self.display.evaluate(miniwob_state(ctx.state["instance"]), tab="task")
        except TaskTabGone as e:  # the policy closed it: the instance is gone, not a grading failure
            where.update(left=True, instance=False, tab_closed=True)
            return 0.0, {**report, "reason": str(e)}
        except DisplayError as e:
            return 0.0, {**report, "error_kind": "grading", "error": f"the task's page could not be read: {e}"}
        if not page.get("instance"):  # navigated away or reloaded in the task's tab
            where.update(left=True, instance=False, url=page.get("url"))
            return 0.0, {**report, "reason": "the task's page instance is gone from its tab"}
        report.update(raw_reward=page["raw"], decayed_reward=page["reward"], page_done=page["done"],
                      reason=page["reason"])
        # the raw reward, as the page computed it; an episode the page never ended scores 0
        return (float(page["raw"]) if page["done"] else 0.0), report

    # ------------------------------------------------------------------ observations
    def _observe(self, result: str) -> dict:
        frame = self.ctx.state.get("frame") if self.ctx else None
        if frame is not None:
            self._frame = frame
        # each step's frame is a new array, handed out as it is; a frame shown again (an action
        # that failed keeps the last one) is copied, so what a caller kept never changes under it
        fresh = self._frame is not self._handed_out
        self._handed_out = self._frame
        state = (self.ctx.state.get("last") or {}).get("state", {}) if self.ctx else {}
        where = []
        if "url" in state:
            where.append(f"URL: {state['url']}")
            where.append(f"Tab: {state.get('tab_index')} of {state.get('tabs')}")
        if state.get("title"):
            where.append(f"Title: {state['title']}")
        text = f"Task: {self._instruction}\n" + "\n".join(where) + f"\n\n{result}"
        self._last_obs = text[: self.text_space.max_length]
        # a copy: an action that failed shows the last frame again, and callers keep what they get
        return {"screenshot": self._frame if fresh else self._frame.copy(), "text": self._last_obs}

    async def reuse_sandbox(self, task: GUITask) -> ToolContext | None:
        """A browser task after a browser task: the page reloaded in the same sandbox (None: a new one)."""
        if not (self.reuse_browser and task.kind == "miniwob" and self.display is not None
                and isinstance(self.task, GUITask) and self.task.kind == "miniwob"):
            return None
        try:
            await self.display.load(self._page_config(task))
            return await self._context(self.sandbox, task)
        except (DisplayError, OrchardError):
            return None  # the old sandbox is unwell: start a fresh one

    async def areset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        text, info = await super().areset(seed=seed, options=options)
        return self._observe(text), info

    async def astep(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        text, reward, terminated, truncated, info = await super().astep(action)
        if self.trajectory is not None and self.ctx is not None:
            crashes = self.ctx.state.get("crashes")
            if crashes:
                self.trajectory.metadata["browser_restarts"] = list(crashes)
        return self._observe(text), reward, terminated, truncated, info

    async def resume(self, sandbox: AsyncSandboxInstance, task: GUITask, ctx: ToolContext) -> ToolContext:
        """A restored set-up: files are there, the display's processes are not; start them afresh."""
        await sandbox.exec(["rm", "-f", f"{sandbox.workdir or '/workspace'}/.gui/gui.sock"], timeout=30)
        return await self.setup(sandbox, task)

    async def release_sandbox(self, background: bool = False) -> None:
        if self.display is not None:
            self.display.close()
            self.display = None
        await super().release_sandbox(background)

    def render(self):
        if self.render_mode == "rgb_array":
            return self._frame
        return super().render()

    def oracle_policy(self):
        from .oracles import GUIOraclePolicy

        return GUIOraclePolicy()


__all__ = ["GUIEnv"]
