"""The Claw tool service: one process per sandbox holding the world, serving every door.

Standard library only (it runs under the agent's own Python in any image). Started by the
env at reset through `claw_boot.py`, which compiles this module from text sent on stdin (no
file of the sandbox is ever imported, and no import happens once it serves):

    python -I -S -B -c "$(cat claw_boot.py)" --socket PATH
        < {"modules": [claw_tools, claw_service], "main": "claw_service"}
          {"seed", "faults", "allowed", "dh"}                               (one JSON line each)

It reads the task's configuration from stdin, agrees on a key with the env (Diffie-Hellman:
the env's public value comes in, ours goes out on stdout, so the key never passes through
any other process), makes itself non-dumpable (its memory and /proc files closed to the
policy's processes), binds the socket, forks into the background and exits the foreground.

Requests on the unix socket, one JSON object per connection (the client half-closes):
    {"op": "call", "tool": T, "args": {...}, "door": "function"|"cli"|"mcp"}  -> {"ok", "result"|"error"}
    {"op": "list"}                                                          -> {"ok", "tools": [schemas]}
    {"op": "snapshot", "nonce": N}  -> {"ok", "payload": JSON text, "mac": HMAC-SHA256(key, payload)}
    {"op": "health"}                                                        -> {"ok", "pid", "calls"}
The snapshot (world state + call log + nonce) is what the grader reads: a policy that edits
files or replaces this process cannot produce a payload with a valid MAC for a fresh nonce.
Every call, from whichever door, is logged here (tool, arguments, result, error, fault, time).

A request is bounded (MAX_REQUEST bytes, MAX_DEPTH levels of nesting, MAX_NUMBER characters
per number, READ_TIMEOUT to arrive, MAX_CONNECTIONS at once) and anything it makes go wrong
comes back as an error answer: no request reaches an error path of its own (socketserver's
would import `traceback`), and the service keeps answering.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import hmac
import json
import os
import secrets
import socket
import socketserver
import sys
import threading
import time

try:  # in the package on the host
    from . import claw_tools
except ImportError:  # in the sandbox: claw_boot.py put it in sys.modules (never from a file there)
    import claw_tools

MAX_REQUEST = 4 * 1024 * 1024   # bytes read from one connection
MAX_ARGS = 1024 * 1024          # bytes of JSON arguments one call may carry
MAX_DEPTH = 32                  # levels of arrays and objects in one request
MAX_NUMBER = 64                 # characters of one JSON number (10**100000 is not an argument)
MAX_CONNECTIONS = 32            # requests in flight at once; more are told to retry
READ_TIMEOUT = 30.0             # seconds a request may take to arrive
FAULT_DELAY = 0.2               # seconds an injected timeout stalls before failing
FAULT_TEXT = {
    "rate_limit": "429 Too Many Requests: rate limit exceeded for {tool}; retry in a moment",
    "server_error": "500 Internal Server Error: the service failed while handling {tool}; try again",
    "timeout": "504 Gateway Timeout: {tool} did not answer in time; try again",
}
# RFC 3526 group 14 (2048-bit MODP), generator 2
DH_P = int("FFFFFFFFFFFFFFFFC90FDAA22168C234C4C6628B80DC1CD129024E088A67CC74020BBEA63B139B22514A08798E3404DD"
           "EF9519B3CD3A431B302B0A6DF25F14374FE1356D6D51C245E485B576625E7EC6F44C42E9A637ED6B0BFF5CB6F406B7ED"
           "EE386BFB5A899FA5AE9F24117C4B1FE649286651ECE45B3DC2007CB8A163BF0598DA48361C55D39A69163FA8FD24CF5F"
           "83655D23DCA3AD961C62F356208552BB9ED529077096966D670C354E4ABC9804F1746C08CA18217C32905E462E36CE3B"
           "E39E772C180E86039B2783A2EC07A28FB5C55DF06F4C52C9DE2BCBF6955817183995497CEA956AE515D2261898FA0510"
           "15728E5A8AACAA68FFFFFFFFFFFFFFFF", 16)
DH_G = 2
# Private exponents of 256 bits, not 2048: group 14 gives 112-bit security, and NIST SP 800-56A
# (rev. 3, 5.6.1.1.1) asks a safe-prime group's private key for at least twice that. A full-size
# exponent cost ~20 ms per modular exponentiation, four per episode (two here, two in the env).
DH_SECRET_BITS = 256


def dh_secret() -> int:
    """A private Diffie-Hellman exponent in [2, 2**DH_SECRET_BITS)."""
    return secrets.randbelow(2 ** DH_SECRET_BITS - 2) + 2


def canonical(obj) -> str:
    """The one JSON text of a value: what is signed and what is compared across doors."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def dh_key(their_public: int, our_secret: int) -> bytes:
    if not 1 < their_public < DH_P - 1:
        raise ValueError("bad Diffie-Hellman public value")
    shared = pow(their_public, our_secret, DH_P)
    return hashlib.sha256(shared.to_bytes(256, "big")).digest()


