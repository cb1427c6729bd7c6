"""End every process in the sandbox but the GUI stack and this script's own ancestry (the agent).

The desktop verifier runs it before any check (env -> sandbox/insandbox runner, from memory,
never from a file the policy could have replaced): nothing the policy started from its
terminal (a background loop, a stand-in window manager, a shell it `exec`ed into something
else) still runs while the checks read the end state. The stack to spare (the daemon, Xvfb,
openbox) comes from the daemon's hello at reset, each as (pid, start time), so a process that
took over a freed pid is not spared. Stop them all first (no forking away), then kill.

    args: {"keep": {"xvfb": [pid, start], ...}}  ->  prints {"ended": [comm, ...], "stack_gone": [name, ...]}
"""

from __future__ import annotations

import json
import os
import signal
import time

from procwatch import processes


def ancestry(table: dict[str, dict]) -> set[str]:
    pid, out = str(os.getpid()), set()
    while pid in table and pid not in out:
        out.add(pid)
        pid = table[pid]["ppid"]
    return out | {"1"}


def main(args: dict) -> None:
    table = processes()
    spare = ancestry(table)
    stack = {name: str(pid) for name, (pid, start) in args.get("keep", {}).items()
             if table.get(str(pid), {}).get("start") == start}
    gone = sorted(set(args.get("keep", {})) - set(stack))
    spare |= set(stack.values())
    ended: list[str] = []
    for _ in range(20):
        victims = {pid: p for pid, p in processes().items() if pid not in spare and p["state"] != "Z"}
        if not victims:
            print(json.dumps({"ended": ended, "stack_gone": gone}))
            return
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in victims:
                try:
                    os.kill(int(pid), sig)
                except ProcessLookupError:
                    pass
        ended += [p["comm"] for p in victims.values()]
        time.sleep(0.1)
    print(json.dumps({"ended": ended, "stack_gone": gone, "left": sorted(victims)}))
