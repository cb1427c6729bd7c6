"""The orchestrator's jobs: the exec path of its control plane (`sandboxes.py`), with
per-sandbox serialisation and a global concurrency bound around the control's own run.

Commands on one sandbox run one at a time, in order (a lock in the store, so this holds
across replicas); commands on different sandboxes run in parallel up to
`exec_concurrency` on this replica, with up to `exec_queue` more waiting; beyond that a
request is refused with 503 (safe to retry). The command goes straight from this replica
to the sandbox's agent — no control plane on the hot path.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from orchard_gym.control import InProcessControl, job_from_result
from orchard_gym.errors import JobNotFound, SandboxTimeout, ServiceUnavailable
from orchard_gym.models import ExecEvent, ExecRequest, ExecResult, PatchResult

from .auth import OWNER_LABEL
from .errors import Conflict, job_error
from .settings import ServiceSettings
from .store import Job, Store


def job_key(job_id: str) -> str:
    return f"job:{job_id}"


class ExecManager:
    def __init__(self, settings: ServiceSettings, store: Store, control: InProcessControl, metrics=None):
        self.settings, self.store, self.control, self.metrics = settings, store, control, metrics
        self.replica = settings.replica_id
        self._slots = asyncio.Semaphore(settings.exec_concurrency)
        self.waiting = 0  # admitted, not yet running
        self.running = 0
        self._tasks: dict[str, asyncio.Task] = {}
        self._cancelled: set[str] = set()  # queued jobs cancelled before they started

    # ------------------------------------------------------------------ admission
    def _admit(self) -> None:
        if self.waiting + self.running >= self.settings.exec_concurrency + self.settings.exec_queue:
            if self.metrics is not None:
                self.metrics.rejected.inc()
            raise ServiceUnavailable(
                f"this orchestrator runs {self.running} commands with {self.waiting} waiting; retry later")

    @asynccontextmanager
    async def _turn(self, sandbox_id: str):
        """This sandbox's lock, then a global slot. The caller has been admitted."""
        counted = True
        try:
            async with self.store.lock(f"exec:{sandbox_id}", self.settings.lock_ttl):
                async with self._slots:
                    self.waiting -= 1
                    counted = False
                    self.running += 1
                    keepalive = asyncio.get_running_loop().create_task(self._keep_alive(sandbox_id))
                    try:
                        yield
                    finally:
                        self.running -= 1
                        keepalive.cancel()
        finally:
            if counted:
                self.waiting -= 1

    async def _keep_alive(self, sandbox_id: str) -> None:
        """A running command keeps its sandbox alive, however long it runs."""
        period = max(0.1, self.settings.sandbox_ttl / 3)
        while True:
            await asyncio.sleep(period)
            try:
                await self.store.touch(sandbox_id)
            except Exception:
                pass

    # ------------------------------------------------------------------ exec
    async def submit(self, sandbox_id: str, req: ExecRequest, wait: bool, wait_timeout: float) -> Job:
        record = await self.control.use(sandbox_id)
        key_owner = record.labels.get(OWNER_LABEL)  # the job is readable by whoever may see its sandbox
        self._admit()
        self.waiting += 1
        now = time.time()
        job_id = req.job_id or uuid.uuid4().hex
        # the agent runs it under the same id, so that a cancel (from any replica) finds it
        req = req.model_copy(update={"job_id": job_id})
        job = Job(job_id=job_id, sandbox_id=sandbox_id, command=req.command, status="queued",
                  created_at=now, key_owner=key_owner)
        try:
            if req.job_id in self._tasks or await self.store.get_job(job_id) is not None:
                raise Conflict(f"job {job_id} exists already: job ids must be unique")
            await self.store.put_job(job, self.replica, self.settings.job_ttl)
        except BaseException:
            self.waiting -= 1
            raise
        task = asyncio.get_running_loop().create_task(self._run(job, req))
        self._tasks[job.job_id] = task
        task.add_done_callback(lambda _: self._tasks.pop(job.job_id, None))
        if not wait:
            return job
        try:
            async with asyncio.timeout(wait_timeout):
                done, exc = await asyncio.shield(task)
        except TimeoutError:
            return await self.store.get_job(job.job_id) or job
        if exc is not None:
            raise exc  # the sandbox died, vanished, ...: the same typed error as in-process
        return done

    async def _run(self, job: Job, req: ExecRequest) -> tuple[Job, Exception | None]:
        exc: Exception | None = None
        sandbox_id = job.sandbox_id
        try:
            async with self._turn(sandbox_id):
                job.status, job.started_at = "running", time.time()
                if job.job_id in self._cancelled:  # as if killed at once: a result, not an error
                    done = job_from_result(sandbox_id, req, ExecResult(exit_code=-9, cancelled=True,
                                                                       job_id=job.job_id), job.started_at)
                else:
                    await self.store.put_job(job, self.replica, self.settings.job_ttl)
                    done = await self.control.run(sandbox_id, req)
            # our own result: no second validation, no dump (model_construct takes the fields as they are)
            job = Job.model_construct(**{**done.__dict__, "job_id": job.job_id, "created_at": job.created_at,
                                         "started_at": job.started_at, "key_owner": job.key_owner})
        except Exception as e:
            exc = e
            job.status, job.completed_at, job.error = "failed", time.time(), job_error(e)
        self._cancelled.discard(job.job_id)
        if self.metrics is not None:
            self.metrics.observe_job(job)
        try:
            await self.store.put_job(job, None, self.settings.job_ttl)
            await self.store.notify(job_key(job.job_id))
        except Exception:
            pass  # the store is down; the local waiter still gets the result
        return job, exc

    async def cancel(self, job_id: str) -> bool:
        """Kill a job: queued here, it never starts; running, its sandbox's agent kills it."""
        job = await self.get_job(job_id)
        if job.is_complete:
            return False
        if job_id in self._tasks:  # ours: if it has not reached its agent yet, it never will
            self._cancelled.add(job_id)
            if job.status == "queued":
                return True
        # 'running' is recorded just before the agent is called: give the agent a moment to have it
        deadline = time.monotonic() + 2.0
        while not await self.control.call(job.sandbox_id, "cancel", job_id):
            job = await self.get_job(job_id)
            if job.is_complete or time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    async def get_job(self, job_id: str) -> Job:
        job = await self.store.get_job(job_id)
        if job is None:
            raise JobNotFound(f"no job {job_id!r}")
        return job

    async def wait_job(self, job_id: str, timeout: float) -> Job:
        task = self._tasks.get(job_id)
        if task is not None:  # running here: wait on it directly
            try:
                async with asyncio.timeout(timeout):
                    return (await asyncio.shield(task))[0]
            except TimeoutError:
                raise SandboxTimeout(f"job {job_id} still running after {timeout:g}s") from None
        deadline = time.monotonic() + timeout
        async with self.store.waiter(job_key(job_id)) as waiter:
            while True:
                job = await self.get_job(job_id)
                if job.is_complete:
                    return job
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SandboxTimeout(f"job {job_id} still {job.status} after {timeout:g}s")
                await waiter.wait(left)

    async def fail_orphaned(self, job_id: str, owner: str) -> None:
        """A replica died while running this job: its outcome is unknown."""
        job = await self.store.get_job(job_id)
        if job is None or job.is_complete:
            if job is not None:
                await self.store.put_job(job, None, self.settings.job_ttl)  # clears it from the active set
            else:
                await self.store.forget_active_job(job_id)
            return
        job.status, job.completed_at = "failed", time.time()
        job.error = (f"AgentUnavailable: orchestrator replica {owner} stopped while the command ran; "
                     f"its outcome is unknown")
        await self.store.put_job(job, None, self.settings.job_ttl)
        await self.store.notify(job_key(job_id))

    # ------------------------------------------------------------------ stream, patch
    async def stream(self, sandbox_id: str, req: ExecRequest) -> AsyncIterator[ExecEvent]:
        """Checks happen now (so errors get their status code); the command runs when the
        returned iterator is consumed."""
        await self.control.use(sandbox_id)
        self._admit()

        async def events():
            started = time.monotonic()
            self.waiting += 1  # counted only once consumed: a stream never started holds nothing
            async with self._turn(sandbox_id):
                async for event in self.control.exec_stream(sandbox_id, req):
                    yield event
            if self.metrics is not None:
                self.metrics.exec_seconds.observe(time.monotonic() - started)

        return events()

    async def apply_patch(self, sandbox_id: str, patch: str, timeout: float, cwd: str | None) -> PatchResult:
        await self.control.use(sandbox_id)
        self._admit()
        self.waiting += 1
        async with self._turn(sandbox_id):
            return await self.control.call(sandbox_id, "apply_patch", patch, cwd, timeout)

    async def aclose(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

