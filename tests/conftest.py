"""Shared fixtures. Everything here starts real components: agents, sandboxes."""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

# the ORCHARD_REQUIRE mechanism (see tests/components.py); its hooks run from here
from components import (  # noqa: F401
    needs,
    pytest_configure,
    pytest_make_collect_report,
    pytest_report_header,
    pytest_runtest_makereport,
    pytest_runtest_setup,
    require,
    require_module,
    variant_limit,
)
# the test tiers (`--fast`, the `slow` mark of the full-suite-only tests); see tests/tiers.py
from tiers import (  # noqa: F401
    pytest_addoption,
    pytest_collection_modifyitems,
    pytest_ignore_collect,
    pytest_xdist_make_scheduler,
)

REPO = Path(__file__).resolve().parents[1]


def _private_tmpdir() -> None:
    """Each test process (each xdist worker, and every process it starts) gets its own temp
    folder, so the default sandbox roots (`/tmp/orchard-gym-UID`, `orchard serve`'s
    `/tmp/orchard-gym-serve-UID`: both under `tempfile.gettempdir()`) are its own: a worker's
    orchestrator with a 1 s TTL reaped, and its leak checks listed, the other worker's (and
    another concurrent run's) sandboxes on the one shared root. Short (`/tmp/w` + the pid):
    a sandbox's unix socket path must stay under 108 bytes with a 63-character id."""
    import atexit
    import tempfile

    base = Path(f"/tmp/w{os.getpid()}")
    if os.environ.get("TMPDIR") == str(base):
        return
    base.mkdir(exist_ok=True)
    # pytest's own tmp_path folders stay where they were (their paths hold sockets too)
    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", tempfile.gettempdir())
    os.environ["TMPDIR"] = str(base)
    tempfile.tempdir = None  # computed again, from $TMPDIR
    atexit.register(shutil.rmtree, base, ignore_errors=True)


_private_tmpdir()

# Started as `cmd &` by a shell without job control (a CI step, nohup), pytest inherits SIGINT
# ignored, and so would every child: the Ctrl-C tests' commands then never see their Ctrl-C.
# A Python handler (unlike SIG_IGN) is reset to the default in the children at exec.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def tgkill(pid: int, tid: int, sig: int) -> None:
    """Send `sig` to one thread `tid` of process `pid` (a process-directed kill lets the kernel pick)."""
    import ctypes
    import platform

    number = {"x86_64": 234, "aarch64": 131}.get(platform.machine())
    if number is None:
        pytest.skip(f"the tgkill syscall number on {platform.machine()} is not known here")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(number, pid, tid, sig) != 0:
        raise OSError(ctypes.get_errno(), f"tgkill({pid}, {tid}, {sig})")
AGENT_PY = REPO / "orchard_gym" / "agent"  # a folder: python runs its __main__.py
HAS_BWRAP = shutil.which("bwrap") is not None
WHY_NO_BWRAP = "" if HAS_BWRAP else "bwrap is not on PATH (bash scripts/setup_system.sh)"
needs_bwrap = needs("bwrap", WHY_NO_BWRAP)


