"""Desktop tasks' checks, run by the env on the sandbox's end state.

The checks and their expected values live on the host (the task file is never copied
into the sandbox), and they read the state through the sandbox's agent. A desktop task
gives the policy a terminal (or one is a menu away), so anything a process of the
policy's can write is written by it, and a check may trust only what is the task's
effect whichever way it was made (a file's content, the answer), never a stand-in for it:
- first every process the policy left running is ended (sandbox/quiesce.py; the report's
  `ended`), so none can change the end state, or answer in a program's place, while the
  checks read it;
- the window manager's state (wm_current_desktop, wm_desktops) is asked of the window
  manager the task started, through a window made at check time (sandbox/wmprobe.py),
  never read from the root-window properties any X client can set; the window manager
  gone (killed, replaced) fails those checks;
- helpers run from memory with the agent's isolated Python (insandbox.py), not from files
  in the home folder.
Each task says which shortcuts are fair (`shortcuts`). Paths are relative to the
sandbox's home (its workdir); a check of a file or folder refuses a symlink in its place.
"""

from __future__ import annotations

import shlex

from orchard_gym.client import AsyncSandboxInstance
from orchard_gym.errors import OrchardError

from .display import Display
from .insandbox import run_helper

WM_CHECKS = {"wm_current_desktop", "wm_desktops"}
# a shell test per kind; `! -L`: a symlink would stand in for what the task asked to make
REAL = "[ ! -L {p} ]"
PATH_TESTS = {"file_exists": "[ -f {p} ] && " + REAL, "file_absent": "[ -e {p} ] || [ -L {p} ]",
              "dir_exists": "[ -d {p} ] && " + REAL, "file_executable": "[ -f {p} ] && [ -x {p} ] && " + REAL}


async def _read(sandbox: AsyncSandboxInstance, path: str) -> str | None:
    r = await sandbox.exec(PATH_TESTS["file_exists"].format(p=shlex.quote(path)), timeout=30)
    if r.exit_code != 0:
        return None  # missing, not a regular file, or a symlink to something else
    try:
        return (await sandbox.download_content(path)).decode("utf-8", errors="replace")
    except (OrchardError, OSError):  # gone, too big
        return None


def _norm(text: str, check: dict) -> str:
    if check.get("strip", True):
        text = "\n".join(line.rstrip() for line in text.strip().splitlines())
    if check.get("ignore_case"):
        text = text.lower()
    return text


async def quiesce(sandbox: AsyncSandboxInstance, display: Display) -> dict:
    """End the policy's processes; {ended: [names], stack_gone: [xvfb|openbox|daemon]}."""
    return await run_helper(sandbox, display.python, ["procwatch", "quiesce"], {"keep": display.hello.get("pids", {})})


async def verify(sandbox: AsyncSandboxInstance, checks: list[dict], answer: str | None,
                 display: Display) -> tuple[list[dict], dict]:
    """(each check's result, what the clean-up did)."""
    end = await quiesce(sandbox, display)
    base = sandbox.workdir or "/workspace"
    out = []
    for check in checks:
        kind, path = check["type"], check.get("path")
        full = f"{base}/{path}" if path else None
        ok, seen = False, None
        if kind in ("file_equals", "file_contains"):
            seen = await _read(sandbox, full)
            if seen is not None:
                want = _norm(check["text"], check)
                ok = _norm(seen, check) == want if kind == "file_equals" else want in _norm(seen, check)
        elif kind in PATH_TESTS:
            r = await sandbox.exec(PATH_TESTS[kind].format(p=shlex.quote(full)), timeout=30)
            ok = (r.exit_code == 0) != (kind == "file_absent")
        elif kind in ("answer_equals", "answer_contains"):
            seen = answer
            if answer is not None:
                a, want = _norm(answer, check), _norm(check["text"], check)
                ok = a == want if kind == "answer_equals" else want in a
        out.append({"type": kind, "path": path, "passed": bool(ok),
                    **({"seen": seen[:200]} if isinstance(seen, str) else {})})
    wm = [i for i, c in enumerate(checks) if c["type"] in WM_CHECKS]
    if wm:
        if {"xvfb", "openbox"} & set(end.get("stack_gone", [])):
            results = [{"passed": False, "seen": "the window manager the task started is gone"}] * len(wm)
        else:
            results = await run_helper(sandbox, display.python, ["xinput", "wmprobe"],
                                       {"display": display.hello["display"], "checks": [checks[i] for i in wm]})
        for i, result in zip(wm, results):
            out[i] = {"type": checks[i]["type"], "path": None, "passed": bool(result["passed"]),
                      "seen": str(result["seen"])[:200]}
    return out, end
