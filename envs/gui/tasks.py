"""GUI tasks as data: MiniWoB++ families (tasks/miniwob.json) and desktop tasks (tasks/desktop/*.json).

MiniWoB++ (`miniwob` on PyPI, MIT) ships each task as an HTML page with its own problem
generator and reward logic; a task here names the page and its scripted oracle:

    {"family": "click-button", "oracle": "click_quoted_button"}

The episode's seed seeds the page's generator (Math.seedrandom), so one task id is a family
of instances. A desktop task lays out files, starts programs on the openbox desktop and
says how the end state is verified (checks run from the host through the sandbox's agent):

    {"task_id": "desktop/editor-write", "instruction": "...",
     "shortcuts": "the saved file is the effect: writing it from another program is fair",
     "files": {"notes.txt": "..."}, "apps": [["mousepad", "notes.txt"]],
     "checks": [{"type": "file_equals", "path": "notes.txt", "text": "..."}],
     "oracle": [{"name": "key", "arguments": {"keys": "ctrl+a"}}, ...]}
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

TASK_DIR = Path(__file__).parent / "tasks"
CHECK_TYPES = {"file_equals", "file_contains", "file_absent", "file_exists", "dir_exists", "file_executable",
               "answer_equals", "answer_contains", "wm_current_desktop", "wm_desktops"}
RETIRED = {"root_property": "it read an X root-window property, which any X client (xprop -set in a terminal) "
                            "can write; ask the window manager: wm_current_desktop / wm_desktops"}


class GUITask(BaseModel):
    model_config = ConfigDict(extra="forbid")
    task_id: str
    kind: Literal["miniwob", "desktop"]
    instruction: str = Field("", description="desktop: the instruction; MiniWoB: read from the page's query")
    family: str | None = Field(None, description="MiniWoB: the page, html/miniwob/FAMILY.html")
    oracle: str | list[dict] = Field(description="MiniWoB: an oracle's name in oracles.py; desktop: actions")
    files: dict[str, str] = Field(default_factory=dict, description="desktop: files under the home folder")
    executable: list[str] = Field(default_factory=list, description="desktop: which of `files` are executable")
    apps: list[list[str]] = Field(default_factory=list, description="desktop: programs started at setup")
    checks: list[dict] = Field(default_factory=list, description="desktop: how the end state is verified")
    episode_seconds: float = Field(3600, description="MiniWoB: the page's own time limit")
    shortcuts: str = Field("", description="desktop: which other ways to the checked effect are fair, and why "
                                           "(the checks verify the effect, not the path)")

    @field_validator("checks")
    @classmethod
    def _known_checks(cls, checks: list[dict]) -> list[dict]:
        for c in checks:
            if c.get("type") in RETIRED:
                raise ValueError(f"check type {c['type']!r} is retired: {RETIRED[c['type']]}")
            if c.get("type") not in CHECK_TYPES:
                raise ValueError(f"unknown check type {c.get('type')!r}; known: {sorted(CHECK_TYPES)}")
            if c["type"] in ("wm_current_desktop", "wm_desktops"):
                low = 1 if c["type"] == "wm_desktops" else 0
                if not isinstance(c.get("equals"), int) or isinstance(c["equals"], bool) or not low <= c["equals"] < 64:
                    raise ValueError(f"{c['type']} needs an integer `equals` in [{low}, 64)")
        return checks

    def model_post_init(self, _):
        if self.kind == "desktop" and not self.checks:
            raise ValueError(f"desktop task {self.task_id} has no checks")
        if self.kind == "miniwob" and not self.family:
            raise ValueError(f"MiniWoB task {self.task_id} names no family")


def miniwob_html() -> Path:
    """The html/ folder of the installed `miniwob` package (without importing it: it pulls in Selenium)."""
    spec = importlib.util.find_spec("miniwob")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("MiniWoB++ tasks need the miniwob package: pip install 'orchard-gym[gui]'")
    return Path(list(spec.submodule_search_locations)[0]) / "html"


def shared_miniwob_html() -> Path:
    """MiniWoB's html/ where local sandboxes can read it: a copy in the orchard cache, made once
    per package location and version. The package itself may live under /tmp (a venv in a
    checkout there), which is private inside every sandbox."""
    from orchard_gym.envs.swe.venvs import cache_root

    src = miniwob_html().resolve()
    try:
        version = importlib.metadata.version("miniwob")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    key = hashlib.sha256(f"{src}\n{version}".encode()).hexdigest()[:12]
    dest = cache_root() / "gui" / f"miniwob-html-{key}"
    if (dest / ".ready").exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(f"{dest.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(src, partial)
    (partial / ".ready").touch()
    try:
        os.rename(partial, dest)  # atomic: a concurrent copier either wins or finds ours
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)
        if not (dest / ".ready").exists():
            raise
    return dest


def _miniwob(path: Path) -> dict[str, GUITask]:
    entries = json.loads(path.read_text())
    out = {}
    for e in entries:
        task = GUITask(task_id=f"miniwob/{e['family']}", kind="miniwob", family=e["family"], oracle=e["oracle"])
        out[task.task_id] = task
    return out


def _desktop(folder: Path) -> dict[str, GUITask]:
    out = {}
    for file in sorted(folder.glob("*.json")):
        try:
            task = GUITask.model_validate({"kind": "desktop", **json.loads(file.read_text())})
        except (ValueError, TypeError) as e:
            raise ValueError(f"{file}: not a valid GUI task: {e}") from None
        out[task.task_id] = task
    return out


def load_tasks(source: Any = "builtin") -> dict[str, GUITask]:
    """Tasks by id: "builtin" (both sets), "miniwob", "desktop", a folder of desktop task files,
    a MiniWoB list file, or a dict {task_id: GUITask | dict}."""
    if isinstance(source, dict):
        return {k: v if isinstance(v, GUITask) else GUITask.model_validate(v) for k, v in source.items()}
    if source in (None, "builtin", "miniwob", "desktop"):
        tasks: dict[str, GUITask] = {}
        if source != "desktop":
            tasks.update(_miniwob(TASK_DIR / "miniwob.json"))
        if source != "miniwob":
            tasks.update(_desktop(TASK_DIR / "desktop"))
        return tasks
    path = Path(source)
    if path.is_dir():
        tasks = _desktop(path)
    elif path.is_file():
        tasks = _miniwob(path)
    else:
        raise ValueError(f"no GUI tasks at {source!r}: use 'builtin', 'miniwob', 'desktop', a folder or a file")
    if not tasks:
        raise ValueError(f"no GUI tasks in {source!r}")
    return tasks
