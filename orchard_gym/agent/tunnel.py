"""A byte tunnel to a server inside the sandbox: `POST /connect {"port": N}`.

The agent connects to 127.0.0.1:N from inside the sandbox (its network namespace, where the
orchestrator cannot reach), answers `101 Switching Protocols`, and then copies bytes both
ways until either side closes. The orchestrator's service endpoints (Orchard Env's
`expose_service`) send each proxied request through one. A port nothing listens on gets 502.
"""

from __future__ import annotations

import selectors
import socket

from common import BadRequest, _only_keys

CONNECT_TIMEOUT = 5.0
BUFFER = 1 << 16


def serve(handler, req: dict) -> None:
    _only_keys(req, {"port"})
    port = req.get("port")
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise BadRequest("port must be an integer from 1 to 65535", 422)
    try:
        upstream = socket.create_connection(("127.0.0.1", port), timeout=CONNECT_TIMEOUT)
    except OSError as e:
        raise BadRequest(f"nothing answers on port {port} in the sandbox: {e.strerror or e}", 502)
    handler.close_connection = True  # the connection is the tunnel's now
    try:
        handler.wfile.write(handler.send_head(101, [("Upgrade", "orchard-tunnel"), ("Connection", "Upgrade")]))
        handler.wfile.flush()
        _splice(handler, upstream)
    finally:
        upstream.close()


def _splice(handler, upstream: socket.socket) -> None:
    client = handler.connection
    upstream.settimeout(None)  # (the client sends nothing before it has read the 101)
    sel = selectors.DefaultSelector()
    sel.register(client, selectors.EVENT_READ, upstream)
    sel.register(upstream, selectors.EVENT_READ, client)
    open_sides = 2
    try:
        while open_sides:
            for key, _ in sel.select():
                src, dst = key.fileobj, key.data
                try:
                    data = src.recv(BUFFER)
                except OSError:
                    data = b""
                if data:
                    try:
                        dst.sendall(data)
                        continue
                    except OSError:
                        return
                sel.unregister(src)  # this side is done sending: pass the end on
                open_sides -= 1
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
    finally:
        sel.close()