class World:
    """The world state, the call log and the fault plan; `call` is the only way to change it."""

    def __init__(self, seed: dict, faults: list | None = None, allowed: list | None = None,
                 fault_delay: float = FAULT_DELAY):
        self.state = claw_tools.seeded_state(seed)
        self.faults = {(f["tool"], int(f["call"])): f["kind"] for f in (faults or [])}
        for kind in self.faults.values():
            if kind not in FAULT_TEXT:
                raise ValueError(f"unknown fault kind {kind!r}; choose from {sorted(FAULT_TEXT)}")
        self.allowed = set(allowed) if allowed else set(claw_tools.TOOLS)
        unknown = self.allowed - set(claw_tools.TOOLS)
        if unknown:
            raise ValueError(f"unknown tools allowed: {sorted(unknown)}")
        self.fault_delay = fault_delay
        self.counts: dict[str, int] = {}
        self.log: list[dict] = []
        self.lock = threading.Lock()

    def tools(self) -> list[dict]:
        return [claw_tools.schema(name) for name in claw_tools.TOOLS if name in self.allowed]

    def call(self, tool, args, door: str = "function") -> dict:
        """Run one call; never raises. The answer: {"ok": True, "result"} or {"ok": False, "error"}."""
        entry = {"tool": tool if isinstance(tool, str) else repr(tool), "door": door if isinstance(door, str) else "?",
                 "time": time.time(), "fault": None}
        size = len(canonical(args)) if _jsonable(args) else -1
        entry["args"] = copy.deepcopy(args) if 0 <= size <= MAX_ARGS else {"_omitted_bytes": size}
        answer = self._call(tool, args, size, entry)
        with self.lock:
            entry["seq"] = len(self.log)
            entry["ok"] = answer["ok"]
            entry["result" if answer["ok"] else "error"] = answer.get("result", answer.get("error"))
            self.log.append(entry)
        return answer

    def _call(self, tool, args, size: int, entry: dict) -> dict:
        if not isinstance(tool, str) or tool not in claw_tools.TOOLS:
            return {"ok": False, "error": f"unknown tool {_clip(repr(tool))}; `claw --list` shows the tools"}
        if tool not in self.allowed:
            return {"ok": False, "error": f"tool {tool!r} is not available in this task"}
        if size > MAX_ARGS:
            return {"ok": False, "error": f"arguments too large ({size} bytes; the limit is {MAX_ARGS})"}
        if not isinstance(args, dict):
            return {"ok": False, "error": f"arguments must be a JSON object, not {type(args).__name__}"}
        try:
            claw_tools.validate(claw_tools.TOOLS[tool]["parameters"], args)
        except claw_tools.ToolFailure as e:
            return {"ok": False, "error": f"bad arguments for {tool}: {e}"}
        with self.lock:
            self.counts[tool] = self.counts.get(tool, 0) + 1
            fault = self.faults.get((tool, self.counts[tool]))
        if fault:
            entry["fault"] = fault
            if fault == "timeout":
                time.sleep(self.fault_delay)
            return {"ok": False, "error": FAULT_TEXT[fault].format(tool=tool)}
        with self.lock:
            trial = copy.deepcopy(self.state)  # a call that fails half-way changes nothing
            try:
                result = claw_tools.run_tool(trial, tool, args)
            except claw_tools.ToolFailure as e:
                return {"ok": False, "error": f"{tool}: {e}"}
            except Exception as e:  # a bug in a tool must not take the world down
                return {"ok": False, "error": f"{tool} failed: {type(e).__name__}: {e}"}
            self.state = trial
        return {"ok": True, "result": result}

    def snapshot(self) -> dict:
        with self.lock:
            return {"state": copy.deepcopy(self.state), "log": copy.deepcopy(self.log), "counts": dict(self.counts)}


