"""A token service: /token answers a token made at start, /check?value=V says whether V is it."""
import os
import secrets
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

TOKEN = secrets.token_hex(16)


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        url = urlparse(self.path)
        if url.path == "/token":
            body = TOKEN
        elif url.path == "/check":
            body = "yes" if parse_qs(url.query).get("value") == [TOKEN] else "no"
        elif url.path == "/health":
            body = "ok"
        else:
            self.send_error(404)
            return
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


ThreadingHTTPServer(("0.0.0.0", int(os.environ.get("PORT", "8000"))), Handler).serve_forever()
