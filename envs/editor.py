"""The file editor tool, with SWE-agent/OpenHands `str_replace_editor` semantics.

Files move through the agent's file API (download, edit here, upload), so the editor
works in any image, including ones without Python.
"""

from __future__ import annotations

import posixpath
import shlex
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .tools import Tool, ToolContext, ToolError, ToolResult, clip

SNIPPET_LINES = 4


def numbered(text: str, start: int = 1) -> str:
    """`cat -n` style: right-aligned line numbers, a tab, the line."""
    return "\n".join(f"{i:6}\t{line}" for i, line in enumerate(text.split("\n"), start))


class EditorArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    command: Literal["view", "create", "str_replace", "insert", "undo_edit"]
    path: str = Field(description="file or directory; relative paths are under the repository")
    file_text: str | None = Field(None, description="create: the new file's content")
    old_str: str | None = Field(None, description="str_replace: text that occurs exactly once in the file")
    new_str: str | None = Field(None, description="str_replace/insert: the replacement / inserted text")
    insert_line: int | None = Field(None, ge=0, description="insert: new_str goes after this line (0 = top)")
    view_range: list[int] | None = Field(None, min_length=2, max_length=2,
                                         description="view: [first, last] line, last -1 for the end")


class EditorTool(Tool):
    name = "str_replace_editor"
    description = (
        "View, create and edit files. `view` shows a file with line numbers (or lists a directory 2 levels deep); "
        "`create` writes a new file; `str_replace` replaces old_str, which must occur exactly once, with new_str; "
        "`insert` inserts new_str after line insert_line; `undo_edit` reverts the last edit of a file."
    )
    Args = EditorArgs

    async def run(self, ctx: ToolContext, args: EditorArgs) -> ToolResult:
        path = posixpath.normpath(posixpath.join(ctx.cwd, args.path))
        history: dict[str, list[str]] = ctx.state.setdefault("editor_history", {})
        handler = getattr(self, f"_{args.command}")
        output = await handler(ctx, path, args, history)
        return ToolResult(output=output, command=f"str_replace_editor {args.command} {path}", exit_code=0)

    async def _read(self, ctx: ToolContext, path: str) -> str:
        try:
            data = await ctx.sandbox.download_content(path)
        except FileNotFoundError:
            raise ToolError(f"The path {path} does not exist.") from None
        except Exception as e:  # a directory, permissions, ...
            raise ToolError(f"Cannot read {path}: {e}") from None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise ToolError(f"{path} is not a UTF-8 text file; use bash to inspect it.") from None

    async def _is_dir(self, ctx: ToolContext, path: str) -> bool:
        r = await ctx.sandbox.exec(["test", "-d", path], timeout=30)
        return r.exit_code == 0

    async def _write(self, ctx: ToolContext, path: str, text: str) -> None:
        await ctx.sandbox.upload_content(text.encode("utf-8"), path)

    async def _view(self, ctx, path, args, history) -> str:
        if await self._is_dir(ctx, path):
            if args.view_range:
                raise ToolError("view_range is not allowed when path is a directory.")
            cmd = f"find {shlex.quote(path)} -maxdepth 2 -not -path '*/.*' | sort"
            r = await ctx.sandbox.exec(cmd, timeout=60)
            return clip(f"Files and directories up to 2 levels deep in {path}, excluding hidden items:\n{r.stdout}")
        text = await self._read(ctx, path)
        lines = text.split("\n")
        start = 1
        if args.view_range:
            first, last = args.view_range
            if not 1 <= first <= len(lines):
                raise ToolError(f"Invalid view_range {args.view_range}: first line must be in [1, {len(lines)}].")
            if last != -1 and not first <= last <= len(lines):
                raise ToolError(f"Invalid view_range {args.view_range}: last line must be in [{first}, {len(lines)}] or -1.")
            lines = lines[first - 1 :] if last == -1 else lines[first - 1 : last]
            start = first
        return clip(f"Here's the result of running `cat -n` on {path}:\n{numbered(chr(10).join(lines), start)}\n")

    async def _create(self, ctx, path, args, history) -> str:
        if args.file_text is None:
            raise ToolError("Parameter `file_text` is required for command: create.")
        exists = await ctx.sandbox.exec(["test", "-e", path], timeout=30)
        if exists.exit_code == 0:
            raise ToolError(f"File already exists at: {path}. Cannot overwrite files using command `create`.")
        await self._write(ctx, path, args.file_text)
        history.setdefault(path, []).append(None)  # undo of a create removes the file
        return f"File created successfully at: {path}"

    async def _str_replace(self, ctx, path, args, history) -> str:
        if args.old_str is None:
            raise ToolError("Parameter `old_str` is required for command: str_replace.")
        text = await self._read(ctx, path)
        old, new = args.old_str.expandtabs(), (args.new_str or "").expandtabs()
        text_cmp = text.expandtabs()
        count = text_cmp.count(old)
        if count == 0:
            raise ToolError(f"No replacement was performed, old_str `{args.old_str}` did not appear verbatim in {path}.")
        if count > 1:
            lines = [i + 1 for i, line in enumerate(text_cmp.split("\n")) if old.split("\n")[0] in line]
            raise ToolError(f"No replacement was performed. Multiple occurrences of old_str `{args.old_str}` in lines "
                            f"{lines}. Please ensure it is unique.")
        history.setdefault(path, []).append(text)
        updated = text_cmp.replace(old, new)
        await self._write(ctx, path, updated)
        at = text_cmp.split(old)[0].count("\n")
        return (f"The file {path} has been edited. " + self._snippet(updated, at, new.count("\n"), path)
                + "Review the changes and make sure they are as expected. Edit the file again if necessary.")

    async def _insert(self, ctx, path, args, history) -> str:
        if args.insert_line is None or args.new_str is None:
            raise ToolError("Parameters `insert_line` and `new_str` are required for command: insert.")
        text = await self._read(ctx, path)
        lines = text.expandtabs().split("\n")
        if args.insert_line > len(lines):
            raise ToolError(f"Invalid `insert_line` parameter: {args.insert_line}. It should be within the range "
                            f"of lines of the file: [0, {len(lines)}]")
        new_lines = args.new_str.expandtabs().split("\n")
        updated = "\n".join(lines[: args.insert_line] + new_lines + lines[args.insert_line :])
        history.setdefault(path, []).append(text)
        await self._write(ctx, path, updated)
        return (f"The file {path} has been edited. " + self._snippet(updated, args.insert_line, len(new_lines) - 1, path)
                + "Review the changes and make sure they are as expected (correct indentation, no duplicate lines, "
                  "etc). Edit the file again if necessary.")

    async def _undo_edit(self, ctx, path, args, history) -> str:
        if not history.get(path):
            raise ToolError(f"No edit history found for {path}.")
        previous = history[path].pop()
        if previous is None:
            await ctx.sandbox.exec(["rm", "-f", path], timeout=30)
            return f"Last edit to {path} undone successfully (the file was removed)."
        await self._write(ctx, path, previous)
        return f"Last edit to {path} undone successfully. {self._snippet(previous, 0, previous.count(chr(10)), path)}"

    @staticmethod
    def _snippet(text: str, at_line: int, extra_lines: int, path: str) -> str:
        lines = text.split("\n")
        first = max(0, at_line - SNIPPET_LINES)
        last = min(len(lines), at_line + extra_lines + SNIPPET_LINES + 1)
        body = numbered("\n".join(lines[first:last]), first + 1)
        return f"Here's the result of running `cat -n` on a snippet of {path}:\n{body}\n"
