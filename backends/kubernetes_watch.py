"""Watching sandbox pods: pod status helpers and `PodWatcher`, one LIST + WATCH of an owner's
sandbox pods in a thread (resourceVersion tracking, bookmarks, re-list on 410, reconnects
with backoff). See backends/kubernetes.py for the backend that uses it."""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import socket
import threading
import time
from collections import Counter, OrderedDict
from typing import Any, Protocol

from tenacity import RetryCallState, Retrying, retry_if_exception

from orchard_gym.errors import BackendError
from orchard_gym.retry import wait_backoff

from .kubernetes_errors import retry_after

try:
    from kubernetes.client.rest import ApiException
    from kubernetes.watch.watch import iter_resp_lines
except ImportError:  # pragma: no cover - the extra is missing
    pass



class WatchedBackend(Protocol):
    """What the watch needs of its backend (backends/kubernetes.py KubernetesBackend)."""

    namespace: str
    sandbox_label: str
    config: Any
    core: Any

    def _call(self, fn, *args, **kw) -> Any: ...
    def _after_first_sync(self) -> None: ...
    def _reap(self, sandbox_id: str) -> None: ...

log = logging.getLogger("orchard_gym.backends.kubernetes")

IMAGE_ERRORS = {"ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName", "ImageInspectError",
                "RegistryUnavailable"}
FATAL_WAITING = {"CreateContainerError", "CrashLoopBackOff", "RunContainerError", "PreCreateHookError",
                 "PostStartHookError"}
TOMBSTONES = 10_000  # failed sandboxes whose pods are gone, remembered until deleted (at most)


# --------------------------------------------------------------------------- pod status
def _conditions(pod: dict) -> dict[str, dict]:
    return {c.get("type"): c for c in (pod.get("status") or {}).get("conditions") or []}


def pod_status(pod: dict) -> tuple[str, str | None, str | None]:
    """(status, error, kind) of a sandbox from its pod: status is pending/running/failed/
    deleting; kind is "image" when the image cannot be pulled."""
    meta, st = pod.get("metadata") or {}, pod.get("status") or {}
    if meta.get("deletionTimestamp"):
        return "deleting", None, None
    phase = st.get("phase") or "Pending"
    inits, mains = st.get("initContainerStatuses") or [], st.get("containerStatuses") or []
    for cs in inits + mains:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason")
        if reason in IMAGE_ERRORS:
            return "failed", (f"image {cs.get('image')!r} of container {cs.get('name')} cannot be pulled "
                              f"({reason}: {waiting.get('message', '')})"), "image"
        if reason in FATAL_WAITING:
            return "failed", f"container {cs.get('name')}: {reason}: {waiting.get('message', '')}", None
    if phase in ("Failed", "Succeeded"):
        parts = [f"pod {phase.lower()}"]
        if st.get("reason"):
            parts.append(f"{st['reason']}: {st.get('message', '')}".rstrip(": "))
        for cs in inits + mains:
            term = (cs.get("state") or {}).get("terminated")
            if term and (term.get("exitCode") or cs in mains):
                parts.append(_terminated(cs.get("name"), term))
        return "failed", "; ".join(parts), None
    for cs in inits:
        term = (cs.get("state") or {}).get("terminated")
        if term and term.get("exitCode"):
            return "failed", "agent injection failed: " + _terminated(cs.get("name"), term), None
    for cs in mains:
        term = (cs.get("state") or {}).get("terminated")
        if term:
            return "failed", _terminated(cs.get("name"), term), None
    if phase == "Running":
        ready = _conditions(pod).get("Ready", {}).get("status") == "True"
        started = any(cs.get("started") for cs in mains)
        if ready or started:
            return "running", None, None
    return "pending", None, None


def _terminated(name: str | None, term: dict) -> str:
    text = f"container {name} terminated: {term.get('reason') or 'exited'} (exit code {term.get('exitCode')})"
    if term.get("reason") == "OOMKilled":
        text += " (killed for memory)"
    if term.get("message"):
        text += f": {term['message'].strip()[-400:]}"
    return text


def pod_is_ready(pod: dict) -> bool:
    return (_conditions(pod).get("Ready", {}).get("status") == "True"
            and bool((pod.get("status") or {}).get("podIP")) and not pod["metadata"].get("deletionTimestamp"))


