"""`claw`: the Claw tools on the command line (door 2, for bash-only harnesses). Stdlib only.

    claw --list                          the tools and what they do
    claw --schema mail_send              a tool's JSON schema
    claw mail_list_messages --json '{"folder": "inbox"}'
    claw --request < request.json        a raw service request (what the env itself uses)

A call prints the tool's result as JSON and exits 0; a refused call prints
`error: ...` on stderr and exits 1; a service that cannot be reached exits 2.
"""

from __future__ import annotations

import json
import os
import sys

try:  # in the package on the host
    from . import claw_wire
except ImportError:  # a script in the sandbox (-I leaves the script's folder off sys.path)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import claw_wire


def _fail(message: str, code: int = 1) -> int:
    sys.stderr.write(f"error: {message}\n")
    return code


def main(argv: list[str], wire=claw_wire) -> int:
    """`wire`: how requests reach the world (claw_wire: the service's socket; claw_file_world:
    the world in files of an exported Harbor task)."""
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(__doc__)
        return 0
    if argv[0] == "--request":
        raw = sys.stdin.buffer.read()
        sys.stdout.write(json.dumps(wire.request_raw(raw)) + "\n")
        return 0
    if argv[0] in ("--list", "--schema"):
        answer = wire.request({"op": "list"})
        if not answer.get("ok"):
            return _fail(answer.get("error", "?"), 2)
        tools = {t["function"]["name"]: t["function"] for t in answer["tools"]}
        if argv[0] == "--schema":
            if len(argv) != 2 or argv[1] not in tools:
                return _fail(f"usage: claw --schema TOOL (one of: {', '.join(tools)})")
            sys.stdout.write(json.dumps(tools[argv[1]]["parameters"], indent=2) + "\n")
            return 0
        for name, tool in tools.items():
            sys.stdout.write(f"{name}\t{tool['description']}\n")
        return 0
    tool, rest = argv[0], argv[1:]
    if rest and rest[0] == "--json" and len(rest) == 2:
        text = rest[1]
    elif not rest:
        text = "{}"
    else:
        return _fail("usage: claw TOOL --json '{...}'")
    try:
        args = json.loads(text)
    except ValueError as e:
        return _fail(f"--json is not valid JSON: {e}")
    answer = wire.call(tool, args, "cli")
    if answer.get("ok"):
        sys.stdout.write(json.dumps(answer["result"], indent=2, ensure_ascii=False) + "\n")
        return 0
    error = answer.get("error", "?")
    return _fail(error, 2 if "unreachable" in error else 1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
