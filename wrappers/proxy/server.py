"""The recording proxy: OpenAI-compatible model endpoints per rollout, recorded.

    orchard proxy --port 8100 --upstream http://localhost:8000/v1     # upstream mode

A harness gets `base_url = http://PROXY/r/<rollout_id>/v1` and `api_key = <rollout token>`
and calls `/chat/completions` (streaming or not, tools, tool_choice), `/responses` or
`/models` there. In **upstream** mode the proxy forwards each call to an OpenAI-compatible
server and records request, response, token ids and logprobs (when the upstream returns
them), usage and timings. In **policy** mode the call is parked until the trainer/eval
loop answers it (`RolloutStore.next_call` / `respond`, or the control API's
`/rollouts/{id}/next` and `/respond`): that is how `HarnessEnv` turns a harness into an env.

The control API (`/rollouts...`, `/export`) needs the admin key; model endpoints need the
rollout's own token, so a sandbox can neither read nor write another rollout's records.
When the proxy also listens on a unix socket (`uds`), that socket serves only the model
endpoints and `/health`: it is what sandboxes reach (see `wrappers/proxy/relay.py`).
See docs/recording.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import threading

from .app import create_app
from .models import Answer, FinishRollout, OpenRollout, ProxyConfig
from .records import RolloutStore

__all__ = ["Answer", "FinishRollout", "OpenRollout", "ProxyConfig", "RecordingProxy", "create_app",
           "default_socket_dir", "serve"]

log = logging.getLogger("orchard_gym.proxy")


# ---------------------------------------------------------------------------- running it
def _quiet_server(config):
    """uvicorn's Server without its signal handlers (the proxy runs inside other programs)."""
    import uvicorn

    class Quiet(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):
            yield

    return Quiet(config)


def default_socket_dir() -> str:
    """Where proxies put their unix sockets: a folder local sandboxes see (not under /tmp,
    which each sandbox gets privately)."""
    from orchard_gym.envs.swe.venvs import cache_root

    return str(cache_root() / "run")


class RecordingProxy:
    """The proxy as an object: start it in a running event loop (`await proxy.start()`),
    or on a thread of its own (`proxy.start_in_thread()`), then use `proxy.store` (same
    loop only) or the HTTP API at `proxy.url`.

    >>> import httpx
    >>> proxy = RecordingProxy(ProxyConfig(upstream="http://127.0.0.1:9/v1")).start_in_thread()
    >>> admin = {"Authorization": f"Bearer {proxy.admin_key}"}
    >>> rollout = httpx.post(f"{proxy.url}/rollouts", json={}, headers=admin).json()
    >>> rollout["base_url"] == f"{proxy.url}/r/{rollout['rollout_id']}/v1"
    True
    >>> proxy.stop_in_thread()
    """

    def __init__(self, config: ProxyConfig | None = None, store: RolloutStore | None = None):
        self.app = create_app(config, store)
        self.config: ProxyConfig = self.app.state.config
        self.store: RolloutStore = self.app.state.store
        self._server = None
        self._task: asyncio.Task | None = None
        self._thread: threading.Thread | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.port: int | None = None

    @property
    def admin_key(self) -> str:
        return self.config.admin_key

    @property
    def uds(self) -> str | None:
        return self.config.uds

    @property
    def url(self) -> str:
        return self.config.public_url or f"http://{self.config.host}:{self.port}"

    def rollout_url(self, rollout_id: str) -> str:
        return f"{self.url}/r/{rollout_id}/v1"

    def _sockets(self) -> list[socket.socket]:
        family = socket.AF_INET6 if ":" in self.config.host else socket.AF_INET
        # proto=IPPROTO_TCP, so asyncio sets TCP_NODELAY on accepted connections (it checks
        # sock.proto): without it, Nagle + delayed ACKs add ~40 ms to keep-alive calls
        tcp = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        tcp.bind((self.config.host, self.config.port))
        self.port = tcp.getsockname()[1]
        sockets = [tcp]
        if self.config.uds:
            os.makedirs(os.path.dirname(self.config.uds) or ".", mode=0o700, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.config.uds)
            unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            unix.bind(self.config.uds)
            os.chmod(self.config.uds, 0o600)
            sockets.append(unix)
        for s in sockets:
            s.listen(2048)
            s.setblocking(False)
        return sockets

    async def start(self) -> RecordingProxy:
        import uvicorn

        if self._task is not None:
            return self
        sockets = self._sockets()
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="on",
                                timeout_graceful_shutdown=2, timeout_keep_alive=30, backlog=2048)
        self._server = _quiet_server(config)
        self.loop = asyncio.get_running_loop()
        self._task = asyncio.ensure_future(self._server.serve(sockets=sockets))
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises what went wrong
                raise RuntimeError("the proxy stopped while starting")
            await asyncio.sleep(0.01)
        return self

    async def stop(self) -> None:
        if self._task is None:
            return
        self._server.should_exit = True
        with contextlib.suppress(Exception):
            await self._task
        self._task = None
        if self.config.uds:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.config.uds)

    def start_in_thread(self) -> RecordingProxy:
        ready = threading.Event()
        failure: list[BaseException] = []

        def serve():
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self.start())
            except BaseException as e:
                failure.append(e)
                ready.set()
                return
            ready.set()
            loop.run_until_complete(self._task)
            loop.close()

        self._thread = threading.Thread(target=serve, name="orchard-proxy", daemon=True)
        self._thread.start()
        ready.wait(30)
        if failure:
            raise failure[0]
        return self

    def stop_in_thread(self) -> None:
        if self._thread is None:
            return
        self._server.should_exit = True
        self._thread.join(10)
        self._thread = None
        self._task = None
        if self.config.uds:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.config.uds)

    async def __aenter__(self) -> RecordingProxy:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.stop()


def serve(config: ProxyConfig) -> None:
    """Run the proxy in the foreground until Ctrl-C (what `orchard proxy` does)."""
    import uvicorn

    proxy = RecordingProxy(config)
    sockets = proxy._sockets()
    log_config = uvicorn.Config(proxy.app, log_level="info", lifespan="on", timeout_graceful_shutdown=5)
    print(json.dumps({"url": proxy.url, "uds": proxy.uds, "upstream": config.upstream,
                      "admin_key": proxy.admin_key}), flush=True)
    try:
        asyncio.run(uvicorn.Server(log_config).serve(sockets=sockets))
    finally:
        if config.uds:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(config.uds)

