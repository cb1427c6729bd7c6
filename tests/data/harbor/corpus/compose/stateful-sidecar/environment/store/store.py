"""A key-value store over HTTP: GET /k/NAME, PUT /k/NAME (the body is the value)."""
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STATE = {"status": os.environ["INITIAL_STATUS"]}


class Handler(BaseHTTPRequestHandler):
    def key(self):
        return self.path[3:] if self.path.startswith("/k/") and len(self.path) > 3 else None

    def answer(self, code, body=b""):
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        key = self.key()
        if key in STATE:
            self.answer(200, STATE[key].encode())
        else:
            self.answer(404)

    def do_PUT(self):
        key = self.key()
        if key is None:
            self.answer(404)
            return
        STATE[key] = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode().strip()
        self.answer(204)


ThreadingHTTPServer(("0.0.0.0", 8000), Handler).serve_forever()
