"""A fake Kubernetes API server: the real wire protocol, on loopback, for the real client.

What it serves (JSON only, core/v1 and networking.k8s.io/v1, any namespace):

    /api/v1/namespaces/NS/pods[/NAME]                          GET (get, list, watch) POST DELETE PATCH
    /api/v1/namespaces/NS/secrets[/NAME]                       same
    /apis/networking.k8s.io/v1/namespaces/NS/networkpolicies[/NAME]   same
    /version, /api, /apis                                      enough for `kubectl version`-like probes

Semantics kept from the real thing, because the backend's correctness depends on them:

- one global resourceVersion counter (like etcd's revision); every write bumps it and the
  object carries it; lists carry the collection's resourceVersion;
- watches stream `{"type", "object"}` lines in chunked encoding, from a given
  resourceVersion (replayed from a bounded history) or from "now" with synthetic ADDED
  events; a resourceVersion older than the history answers an ERROR event with a 410
  Status ("too old resource version"), as the API server does; `allowWatchBookmarks`
  gets BOOKMARK events (every `bookmark_interval` seconds); `timeoutSeconds` ends a watch;
- label selectors (=, ==, !=, exists, !exists, in, notin); Status bodies with reason and
  code for 401/404/409/410/422/429; a 429 carries Retry-After;
- deleting a pod that a kubelet runs, with a grace period, sets deletionTimestamp and the
  kubelet removes the object once its containers are gone; grace 0 removes it at once
  (force deletion); owners' dependents (ownerReferences) are garbage-collected;
- create bodies are validated against the Kubernetes schema (kubernetes-validate, strict:
  unknown fields are refused) for `SCHEMA_VERSION`;
- PATCH takes merge-patch and strategic-merge-patch bodies; both are applied as a JSON
  merge patch (lists replaced, not merged by key: enough for metadata patches).

Fault injection for tests lives under /_fake/ (no auth): see `Faults` and the routes in
`Handler._fake`.
"""

from __future__ import annotations

import base64
import copy
import json
import logging
import re
import threading
import time
import uuid
from collections import Counter, deque
from datetime import datetime, UTC
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

log = logging.getLogger("fake_k8s")

SCHEMA_VERSION = "1.31.0"
KINDS = {  # plural -> (kind, apiVersion, path prefix)
    "pods": ("Pod", "v1", "api/v1"),
    "secrets": ("Secret", "v1", "api/v1"),
    "networkpolicies": ("NetworkPolicy", "networking.k8s.io/v1", "apis/networking.k8s.io/v1"),
}
ROUTE = re.compile(r"^/(api/v1|apis/networking\.k8s\.io/v1)/namespaces/([^/]+)/([a-z]+)(?:/([^/]+))?/?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, headers: dict | None = None):
        super().__init__(message)
        self.code, self.reason, self.message, self.headers = code, reason, message, headers or {}

    def status(self) -> dict:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "code": self.code}


# --------------------------------------------------------------------------- selectors
def parse_selector(text: str | None) -> list[tuple[str, str, frozenset]]:
    """A label selector as (key, op, values) requirements; ValueError when malformed."""
    if not text:
        return []
    terms, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            terms.append(cur)
            cur = ""
        else:
            cur += ch
    terms.append(cur)
    reqs = []
    key_re = r"[A-Za-z0-9][-A-Za-z0-9_./]*"
    for term in (t.strip() for t in terms):
        if m := re.fullmatch(rf"({key_re})\s+(in|notin)\s+\(([^)]*)\)", term):
            reqs.append((m[1], m[2], frozenset(v.strip() for v in m[3].split(",") if v.strip())))
        elif m := re.fullmatch(rf"({key_re})\s*(!=|==|=)\s*([-A-Za-z0-9_.]*)", term):
            reqs.append((m[1], "!=" if m[2] == "!=" else "=", frozenset([m[3]])))
        elif m := re.fullmatch(rf"!\s*({key_re})", term):
            reqs.append((m[1], "!", frozenset()))
        elif re.fullmatch(key_re, term):
            reqs.append((term, "exists", frozenset()))
        else:
            raise ValueError(f"unable to parse requirement: {term!r}")
    return reqs


