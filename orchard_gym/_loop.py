"""One background event loop per process, for the synchronous API."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """An asyncio loop on a daemon thread; `run(coro)` blocks until the coroutine ends.

    Sandboxes started from this thread die with the process (bubblewrap ties a sandbox
    to the thread that spawned it), so the thread lives as long as the process does.
    """

    _shared: LoopThread | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name="orchard-gym-loop", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    @classmethod
    def _forget(cls) -> None:
        cls._shared = None  # a forked child has the object but not the thread
        cls._lock = threading.Lock()

    @classmethod
    def shared(cls) -> LoopThread:
        with cls._lock:
            if cls._shared is None:
                cls._shared = cls()
            return cls._shared

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if threading.current_thread() is self._thread:
            raise RuntimeError("the sync API was called from its own event loop; use the async API there")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            if threading.current_thread() is threading.main_thread():
                return _result_interruptibly(future, timeout)
            return future.result(timeout)
        except BaseException:
            future.cancel()  # e.g. Ctrl-C in the caller: stop the work too
            raise


os.register_at_fork(after_in_child=LoopThread._forget)

# The kernel may hand Ctrl-C or SIGTERM to any thread (this loop's, a worker's); Python then only
# flags it for the main thread, which runs the handler when it next runs bytecode. Blocked on one
# future for a whole `orchard eval`, it would not until the run ended: it wakes this often instead.
SIGNAL_CHECK_SECONDS = 0.2


def _result_interruptibly(future: concurrent.futures.Future, timeout: float | None):
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        wait = SIGNAL_CHECK_SECONDS if deadline is None else min(SIGNAL_CHECK_SECONDS,
                                                                 max(0.0, deadline - time.monotonic()))
        try:
            return future.result(wait)
        except TimeoutError:
            if future.done():  # its own TimeoutError, or it finished just after this wait gave up
                return future.result()
            if deadline is not None and time.monotonic() >= deadline:
                raise  # the caller's timeout is up


async def run_in_thread(fn, *args):
    """Like asyncio.to_thread, but on a fresh thread, so it still works at interpreter
    exit, when the default executor refuses new work (exit cleanup needs it then)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(setter, value):
        if not future.done():
            setter(value)

    def hand_over(setter, value):
        try:
            loop.call_soon_threadsafe(settle, setter, value)
        except RuntimeError:  # the loop closed meanwhile (Ctrl-C, exit): nobody awaits the result
            pass

    def work():
        try:
            result = fn(*args)
        except BaseException as e:  # handed to the awaiting coroutine
            hand_over(future.set_exception, e)
        else:
            hand_over(future.set_result, result)

    threading.Thread(target=work, name="orchard-gym-io", daemon=True).start()
    return await future