def _jsonable(value) -> bool:
    try:
        canonical(value)
        return True
    except (TypeError, ValueError):
        return False


class Service:
    """The world behind a socket; `handle` answers one request object."""

    def __init__(self, world: World, key: bytes, hardened: bool):
        self.world, self.key, self.hardened = world, key, hardened
        self.boot = secrets.token_hex(8)

    def handle(self, request) -> dict:
        if not isinstance(request, dict):
            return {"ok": False, "error": "a request is a JSON object"}
        op = request.get("op")
        if op == "call":
            return self.world.call(request.get("tool"), request.get("args", {}), request.get("door", "cli"))
        if op == "list":
            return {"ok": True, "tools": self.world.tools()}
        if op == "health":
            return {"ok": True, "pid": os.getpid(), "calls": len(self.world.log), "hardened": self.hardened}
        if op == "snapshot":
            nonce = request.get("nonce")
            if not isinstance(nonce, str) or not 16 <= len(nonce) <= 128:
                return {"ok": False, "error": "snapshot needs a nonce (16-128 characters)"}
            body = dict(self.world.snapshot(), nonce=nonce, boot=self.boot, hardened=self.hardened, pid=os.getpid())
            payload = canonical(body)
            mac = hmac.new(self.key, payload.encode(), hashlib.sha256).hexdigest()
            return {"ok": True, "payload": payload, "mac": mac}
        return {"ok": False, "error": f"unknown op {_clip(repr(op))}; use call, list, snapshot or health"}


def read_request(conn: socket.socket) -> bytes | None:
    """The request's bytes, or None when more than MAX_REQUEST came: the rest is read and dropped
    (for READ_TIMEOUT at most), so that the caller's send completes and it gets the error answer."""
    chunks, size, deadline = [], 0, time.monotonic() + READ_TIMEOUT
    while True:
        data = conn.recv(65536)
        if not data:
            return b"".join(chunks) if size <= MAX_REQUEST else None
        size += len(data)
        if size <= MAX_REQUEST:
            chunks.append(data)
        elif chunks:
            chunks = []  # over the limit: keep nothing
        if time.monotonic() > deadline:
            raise TimeoutError("the request took longer than READ_TIMEOUT to arrive")


def decode(raw: bytes | None):
    """Request bytes -> object, or an error answer (too big, not UTF-8, not JSON, too deep,
    a number too long or not finite)."""
    if raw is None:
        return {"ok": False, "error": f"request too large (the limit is {MAX_REQUEST} bytes)"}, False
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return {"ok": False, "error": f"request is not valid UTF-8 (byte {e.start})"}, False
    try:
        value = json.loads(text, parse_int=_int, parse_float=_float, parse_constant=_constant)
    except RecursionError:
        return {"ok": False, "error": f"request nested too deeply (the limit is {MAX_DEPTH} levels)"}, False
    except ValueError as e:
        return {"ok": False, "error": f"request is not valid JSON: {_clip(str(e))}"}, False
    if _deeper_than(value, MAX_DEPTH):
        return {"ok": False, "error": f"request nested too deeply (the limit is {MAX_DEPTH} levels)"}, False
    return value, True


def _int(text: str) -> int:
    if len(text) > MAX_NUMBER:
        raise ValueError(f"a number of {len(text)} characters (the limit is {MAX_NUMBER})")
    return int(text)


def _float(text: str) -> float:
    if len(text) > MAX_NUMBER:
        raise ValueError(f"a number of {len(text)} characters (the limit is {MAX_NUMBER})")
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{_clip(text)} is out of range")
    return value


