"""Warm pools: ready sandboxes per spec, claimed in O(1), refilled in the background.

    async with AsyncSandboxClient({"type": "docker"}, pool={"localhost/orchard/bookworm": 8}) as client:
        box = await client.create_sandbox(image="localhost/orchard/bookworm")   # a warm one, if any

A claim pops the oldest ready sandbox (no await between the pop and the hand-out, so
racing claims never share one), checks that it is still alive (a dead one is deleted,
replaced and never handed out) and starts a refill. A claimed sandbox is the caller's:
it is deleted as any other, never returned to the pool. An empty pool (or a spec no
pool matches) means the caller creates one as usual.

What must match (`match_key`): image ('host' and None are the same), cpu, memory (as
bytes), block_network and env (exactly: the backends bake it into the agent's process).
A spec with its own `sandbox_id`, `labels` or `from_snapshot` never matches (all are fixed when the
backend creates the sandbox); `timeout` is ignored (a warm sandbox is ready already).

`WarmPool` knows nothing of backends: a `PoolProvider` creates, checks and deletes (the
SDK's: `ControlProvider` here; the orchestrator's: `service/pools.py`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any, Protocol

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .errors import InvalidRequest, SandboxNotFound
from .models import HOST_IMAGES, Cpu, Memory, SandboxRecord, SandboxSpec

log = logging.getLogger("orchard_gym.pool")
MAX_POOL_SIZE = 1000
MAX_BACKOFF = 30.0


class PoolSpec(BaseModel):
    """One pool: `size` ready sandboxes of this spec."""

    model_config = ConfigDict(extra="forbid")

    image: str | None = Field(None, description="the image; None or 'host' on the local backend")
    size: int = Field(..., ge=0, le=MAX_POOL_SIZE, description="ready sandboxes to keep")
    cpu: Cpu | None = None
    memory: Memory | None = None
    block_network: bool = True
    env: dict[str, str] = Field(default_factory=dict)
    parallel: int = Field(4, ge=1, le=64, description="sandboxes created at once while refilling")
    timeout: float = Field(120.0, gt=0, le=86400, allow_inf_nan=False, description="seconds one may take to be ready")

    @field_validator("size", "parallel", mode="before")
    @classmethod
    def _whole(cls, v):
        if isinstance(v, bool) or (isinstance(v, float) and not (math.isfinite(v) and v.is_integer())):
            raise ValueError("must be a whole number")
        return v

    def sandbox_spec(self, labels: dict[str, str] | None = None) -> SandboxSpec:
        return SandboxSpec(image=self.image, cpu=self.cpu, memory=self.memory, block_network=self.block_network,
                           env=self.env, timeout=self.timeout, labels=labels or {})

    def key(self) -> tuple:
        return match_key(self.sandbox_spec())


def match_key(spec: SandboxSpec) -> tuple | None:
    """What a spec must share with a pool's to be served from it; None: never pooled (a pooled
    sandbox has no services, and a disk limit is set at create: a spec with one never takes a
    pooled sandbox made without)."""
    if (spec.sandbox_id is not None or spec.labels or spec.from_snapshot is not None or spec.services
            or spec.disk is not None):
        return None
    image = None if spec.image in HOST_IMAGES else spec.image
    return image, spec.cpu, spec.memory_bytes, spec.block_network, tuple(sorted(spec.env.items()))


def _problems(e: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, err['loc'])) or 'value'}: {err['msg']}" for err in e.errors())


def parse_pools(value: Any) -> list[PoolSpec]:
    """`{"image": n}`, `{"image": {"size": n, "cpu": 1, ...}}`, a PoolSpec, or a list of
    PoolSpecs/dicts (with "image") -> pool specs. Raises InvalidRequest on anything else."""
    if value is None:
        return []
    if isinstance(value, PoolSpec):
        items: Iterable = [value]
    elif isinstance(value, dict):
        items = []
        for image, v in value.items():
            if image is not None and not isinstance(image, str):
                raise InvalidRequest(f"pool: an image name is a string (or None), not {image!r}")
            items.append({"image": image, **v} if isinstance(v, dict) else {"image": image, "size": v})
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        raise InvalidRequest(f"pool must be a dict {{image: size}}, a PoolSpec or a list of them, not {value!r}")
    specs, seen = [], set()
    for item in items:
        if isinstance(item, PoolSpec):
            spec = item
        elif isinstance(item, dict):
            try:
                spec = PoolSpec(**item)
            except ValidationError as e:
                raise InvalidRequest(f"pool {item.get('image')!r}: {_problems(e)}") from None
            except TypeError as e:  # a non-string key
                raise InvalidRequest(f"pool {item.get('image')!r}: {e}") from None
        else:
            raise InvalidRequest(f"pool: each entry is a dict or a PoolSpec, not {item!r}")
        try:
            key = spec.key()
        except ValidationError as e:  # env the sandbox spec refuses (reserved names)
            raise InvalidRequest(f"pool {spec.image!r}: {_problems(e)}") from None
        if key in seen:
            raise InvalidRequest(f"pool {spec.image!r}: two pools with the same spec")
        seen.add(key)
        specs.append(spec)
    return specs


def parse_pool_option(text: str) -> PoolSpec:
    """`IMAGE=N[,cpu=C][,memory=M][,network=on|off][,parallel=P]` (`orchard serve --pool`)."""
    head, *rest = text.split(",")
    image, sep, size = head.rpartition("=")
    if not sep or not image:
        raise InvalidRequest(f"pool {text!r}: expected IMAGE=N[,cpu=..,memory=..,network=on|off,parallel=..]")
    fields: dict[str, Any] = {"image": None if image in HOST_IMAGES else image, "size": _int(size, text, "N")}
    for part in rest:
        name, sep, v = part.partition("=")
        name = name.strip()
        if not sep:
            raise InvalidRequest(f"pool {text!r}: {part!r} is not KEY=VALUE")
        if name == "cpu":
            fields["cpu"] = v
        elif name == "memory":
            fields["memory"] = v
        elif name == "parallel":
            fields["parallel"] = _int(v, text, "parallel")
        elif name == "network":
            if v not in ("on", "off"):
                raise InvalidRequest(f"pool {text!r}: network is on or off, not {v!r}")
            fields["block_network"] = v == "off"
        else:
            raise InvalidRequest(f"pool {text!r}: unknown key {name!r} (known: cpu, memory, network, parallel)")
    return parse_pools([fields])[0]


def _int(v: str, text: str, what: str) -> int:
    try:
        return int(v)
    except ValueError:
        raise InvalidRequest(f"pool {text!r}: {what} must be a whole number, not {v!r}") from None


class PoolProvider(Protocol):
    async def create(self, spec: SandboxSpec) -> SandboxRecord:
        """A new sandbox of `spec`, ready (its agent answers)."""

    async def alive(self, record: SandboxRecord) -> bool:
        """Whether it can still be handed out (and, where idle ones expire, keep it alive)."""

    async def delete(self, sandbox_id: str) -> None: ...


class ControlProvider:
    """The SDK's provider: a SandboxControl (in-process backend or orchestrator)."""

    def __init__(self, control):
        self.control = control

    async def create(self, spec: SandboxSpec) -> SandboxRecord:
        return await self.control.create(spec, True, spec.timeout)

    async def alive(self, record: SandboxRecord) -> bool:
        try:
            return (await self.control.get(record.sandbox_id)).status == "running"
        except SandboxNotFound:
            return False

    async def refresh(self, record: SandboxRecord) -> bool:
        """The watcher's check: also a heartbeat, as an orchestrator reaps idle sandboxes."""
        try:
            await self.control.heartbeat(record.sandbox_id)
        except SandboxNotFound:
            return False
        return await self.alive(record)

    async def delete(self, sandbox_id: str) -> None:
        try:
            await self.control.delete(sandbox_id)
        except SandboxNotFound:
            pass


