"""orchard_gym._loop: the helpers that run blocking work off the event loop."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from orchard_gym._loop import run_in_thread


def test_work_that_outlives_its_loop_ends_quietly():
    """Ctrl-C closes the loop while a create still runs in its thread: the thread's result has
    nobody to go to, and must not print 'Exception in thread ... Event loop is closed'."""
    release, finished = threading.Event(), threading.Event()
    crashes: list[BaseException] = []
    previous = threading.excepthook
    threading.excepthook = lambda args: crashes.append(args.exc_value)

    def slow():
        release.wait(10)
        finished.set()
        return 1

    async def start():
        task = asyncio.ensure_future(run_in_thread(slow))
        await asyncio.sleep(0.05)
        task.cancel()

    try:
        loop = asyncio.new_event_loop()
        loop.run_until_complete(start())
        loop.close()
        release.set()
        assert finished.wait(10)
        for t in threading.enumerate():
            if t.name == "orchard-gym-io":
                t.join(10)
    finally:
        threading.excepthook = previous
    assert crashes == []


def test_results_and_errors_reach_the_awaiting_coroutine():
    async def both():
        ok = await run_in_thread(lambda: 7)
        try:
            await run_in_thread(lambda: 1 / 0)
        except ZeroDivisionError as e:
            return ok, e
        raise AssertionError("the error was lost")

    ok, err = asyncio.run(both())
    assert ok == 7 and isinstance(err, ZeroDivisionError)


CTRL_C_CHILD = """
import asyncio, sys, threading
from orchard_gym._loop import LoopThread
loop = LoopThread.shared()
print(loop._thread.native_id, flush=True)
try:
    loop.run(asyncio.sleep(60))
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(130)
"""


def test_ctrl_c_the_kernel_hands_to_the_loop_thread_interrupts_the_blocked_caller():
    """The kernel may deliver a process's SIGINT to any thread. Taken by the loop thread, it only
    flags the main thread, which sat in `future.result()` until the whole call ended: Ctrl-C on
    `orchard eval` did nothing for the rest of the run."""
    import signal
    import subprocess
    import sys

    from conftest import tgkill

    p = subprocess.Popen([sys.executable, "-c", CTRL_C_CHILD], stdout=subprocess.PIPE, text=True)
    try:
        loop_tid = int(p.stdout.readline())
        time.sleep(0.3)  # into loop.run(): a signal before it would end the child the same way
        tgkill(p.pid, loop_tid, signal.SIGINT)
        assert p.wait(20) == 130
        assert "interrupted" in p.stdout.read()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)


def test_a_timeout_of_the_caller_and_the_coroutines_own_timeouterror_stay_apart():
    from orchard_gym._loop import LoopThread

    async def raises():
        raise TimeoutError("the coroutine's own")

    loop = LoopThread.shared()
    with pytest.raises(TimeoutError, match="the coroutine's own"):
        loop.run(raises())
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        loop.run(asyncio.sleep(5), timeout=0.5)
    assert time.monotonic() - started < 4  # the caller's timeout, not the sleep's end


def test_a_result_that_lands_just_after_a_wait_gave_up_is_returned():
    """The main thread waits in 0.2 s slices (to run signal handlers); a call that finished right
    after a slice timed out was reported as that slice's TimeoutError (a GUI reset failed so in a
    CI run). The future here completes exactly in that window."""
    import concurrent.futures

    from orchard_gym._loop import _result_interruptibly

    class LateFuture(concurrent.futures.Future):
        def result(self, timeout=None):
            if timeout is not None and not self.done():
                self.set_result("the call's result")  # done now, but this wait already timed out
                raise concurrent.futures.TimeoutError()
            return super().result(timeout)

    assert _result_interruptibly(LateFuture(), None) == "the call's result"
    assert _result_interruptibly(LateFuture(), 5.0) == "the call's result"
