"""The computer_use actions (OpenForge's browser-use table 8) as tools, one per action name.

    {"name": "left_click", "arguments": {"coordinate": [0.42, 0.31]}}
    {"name": "key", "arguments": {"keys": "ctrl+a"}}
    {"name": "computer_use", "arguments": {"action": "type", "text": "hello"}}   # the same, one tool

Coordinates are fractions of the screenshot ([0, 1], x right, y down) unless the env was
made with coordinates="pixels". Each tool does its action and takes the next screenshot in
one request to the sandbox's GUI daemon; the env reads the frame from the context.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..tools import Tool, ToolContext, ToolError, ToolResult

Point = tuple[float, float]
MAX_TEXT = 10_000


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PointArgs(_Args):
    coordinate: Point = Field(description="[x, y]: fractions of the screen in [0, 1] (or pixels, if so configured)")


class DragArgs(_Args):
    start_coordinate: Point | None = Field(None, description="where the drag starts (default: the cursor)")
    coordinate: Point = Field(description="where the drag ends")


class TypeArgs(_Args):
    text: str = Field(max_length=MAX_TEXT, description="text to type into the focused field")


class KeyArgs(_Args):
    keys: str | list[str] = Field(description="a key or chord, e.g. 'Enter', 'ctrl+a', ['ctrl', 'a']; "
                                              "several chords separated by spaces are pressed in turn")

    @field_validator("keys")
    @classmethod
    def _chords(cls, v):
        chords = [v] if isinstance(v, list) else v.split()
        if not chords or any(not c for c in chords) or len(chords) > 50:
            raise ValueError("give 1 to 50 keys or chords")
        for c in chords:
            parts = c if isinstance(c, list) else c.split("+")
            if any(not isinstance(p, str) or not p.strip() or len(p) > 30 for p in parts):
                raise ValueError(f"bad chord {c!r}")
        return v


class ScrollArgs(_Args):
    pixels: int = Field(ge=-20_000, le=20_000, description="how far; positive: down (scroll) or right (hscroll)")
    coordinate: Point | None = Field(None, description="where to scroll (default: at the cursor)")


class UrlArgs(_Args):
    url: str = Field(max_length=4096, description="an http(s) URL")


class IndexArgs(_Args):
    index: int = Field(ge=0, le=100, description="the tab's position, 0-based, in the order they opened")


class WaitArgs(_Args):
    seconds: float = Field(1.0, ge=0, le=60, description="how long to wait", alias="time")
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class TerminateArgs(_Args):
    status: Literal["success", "failure"] = Field(description="whether you think the task is done")


class AnswerArgs(_Args):
    text: str = Field(max_length=MAX_TEXT, description="your final answer")


class NoArgs(_Args):
    pass


class GUITool(Tool):
    """One action: validated here, converted to pixels, done by the daemon."""

    Args: ClassVar[type[BaseModel]] = NoArgs

    def __init__(self, name: str, description: str, args: type[BaseModel]):
        self.name, self.description, self.Args = name, description, args

    def to_pixels(self, ctx: ToolContext, point: Point) -> list[int]:
        w, h = ctx.state["size"]
        x, y = point
        if ctx.state["coordinates"] == "pixels":
            if not (0 <= x < w and 0 <= y < h):
                raise ToolError(f"coordinate {list(point)} is off the {w}x{h} screen (pixels)")
            return [int(x), int(y)]
        if not (0.0 <= x <= 1.0 and 0.0 <= y <= 1.0):
            raise ToolError(f"coordinate {list(point)} is not within [0, 1] (give fractions of the screen)")
        return [min(int(x * w), w - 1), min(int(y * h), h - 1)]

    def action(self, ctx: ToolContext, args: BaseModel) -> dict:
        out: dict[str, Any] = {"name": self.name}
        data = args.model_dump()
        if data.get("coordinate") is not None:
            out["coordinate"] = self.to_pixels(ctx, data["coordinate"])
        if self.name == "left_click_drag":
            out["start"] = self.to_pixels(ctx, data["start_coordinate"]) if data["start_coordinate"] else \
                ctx.state.get("cursor", [0, 0])
        for key in ("text", "pixels", "url", "index", "seconds"):
            if key in data:
                out[key] = data[key]
        if self.name == "key":
            keys = data["keys"]
            out["keys"] = [keys] if isinstance(keys, list) else keys.split()
        return out

    async def run(self, ctx: ToolContext, args: BaseModel) -> ToolResult:
        if self.name == "terminate":
            ctx.state["status"] = args.status
            return ToolResult(output=f"Terminated ({args.status}).", submitted=True)
        if self.name == "answer":
            ctx.state["answer"] = args.text
            return ToolResult(output="Answered.", submitted=True)
        action = self.action(ctx, args)
        head, frame = await ctx.state["display"].act(action, ctx.state["settle"])
        ctx.state["last"] = head
        note_away(ctx.state, head.get("state") or {})
        if frame is not None:
            ctx.state["frame"] = frame
        if "coordinate" in action:
            ctx.state["cursor"] = action["coordinate"]
        notes = list(head.get("restarted", []))
        if not head.get("ok"):
            raise ToolError(head.get("error", "the action failed") + ("; " + "; ".join(notes) if notes else ""))
        text = describe(action) + (f" ({head['note']})" if head.get("note") else "")
        if notes:
            ctx.state.setdefault("crashes", []).extend(notes)
            text += "\n[" + "; ".join(notes) + "]"
        return ToolResult(output=text, command=[action["name"], *map(str, _args_of(action))], exit_code=0,
                          submitted=bool(head.get("page_done")))


def note_away(state: dict, page: dict) -> None:
    """Count the action; when it left the policy on another page or tab than the task's, note
    where (the grade reports it: info["report"]["task_page"])."""
    state["actions"] = state.get("actions", 0) + 1
    if page.get("on_task_page") is False:
        away = state.setdefault("away", [])
        if len(away) < 100:
            away.append({"action": state["actions"], "url": page.get("url"), "tab_index": page.get("tab_index")})


def _args_of(action: dict) -> list:
    return [v for k, v in action.items() if k != "name"]


def describe(action: dict) -> str:
    name = action["name"]
    if "coordinate" in action:
        return f"{name} at {action['coordinate'][0]},{action['coordinate'][1]} (pixels)."
    if name == "type":
        return f"Typed {len(action['text'])} characters."
    return f"{name} done."


SPECS: list[tuple[str, str, type[BaseModel]]] = [
    ("left_click", "Click the left mouse button at coordinate.", PointArgs),
    ("right_click", "Click the right mouse button at coordinate.", PointArgs),
    ("middle_click", "Click the middle mouse button at coordinate.", PointArgs),
    ("double_click", "Double-click at coordinate (selects a word).", PointArgs),
    ("triple_click", "Triple-click at coordinate (selects a line).", PointArgs),
    ("mouse_move", "Move the cursor to coordinate.", PointArgs),
    ("left_click_drag", "Drag with the left button held, from start_coordinate (or the cursor) to coordinate.",
     DragArgs),
    ("type", "Type text into the focused field.", TypeArgs),
    ("key", "Press a key or chord, e.g. 'Enter' or 'ctrl+a'.", KeyArgs),
    ("scroll", "Scroll vertically by pixels (positive: down), at coordinate or the cursor.", ScrollArgs),
    ("hscroll", "Scroll horizontally by pixels (positive: right), at coordinate or the cursor.", ScrollArgs),
    ("goto", "Open an http(s) URL in the current tab.", UrlArgs),
    ("go_back", "Go back one page in the current tab's history.", NoArgs),
    ("new_tab", "Open a new, empty tab and switch to it.", NoArgs),
    ("tab_focus", "Switch to the tab at index (0-based, in the order they opened).", IndexArgs),
    ("wait", "Wait a number of seconds (at most 60).", WaitArgs),
    ("terminate", "End the episode, saying whether the task is done (success) or cannot be (failure).",
     TerminateArgs),
    ("answer", "Give the final answer (for tasks that ask a question) and end the episode.", AnswerArgs),
]
ACTION_NAMES = [name for name, _, _ in SPECS]
BROWSER_ONLY = {"goto", "go_back", "new_tab", "tab_focus"}


class ComputerUseArgs(BaseModel):
    model_config = ConfigDict(extra="allow")
    action: str = Field(description=f"one of: {', '.join(ACTION_NAMES)}; the other fields are that action's")


class ComputerUseTool(Tool):
    """All actions behind one tool, as the seed's harness exposes them:
    {"action": "left_click", "coordinate": [x, y]}."""

    name = "computer_use"
    description = "Control the screen: " + "; ".join(f"{n}: {d}" for n, d, _ in SPECS)
    Args = ComputerUseArgs

    def __init__(self, tools: dict[str, GUITool]):
        self.tools = tools

    async def run(self, ctx: ToolContext, args: ComputerUseArgs) -> ToolResult:
        tool = self.tools.get(args.action)
        if tool is None:
            raise ToolError(f"unknown action {args.action!r}; actions: {', '.join(self.tools)}")
        rest = {k: v for k, v in (args.model_extra or {}).items()}
        return await tool.run(ctx, tool.parse(rest))


def make_tools(browser: bool = True) -> list[Tool]:
    tools = {n: GUITool(n, d, a) for n, d, a in SPECS if browser or n not in BROWSER_ONLY}
    return [*tools.values(), ComputerUseTool(tools)]
