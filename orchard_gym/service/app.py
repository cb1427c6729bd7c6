"""The orchestrator's FastAPI app: settings -> backend, store, managers, reconciler.

    uvicorn 'orchard_gym.service.app:create_app' --factory   # or: orchard serve
"""

from __future__ import annotations

import asyncio
import logging
import time
import itertools
import secrets
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from orchard_gym import __version__
from orchard_gym.backends.config import parse_backend_config
from orchard_gym.errors import InvalidRequest, OrchardError

from .api import public, router
from .pty_route import router as pty_router
from .services import public as services_public
from .services import router as services_router
from .snapshots import router as snapshots_router
from .auth import KeyRing
from .errors import status_of
from .logs import request_id, setup_logging
from .metrics import Metrics
from .pools import ServicePools, sweep_left_behind
from .reconciler import Reconciler
from .sandboxes import ServiceControl
from .settings import ServiceSettings, is_loopback
from .store import MemoryStore, Store

log = logging.getLogger("orchard_gym.service")
access = logging.getLogger("orchard_gym.service.access")

_HTTP_ERROR_NAMES = {401: "AuthenticationError", 403: "AuthenticationError", 404: "NotFound",
                     405: "MethodNotAllowed", 408: "SandboxTimeout", 422: "InvalidRequest",
                     503: "ServiceUnavailable"}


@dataclass
class Service:
    """Everything one replica runs; `app.state.service`."""

    settings: ServiceSettings
    backend: object
    store: Store
    control: ServiceControl  # the SDK's control plane, its records in the store; the routes call it
    reconciler: Reconciler
    metrics: Metrics


def make_store(settings: ServiceSettings) -> Store:
    if settings.redis_url:
        from .redis_store import RedisStore

        return RedisStore(settings.redis_url, settings.redis_prefix, **settings.redis_options())
    return MemoryStore()


async def check_store(settings: ServiceSettings) -> None:
    """Fail now, with a clear message, if the shared store cannot be used."""
    store = make_store(settings)
    try:
        await store.start()
    finally:
        await store.aclose()


def make_backend(settings: ServiceSettings):
    return parse_backend_config(settings.backend_config_dict()).get_backend()


def create_app(settings: ServiceSettings | None = None, *, backend=None, store: Store | None = None) -> FastAPI:
    """The app for one replica. `backend`/`store` override what the settings would build."""
    settings = settings or ServiceSettings()
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        the_store = store or make_store(settings)
        await the_store.start()
        the_backend = backend or make_backend(settings)
        control = ServiceControl(settings, the_backend, the_store, metrics)
        reconciler = Reconciler(settings, the_backend, the_store, control, metrics)
        app.state.service = Service(settings, the_backend, the_store, control, reconciler, metrics)
        try:
            await reconciler.reconcile_once()  # adopt what a previous run left, before serving
        except Exception:
            log.exception("first reconciliation pass failed")
        reconciler.start()
        try:
            await sweep_left_behind(the_backend, the_store, settings.replica_id)
        except Exception:
            log.exception("could not sweep the pools of replicas that are gone")
        if settings.pools:
            control.pools = ServicePools(settings.pool_specs(), the_backend, the_store, settings.replica_id)
            await control.pools.start()
        log.info("orchestrator started", extra={"replica": settings.replica_id, "backend": the_backend.name,
                                                "store": the_store.kind})
        try:
            yield
        finally:
            if control.pools is not None:
                await control.pools.aclose()  # the idle ones; claimed ones live on as any other
            await reconciler.aclose()
            await control.aclose()
            await the_backend.aclose()  # sandboxes live on: a restarted replica adopts them
            await the_store.aclose()
            log.info("orchestrator stopped", extra={"replica": settings.replica_id})

    app = FastAPI(title="orchard-gym orchestrator", version=__version__, lifespan=lifespan,
                  description="Orchard-compatible sandbox API over any backend. "
                              "Send `X-API-Key` on every route but `/` and `/health`; a key sees only "
                              "the sandboxes it created (an admin key sees all).")
    app.state.settings = settings
    app.state.keyring = KeyRing(settings.api_keys, settings.admin_keys)
    app.state.metrics = metrics
    app.include_router(public)
    app.include_router(router)
    app.include_router(pty_router)  # authenticates itself: a WebSocket has no X-API-Key dependency
    app.include_router(services_router)
    app.include_router(snapshots_router)
    app.include_router(services_public)  # /s/{token}/...: the token is the credential
    _install_error_handlers(app)
    app.add_middleware(RequestContext, metrics=metrics)
    return app


