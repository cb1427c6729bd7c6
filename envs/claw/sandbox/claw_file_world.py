"""The Claw world kept in files, for tools with no service process (Harbor task folders,
envs/harbor/export_claw.py). Standard library only: it runs under whatever python3 the image has.

    FOLDER/world.json    {"seed", "faults", "allowed"}: the task's world, as the service's config has it
    FOLDER/calls.jsonl   the call log: one `World` log entry a line (tool, args, door, ok, result|error, fault)

There is no state file: the world state is what replaying the log through `claw_service.World`
gives (the tools are deterministic: new ids come from counters, the clock is the seed's). A
request (`request`/`request_raw`, claw_wire's interface, so `claw_cli.main(argv, wire=this
module)` is the same command line as Orchard/Claw-v0's) replays the log, makes the call and
appends its entry, under an exclusive lock on the log. The exported verifier replays the same
way (`replay`), from its own copy of the task's world and of the tools.
"""

from __future__ import annotations

import fcntl
import json
import os

try:  # in the package on the host
    from .claw_service import FAULT_DELAY, World, decode
    from .claw_wire import encode
except ImportError:  # a script in an exported task folder (its folder put on sys.path by the caller)
    from claw_service import FAULT_DELAY, World, decode
    from claw_wire import encode

HERE = os.path.dirname(os.path.abspath(__file__))
WORLD = "world.json"
LOG = "calls.jsonl"


def read_log(lines) -> list[dict]:
    """The log's entries; ValueError naming the first line that is not a JSON object."""
    entries = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except ValueError as e:
            raise ValueError(f"line {number} of the call log is not JSON: {e}") from None
        if not isinstance(entry, dict):
            raise ValueError(f"line {number} of the call log is not a JSON object")
        entries.append(entry)
    return entries


def replay(config: dict, entries: list[dict]) -> World:
    """The world the logged calls lead to from the task's seed: each call made again (validated,
    allowed, its fault fired by the same count, no fault delay), whatever the log says it returned."""
    world = World(config.get("seed") or {}, config.get("faults"), config.get("allowed"), fault_delay=0.0)
    for entry in entries:
        world.call(entry.get("tool"), entry.get("args", {}), entry.get("door", "cli"))
    world.fault_delay = FAULT_DELAY
    return world


def request_raw(data: bytes, path: str | None = None, timeout: float = 60.0) -> dict:
    """Answer one request as the service would: `call` and `list` (there is no snapshot: the
    log is the record). `path`: the world's folder (default: this module's)."""
    request, ok = decode(data)
    if not ok:
        return request
    op = request.get("op") if isinstance(request, dict) else None
    if op not in ("call", "list"):
        return {"ok": False, "error": f"unknown op {op!r}: this world answers call and list"}
    folder = path or HERE
    try:
        with open(os.path.join(folder, WORLD)) as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        return {"ok": False, "error": f"the claw world is unreadable at {folder}: {e}"}
    with open(os.path.join(folder, LOG), "a+", encoding="utf-8") as log:
        fcntl.flock(log, fcntl.LOCK_EX)  # one call at a time: each replays what the ones before it did
        log.seek(0)
        try:
            world = replay(config, read_log(log))
        except ValueError as e:
            return {"ok": False, "error": f"the claw world cannot be replayed: {e}"}
        if op == "list":
            return {"ok": True, "tools": world.tools()}
        answer = world.call(request.get("tool"), request.get("args", {}), request.get("door", "cli"))
        log.write(json.dumps(world.log[-1], ensure_ascii=True) + "\n")
    return answer


def request(obj, path: str | None = None, timeout: float = 60.0) -> dict:
    return request_raw(encode(obj), path, timeout)


def call(tool: str, args, door: str, path: str | None = None) -> dict:
    return request({"op": "call", "tool": tool, "args": args, "door": door}, path)