def selector_matches(reqs, labels: dict) -> bool:
    for key, op, values in reqs:
        present = key in labels
        if op == "=" and (not present or labels[key] not in values):
            return False
        if op == "!=" and present and labels[key] in values:
            return False
        if op == "in" and (not present or labels[key] not in values):
            return False
        if op == "notin" and present and labels[key] in values:
            return False
        if op == "exists" and not present:
            return False
        if op == "!" and present:
            return False
    return True


def label_selector_matches(selector: dict | None, labels: dict) -> bool:
    """A LabelSelector object (matchLabels/matchExpressions); {} selects everything."""
    selector = selector or {}
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], set(expr.get("values") or [])
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def merge_patch(target, patch):
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


# --------------------------------------------------------------------------- store
class Store:
    """Objects by (plural, namespace, name), one resourceVersion counter, an event history."""

    def __init__(self, history: int = 20000):
        self.cond = threading.Condition()
        self.rv = 0
        self.objects: dict[tuple[str, str, str], dict] = {}
        self.events: deque = deque()  # (rv, plural, ns, labels, line)
        self.history = history
        self.compacted = 0  # watches must start at or after this resourceVersion
        self.listeners: list = []  # fn(event_type, plural, obj), called after each write, outside the lock

    def _record(self, etype: str, plural: str, obj: dict) -> None:
        line = json.dumps({"type": etype, "object": obj}, separators=(",", ":")).encode() + b"\n"
        meta = obj["metadata"]
        self.events.append((self.rv, plural, meta.get("namespace"), meta.get("labels") or {}, line))
        while len(self.events) > self.history:
            self.compacted = self.events.popleft()[0]
        self.cond.notify_all()

    def _notify(self, etype: str, plural: str, obj: dict) -> None:
        for fn in list(self.listeners):
            try:
                fn(etype, plural, obj)
            except Exception:
                log.exception("store listener failed")

    def get(self, plural: str, ns: str, name: str) -> dict | None:
        with self.cond:
            obj = self.objects.get((plural, ns, name))
            return copy.deepcopy(obj) if obj is not None else None

    def list(self, plural: str, ns: str, reqs=()) -> tuple[list[dict], int]:
        with self.cond:
            items = [copy.deepcopy(o) for (p, n, _), o in self.objects.items()
                     if p == plural and n == ns and selector_matches(reqs, o["metadata"].get("labels") or {})]
            return items, self.rv

    def create(self, plural: str, ns: str, obj: dict) -> dict:
        kind, api_version, _ = KINDS[plural]
        name = obj["metadata"]["name"]
        with self.cond:
            if (plural, ns, name) in self.objects:
                raise ApiError(409, "AlreadyExists", f'{plural} "{name}" already exists')
            self.rv += 1
            obj = copy.deepcopy(obj)
            obj["kind"], obj["apiVersion"] = kind, api_version
            meta = obj["metadata"]
            meta.update(namespace=ns, uid=str(uuid.uuid4()), resourceVersion=str(self.rv),
                        creationTimestamp=now_iso(), generation=1)
            if plural == "pods":
                obj["status"] = {"phase": "Pending", "qosClass": "Burstable"}
            if plural == "secrets":
                data = dict(obj.get("data") or {})
                for k, v in (obj.pop("stringData", None) or {}).items():
                    data[k] = base64.b64encode(v.encode()).decode()
                obj["data"] = data
                obj.setdefault("type", "Opaque")
            self.objects[(plural, ns, name)] = obj
            self._record("ADDED", plural, obj)
            out = copy.deepcopy(obj)
        self._notify("ADDED", plural, out)
        return out

    def update(self, plural: str, ns: str, name: str, fn, uid: str | None = None) -> dict | None:
        """Change an object in place with fn(obj) (return False for no change); None if it is
        gone (or is another object of that name than `uid`)."""
        with self.cond:
            cur = self.objects.get((plural, ns, name))
            if cur is None or (uid is not None and cur["metadata"]["uid"] != uid):
                return None
            new = copy.deepcopy(cur)
            if fn(new) is False:
                return copy.deepcopy(cur)
            self.rv += 1
            new["metadata"]["resourceVersion"] = str(self.rv)
            self.objects[(plural, ns, name)] = new
            self._record("MODIFIED", plural, new)
            out = copy.deepcopy(new)
        self._notify("MODIFIED", plural, out)
        return out

    def remove(self, plural: str, ns: str, name: str, uid: str | None = None) -> dict | None:
        with self.cond:
            cur = self.objects.get((plural, ns, name))
            if cur is None or (uid is not None and cur["metadata"]["uid"] != uid):
                return None
            del self.objects[(plural, ns, name)]
            self.rv += 1
            cur["metadata"]["resourceVersion"] = str(self.rv)
            self._record("DELETED", plural, cur)
            owner_uid = cur["metadata"]["uid"]
            dependents = [(p, n, o["metadata"]["name"]) for (p, n, _), o in self.objects.items()
                          if n == ns and any(r.get("uid") == owner_uid
                                             for r in o["metadata"].get("ownerReferences") or [])]
            out = copy.deepcopy(cur)
        self._notify("DELETED", plural, out)
        for p, n, dep in dependents:  # the garbage collector, background propagation
            self.remove(p, n, dep)
        return out

    def compact(self) -> int:
        """Forget the whole history: watches from any earlier resourceVersion get 410."""
        with self.cond:
            self.events.clear()
            self.compacted = self.rv
            return self.rv


