"""The GUI daemon's unix-socket server: one JSON line in, one JSON line out, then the frame.

A client on the same machine may ask in its hello for a shared memory file; its fd rides with
the hello's answer (SCM_RIGHTS), and later frames are written there instead of the socket.
Standard library only (it runs in the sandbox next to gui_daemon.py).
"""

from __future__ import annotations

import json
import mmap
import os
import socket
import socketserver
import threading


class Handler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        daemon = self.server.daemon_state  # gui_daemon.Daemon
        frame_buf = None  # this connection's shared frame buffer, once its hello asked for one
        try:
            for line in self.rfile:
                fds = []
                try:
                    req = json.loads(line)
                    if not isinstance(req, dict):
                        raise ValueError("a request is a JSON object")
                    reply, frame = daemon.handle(req, frame_buf)
                    if req.get("op") == "hello" and req.get("frame_fd") and frame_buf is None:
                        frame_buf, fds = self.shared_frame_buffer(daemon, reply)
                except Exception as e:  # never die on one bad request
                    reply, frame = {"ok": False, "error": f"{type(e).__name__}: {e}"}, b""
                data = json.dumps(reply).encode() + b"\n" + frame
                if fds:  # the buffer's fd rides with the hello's answer (SCM_RIGHTS), then is ours alone
                    socket.send_fds(self.request, [data], fds)
                    os.close(fds[0])
                else:
                    self.wfile.write(data)
                    self.wfile.flush()
                if req.get("op") == "stop" if isinstance(req, dict) else False:
                    threading.Thread(target=self.server.shutdown, daemon=True).start()
                    return
        finally:
            if frame_buf is not None:
                try:
                    frame_buf.close()
                except BufferError:
                    pass

    @staticmethod
    def shared_frame_buffer(daemon, reply: dict) -> tuple[mmap.mmap | None, list[int]]:
        """A memory file the size of one frame, mapped here; its fd goes to the client, which maps
        it too (a client in the same kernel: the local backend). Without memfd/send_fds: none."""
        if not (hasattr(os, "memfd_create") and hasattr(socket, "send_fds")):
            return None, []
        size = daemon.grabber.frame_bytes
        fd = os.memfd_create("orchard-gui-frame", getattr(os, "MFD_CLOEXEC", 1))
        os.ftruncate(fd, size)
        buf = mmap.mmap(fd, size)
        reply.update(frame_fd=True, frame_bytes=size)
        return buf, [fd]


class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
