"""Shared state in Redis, so several orchestrator replicas serve one pool of sandboxes.

Keys (under the prefix, `orchard` by default):

    P:sb:<id>         the sandbox record (JSON, never the agent token)
    P:sb-ids          set of sandbox ids
    P:beats           sorted set: sandbox id -> last heartbeat (unix time)
    P:job:<id>        a job (JSON), expiring `job_ttl` after its last write
    P:jobs-active     hash: unfinished job id -> replica running it
    P:lock:<name>     a lock: SET NX PX with a random token, renewed while held
    P:replica:<id>    a replica's liveness key (expires when it stops beating)
    P:leader          which replica runs the reconciler (a lease)
    P:ev:<key>        pub/sub channel: "something about <key> changed"

One pub/sub connection per replica listens to `P:ev:*` and wakes the local waiters.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from contextlib import asynccontextmanager

import redis.asyncio as aioredis
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential
from redis.exceptions import AuthenticationError, NoPermissionError, RedisError, ResponseError, WatchError
from redis.exceptions import ConnectionError as RedisConnectionError

from orchard_gym.models import SandboxRecord

from .settings import redact_url
from .store import Job, Store, StoreUnavailable, Updater

log = logging.getLogger("orchard_gym.service.redis")

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
_LEAD = """
local v = redis.call('GET', KEYS[1])
if not v then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end
if v == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end
return 0
"""


def _is_auth_error(e: Exception) -> bool:
    # over a unix socket redis-py reports NOAUTH as a plain ConnectionError
    text = str(e).lower()
    return isinstance(e, AuthenticationError) or "authentication required" in text or "noauth" in text


class RedisStore(Store):
    kind = "redis"

    def __init__(self, url: str, prefix: str = "orchard", **options):
        """`url`: redis://[user[:password]@]host[:port]/db, rediss://... (TLS) or
        unix://[[user]:password@]/path.sock?db=N; `options`: more `Redis.from_url` arguments
        (username, password, ssl_ca_certs)."""
        super().__init__()
        self.url, self.p = url, prefix
        self.r = aioredis.Redis.from_url(url, socket_connect_timeout=5, health_check_interval=30, **options)
        self._has_password = bool(options.get("password") or self.r.connection_pool.connection_kwargs.get("password"))
        self._renew = self.r.register_script(_RENEW)
        self._release = self.r.register_script(_RELEASE)
        self._lead = self.r.register_script(_LEAD)
        self._listener: asyncio.Task | None = None
        self._listening = asyncio.Event()

    def _k(self, *parts: str) -> str:
        return ":".join((self.p, *parts))

    # ----------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        await self.check()
        self._listener = asyncio.get_running_loop().create_task(self._listen())
        try:
            async with asyncio.timeout(10):
                await self._listening.wait()
        except TimeoutError:
            raise StoreUnavailable(f"Redis at {redact_url(self.url)}: pub/sub did not start within 10 s") from None

    async def _listen(self) -> None:
        """Relay pub/sub events to the waiters, forever; a lost connection is made again with
        backoff (reset once subscribed again)."""
        pattern, skip = self._k("ev", "*"), len(self._k("ev", ""))
        while True:
            pubsub = await self._subscribed(pattern)
            try:
                async for message in pubsub.listen():
                    if message and message.get("type") == "pmessage":
                        self.waiters.wake(message["channel"].decode()[skip:])
            except asyncio.CancelledError:
                raise
            except Exception as e:  # Redis went away: subscribe again
                log.warning("redis pub/sub connection lost (%s: %s); reconnecting", type(e).__name__, e)
            finally:
                await _close_quietly(pubsub)

    async def _subscribed(self, pattern: str):
        """A pub/sub connection subscribed to `pattern`; tries until Redis takes it, with backoff."""
        async for attempt in AsyncRetrying(retry=retry_if_exception_type(Exception),
                                           wait=wait_exponential(multiplier=0.1, max=5.0),
                                           before_sleep=_log_subscribe_failure):
            with attempt:
                pubsub = self.r.pubsub(ignore_subscribe_messages=True)
                try:
                    await pubsub.psubscribe(pattern)
                except BaseException:
                    await _close_quietly(pubsub)
                    raise
        self._listening.set()
        self.waiters.wake_all()  # events may have been missed while (re)connecting
        return pubsub

    async def check(self) -> None:
        """Connect, authenticate and touch our prefix now, so that a wrong password or an ACL
        that does not let us in stops the replica at start with a clear message, instead of
        failing requests later."""
        where = redact_url(self.url)
        how = ("in ORCHARD_REDIS_URL (redis://user:password@host:port/db) or ORCHARD_REDIS_PASSWORD "
               "(and ORCHARD_REDIS_USERNAME for an ACL user)")
        try:
            await self.r.ping()
            await self.r.exists(self._k("leader"))
            pubsub = self.r.pubsub()
            try:
                await pubsub.psubscribe(self._k("ev", "*"))
                await pubsub.get_message(timeout=5)  # the reply: an ACL without our channels says NOPERM
            finally:
                await pubsub.aclose()
        except (AuthenticationError, RedisConnectionError) as e:
            if not _is_auth_error(e):
                raise StoreUnavailable(f"cannot reach Redis at {where}: {type(e).__name__}: {e}") from None
            if self._has_password:
                raise StoreUnavailable(f"Redis at {where} refused our credentials ({e}); check them {how}") from None
            raise StoreUnavailable(f"Redis at {where} requires a password and none is set ({e}); set it {how}") from None
        except NoPermissionError as e:
            raise StoreUnavailable(f"Redis at {where} does not let this user use keys and channels under "
                                   f"{self.p + ':'!r} ({e}); fix its ACL or ORCHARD_REDIS_PREFIX") from None
        except ResponseError as e:
            raise StoreUnavailable(f"Redis at {where} refused the connection: {e}") from None
        except (RedisError, OSError) as e:
            raise StoreUnavailable(f"cannot reach Redis at {where}: {type(e).__name__}: {e}") from None

    async def ping(self) -> bool:
        try:
            return bool(await self.r.ping())
        except Exception:
            return False

    async def aclose(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            try:
                await self._listener
            except (asyncio.CancelledError, Exception):
                pass
        await self.r.aclose()

    # ----------------------------------------------------------------- sandboxes
    @staticmethod
    def _load(raw: bytes | None, beat) -> SandboxRecord | None:
        if raw is None:
            return None
        record = SandboxRecord.model_validate_json(raw)
        if beat is not None:
            record.last_heartbeat = float(beat)
        return record

    async def add_sandbox(self, record: SandboxRecord) -> bool:
        if not await self.r.set(self._k("sb", record.sandbox_id), record.model_dump_json(), nx=True):
            return False
        async with self.r.pipeline(transaction=True) as pipe:
            pipe.sadd(self._k("sb-ids"), record.sandbox_id)
            pipe.zadd(self._k("beats"), {record.sandbox_id: record.last_heartbeat})
            await pipe.execute()
        return True

    async def get_sandbox(self, sandbox_id: str) -> SandboxRecord | None:
        async with self.r.pipeline(transaction=False) as pipe:
            pipe.get(self._k("sb", sandbox_id))
            pipe.zscore(self._k("beats"), sandbox_id)
            raw, beat = await pipe.execute()
        return self._load(raw, beat)

    async def list_sandboxes(self) -> list[SandboxRecord]:
        ids = sorted(i.decode() for i in await self.r.smembers(self._k("sb-ids")))
        if not ids:
            return []
        async with self.r.pipeline(transaction=False) as pipe:
            pipe.mget([self._k("sb", i) for i in ids])
            pipe.zmscore(self._k("beats"), ids)
            raws, beats = await pipe.execute()
        return [r for r in (self._load(raw, beat) for raw, beat in zip(raws, beats)) if r is not None]

    async def update_sandbox(self, sandbox_id: str, fn: Updater) -> SandboxRecord | None:
        key = self._k("sb", sandbox_id)
        async with self.r.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(key)
                    raw = await pipe.get(key)
                    beat = await pipe.zscore(self._k("beats"), sandbox_id)
                    record = self._load(raw, beat)
                    if record is None or fn(record) is False:
                        await pipe.unwatch()
                        return record
                    pipe.multi()
                    pipe.set(key, record.model_dump_json())
                    await pipe.execute()
                    return record
                except WatchError:
                    continue  # someone else changed it meanwhile: read it again

    async def remove_sandbox(self, sandbox_id: str) -> bool:
        async with self.r.pipeline(transaction=True) as pipe:
            pipe.delete(self._k("sb", sandbox_id))
            pipe.srem(self._k("sb-ids"), sandbox_id)
            pipe.zrem(self._k("beats"), sandbox_id)
            deleted, _, _ = await pipe.execute()
        return bool(deleted)

    async def touch(self, sandbox_id: str, now: float | None = None) -> SandboxRecord | None:
        async with self.r.pipeline(transaction=False) as pipe:
            pipe.zadd(self._k("beats"), {sandbox_id: now or time.time()}, xx=True)
            pipe.get(self._k("sb", sandbox_id))
            pipe.zscore(self._k("beats"), sandbox_id)
            _, raw, beat = await pipe.execute()
        return self._load(raw, beat)

    async def expired(self, before: float) -> list[str]:
        return [i.decode() for i in await self.r.zrangebyscore(self._k("beats"), "-inf", f"({before}")]

    # ----------------------------------------------------------------- jobs
    async def put_job(self, job: Job, owner: str | None, ttl: float) -> None:
        async with self.r.pipeline(transaction=True) as pipe:
            pipe.set(self._k("job", job.job_id), job.model_dump_json(), px=int(ttl * 1000))
            if owner is None:
                pipe.hdel(self._k("jobs-active"), job.job_id)
            else:
                pipe.hset(self._k("jobs-active"), job.job_id, owner)
            await pipe.execute()

    async def get_job(self, job_id: str) -> Job | None:
        raw = await self.r.get(self._k("job", job_id))
        return None if raw is None else Job.model_validate_json(raw)

    async def active_jobs(self) -> dict[str, str]:
        return {k.decode(): v.decode() for k, v in (await self.r.hgetall(self._k("jobs-active"))).items()}

    async def forget_active_job(self, job_id: str) -> None:
        await self.r.hdel(self._k("jobs-active"), job_id)

    # ----------------------------------------------------------------- events
    async def notify(self, key: str) -> None:
        self.waiters.wake(key)  # this replica's waiters at once; the others through Redis
        await self.r.publish(self._k("ev", key), b"1")

    # ----------------------------------------------------------------- locks, replicas
    @asynccontextmanager
    async def lock(self, name: str, ttl: float):
        key, token, ms = self._k("lock", name), uuid.uuid4().hex, max(1, int(ttl * 1000))
        while True:
            async with self.waiter(f"lock:{name}") as waiter:
                if await self.r.set(key, token, nx=True, px=ms):
                    break
                # woken when the holder releases it; the timeout covers a holder that died
                await waiter.wait(min(ttl, 1.0))

        async def renew():
            while True:
                await asyncio.sleep(ttl / 3)
                try:
                    if not await self._renew(keys=[key], args=[token, ms]):
                        log.warning("lock %s was lost while held", name)
                        return
                except Exception as e:  # Redis blip: try again next period
                    log.warning("could not renew lock %s: %s", name, e)

        renewer = asyncio.get_running_loop().create_task(renew())
        try:
            yield
        finally:
            renewer.cancel()
            try:
                await asyncio.shield(self._release_and_notify(key, token, name))
            except Exception as e:
                log.warning("could not release lock %s (it expires in %.0fs): %s", name, ttl, e)

    async def _release_and_notify(self, key: str, token: str, name: str) -> None:
        await self._release(keys=[key], args=[token])
        await self.notify(f"lock:{name}")

    async def beat_replica(self, replica_id: str, ttl: float) -> None:
        await self.r.set(self._k("replica", replica_id), b"1", px=max(1, int(ttl * 1000)))

    async def replica_alive(self, replica_id: str) -> bool:
        return bool(await self.r.exists(self._k("replica", replica_id)))

    async def lead(self, replica_id: str, ttl: float) -> bool:
        return bool(await self._lead(keys=[self._k("leader")], args=[replica_id, max(1, int(ttl * 1000))]))


async def _close_quietly(pubsub) -> None:
    try:
        await pubsub.aclose()
    except Exception:
        pass


def _log_subscribe_failure(state: RetryCallState) -> None:
    e = state.outcome.exception() if state.outcome is not None else None
    log.warning("redis pub/sub: cannot subscribe (%s: %s); again in %.1fs", type(e).__name__, e,
                state.next_action.sleep if state.next_action is not None else 0.0)
