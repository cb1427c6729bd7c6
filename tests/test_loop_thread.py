"""orchard_gym._loop: the helpers that run blocking work off the event loop."""

from __future__ import annotations

import asyncio
import threading

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