def _error(status: int, name: str, detail, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"detail": detail, "error": name}, status_code=status, headers=headers)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        problems = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
                    for e in exc.errors()]
        return _error(422, "InvalidRequest", problems)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        return _error(exc.status_code, _HTTP_ERROR_NAMES.get(exc.status_code, "HTTPError"), exc.detail,
                      getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def any_error(request: Request, exc: Exception):
        status, name = status_of(exc)
        if status == 500:  # a bug: with the traceback
            log.error("request failed", exc_info=exc, extra={"path": request.url.path})
        elif status >= 500:  # an agent, backend or store that failed us
            log.warning("request failed", extra={"path": request.url.path, "error": f"{name}: {exc}"})
        headers = {"Retry-After": "1"} if status == 503 else None
        return _error(status, name, str(exc) or type(exc).__name__, headers)

    # Registered by class, these are answered inside the middleware stack (so the access log
    # and metrics see their status); anything else is a bug: a 500 from the outermost layer.
    for cls in (OrchardError, FileNotFoundError, *_store_errors()):
        app.add_exception_handler(cls, any_error)


def _store_errors() -> tuple[type[BaseException], ...]:
    try:
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import TimeoutError as RedisTimeout
    except ImportError:  # pragma: no cover
        return ()
    return (RedisConnectionError, RedisTimeout)


# request ids: unique per replica without a urandom syscall per request (uuid4 was 3% of a
# replica's CPU under load); the random prefix tells replicas and restarts apart
_RID_PREFIX = secrets.token_hex(4)
_rid_counter = itertools.count()


class RequestContext:
    """Request ids, one JSON access-log line per request, and the HTTP metrics."""

    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        rid = None
        for key, value in scope.get("headers", ()):
            if key == b"x-request-id":
                rid = value.decode("latin-1")[:64]
                break
        rid = rid or f"{_RID_PREFIX}{next(_rid_counter) & 0xFFFFFFFF:08x}"
        token = request_id.set(rid)
        status = 500
        started = time.perf_counter()

        async def send_with_id(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), (b"x-request-id", rid.encode("latin-1"))]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            elapsed = time.perf_counter() - started
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            method = scope.get("method", "")
            self.metrics.observe_request(method, route, str(status), elapsed)
            if access.isEnabledFor(logging.INFO):
                access.info("request", extra={"method": method, "path": scope.get("path"), "route": route,
                                              "status": status, "ms": round(elapsed * 1000, 3)})
            request_id.reset(token)


def serve(settings: ServiceSettings, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Run one replica with uvicorn (`orchard serve`)."""
    import uvicorn

    if not settings.auth_required and not is_loopback(host):
        raise InvalidRequest(f"refusing to serve on {host} without API keys: set ORCHARD_API_KEYS "
                             f"(comma-separated), or bind a loopback address such as 127.0.0.1")
    setup_logging(settings.log_level)
    if not settings.auth_required:
        log.warning("no API keys configured: every caller on this machine is trusted")
    if settings.redis_url:
        asyncio.run(check_store(settings))  # a wrong Redis password stops us here, not at the first request
    app = create_app(settings)
    # keep idle connections longer than clients do (httpx: 5 s; the SDK: 30 s), so a client never
    # sends on a connection the server is closing; uvloop and httptools when installed
    uvicorn.run(app, host=host, port=port, log_config=None, access_log=False, timeout_graceful_shutdown=5,
                timeout_keep_alive=75, backlog=4096, log_level=settings.log_level.lower())