class Faults:
    """What the next requests will suffer (set through POST /_fake/faults)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.throttle = 0  # next N API requests (not watches) answer 429
        self.retry_after = 0
        self.errors = 0  # next N API requests answer `error_code`
        self.error_code = 500
        self.refuse_watches = 0  # next N watch requests answer 500
        self.slow_lists = 0.0  # the next list (not watch) is answered this many seconds after it was read
        self.cut_generation = 0  # bumping it cuts every open watch mid-event

    def take_slow_list(self) -> float:
        with self.lock:
            delay, self.slow_lists = self.slow_lists, 0.0
            return delay

    def take(self, watch: bool) -> ApiError | None:
        with self.lock:
            if watch:
                if self.refuse_watches > 0:
                    self.refuse_watches -= 1
                    return ApiError(500, "InternalError", "fake: watch refused")
                return None
            if self.throttle > 0:
                self.throttle -= 1
                return ApiError(429, "TooManyRequests", "fake: too many requests, please try again later",
                                {"Retry-After": str(self.retry_after)})
            if self.errors > 0:
                self.errors -= 1
                return ApiError(self.error_code, "InternalError", "fake: injected server error")
        return None


# --------------------------------------------------------------------------- server
class FakeApiServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def __init__(self, addr=("127.0.0.1", 0), *, token: str | None = None, bookmark_interval: float = 5.0,
                 validate: bool = True):
        self.store = Store()
        self.faults = Faults()
        self.token = token
        self.bookmark_interval = bookmark_interval
        self.validate = validate
        self.stats: Counter = Counter()
        self.stats_lock = threading.Lock()
        self.in_flight = 0
        self.kubelet = None
        self.open_watches = 0
        super().__init__(addr, Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def count(self, key: str, n: int = 1) -> None:
        with self.stats_lock:
            self.stats[key] += n

    def track(self, delta: int) -> None:
        with self.stats_lock:
            self.in_flight += delta
            self.stats["max_in_flight"] = max(self.stats["max_in_flight"], self.in_flight)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # else headers and body in two writes cost a delayed ACK (40 ms)
    server: FakeApiServer

    def log_message(self, fmt, *args):  # quiet
        log.debug("%s " + fmt, self.address_string(), *args)

    # ------------------------------------------------------------------ plumbing
    def _body(self) -> bytes:
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _json_body(self):
        raw = self._body()
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise ApiError(400, "BadRequest", "the request body is not JSON") from None

    def _send(self, code: int, obj, headers: dict | None = None) -> None:
        data = json.dumps(obj, separators=(",", ":")).encode()
        if getattr(self, "_answer_late", 0.0):  # a slow list: what it says may be stale when it lands
            time.sleep(self._answer_late)
            self._answer_late = 0.0
        self._untrack()  # the answer is done: the client may send its next request before we wrote it
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _untrack(self) -> None:
        if getattr(self, "_tracking", False):
            self._tracking = False
            self.server.track(-1)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def do_GET(self):
        self._dispatch("GET")

    def do_POST(self):
        self._dispatch("POST")

    def do_DELETE(self):
        self._dispatch("DELETE")

    def do_PATCH(self):
        self._dispatch("PATCH")

    def do_PUT(self):
        self._dispatch("PUT")

    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        srv = self.server
        try:
            if url.path.startswith("/_fake/"):
                return self._fake(method, url.path, query)
            if srv.token and self.headers.get("Authorization") != f"Bearer {srv.token}":
                self._body()
                raise ApiError(401, "Unauthorized", "Unauthorized")
            if url.path in ("/version", "/version/"):
                return self._send(200, {"major": "1", "minor": "31", "gitVersion": "v1.31.0-fake",
                                        "platform": "linux/amd64"})
            if url.path in ("/api", "/apis"):
                return self._send(200, {"kind": "APIVersions", "versions": ["v1"]} if url.path == "/api"
                                  else {"kind": "APIGroupList", "groups": []})
            m = ROUTE.match(url.path)
            if not m or m[3] not in KINDS or KINDS[m[3]][2] != m[1]:
                self._body()
                raise ApiError(404, "NotFound", f"the server could not find the requested resource ({url.path})")
            prefix, ns, plural, name = m.groups()
            watch = method == "GET" and name is None and query.get("watch") in ("true", "1")
            fault = srv.faults.take(watch)
            if fault is not None:
                self._body()
                srv.count(f"fault_{fault.code}")
                raise fault
            srv.count(f"{method} {plural}{'/name' if name else ''}{' watch' if watch else ''}")
            if watch:
                return self._watch(plural, ns, query)
            if method == "GET" and name is None:
                self._answer_late = srv.faults.take_slow_list()
            srv.track(+1)
            self._tracking = True
            try:
                self._resource(method, plural, ns, name, query)
            finally:
                self._untrack()
        except ApiError as e:
            self._send(e.code, e.status(), e.headers)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as e:  # a bug in the fake: say so, as a 500
            log.exception("fake apiserver: %s %s failed", method, self.path)
            try:
                self._send(500, ApiError(500, "InternalError", f"fake apiserver bug: {e}").status())
            except OSError:
                self.close_connection = True

    # ------------------------------------------------------------------ REST
    def _resource(self, method: str, plural: str, ns: str, name: str | None, query: dict) -> None:
        store = self.server.store
        if method == "GET" and name is None:
            self._body()
            if query.get("fieldSelector"):
                raise ApiError(400, "BadRequest", "fake: fieldSelector is not supported")
            try:
                reqs = parse_selector(query.get("labelSelector"))
            except ValueError as e:
                raise ApiError(400, "BadRequest", str(e)) from None
            items, rv = store.list(plural, ns, reqs)
            kind, api_version, _ = KINDS[plural]
            return self._send(200, {"kind": f"{kind}List", "apiVersion": api_version,
                                    "metadata": {"resourceVersion": str(rv)}, "items": items})
        if method == "GET":
            self._body()
            obj = store.get(plural, ns, name)
            if obj is None:
                raise ApiError(404, "NotFound", f'{plural} "{name}" not found')
            return self._send(200, obj)
        if method == "POST" and name is None:
            body = self._json_body()
            obj = self._validated(plural, ns, body)
            return self._send(201, store.create(plural, ns, obj))
        if method == "DELETE" and name is not None:
            body = self._json_body() or {}
            grace = query.get("gracePeriodSeconds", body.get("gracePeriodSeconds"))
            return self._send(200, self._delete(plural, ns, name, None if grace is None else int(grace)))
        if method == "PATCH" and name is not None:
            ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            body = self._json_body()
            if ctype not in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
                raise ApiError(415, "UnsupportedMediaType", f"fake: unsupported patch type {ctype!r}")
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "a merge patch must be a JSON object")
            if "metadata" in body and {"name", "namespace", "uid"} & set(body["metadata"] or {}):
                raise ApiError(422, "Invalid", "fake: metadata.name/namespace/uid cannot be patched")
            out = store.update(plural, ns, name, lambda o: o.update(merge_patch(o, body)))
            if out is None:
                raise ApiError(404, "NotFound", f'{plural} "{name}" not found')
            return self._send(200, out)
        self._body()
        raise ApiError(405, "MethodNotAllowed", f"fake: {method} is not supported here")

    def _validated(self, plural: str, ns: str, body) -> dict:
        kind, api_version, _ = KINDS[plural]
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body must be a JSON object")
        if body.get("kind") not in (None, kind) or body.get("apiVersion") not in (None, api_version):
            raise ApiError(400, "BadRequest", f"expected {api_version} {kind}, got {body.get('apiVersion')} "
                                              f"{body.get('kind')}")
        meta = body.get("metadata") or {}
        name = meta.get("name")
        if not isinstance(name, str) or len(name) > 253 or not DNS_SUBDOMAIN.match(name):
            raise ApiError(422, "Invalid", f'{kind} "{name}" is invalid: metadata.name: Invalid value: a '
                                           f"lowercase RFC 1123 subdomain must consist of lower case "
                                           f"alphanumeric characters, '-' or '.'")
        if meta.get("namespace") not in (None, ns):
            raise ApiError(400, "BadRequest", "the namespace of the object does not match the namespace on "
                                              "the request")
        for key in (meta.get("labels") or {}):
            if not re.fullmatch(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?",
                                key):
                raise ApiError(422, "Invalid", f"{kind} {name!r} is invalid: metadata.labels: invalid key {key!r}")
        if self.server.validate:
            import kubernetes_validate

            full = {**body, "kind": kind, "apiVersion": api_version}
            try:
                kubernetes_validate.validate(full, SCHEMA_VERSION, strict=True)
            except kubernetes_validate.ValidationError as e:
                first = str(e).split("\n", 1)[0]
                path = ".".join(str(p) for p in getattr(e, "path", ()) or ())
                raise ApiError(422, "Invalid", f'{kind} "{name}" is invalid: {path}: {first}') from None
        if plural == "pods":
            for c in (body["spec"].get("initContainers") or []) + body["spec"]["containers"]:
                for env in c.get("env") or []:
                    if not re.fullmatch(r"[-._a-zA-Z][-._a-zA-Z0-9]*", env.get("name", "")):
                        raise ApiError(422, "Invalid", f'Pod "{name}" is invalid: env name {env.get("name")!r}')
        return body

    def _delete(self, plural: str, ns: str, name: str, grace: int | None) -> dict:
        store, kubelet = self.server.store, self.server.kubelet
        obj = store.get(plural, ns, name)
        if obj is None:
            raise ApiError(404, "NotFound", f'{plural} "{name}" not found')
        if plural == "pods":
            if grace is None:
                grace = int(obj["spec"].get("terminationGracePeriodSeconds", 30))
            scheduled = bool(obj["spec"].get("nodeName"))
            finished = obj.get("status", {}).get("phase") in ("Succeeded", "Failed")
            if grace > 0 and scheduled and not finished and kubelet is not None:
                if obj["metadata"].get("deletionTimestamp"):
                    return obj

                def mark(o):
                    o["metadata"]["deletionTimestamp"] = now_iso()
                    o["metadata"]["deletionGracePeriodSeconds"] = grace

                return store.update(plural, ns, name, mark, uid=obj["metadata"]["uid"]) or obj
        gone = store.remove(plural, ns, name, uid=obj["metadata"]["uid"])
        return gone or obj

    # ------------------------------------------------------------------ watch
    def _watch(self, plural: str, ns: str, query: dict) -> None:
        srv, store = self.server, self.server.store
        self._body()
        try:
            reqs = parse_selector(query.get("labelSelector"))
        except ValueError as e:
            raise ApiError(400, "BadRequest", str(e)) from None
        rv_param = query.get("resourceVersion") or ""
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        timeout = float(query["timeoutSeconds"]) if query.get("timeoutSeconds") else 1800.0
        kind, api_version, _ = KINDS[plural]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        deadline = time.monotonic() + timeout
        generation = srv.faults.cut_generation
        with srv.stats_lock:
            srv.open_watches += 1
        try:
            with store.cond:
                if rv_param in ("", "0"):  # "most recent": the current state as ADDED events
                    position = store.rv
                    initial = [json.dumps({"type": "ADDED", "object": o}, separators=(",", ":")).encode() + b"\n"
                               for (p, n, _), o in store.objects.items()
                               if p == plural and n == ns and selector_matches(reqs, o["metadata"].get("labels") or {})]
                else:
                    try:
                        position = int(rv_param)
                    except ValueError:
                        raise ApiError(400, "BadRequest", f"invalid resourceVersion {rv_param!r}") from None
                    initial = []
                    if position < store.compacted:
                        initial = None
            if initial is None:
                srv.count("watch_410")
                gone = ApiError(410, "Expired", f"too old resource version: {position} ({store.compacted})")
                self._chunk(json.dumps({"type": "ERROR", "object": gone.status()}).encode() + b"\n")
                return self._chunk(b"")
            for line in initial:
                self._chunk(line)
            next_bookmark = time.monotonic() + srv.bookmark_interval
            while True:
                with store.cond:
                    while True:
                        if srv.faults.cut_generation != generation:
                            break
                        if store.rv > position:
                            break
                        now = time.monotonic()
                        wake = min(deadline, next_bookmark if bookmarks else deadline)
                        if now >= wake:
                            break
                        store.cond.wait(min(wake - now, 0.5))
                    if srv.faults.cut_generation != generation:
                        srv.count("watch_cut")
                        # half an event, then the connection dies: the client sees a broken stream
                        self._chunk(b'{"type":"MODIFIED","object":{"kind":"' + kind.encode())
                        self.close_connection = True
                        self.connection.shutdown(2)
                        return
                    if position < store.compacted:  # our next events were dropped from the history
                        srv.count("watch_410")
                        gone = ApiError(410, "Expired", f"too old resource version: {position} ({store.compacted})")
                        pending = [json.dumps({"type": "ERROR", "object": gone.status()}).encode() + b"\n"]
                        position = None
                    else:
                        pending = []
                        for rv, p, n, labels, line in reversed(store.events):
                            if rv <= position:
                                break
                            if p == plural and n == ns and selector_matches(reqs, labels):
                                pending.append(line)
                        pending.reverse()
                        position = store.rv
                for line in pending:
                    self._chunk(line)
                if position is None:
                    return self._chunk(b"")
                now = time.monotonic()
                if bookmarks and now >= next_bookmark:
                    srv.count("bookmarks")
                    self._chunk(json.dumps({"type": "BOOKMARK", "object": {
                        "kind": kind, "apiVersion": api_version,
                        "metadata": {"resourceVersion": str(position)}}}).encode() + b"\n")
                    next_bookmark = now + srv.bookmark_interval
                if now >= deadline:
                    return self._chunk(b"")
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True
        finally:
            with srv.stats_lock:
                srv.open_watches -= 1

    # ------------------------------------------------------------------ test controls
    def _fake(self, method: str, path: str, query: dict) -> None:
        srv = self.server
        body = self._json_body() or {}
        if path == "/_fake/faults" and method == "POST":
            f = srv.faults
            with f.lock:
                for key in ("throttle", "retry_after", "errors", "error_code", "refuse_watches"):
                    if key in body:
                        setattr(f, key, int(body[key]))
                if "slow_lists" in body:
                    f.slow_lists = float(body["slow_lists"])
                if body.get("cut_watches"):
                    f.cut_generation += 1
            with srv.store.cond:
                srv.store.cond.notify_all()
            compacted = srv.store.compact() if body.get("compact") else None
            return self._send(200, {"ok": True, "compacted": compacted})
        if path == "/_fake/stats" and method == "GET":
            with srv.stats_lock:
                stats = dict(srv.stats)
                stats["open_watches"] = srv.open_watches
                stats["in_flight"] = srv.in_flight
            stats["resource_version"] = srv.store.rv
            stats["objects"] = Counter(p for p, _, _ in list(srv.store.objects))
            if srv.kubelet is not None:
                stats["kubelet"] = srv.kubelet.stats()
            return self._send(200, stats)
        if path == "/_fake/ready_times" and method == "GET":  # the instant kubelet's pod name -> Ready time
            return self._send(200, dict(getattr(srv.kubelet, "ready_at", {})))
        if path == "/_fake/stats" and method == "DELETE":
            with srv.stats_lock:
                srv.stats.clear()
            return self._send(200, {"ok": True})
        m = re.fullmatch(r"/_fake/pods/([^/]+)/([^/]+)/fail", path)
        if m and method == "POST":  # what the kubelet does on eviction or a node failure
            reason, message = body.get("reason", "Evicted"), body.get("message", "fake: the pod was evicted")
            if srv.kubelet is not None and body.get("kill", True):
                srv.kubelet.kill_pod_containers(m[1], m[2])

            def fail(o):
                st = o.setdefault("status", {})
                st.update(phase="Failed", reason=reason, message=message)
                for c in st.get("conditions") or []:
                    if c["type"] in ("Ready", "ContainersReady"):
                        c["status"] = "False"

            out = srv.store.update("pods", m[1], m[2], fail)
            if out is None:
                raise ApiError(404, "NotFound", "no such pod")
            return self._send(200, out)
        raise ApiError(404, "NotFound", f"fake: no control route {method} {path}")
