"""The Claw tools as an MCP server over stdio (door 3). Stdlib only.

Model Context Protocol, JSON-RPC 2.0, one message per line on stdin/stdout: `initialize`,
`notifications/initialized`, `ping`, `tools/list`, `tools/call`. Each call is forwarded to
the sandbox's Claw service (the same world the other doors change). Tool errors come back
as results with `isError: true`, as the spec asks, so the model sees them.
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

VERSIONS = ["2025-06-18", "2025-03-26", "2024-11-05"]
SERVER = {"name": "claw", "version": "0.1.0"}


def handle(message):
    """One JSON-RPC message -> the response object, or None for notifications."""
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0" or not isinstance(message.get("method"), str):
        return _error(message.get("id") if isinstance(message, dict) else None, -32600, "invalid request")
    method, params, mid = message["method"], message.get("params") or {}, message.get("id")
    if "id" not in message:
        return None  # a notification (initialized, cancelled, ...): nothing to answer
    if method == "initialize":
        asked = params.get("protocolVersion") if isinstance(params, dict) else None
        return _result(mid, {"protocolVersion": asked if asked in VERSIONS else VERSIONS[0],
                             "capabilities": {"tools": {"listChanged": False}}, "serverInfo": SERVER})
    if method == "ping":
        return _result(mid, {})
    if method == "tools/list":
        answer = claw_wire.request({"op": "list"})
        if not answer.get("ok"):
            return _error(mid, -32603, answer.get("error", "?"))
        return _result(mid, {"tools": [{"name": t["function"]["name"], "description": t["function"]["description"],
                                        "inputSchema": t["function"]["parameters"]} for t in answer["tools"]]})
    if method == "tools/call":
        if not isinstance(params, dict) or not isinstance(params.get("name"), str):
            return _error(mid, -32602, "tools/call needs params.name")
        answer = claw_wire.call(params["name"], params.get("arguments") or {}, "mcp")
        if answer.get("ok"):
            text = json.dumps(answer["result"], ensure_ascii=False)
            return _result(mid, {"content": [{"type": "text", "text": text}], "isError": False})
        return _result(mid, {"content": [{"type": "text", "text": f"error: {answer.get('error')}"}], "isError": True})
    return _error(mid, -32601, f"method not found: {method}")


def _result(mid, result):
    return {"jsonrpc": "2.0", "id": mid, "result": result}


def _error(mid, code, message):
    return {"jsonrpc": "2.0", "id": mid, "error": {"code": code, "message": message}}


def main() -> int:
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        try:
            message = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            response = _error(None, -32700, f"parse error: {e}")
        else:
            response = handle(message)
        if response is not None:
            sys.stdout.write(json.dumps(response, ensure_ascii=False) + "\n")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