def zygote_agent_pid(root, sandbox_id: str) -> int | None:
    """The live host pid of a local sandbox's agent when the zygote forked it, else None. Such
    an agent is its PID namespace's init (no signal from inside the sandbox can kill it) and
    keeps the zygote's environment, so `marked_pids` does not find it; its commands it finds."""
    from orchard_gym.backends import procs

    try:
        meta = json.loads((Path(root) / sandbox_id / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    if meta.get("spawner") != "zygote" or not procs.alive(meta.get("pid")):
        return None
    return meta["pid"]["pid"]


def kill_agent(root, sandbox, from_inside) -> None:
    """Kill a local sandbox's agent: from the host when the zygote made it (see
    zygote_agent_pid), else by `from_inside()` (e.g. an exec of `kill -9 $PPID`)."""
    pid = zygote_agent_pid(root, sandbox)
    if pid is not None:
        os.kill(pid, signal.SIGKILL)
    else:
        from_inside()


def sandbox_pids(root, sandbox_id: str) -> list[int]:
    """Every live process of a local sandbox: those carrying its marker, and its zygote agent."""
    pid = zygote_agent_pid(root, sandbox_id)
    return marked_pids(f"ORCHARD_SANDBOX={sandbox_id}") + ([pid] if pid is not None else [])


def marked_pids(needle: str) -> list[int]:
    """Live (non-zombie) processes whose environment holds `needle`."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if needle.encode() in env and state not in (b"Z", b"X"):
            found.append(int(name))
    return found


def wait_until(predicate, timeout: float = 5.0, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


class AgentProcess:
    """A real agent process on a unix socket, with an httpx client for it."""

    def __init__(self, tmp: Path, token: str = "secret-token", *args: str):
        self.socket = str(tmp / "agent.sock")
        self.cwd = tmp / "work"
        self.cwd.mkdir()
        self.token = token
        env = {**os.environ, "ORCHARD_AGENT_TOKEN": token}
        self.proc = subprocess.Popen(
            [sys.executable, str(AGENT_PY), "--socket", self.socket, "--cwd", str(self.cwd), *args], env=env
        )
        transport = httpx.HTTPTransport(uds=self.socket)
        self.http = httpx.Client(transport=transport, base_url="http://agent", timeout=30,
                                 headers={"Authorization": f"Bearer {token}"})
        self.anon = httpx.Client(transport=httpx.HTTPTransport(uds=self.socket), base_url="http://agent", timeout=30)
        assert wait_until(self._up, 10), "agent did not start"

    def _up(self) -> bool:
        try:
            return self.anon.get("/health").status_code == 200
        except httpx.TransportError:
            return False

    def exec(self, **body) -> dict:
        resp = self.http.post("/exec", json=body)
        assert resp.status_code == 200, resp.text
        return resp.json()

    def raw(self, data: bytes) -> bytes:
        """Send raw bytes on a fresh connection and return what comes back."""
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(5)
        s.connect(self.socket)
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        chunks = []
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
        s.close()
        return b"".join(chunks)

    def close(self) -> None:
        self.http.close()
        self.anon.close()
        self.proc.terminate()
        self.proc.wait(30)  # SIGTERM is handled at once, but a loaded machine schedules it late


@pytest.fixture
def agent(tmp_path):
    a = AgentProcess(tmp_path, "secret-token", "--max-output", "100000")
    yield a
    a.close()


@pytest.fixture
def local_root(tmp_path_factory):
    # short path: unix socket paths are limited to 108 bytes
    root = Path(f"/tmp/og-test-{os.getpid()}-{time.monotonic_ns() % 10**8}")
    root.mkdir()
    yield root
    shutil.rmtree(root, ignore_errors=True)


def local_configs():
    return [pytest.param({"type": "local", "isolation": "bwrap"}, id="local-bwrap", marks=[needs_bwrap]),
            pytest.param({"type": "local", "isolation": "none"}, id="local-plain")]


# --------------------------------------------------------------------------- conformance
# Each backend the conformance suite runs against: its config, the image to use, and the
# address at which a sandbox with network reaches a server on this machine.
def conformance_params():
    params = [pytest.param({"config": {"type": "local", "isolation": "bwrap"}, "image": None,
                            "host_address": "127.0.0.1"}, id="local-bwrap", marks=[needs_bwrap]),
              pytest.param({"config": {"type": "local", "isolation": "none"}, "image": None,
                            "host_address": "127.0.0.1", "no_netns": True}, id="local-plain")]
    # the SDK's remote mode: an orchestrator (a real uvicorn subprocess) over the local backend,
    # which has network namespaces where bwrap is installed
    params.append(pytest.param({"config": {"type": "local"}, "image": None, "host_address": "127.0.0.1",
                                "remote": True, "netns_needs_bwrap": True}, id="remote-local"))
    gateway, why_not = docker_engine()
    for name, image in DOCKER_IMAGES.items():
        # a sandbox with network reaches this machine at its network's bridge gateway
        params.append(pytest.param({"config": {"type": "docker"}, "image": image, "host_address": gateway},
                                   id=f"docker-{name}", marks=[pytest.mark.docker, needs("docker", why_not)]))
    # kubernetes through the fake API server (tests/fake_k8s) whose kubelet runs pods with Podman
    k8s_why_not = fake_k8s_unavailable()
    for name, image in DOCKER_IMAGES.items():
        params.append(pytest.param({"config": {"type": "kubernetes"}, "image": image, "host_address": gateway,
                                    "fake_k8s": True}, id=f"kubernetes-{name}",
                                   marks=[pytest.mark.kubernetes,  # needs Podman too (see the reason)
                                          needs("kubernetes", k8s_why_not)]))
    # a real cluster, for scripts/e2e_k8s.sh: ORCHARD_K8S_E2E='{"kubeconfig": ..., "namespace": ...}'
    if os.environ.get("ORCHARD_K8S_E2E"):
        import json

        params.append(pytest.param({"config": {"type": "kubernetes", **json.loads(os.environ["ORCHARD_K8S_E2E"])},
                                    "image": os.environ.get("ORCHARD_K8S_E2E_IMAGE", DOCKER_IMAGES["busybox"]),
                                    "host_address": os.environ.get("ORCHARD_K8S_E2E_HOST_ADDRESS", "127.0.0.1")},
                                   id="kubernetes-real", marks=[pytest.mark.kubernetes]))
    return params


def skip_without_netns(case) -> None:
    """Skip a network-blocking check on a variant that has no network namespace to block with."""
    __tracebackhide__ = True  # reports name the test, not this helper
    if case.get("no_netns"):
        variant_limit("the local backend with isolation=none has no network namespace to block with")
    if case.get("netns_needs_bwrap"):
        require("bwrap", WHY_NO_BWRAP)


def fake_k8s_unavailable() -> str | None:
    """Why the fake Kubernetes cluster cannot run here (None: it can)."""
    try:
        import kubernetes  # noqa: F401
    except ImportError:
        return "the kubernetes client is not installed (bash scripts/install.sh dev,docker,k8s)"
    gateway, why_not = docker_engine()
    return (why_not or "no container engine") if gateway is None else None


@pytest.fixture(scope="session")
def fake_k8s(tmp_path_factory):
    """One fake cluster (API server + Podman kubelet, a subprocess) for the session."""
    from fake_k8s import FakeCluster

    cluster = FakeCluster(tmp_path_factory.mktemp("fake-k8s"), kubelet="podman")
    yield cluster
    cluster.stop()


DOCKER_IMAGES = {"busybox": "localhost/orchard/busybox:latest", "bookworm": "localhost/orchard/bookworm:latest"}
INJECTOR_IMAGE = os.environ.get("ORCHARD_INJECTOR_IMAGE") or "localhost/orchard/agent-injector:latest"


def remove_prefix_volumes(prefix: str) -> list[str]:
    """Remove the volumes (the agent bundle's) of a docker backend with a label prefix of a test's
    own: no later backend uses that prefix, so none would reuse or sweep them (they piled up, one
    41 MB bundle per run). Returns the names of that prefix's volumes still there afterwards."""
    from orchard_gym.backends.engine import open_engine

    client, _ = open_engine(timeout=30)
    try:
        for volume in client.api.volumes(filters={"label": f"{prefix}.role"}).get("Volumes") or []:
            client.api.remove_volume(volume["Name"], force=True)
        return [v["Name"] for v in client.api.volumes(filters={"label": f"{prefix}.role"}).get("Volumes") or []]
    finally:
        client.close()


@functools.cache
def docker_engine() -> tuple[str | None, str]:
    """(gateway of the engine's default network, "") when the engine (Podman in CI) and the
    test images are there; else (None, why not)."""
    try:
        import docker

        from orchard_gym.backends.engine import default_base_url, open_engine
    except ImportError:
        return None, "the docker SDK is not installed (bash scripts/install.sh dev,docker)"
    url = default_base_url()
    try:
        client, _ = open_engine(url, timeout=10)
    except Exception as e:
        return None, f"no container engine at {url} ({e}); run scripts/podman_service.sh start"
    try:
        client.ping()
        missing = []
        for image in (*DOCKER_IMAGES.values(), INJECTOR_IMAGE):
            try:
                client.api.inspect_image(image)
            except docker.errors.ImageNotFound:
                missing.append(image)
        if missing:
            return None, (f"images missing: {', '.join(missing)} (run scripts/build_test_images.sh and "
                          f"scripts/build_injector_image.sh)")
        return client.api.inspect_network("bridge")["IPAM"]["Config"][0]["Gateway"], ""
    except Exception as e:
        return None, f"no container engine at {url} ({e}); run scripts/podman_service.sh start"
    finally:
        client.close()


def image_why_not(image: str, build: str) -> str | None:
    """Why `image` (made by the command `build`) cannot be used on the engine here, or None."""
    gateway, why_not = docker_engine()
    if gateway is None:
        return why_not
    import docker

    from orchard_gym.backends.engine import open_engine

    client, _ = open_engine(timeout=10)
    try:
        client.api.inspect_image(image)
    except docker.errors.ImageNotFound:
        return f"{image} is missing (run {build})"
    finally:
        client.close()
    return None


def gui_image_why_not() -> str | None:
    """Why the GUI env's image (scripts/build_gui_image.sh) cannot be used here, or None."""
    from orchard_gym.envs.gui.env import DEFAULT_IMAGE

    return image_why_not(DEFAULT_IMAGE, "scripts/build_gui_image.sh")


@pytest.fixture(params=conformance_params())
def backend_case(request, local_root):
    case = dict(request.param)
    config = dict(case["config"])
    if config["type"] == "local":
        config["root"] = str(local_root)
    if case.get("fake_k8s"):
        config = request.getfixturevalue("fake_k8s").backend_config(**config)
    case["config"] = config
    if case.get("remote"):
        orchestrator = request.getfixturevalue("remote_orchestrator")
        case["base_url"], case["api_key"] = orchestrator.url, orchestrator.api_key
    return case


def client_kwargs(case) -> dict:
    """SandboxClient/AsyncSandboxClient arguments for a conformance case."""
    if case.get("remote"):
        return {"base_url": case["base_url"], "api_key": case["api_key"]}
    return {"backend": case["config"]}


@pytest.fixture(scope="session")
def remote_orchestrator(tmp_path_factory):
    """One orchestrator for the session's remote-mode tests (in-memory store, local backend)."""
    from service_helpers import Orchestrator, remove_all_sandboxes, short_root

    root = short_root("orch")
    orch = Orchestrator(root, log_dir=tmp_path_factory.mktemp("orchestrator"), reconcile_interval=1)
    yield orch
    orch.stop()
    remove_all_sandboxes(root)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def client(backend_case):
    from orchard_gym import SandboxClient

    c = SandboxClient(**client_kwargs(backend_case))
    yield c
    c.close()


@pytest.fixture
def sandbox(client, backend_case):
    box = client.create_sandbox(image=backend_case["image"])
    yield box
    try:
        box.delete()
    except Exception:
        pass
