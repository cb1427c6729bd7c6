"""Desktop tasks' checks, run by the env on the sandbox's end state.

The checks and their expected values live on the host (the task file is never copied
into the sandbox), and they read the state through the sandbox's agent: the policy,
which acts only through the screen, can change the state it is asked to change but not
the verifier or what it expects. Paths are relative to the sandbox's home (its workdir).
"""

from __future__ import annotations

import shlex

from orchard_gym.client import AsyncSandboxInstance
from orchard_gym.errors import OrchardError


async def _read(sandbox: AsyncSandboxInstance, path: str) -> str | None:
    try:
        return (await sandbox.download_content(path)).decode("utf-8", errors="replace")
    except (OrchardError, OSError):  # missing, not a regular file, too big
        return None


def _norm(text: str, check: dict) -> str:
    if check.get("strip", True):
        text = "\n".join(line.rstrip() for line in text.strip().splitlines())
    if check.get("ignore_case"):
        text = text.lower()
    return text


async def verify(sandbox: AsyncSandboxInstance, checks: list[dict], answer: str | None, display: str) -> list[dict]:
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
        elif kind in ("file_exists", "file_absent", "dir_exists", "file_executable"):
            test = {"file_exists": "-f", "file_absent": "-e", "dir_exists": "-d", "file_executable": "-x"}[kind]
            r = await sandbox.exec(f"test {test} {shlex.quote(full)}", timeout=30)
            ok = (r.exit_code == 0) != (kind == "file_absent")
        elif kind in ("answer_equals", "answer_contains"):
            seen = answer
            if answer is not None:
                a, want = _norm(answer, check), _norm(check["text"], check)
                ok = a == want if kind == "answer_equals" else want in a
        elif kind == "root_property":  # X server state (e.g. _NET_NUMBER_OF_DESKTOPS), as xprop prints it
            r = await sandbox.exec(["xprop", "-display", display, "-root", check["name"]], timeout=30)
            seen = r.stdout.strip()
            ok = r.exit_code == 0 and seen.split("=", 1)[-1].strip() == str(check["equals"])
        out.append({"type": kind, "path": path, "passed": bool(ok),
                    **({"seen": seen[:200]} if isinstance(seen, str) else {})})
    return out
