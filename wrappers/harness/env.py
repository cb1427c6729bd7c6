"""Any harness as a Gymnasium env: the policy plays the harness's model.

    import gymnasium as gym, json, orchard_gym
    env = gym.make("Orchard/SWE-v0", harness="mini-swe-agent", backend={"type": "local"})
    obs, info = env.reset(options={"task_id": "semver-3.0.2"})
    request = json.loads(obs)                 # {"messages": [...], "tools": [...]}: the harness's prompt
    obs, reward, terminated, truncated, info = env.step(
        {"name": "bash", "arguments": {"command": "ls"}})   # the assistant message (a tool call here)
    ...                                       # until the harness exits: then the task is graded

`reset` provisions the task's sandbox with the task env's own setup, opens a rollout on
the recording proxy (policy mode) and starts the harness in the sandbox with its model
base URL at the rollout's prefix. The observation is the harness's pending model request
as JSON text, `{"messages": [...], "tools": [...]}`, chat-style whichever endpoint it
used; `info["request"]` is the whole request. The action is the assistant message: text,
a tool call `{"name", "arguments"}`, a list of tool calls, or `{"role": "assistant",
"content", "tool_calls"}`. `step` hands it to the harness and returns its next request;
when the harness exits, the episode terminates with the task env's grade as reward.

Ends that are not the policy's doing are errors: the harness crashes (an exit code it
does not exit with normally), the sandbox dies, the wall-clock budget `max_seconds`
runs out (the harness is killed). Then the episode is truncated with `info["error"]`,
the rollout is finished with that error, and its trajectory is marked (`error` set) so
trainers drop it; it is never given a reward. Running out of `max_steps` (model calls
answered) kills the harness too, but is the policy's outcome: truncated, and graded.

Networking: with `network="isolated"` (the default) the sandbox has no network at all
(its own empty network namespace on the local backend) and reaches the proxy only
through the proxy's unix socket, via `wrappers/proxy/relay.py` inside the sandbox. With
`network="proxy"` (docker, kubernetes) the sandbox is a blocked one (docker: an internal
network with no route out, the host guard refusing every host port but the proxy's;
kubernetes: a NetworkPolicy) and the harness calls the proxy over TCP at `proxy_url`
(default: the proxy's port at the sandbox's `host_address`, the host as the sandbox sees
it). A sandbox that cannot see the host's file system (docker, kubernetes) gets the
harness shipped in: its npm payload (`Harness.sandbox_payload`) and/or its whole venv,
relinked there to the sandbox's own python (`ShippedVenv`); on an in-process docker backend
they are baked into the task's image once (baked.py), elsewhere uploaded at each reset. With `network="host"` the sandbox has the network and
the harness calls the proxy's TCP URL (`proxy_url`, default the proxy's own), at the price
of a sandbox that can reach anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import os
import shlex
import time
from pathlib import Path
from typing import Any, ClassVar, Literal

import gymnasium as gym
from orchard_gym.envs.base import INFRA_ERRORS, SandboxEnv, grading_error
from orchard_gym.envs.spaces import UnicodeText

from orchard_gym._loop import LoopThread, run_in_thread
from orchard_gym.errors import OrchardError
from orchard_gym.ledger import charge_calls
from orchard_gym.trajectory import Trajectory, Turn

from .spec import Harness, ShippedVenv, get_harness
from ..proxy.openai_format import FormatError, assistant_message
from ..proxy.records import PendingCall, RolloutClosed, RolloutRecord

RELAY_PY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "proxy", "relay.py")


class HarnessError(OrchardError):
    """The harness could not be started, or ended before its first model call."""


class AnyAction(UnicodeText):
    """Text, a tool call, a list of tool calls, or an assistant message dict."""

    def contains(self, x: Any) -> bool:
        try:
            assistant_message(x)
        except FormatError:
            return False
        return not isinstance(x, str) or len(x) <= self.max_length


class HarnessEnv(gym.Env):
    """See the module docstring. `env`: the task env (a `SandboxEnv` instance, or its class,
    built with `**env_kwargs`); `harness`: a name ('mini-swe-agent') or a `Harness`;
    `proxy`: a started `RecordingProxy` to share (default: one of its own, started on the
    first reset, with a unix socket); `max_steps`: model calls answered; `max_seconds`:
    the rollout's wall-clock budget (OpenForge RL uses 900 s); `model`: the model name
    the harness is told to use; `bake_payloads`: on an in-process docker backend, start the
    sandboxes from the task's image with the harness baked in (baked.py; False: upload and
    unpack it at every reset, as on kubernetes)."""

    metadata: ClassVar[dict] = {"render_modes": ["ansi"]}

    def __init__(self, env: SandboxEnv | type[SandboxEnv], harness: str | dict | Harness, *, proxy: Any = None,
                 max_steps: int = 100, max_seconds: float | None = 900.0,
                 network: Literal["isolated", "proxy", "host"] = "isolated", proxy_url: str | None = None,
                 model: str = "orchard-policy", render_mode: str | None = None,
                 observation_max_length: int = 10_000_000, bake_payloads: bool = True, **env_kwargs: Any):
        if render_mode not in (None, "ansi"):
            raise gym.error.Error(f"render_mode must be None or 'ansi', not {render_mode!r}")
        if max_steps < 1:
            raise gym.error.Error("max_steps must be at least 1")
        if not isinstance(bake_payloads, bool):
            raise gym.error.Error(f"bake_payloads must be True or False, not {bake_payloads!r}")
        if network not in ("isolated", "proxy", "host"):
            raise gym.error.Error(f"network must be 'isolated', 'proxy' or 'host', not {network!r}")
        self.task_env: SandboxEnv = env(**env_kwargs) if isinstance(env, type) else env
        if env_kwargs and not isinstance(env, type):
            raise gym.error.Error(f"env kwargs {sorted(env_kwargs)} given with an env instance")
        self.harness = get_harness(harness)
        self.env_id = self.task_env.env_id
        self.max_steps, self.max_seconds = max_steps, max_seconds
        self.network, self.proxy_url, self.model = network, proxy_url, model
        self.bake_payloads = bake_payloads
        self.render_mode = render_mode
        self.observation_space = UnicodeText(observation_max_length)
        self.action_space = AnyAction(1_000_000)
        self.proxy = proxy
        self._owns_proxy = proxy is None
        self.trajectory: Trajectory | None = None
        self.rollout_id: str | None = None
        self._record: RolloutRecord | None = None
        self._harness_task: asyncio.Task | None = None
        self._pending: PendingCall | None = None
        self._started = 0.0
        self._done = True
        self._obs = ""

    # ------------------------------------------------------------------ plumbing
    async def _get_proxy(self):
        if self.proxy is None:
            from ..proxy.server import ProxyConfig, RecordingProxy, default_socket_dir

            _sweep_stale_sockets(default_socket_dir())
            sock = os.path.join(default_socket_dir(), f"proxy-{os.getpid()}-{id(self) % 10**8}.sock")
            self.proxy = RecordingProxy(ProxyConfig(uds=sock))
        if self.proxy.loop is None:
            await self.proxy.start()
        if self.network == "proxy" and self._owns_proxy:
            raise gym.error.Error("network='proxy' needs a started proxy listening where sandboxes reach it "
                                  "(proxy=RecordingProxy(ProxyConfig(host=..., port=P)), with the docker backend's "
                                  "host_guard_allow_ports=[P])")
        if self.network == "isolated" and not self.proxy.uds:
            raise gym.error.Error("network='isolated' needs a proxy with a unix socket (ProxyConfig(uds=...))")
        return self.proxy

    @property
    def store(self):
        return self.proxy.store

    @property
    def record(self) -> RolloutRecord | None:
        """The current (or last) rollout's record: every model call the harness made."""
        return self._record

    def samples(self, gamma: float = 1.0, drop_failed: bool = True):
        """The finished episode's training samples, `r_t = γ^(T−t)·r_T` (see `reconstruct`)."""
        from ..proxy.reconstruct import reconstruct

        if self._record is None:
            raise gym.error.ResetNeeded("no episode yet")
        return reconstruct(self._record, gamma=gamma, drop_failed=drop_failed)

    def _remaining(self) -> float | None:
        if self.max_seconds is None:
            return None
        return max(0.0, self.max_seconds - (time.monotonic() - self._started))

    def _info(self, **extra) -> dict:
        info = {"task_id": self.trajectory.task_id if self.trajectory else None,
                "step": len(self.trajectory.turns) if self.trajectory else 0, "rollout_id": self.rollout_id}
        info.update(extra)
        return info

    def _observe(self, pending: PendingCall) -> tuple[str, dict]:
        call = pending.record
        self._pending = pending
        self._obs = json.dumps({"messages": call.messages, "tools": call.tools}, ensure_ascii=False)
        return self._obs, self._info(call_id=call.call_id, call_index=call.index, endpoint=call.endpoint,
                                     messages=call.messages, tools=call.tools, request=call.request)

    # ------------------------------------------------------------------ the harness in the sandbox
    def _payloads(self, venv, npm) -> dict[str, Path]:
        """What a sandbox that cannot see the host's installs gets shipped: folder -> archive."""
        from .install import ensure_payload, ensure_venv_payload

        archives = {}
        if npm is not None:
            if not self.harness.sandbox_payload:
                raise HarnessError(f"{self.harness.name} lists no sandbox_payload to ship into a "
                                   f"{self.network!r} sandbox")
            archives["npm"] = ensure_payload(npm, self.harness.sandbox_payload)
        if venv is not None:  # the whole venv, relinked to the sandbox's own python in run.sh
            archives["venv"] = ensure_venv_payload(venv)
        return archives

    async def _baked_image(self, client, image: str | None, venv, npm) -> str | None:
        """On an in-process docker backend, the task's image with the payloads in it (baked.py),
        else None (they are uploaded at launch)."""
        if not self.bake_payloads or client.backend_name != "docker" or (venv is None and npm is None):
            return None
        backend = client.backend
        from .baked import BAKED_ROOT, baked_image
        from .install import npm_root

        archives = await run_in_thread(self._payloads, venv, npm)
        return await run_in_thread(baked_image, backend.base_url, image or backend.config.default_image,
                                   self.harness.name, {f"{BAKED_ROOT}/{k}": v for k, v in archives.items()},
                                   npm_root().parent)

    async def _launch(self, sandbox, ctx, task, venv, npm=None, baked: bool = False) -> None:
        base = (sandbox.workdir or "/workspace").rstrip("/")
        hdir = f"{base}/.orchard-harness"
        h, npm_dir, payload, shipped = self.harness, str(npm) if npm else None, None, None
        if self.network == "proxy" or sandbox.record.backend != "local":
            # the sandbox cannot see the host's installs: they are in its image (baked) or shipped now
            from .baked import BAKED_ROOT
            from .install import venv_python_version

            archives = {} if baked else await run_in_thread(self._payloads, venv, npm)
            where = BAKED_ROOT if baked else hdir
            if npm is not None:
                npm_dir = f"{where}/npm"
                if not baked:
                    payload = f"{hdir}/payload.tar.gz"
                    await sandbox.upload_file(archives["npm"], payload)
            if venv is not None:
                shipped = ShippedVenv(path=f"{where}/venv", archive=None if baked else f"{hdir}/venv.tar.gz",
                                      host_path=str(venv), python=venv_python_version(venv))
                if shipped.archive:
                    await sandbox.upload_file(archives["venv"], shipped.archive)
                venv = shipped.path
        await sandbox.upload_content(h.task_text(self.task_env, task), f"{hdir}/task.txt")
        for i, text in enumerate(h.rendered_files(hdir, str(venv) if venv else None, npm_dir, self.model).values()):
            await sandbox.upload_content(text, f"{hdir}/templates/{i}")
        await sandbox.upload_content(h.launch_script(hdir, npm_dir, payload, shipped), f"{hdir}/run.sh")
        env = {**ctx.env, **h.environment(hdir, str(venv) if venv else None, npm_dir, self.model),
               "ORCHARD_HARNESS": self.rollout_id, "ORCHARD_HARNESS_DIR": hdir, "ORCHARD_TASK_FILE": f"{hdir}/task.txt",
               "ORCHARD_MODEL": self.model, "ORCHARD_MAX_STEPS": str(self.max_steps),
               "OPENAI_API_KEY": self.store.get(self.rollout_id).token}
        if venv:
            env["ORCHARD_HARNESS_VENV"] = str(venv)
        path = f"/r/{self.rollout_id}/v1"
        if self.network == "proxy":  # a blocked sandbox that reaches the proxy over TCP only
            host = (sandbox.record.details or {}).get("host_address")
            if not self.proxy_url and not host:
                raise HarnessError("network='proxy' needs proxy_url, or a backend that reports the sandbox's "
                                   "host_address (docker, kubernetes)")
            url = (self.proxy_url or f"http://{host}:{self.proxy.port}").rstrip("/") + path
            env.update(OPENAI_BASE_URL=url, OPENAI_API_BASE=url, ORCHARD_PROXY_URL=url)
            command = f"exec bash {shlex.quote(hdir)}/run.sh"
        elif self.network == "isolated":
            with open(RELAY_PY, "rb") as f:
                await sandbox.upload_content(f.read(), f"{hdir}/relay.py")
            command = (f"exec python3 -I -S {shlex.quote(hdir)}/relay.py --connect {shlex.quote(self.proxy.uds)} "
                       f"--path {shlex.quote(path)} -- bash {shlex.quote(hdir)}/run.sh")
        else:
            url = (self.proxy_url or self.proxy.url).rstrip("/") + path
            env.update(OPENAI_BASE_URL=url, OPENAI_API_BASE=url, ORCHARD_PROXY_URL=url)
            command = f"exec bash {shlex.quote(hdir)}/run.sh"
        command = f"{command} > {shlex.quote(hdir)}/harness.log 2>&1"
        # the exec's own timeout is only a backstop: the wall-clock budget is enforced here
        limit = min((self.max_seconds or 7 * 86400) + 60, 7 * 86400)
        self._harness_task = asyncio.ensure_future(sandbox.exec(command, timeout=limit, cwd=ctx.cwd, env=env))

    async def _kill_harness(self) -> None:
        """Kill every process of the harness (they carry ORCHARD_HARNESS=<rollout id>)."""
        sandbox = self.task_env.sandbox
        if sandbox is not None and self._harness_task is not None and not self._harness_task.done():
            marker = shlex.quote(f"ORCHARD_HARNESS={self.rollout_id}")
            script = (f"for i in 1 2 3; do for p in /proc/[0-9]*; do grep -qxz {marker} $p/environ 2>/dev/null "
                      f"&& kill -9 ${{p#/proc/}} 2>/dev/null; done; done; true")
            with contextlib.suppress(OrchardError):
                await sandbox.exec(script, timeout=60)
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(self._harness_task), 15)
        await self._drop_harness_task()

    async def _drop_harness_task(self) -> None:
        task, self._harness_task = self._harness_task, None
        if task is not None:
            if not task.done():
                task.cancel()
            with contextlib.suppress(BaseException):
                await task

    async def _harness_log(self, lines: int = 40) -> str:
        sandbox = self.task_env.sandbox
        if sandbox is None:
            return ""
        base = (sandbox.workdir or "/workspace").rstrip("/")
        with contextlib.suppress(Exception):
            r = await sandbox.exec(f"tail -n {lines} {shlex.quote(base)}/.orchard-harness/harness.log", timeout=30)
            return r.stdout
        return ""

    async def _next_event(self) -> tuple[str, Any]:
        """('call', PendingCall) | ('exit', JobResult or exception) | ('timeout', None)."""
        getter = asyncio.ensure_future(self.store.next_call(self.rollout_id))
        try:
            await asyncio.wait({getter, self._harness_task}, timeout=self._remaining(),
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not getter.done():
                getter.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await getter
        if self._harness_task.done():  # an exit wins: a call it left behind has no one waiting
            try:
                return "exit", self._harness_task.result()
            except Exception as e:
                return "exit", e
        if getter.done() and not getter.cancelled() and getter.result() is not None:
            return "call", getter.result()
        return "timeout", None

    # ------------------------------------------------------------------ episode ends
    async def _end(self, reward: float | None, error: str | None, report: dict | None = None,
                   terminated: bool = False, truncated: bool = False, **extra) -> tuple:
        self._done = True
        with contextlib.suppress(RolloutClosed, KeyError):
            self.store.finish(self.rollout_id, reward=None if error else reward, error=error)
        self._record = self.store.get(self.rollout_id).record if self.rollout_id in self.store.rollouts else None
        t = self.trajectory
        t.reward, t.report, t.error = (0.0 if error else float(reward)), report or {}, error
        t.terminated, t.truncated, t.ended_at = terminated, truncated, time.time()
        await self._drop_harness_task()
        await self.task_env.release_sandbox()  # charges its sandboxes to t (see areset)
        charge_calls(t, self._record.calls if self._record else [])  # tokens, from the proxy's records
        info = self._info(**extra)
        if error:
            info["error"] = error
        if report is not None:
            info["report"] = report
        return self._obs, t.reward, terminated, truncated, info

    async def _fail(self, error: str, **extra) -> tuple:
        await self._kill_harness()
        return await self._end(None, error, truncated=True, **extra)

    async def _grade(self, terminated: bool, truncated: bool, **extra) -> tuple:
        try:
            reward, report = await self.task_env.grade(self.task_env.ctx, self.task_env.task)
        except INFRA_ERRORS as e:
            return await self._end(None, f"grading failed: {type(e).__name__}: {e}", truncated=True)
        if grading_error(report):  # a task that cannot be graded (e.g. SWE's broken tasks): dropped, not 0.0
            self.trajectory.error_kind = report["error_kind"]
            return await self._end(None, grading_error(report), report, terminated=terminated,
                                   truncated=truncated, **extra)
        return await self._end(reward, None, report, terminated=terminated, truncated=truncated, **extra)

    async def _handle(self, kind: str, value: Any, answered: int) -> tuple:
        if kind == "call":
            if answered >= self.max_steps:  # the policy's budget: stop the harness, grade what it did
                await self._kill_harness()
                return await self._grade(False, True, truncation=f"step budget of {self.max_steps} model calls used up")
            obs, info = self._observe(value)
            return obs, 0.0, False, False, info
        if kind == "timeout":
            return await self._fail(f"timeout: the rollout ran past its wall-clock budget of {self.max_seconds:g}s; "
                                    f"the harness was killed")
        if isinstance(value, BaseException):
            return await self._fail(f"the sandbox failed while the harness ran: {type(value).__name__}: {value}")
        if value.timed_out:
            return await self._fail("timeout: the harness ran past its time limit and was killed")
        if value.exit_code not in self.harness.ok_exit_codes:
            log = (await self._harness_log()).strip()
            tail = f"; last output:\n{log[-2000:]}" if log else ""
            why = f"the harness crashed: exit code {value.exit_code}{tail}"
            return await self._fail(why, harness_exit_code=value.exit_code)
        self._harness_task = None
        return await self._grade(True, False, harness_exit_code=value.exit_code)

    # ------------------------------------------------------------------ async API
    async def areset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        await self._abandon("reset before the episode ended")
        te = self.task_env
        gym.Env.reset(te, seed=seed)  # the task env draws the task from its own seeded generator
        task_id = te.choose_task(options)
        task = te.get_task(task_id)
        client = await te.get_client()
        await self._get_proxy()
        venv = await run_in_thread(self.harness.install)
        npm = await run_in_thread(self.harness.install_npm)
        self.trajectory = Trajectory(env_id=self.env_id, task_id=task_id, metadata={"harness": self.harness.name})
        self._started, self._done, self._pending, self._obs = time.monotonic(), False, None, ""
        rollout = self.store.open("policy", metadata={"env_id": self.env_id, "task_id": task_id,
                                                      "harness": self.harness.name})
        self.rollout_id = self.trajectory.metadata["rollout_id"] = rollout.id
        te.trajectory = self.trajectory  # the task env charges its sandboxes (task, grader) to this episode
        self._record = rollout.record
        try:
            te.task = task
            spec = {**te.sandbox_spec(task), "block_network": self.network != "host"}
            baked = await self._baked_image(client, spec.get("image"), venv, npm)
            te.sandbox = await client.create_sandbox(**{**spec, "image": baked or spec.get("image")})
            self.trajectory.sandbox_id = te.sandbox.sandbox_id
            te.ctx = await te.setup(te.sandbox, task)
            await self._launch(te.sandbox, te.ctx, task, venv, npm, baked=baked is not None)
            kind, value = await self._next_event()
        except BaseException as e:
            await self._end(None, f"reset failed: {type(e).__name__}: {e}", truncated=True)
            raise
        if kind == "call":
            return self._observe(value)
        # no model call to show: whatever happened, this episode cannot start
        if kind == "timeout":
            why = f"timeout: no model call within the wall-clock budget of {self.max_seconds:g}s"
        elif isinstance(value, BaseException):
            why = f"the sandbox failed while the harness started: {type(value).__name__}: {value}"
        else:
            log = (await self._harness_log()).strip()
            why = (f"the harness exited (code {value.exit_code}) before asking the model anything"
                   + (f"; last output:\n{log[-2000:]}" if log else ""))
        await self._fail(why)
        raise HarnessError(f"{self.harness.name} on {task_id}: {why}")

    async def astep(self, action: Any, *, tokens: dict | None = None) -> tuple[str, float, bool, bool, dict]:
        """`tokens`: what the policy knows about its answer (`prompt_token_ids`,
        `completion_token_ids`, `logprobs`, `usage`), recorded on the call (trainers use it)."""
        if self.trajectory is None or self._done:
            raise gym.error.ResetNeeded("call reset() before step()" if self.trajectory is None
                                        else "the episode is over; call reset()")
        pending = self._pending
        try:
            message = assistant_message(action)
        except FormatError as e:  # nothing reaches the harness: the same request stays pending
            return self._obs, 0.0, False, False, self._info(action_error=str(e), call_id=pending.call_id)
        try:
            self.store.respond(self.rollout_id, pending.call_id, message, **(tokens or {}))
        except KeyError:
            pass  # the harness hung up meanwhile; its exit is the next event
        self.trajectory.turns.append(Turn(index=len(self.trajectory.turns), action=message,
                                          messages=pending.record.messages, observation=self._obs))
        self._pending = None
        try:
            kind, value = await self._next_event()
        except INFRA_ERRORS as e:
            return await self._fail(f"{type(e).__name__}: {e}")
        return await self._handle(kind, value, len(self.trajectory.turns))

    async def abort(self, reason: str) -> tuple:
        """End the episode now as an error (what timeouts do): kill the harness, finish the
        rollout with `reason`, free the sandbox. Returns the final step tuple."""
        if self._done:
            return self._obs, 0.0, False, True, self._info(error=reason)
        return await self._fail(reason)

    async def _abandon(self, reason: str) -> None:
        if self.trajectory is not None and not self._done:
            await self._fail(reason)

    async def aclose(self) -> None:
        await self._abandon("closed before the episode ended")
        await self.task_env.aclose()
        if self._owns_proxy and self.proxy is not None and self.proxy.loop is not None:
            await self.proxy.stop()
            self.proxy = None

    # ------------------------------------------------------------------ sync API
    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        return LoopThread.shared().run(self.areset(seed=seed, options=options))

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict]:
        return LoopThread.shared().run(self.astep(action))

    def close(self) -> None:
        if self.trajectory is not None or self.proxy is not None:
            LoopThread.shared().run(self.aclose())

    def render(self) -> str | None:
        return self._obs if self.render_mode == "ansi" else None


def _sweep_stale_sockets(folder: str) -> None:
    """Remove sockets of our own proxies whose process died without cleaning up."""
    for sock in glob.glob(os.path.join(folder, "proxy-*-*.sock")):
        pid = os.path.basename(sock).split("-")[1]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            with contextlib.suppress(OSError):
                os.unlink(sock)


def make_harness_env(entry_point: str, harness: Any = None, **kwargs: Any) -> gym.Env:
    """The task env at `entry_point`, or a `HarnessEnv` around it when `harness` is given
    (what registration uses, so `gym.make(id, harness="mini-swe-agent")` works)."""
    from gymnasium.envs.registration import load_env_creator

    creator = load_env_creator(entry_point)
    if harness is None:
        return creator(**kwargs)
    own = {k: kwargs.pop(k) for k in ("proxy", "max_steps", "max_seconds", "network", "proxy_url", "model",
                                       "render_mode", "observation_max_length", "bake_payloads") if k in kwargs}
    return HarnessEnv(creator, harness, **own, **kwargs)