def pod_summary(pod: dict | None) -> str:
    """What a pod is waiting for, in one line (for timeouts)."""
    if pod is None:
        return "its pod is not known yet"
    st = pod.get("status") or {}
    parts = [f"phase {st.get('phase', 'Pending')}"]
    for ctype, c in _conditions(pod).items():
        if c.get("status") != "True" and (c.get("reason") or c.get("message")):
            parts.append(f"{ctype}: {c.get('reason', '')} {c.get('message', '')}".strip())
    for cs in (st.get("initContainerStatuses") or []) + (st.get("containerStatuses") or []):
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting:
            parts.append(f"{cs.get('name')} waiting: {waiting.get('reason', '')} {waiting.get('message', '')}".strip())
    return "; ".join(parts)


# --------------------------------------------------------------------------- watcher
class PodWatcher:
    """One LIST + WATCH of the sandbox pods selected by `selector` in `namespace`.

    Runs in a thread (the client is sync) and keeps `pods` (sandbox id -> pod dict) in step
    with the cluster. Every change wakes the asyncio waiters of that sandbox on their own
    loops (call_soon_threadsafe); failures and deletions that orchard-gym did not ask for
    go to the `on_lost` listeners as (sandbox_id, reason).
    """

    def __init__(self, backend: WatchedBackend, selector: str):
        self.backend = backend
        self.selector = selector
        self.sandbox_label = backend.sandbox_label
        self.lock = threading.Lock()
        self.pods: dict[str, dict] = {}
        self.tombstones: OrderedDict[str, str] = OrderedDict()  # sandbox id -> why (pod gone, not by us)
        self.resource_version: str | None = None
        self.synced = threading.Event()
        self.stats: Counter = Counter()
        self._forgotten: OrderedDict[str, None] = OrderedDict()  # uids we deleted: their events are old news
        self._dead: OrderedDict[str, None] = OrderedDict()  # uids seen DELETED
        self._deleting: Counter = Counter()  # sandbox ids with a delete() in flight
        self._reported: OrderedDict[str, None] = OrderedDict()  # uids already reported lost
        self._waiters: dict[str, list] = {}
        self._listeners: list[tuple[asyncio.AbstractEventLoop | None, object]] = []
        self._stop = threading.Event()
        self._resp = None
        self._fresh_list = False
        self._first_synced = False
        self.last_error: str | None = None
        self._thread = threading.Thread(target=self._run, name=f"orchard-k8s-watch-{backend.namespace}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        retrying = Retrying(
            retry=retry_if_exception(lambda e: not isinstance(e, _Gone)),  # a 410 lists again at once
            wait=wait_backoff(0.1, 30.0, hint=retry_after),  # reset by every watch that ends well
            stop=lambda state: self._stop.is_set(),
            sleep=self._stop.wait,  # stop() cuts a wait short
            before_sleep=self._failed,
            reraise=True)
        while not self._stop.is_set():
            try:
                retrying(self._sync_and_watch)
            except _Gone as e:
                self.stats["gone"] += 1
                log.info("kubernetes watch: %s; listing again", e)
                self.resource_version = None
            except Exception:  # retrying gives up only once we are stopping
                if self._stop.is_set():
                    break

    def _sync_and_watch(self) -> None:
        if self.resource_version is None:
            self._relist()
            if not self._first_synced:
                self._first_synced = True
                self.backend._after_first_sync()
        self._watch_once()

    def _failed(self, state: RetryCallState) -> None:
        e = state.outcome.exception() if state.outcome is not None else None
        self.stats["errors"] += 1
        self.last_error = f"{type(e).__name__}: {e}"
        delay = state.next_action.sleep if state.next_action is not None else 0.0
        log.warning("kubernetes watch of %s failed (%s); again in %.1fs", self.backend.namespace,
                    self.last_error, delay)

    def _relist(self) -> None:
        b = self.backend
        # what we knew before asking: a pod our own create seeds while the list is on its way is
        # not in the answer, and must not be taken for one deleted while we were not watching
        with self.lock:
            before = dict(self.pods)
        data = b._call(b.core.list_namespaced_pod, b.namespace, label_selector=self.selector)
        self.stats["lists"] += 1
        items = {p["metadata"]["labels"][self.sandbox_label]: p for p in data.get("items") or []
                 if self.sandbox_label in (p["metadata"].get("labels") or {})}
        # what changed while we were not watching, as the events we missed
        for sid, pod in before.items():
            if sid not in items or items[sid]["metadata"]["uid"] != pod["metadata"]["uid"]:
                self._apply("DELETED", pod)
        for pod in items.values():
            self._apply("MODIFIED", pod)
        self.resource_version = data["metadata"]["resourceVersion"]
        self._fresh_list = True
        self.synced.set()

    def _watch_once(self) -> None:
        b = self.backend
        self.stats["watches"] += 1
        if not self._fresh_list:
            self.stats["resumes"] += 1  # from the last resourceVersion we saw, no list in between
        self._fresh_list = False
        timeout = b.config.watch_timeout
        try:
            resp = b.core.list_namespaced_pod(
                b.namespace, label_selector=self.selector, watch=True, resource_version=self.resource_version,
                allow_watch_bookmarks=True, timeout_seconds=timeout, _preload_content=False,
                _request_timeout=(min(10.0, b.config.api_timeout), timeout + 30))
        except ApiException as e:
            if e.status == 410:
                raise _Gone("the watch's resourceVersion is too old (HTTP 410)") from None
            raise
        self._resp = resp
        try:
            # stop() sets the flag, then shuts the answer it sees; we publish the answer, then read
            # the flag: a stop() between the request and here finds no answer to shut, so we look
            if self._stop.is_set():
                return
            for line in iter_resp_lines(resp):
                if self._stop.is_set():
                    return
                if not line.strip():
                    continue
                event = json.loads(line)
                etype, obj = event.get("type"), event.get("object") or {}
                if etype == "ERROR":
                    if obj.get("code") == 410:
                        raise _Gone(f"watch expired: {obj.get('message', '')}")
                    raise BackendError(f"watch error {obj.get('code')}: {obj.get('message', '')}")
                rv = (obj.get("metadata") or {}).get("resourceVersion")
                if etype == "BOOKMARK":
                    self.stats["bookmarks"] += 1
                elif etype in ("ADDED", "MODIFIED", "DELETED"):
                    self.stats["events"] += 1
                    self._apply(etype, obj)
                if rv:
                    self.resource_version = rv
        finally:
            self._resp = None
            resp.release_conn()

    # ------------------------------------------------------------------ the cache
    def _apply(self, etype: str, pod: dict) -> None:
        meta = pod.get("metadata") or {}
        sid, uid = (meta.get("labels") or {}).get(self.sandbox_label), meta.get("uid")
        if not sid or not uid:
            return
        lost = None
        with self.lock:
            if uid in self._forgotten:
                return
            cur = self.pods.get(sid)
            if etype == "DELETED":
                remember(self._dead, uid)
                if cur is not None and cur["metadata"]["uid"] != uid:
                    return  # an older pod of that name going away
                if self._deleting[sid]:
                    self.pods.pop(sid, None)
                    return
                self.pods.pop(sid, None)
                status, error, _ = pod_status(pod)
                reason = "its pod was deleted by someone else (not through orchard-gym)"
                if status == "failed" and error:
                    reason = f"{error}; then its pod was deleted"
                self.tombstones[sid] = reason
                self.tombstones.move_to_end(sid)
                while len(self.tombstones) > TOMBSTONES:
                    self.tombstones.popitem(last=False)
                if uid not in self._reported:
                    remember(self._reported, uid)
                    lost = reason
            else:
                if self._deleting[sid] and meta.get("deletionTimestamp"):
                    return
                self.pods[sid] = pod
                self.tombstones.pop(sid, None)
                status, error, _ = pod_status(pod)
                if status == "failed" and uid not in self._reported:
                    remember(self._reported, uid)
                    lost = error
            waiters = self._waiters.pop(sid, ())
        for loop, fut in waiters:
            _wake(loop, fut)
        if lost is not None:
            self.stats["lost"] += 1
            self._report(sid, lost)
            if etype == "DELETED":
                self.backend._reap(sid)

    def _report(self, sid: str, reason: str) -> None:
        for loop, fn in list(self._listeners):
            try:
                if loop is None:
                    fn(sid, reason)
                elif inspect.iscoroutinefunction(fn):
                    asyncio.run_coroutine_threadsafe(fn(sid, reason), loop)
                else:
                    loop.call_soon_threadsafe(fn, sid, reason)
            except RuntimeError:  # that loop is closed
                self._listeners.remove((loop, fn))
            except Exception:
                log.exception("on_lost listener failed")

    def seed(self, pod: dict) -> None:
        """Our own create's answer, so that get() knows the pod before the watch says so."""
        meta = pod["metadata"]
        sid, uid = meta["labels"][self.sandbox_label], meta["uid"]
        with self.lock:
            if uid in self._dead or uid in self._forgotten:
                return
            cur = self.pods.get(sid)
            if cur is None or cur["metadata"]["uid"] != uid:
                self.pods[sid] = pod
            self.tombstones.pop(sid, None)

    def lookup(self, sid: str) -> tuple[dict | None, str | None, bool]:
        """(pod, tombstone reason, a delete is in flight) of a sandbox."""
        with self.lock:
            return self.pods.get(sid), self.tombstones.get(sid), bool(self._deleting[sid])

    def snapshot(self) -> list[dict]:
        with self.lock:
            return [p for sid, p in self.pods.items() if not self._deleting[sid]]

    def begin_delete(self, sid: str) -> tuple[dict | None, bool]:
        with self.lock:
            self._deleting[sid] += 1
            pod = self.pods.pop(sid, None)
            if pod is not None:
                remember(self._forgotten, pod["metadata"]["uid"])
            tomb = self.tombstones.pop(sid, None) is not None
            waiters = self._waiters.pop(sid, ())
        for loop, fut in waiters:
            _wake(loop, fut)
        return pod, tomb

    def end_delete(self, sid: str, uid: str | None) -> None:
        with self.lock:
            if uid:
                remember(self._forgotten, uid)
                if self.pods.get(sid, {}).get("metadata", {}).get("uid") == uid:
                    self.pods.pop(sid, None)
            self._deleting[sid] -= 1
            if self._deleting[sid] <= 0:
                del self._deleting[sid]

    def waiter(self, sid: str) -> asyncio.Future:
        """A future completed at the next change of this sandbox's pod."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        with self.lock:
            self._waiters.setdefault(sid, []).append((loop, fut))
        return fut

    def drop_waiter(self, sid: str, fut: asyncio.Future) -> None:
        with self.lock:
            waiters = self._waiters.get(sid)
            if waiters:
                waiters[:] = [(lp, f) for lp, f in waiters if f is not fut]
                if not waiters:
                    del self._waiters[sid]

    def subscribe(self, fn) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        self._listeners.append((loop, fn))

    async def wait_synced(self, timeout: float) -> None:
        if self.synced.is_set():
            return
        deadline = time.monotonic() + timeout
        while not self.synced.is_set():
            if time.monotonic() > deadline:
                raise BackendError(f"the pod watch of namespace {self.backend.namespace} has not synced "
                                   f"({self.last_error or 'no answer yet'})")
            await asyncio.sleep(0.01)

    def stop(self) -> None:
        self._stop.set()
        resp = self._resp
        if resp is not None:  # unblock the read the thread sits in
            try:
                sock = getattr(getattr(resp, "connection", None), "sock", None) or getattr(resp, "_fp", None)
                if hasattr(sock, "shutdown"):
                    sock.shutdown(socket.SHUT_RDWR)
                else:
                    resp.close()
            except Exception:
                pass
        self._thread.join(5)


class _Gone(Exception):
    """The watch's resourceVersion is too old: list again."""


def remember(od: OrderedDict, key: str, limit: int = 50_000) -> None:
    od[key] = None
    od.move_to_end(key)
    while len(od) > limit:
        od.popitem(last=False)


def _wake(loop: asyncio.AbstractEventLoop, fut: asyncio.Future) -> None:
    def done():
        if not fut.done():
            fut.set_result(None)
    try:
        loop.call_soon_threadsafe(done)
    except RuntimeError:  # loop closed
        pass