def _constant(text: str):
    raise ValueError(f"{text} is not a JSON number")


def _deeper_than(value, limit: int) -> bool:
    """Whether arrays/objects nest more than `limit` levels (iterative: no recursion to run out of)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def _clip(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def respond(service: Service, raw: bytes | None) -> bytes:
    """The answer to one request's bytes; whatever goes wrong is an error answer, never an exception."""
    try:
        request, ok = decode(raw)
        return json.dumps(service.handle(request) if ok else request, ensure_ascii=True).encode()
    except Exception as e:  # RecursionError, MemoryError, a bug: this request fails, the service goes on
        try:
            why = f"{type(e).__name__}: {_clip(str(e))}"
        except Exception:
            why = type(e).__name__
        return json.dumps({"ok": False, "error": f"the service could not handle this request ({why})"}).encode()


BUSY = json.dumps({"ok": False, "error": f"the service is busy ({MAX_CONNECTIONS} requests in flight); "
                                         "try again"}).encode()


def serve(service: Service, listener: socket.socket) -> None:
    slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    class Handler(socketserver.BaseRequestHandler):
        def handle(self):
            try:
                self.request.settimeout(READ_TIMEOUT)
                if not slots.acquire(blocking=False):
                    self.request.sendall(BUSY)
                    return
                try:
                    self.request.sendall(respond(service, read_request(self.request)))
                finally:
                    slots.release()
            except OSError:
                pass  # the caller went away, or took longer than READ_TIMEOUT

    class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
        daemon_threads = True

        def server_bind(self):  # the socket is bound already (before the fork)
            pass

        def handle_error(self, request, client_address):
            pass  # socketserver's would import and print `traceback`; `respond` leaves nothing to report

    server = Server(listener.getsockname(), Handler, bind_and_activate=False)
    server.socket.close()
    server.socket = listener
    server.serve_forever(poll_interval=0.5)


def harden() -> bool:
    """PR_SET_DUMPABLE 0: no ptrace, no /proc/PID/mem or environ for the policy's processes."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(4, 0, 0, 0, 0) == 0
    except Exception:
        return False


def sealed(hardened: bool, seal) -> tuple[bool, list]:
    """Close imports (claw_boot's guard) before the first request; hardened only if the process is
    non-dumpable, sealed, and loaded no code from a place it (and so the policy) could write."""
    if seal is None:
        return False, []
    writable = seal()
    return hardened and not writable, writable[:8]


def run(socket_path: str, config: dict, make_world, seal=None, foreground: bool = False) -> int:
    """Start a world service (this one, or agentdojo_service's): harden, agree on the key, build
    the world (`make_world(config)`), bind, seal imports, say hello, go to the background, serve."""
    hardened = harden()
    ours = dh_secret()
    key = dh_key(int(config["dh"]), ours)
    world = make_world(config)
    if os.path.exists(socket_path):
        os.unlink(socket_path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(64)
    hardened, writable = sealed(hardened, seal)
    hello = json.dumps({"dh": str(pow(DH_G, ours, DH_P)), "hardened": hardened, "writable_code": writable})
    if not foreground and os.fork() > 0:
        print(hello, flush=True)
        os._exit(0)
    if not foreground:
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # release the exec's pipes so the launching command ends now
            os.dup2(null, fd)
    else:
        print(hello, flush=True)
    serve(Service(world, key, hardened), listener)
    return 0


def main(argv=None, seal=None) -> int:
    """`seal`: claw_boot's import guard closing (no import from then on); it returns the
    writable places code was loaded from, if any (then the service is not `hardened`)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--socket", required=True)
    p.add_argument("--foreground", action="store_true", help="serve in this process (tests, debugging)")
    opts = p.parse_args(argv)
    config = json.loads(sys.stdin.readline())

    def make_world(config: dict) -> World:
        return World(config.get("seed") or {}, config.get("faults"), config.get("allowed"),
                     float(config.get("fault_delay", FAULT_DELAY)))

    return run(opts.socket, config, make_world, seal, opts.foreground)

if __name__ == "__main__":
    sys.exit(main())