class WarmPool:
    """Keeps `spec.size` ready sandboxes; see the module docstring."""

    def __init__(self, spec: PoolSpec, provider: PoolProvider, labels: dict[str, str] | None = None,
                 check_interval: float = 5.0):
        self.spec, self.provider, self.check_interval = spec, provider, check_interval
        self._sandbox_spec = spec.sandbox_spec(labels)
        self._idle: OrderedDict[str, SandboxRecord] = OrderedDict()
        self._creating = 0
        self._tasks: set[asyncio.Task] = set()
        self._changed = asyncio.Event()
        self._closed = False
        self._closed_event = asyncio.Event()
        self._monitor: asyncio.Task | None = None
        self.counts = {"created": 0, "claimed": 0, "missed": 0, "replaced": 0, "failed_creates": 0}
        self.last_error: str | None = None

    # ------------------------------------------------------------------ claiming
    async def claim(self) -> SandboxRecord | None:
        """A ready sandbox, now the caller's; None when none is ready."""
        self.start()
        while self._idle:
            _, record = self._idle.popitem(last=False)  # popped before any await: never handed out twice
            self._refill()
            if await self._alive(record):
                self.counts["claimed"] += 1
                return record
            self._replace(record)
        self.counts["missed"] += 1
        return None

    async def _alive(self, record: SandboxRecord, refresh: bool = False) -> bool:
        check = getattr(self.provider, "refresh", self.provider.alive) if refresh else self.provider.alive
        try:
            return await check(record)
        except Exception as e:  # an engine hiccup: hand out nothing we are unsure of
            log.warning("pool liveness check failed", extra={"sandbox_id": record.sandbox_id, "error": str(e)})
            return False

    def _replace(self, record: SandboxRecord) -> None:
        """A dead idle sandbox: delete it (in the background) and refill."""
        self.counts["replaced"] += 1
        log.warning("pooled sandbox died; replacing it", extra={"sandbox_id": record.sandbox_id})
        self._spawn(self._delete(record.sandbox_id))
        self._refill()

    # ------------------------------------------------------------------ filling
    def start(self) -> None:
        """Begin filling (needs a running event loop); idempotent."""
        if self._monitor is None and not self._closed:
            self._monitor = asyncio.get_running_loop().create_task(self._watch(), name=f"pool-watch {self.spec.image}")
            self._refill()

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _refill(self) -> None:
        if self._closed:
            return
        while len(self._idle) + self._creating < self.spec.size and self._creating < self.spec.parallel:
            self._creating += 1
            self._spawn(self._create_one())

    async def _create_one(self) -> None:
        record: SandboxRecord | None = None
        try:
            if self._closed:
                return
            try:  # a failed create is tried again after a doubling wait; claims meanwhile create as usual
                async for attempt in AsyncRetrying(retry=retry_if_exception_type(Exception),
                                                   wait=wait_exponential(multiplier=0.5, max=MAX_BACKOFF),
                                                   stop=lambda state: self._closed, sleep=self._nap,
                                                   after=self._create_failed, reraise=True):
                    with attempt:
                        record = await self.provider.create(self._sandbox_spec)
            except Exception:  # the pool closed while creates were failing
                return
            assert record is not None
            self.counts["created"] += 1
            if self._closed:
                await self._delete(record.sandbox_id)
                return
            self._idle[record.sandbox_id] = record
        finally:
            self._creating -= 1
            self._changed.set()
            if not self._closed:
                self._refill()  # the next one (at most `parallel` at once)

    def _create_failed(self, state: RetryCallState) -> None:
        e = state.outcome.exception() if state.outcome is not None else None
        self.counts["failed_creates"] += 1
        self.last_error = f"{type(e).__name__}: {e}"
        log.warning("pool could not create a sandbox", extra={"image": self.spec.image, "error": self.last_error})

    async def _nap(self, seconds: float) -> None:
        """A backoff wait, cut short by close()."""
        try:
            await asyncio.wait_for(self._closed_event.wait(), seconds)
        except TimeoutError:
            pass

    async def _watch(self) -> None:
        """Every check_interval: replace idle sandboxes that died (and keep remote ones alive)."""
        while not self._closed:
            await asyncio.sleep(self.check_interval)
            for sandbox_id, record in list(self._idle.items()):
                if not await self._alive(record, refresh=True) and self._idle.pop(sandbox_id, None) is not None:
                    self._replace(record)

    async def _delete(self, sandbox_id: str) -> None:
        try:
            await self.provider.delete(sandbox_id)
        except Exception as e:
            log.warning("pool could not delete a sandbox", extra={"sandbox_id": sandbox_id, "error": str(e)})

    # ------------------------------------------------------------------ state, closing
    def idle_ids(self) -> list[str]:
        return list(self._idle)

    def stats(self) -> dict:
        return {"image": self.spec.image, "size": self.spec.size, "ready": len(self._idle),
                "creating": self._creating, **self.counts, "last_error": self.last_error}

    async def wait_full(self, timeout: float) -> bool:
        """Wait until `size` sandboxes are ready; False on timeout."""
        self.start()
        deadline = time.monotonic() + timeout
        while len(self._idle) < self.spec.size:
            left = deadline - time.monotonic()
            if left <= 0 or self._closed:
                return False
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                return False
        return True

    async def aclose(self) -> None:
        """Stop refilling, let creations in flight finish (then delete them), delete the idle."""
        self._closed = True
        self._closed_event.set()
        self._changed.set()
        if self._monitor is not None:
            self._monitor.cancel()
            await asyncio.gather(self._monitor, return_exceptions=True)
        while self._tasks:  # creations are not cancelled (a half-made container would leak)
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        idle, self._idle = list(self._idle), OrderedDict()
        await asyncio.gather(*(self._delete(i) for i in idle))


class PoolSet:
    """The pools of one client or orchestrator, by match key."""

    def __init__(self, specs: list[PoolSpec], provider: PoolProvider, labels: dict[str, str] | None = None):
        self.pools = {spec.key(): WarmPool(spec, provider, labels) for spec in specs}

    def __bool__(self) -> bool:
        return bool(self.pools)

    def start(self) -> None:
        for pool in self.pools.values():
            pool.start()

    def find(self, spec: SandboxSpec) -> WarmPool | None:
        key = match_key(spec)
        return None if key is None else self.pools.get(key)

    async def claim(self, spec: SandboxSpec) -> SandboxRecord | None:
        pool = self.find(spec)
        return None if pool is None else await pool.claim()

    async def wait_full(self, timeout: float) -> bool:
        results = await asyncio.gather(*(p.wait_full(timeout) for p in self.pools.values()))
        return all(results)

    def idle_ids(self) -> list[str]:
        return [i for pool in self.pools.values() for i in pool.idle_ids()]

    def stats(self) -> list[dict]:
        return [pool.stats() for pool in self.pools.values()]

    async def aclose(self) -> None:
        await asyncio.gather(*(pool.aclose() for pool in self.pools.values()))
