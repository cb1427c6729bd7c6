"""The docker backend: a sandbox is a container of the task's own image, with the agent
injected into it. Works against Docker Engine and Podman's Docker-compatible API.

Injection (no task image is ever rebuilt, and it needs no Python in it):

1. once per injector image (`scripts/build_injector_image.sh`), a filler container from it
   copies the self-contained agent bundle (its own loader, libc and Python; see
   docs/agent_bundle.md) into the shared volume `PREFIX-bundle-<image id>`
   (backends/docker_bundle.py: safe under concurrent creates, old versions swept);
2. every task container starts from the task image with that volume mounted read-only at
   /opt/orchard-agent and the bundle's loader as its entrypoint, so the image's own
   entrypoint never runs. `init=True` puts a tiny init at PID 1 that reaps zombies;
   the agent's token and `ORCHARD_SANDBOX=<id>` travel in the container's environment.

How a blocked sandbox (`block_network=True`, the default) stays reachable: it joins an
*internal* network (`network`, created on first use), which has no route out of the
host, and the host reaches the agent at the container's IP on that network's bridge
(reach="ip"). We do not use a published loopback port for it because neither Podman
(netavark, checked with 4.3 here) nor Docker forward published ports into internal
networks: the port is allocated but connections to it time out. A network mode of
"none" would leave nothing to reach from the host at all. So reach="port" (a published
127.0.0.1 port, for engines whose container IPs the client cannot route to, such as
Docker Desktop) works only with `block_network=False`.

What an internal network still allows: the other blocked sandboxes on it, and the host
itself at the network's gateway address (`details["host_address"]`, e.g. 10.89.0.1). The
host guard (`host_guard`, on by default; backends/host_guard.py) refuses new connections
from the network's subnet to the host, except to `host_guard_allow_ports`.

Confinement, as the Kubernetes pod spec has it: every capability dropped but
`capabilities` (what a root agent running apt/pip/git needs), `no-new-privileges` (no
setuid gain), `pids_limit` processes at most.

Ownership: every container and volume is labelled `PREFIX.owner=OWNER` and
`PREFIX.creator=host:boot:pid:start` (the creating process). OWNER is the config's
`owner` (shared by the orchestrator's replicas, which `orchard serve` sets) or else the
creator itself. `sweep()` removes only what per-process owners on this host that are gone
(process exited, or the machine rebooted) left behind; a named owner's sandboxes are never
swept by liveness, and owners on other hosts are never judged.

The docker SDK is blocking; every call runs on a fresh thread (like `run_in_thread`,
so that exit clean-up still works), at most `workers` at a time.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import threading
import time

from orchard_gym._loop import run_in_thread
from orchard_gym.errors import BackendError, ImageNotFound, InvalidRequest, OrchardError
from orchard_gym.models import SNAPSHOT_ID_RE, AgentEndpoint, SandboxRecord, SandboxSpec, SnapshotRecord

from . import engine_stats, host_guard
from .docker_bundle import SharedBundle, container_lost, name_in_use
from .docker_services import NetworkTaken, Sidecars
from .engine import default_base_url, open_engine
from .owners import owner_gone, owner_identity
from .base import Backend, new_sandbox_id, new_token, token_sha256
from .config import DockerBackendConfig
from .snapshots_docker import DockerSnapshots

try:
    import docker
    import requests
    from docker import errors as derr
except ImportError:  # pragma: no cover - the extra is missing
    docker = None

log = logging.getLogger(__name__)

AGENT_DIR = "/opt/orchard-agent"
# docs/agent_bundle.md: run the bundle's loader explicitly, so the image needs no glibc
LOADER = f"{AGENT_DIR}/lib/ld-linux-x86-64.so.2"
AGENT_ARGS = ["--library-path", f"{AGENT_DIR}/lib", f"{AGENT_DIR}/bin/python3", "-I", "-S", "-B",
              f"{AGENT_DIR}/agent"]  # a folder of modules: python runs its __main__.py
DEFAULT_WORKDIR = "/workspace"


ARP_NOTIFY = "/proc/sys/net/ipv4/conf/all/arp_notify"
_warned: set[str] = set()


def warn_network_sysctls() -> str | None:
    """Warn once when the host lets bridge MAC changes go unannounced (the reason, or None).

    A Linux bridge without an address of its own takes the lowest MAC of its ports, so it
    changes as sandboxes come and go; sandboxes keep sending to the old gateway MAC until
    their neighbour entry times out, and a transfer in flight stalls for a minute or more of
    TCP retransmit backoff (110 s measured, scripts/stress_docker_network.py). With arp_notify=1 the host announces the new MAC at once
    (gratuitous ARP). scripts/setup_system.sh sets it; see docs/backends.md."""
    try:
        with open(ARP_NOTIFY) as f:
            value = f.read().strip()
    except OSError:
        return None
    if value != "0":
        return None
    why = (f"{ARP_NOTIFY} is 0: sandboxes on a bridge whose MAC changes (as others come and go) stall "
           f"for a minute or more; set it to 1 (scripts/setup_system.sh does)")
    if why not in _warned:
        _warned.add(why)
        log.warning("docker backend: %s", why)
    return why


class DockerBackend(Backend):
    name = "docker"
    supports_services = True  # docker_services.py

    def __init__(self, config: DockerBackendConfig | None = None):
        if docker is None:
            raise BackendError("the docker backend needs the docker SDK: pip install 'orchard-gym[docker]'")
        self.config = config or DockerBackendConfig()
        self.base_url = self.config.base_url or default_base_url()
        p = self.config.label_prefix
        self.owner_label, self.sandbox_label, self.role_label = f"{p}.owner", f"{p}.sandbox", f"{p}.role"
        self.spec_label, self.user_label, self.creator_label = f"{p}.spec", f"{p}.label.", f"{p}.creator"
        self.identity = owner_identity()
        self.owner = self.config.owner or self.identity
        self.guard = "off" if not self.config.host_guard else "not checked yet"
        self.token_label = f"{p}.agent-token"  # the agent has only its SHA-256 (--token-sha256)
        self._slots = threading.BoundedSemaphore(self.config.workers)
        self._network_ok = False
        self.snapshots = DockerSnapshots(self)
        self.services_label = f"{p}.services"
        try:
            from_env = self.config.base_url is None and os.environ.get("DOCKER_HOST")  # DOCKER_TLS_* too
            self.client, version = open_engine(None if from_env else self.base_url,
                                               timeout=self.config.api_timeout, max_pool_size=self.config.workers)
        except Exception as e:
            raise BackendError(f"cannot reach the container engine at {self.base_url} ({e}); for Podman "
                               f"run `scripts/podman_service.sh start`") from None
        self.api = self.client.api  # the low-level client: one engine call per method, no hidden inspects
        self._disk_reason: list[str | None] | None = None  # disk_limit_unavailable(), once asked
        names = [c.get("Name", "") for c in version.get("Components") or []]
        self.engine = f"{names[0] if names else 'Docker Engine'} {version.get('Version', '?')}"
        self.local_engine = self.base_url.startswith("unix://")
        if self.local_engine:
            warn_network_sysctls()
        self.bundle = SharedBundle(self)
        self.services = Sidecars(self)
        try:
            self.swept = self._sweep()  # what crashed clients left behind
        except Exception as e:  # never fail start-up over someone else's leftovers
            log.warning("docker backend: sweep at start-up failed: %s", e)
            self.swept = []

    def _name(self, sandbox_id: str) -> str:
        return f"{self.config.label_prefix}-{sandbox_id}"

    async def _run(self, fn, *args):
        """A blocking SDK call on its own thread, at most `workers` at once."""
        def bounded():
            with self._slots:
                try:
                    return fn(*args)
                except (derr.DockerException, requests.RequestException) as e:  # anything not handled below
                    detail = getattr(e, "explanation", None) or e
                    raise BackendError(f"container engine at {self.base_url}: {detail}") from None
        return await run_in_thread(bounded)

    # ------------------------------------------------------------------ images
    def _ensure_image(self, image: str, hint: str = "") -> dict:
        """The image's inspect data; pulls it once if the policy allows, else ImageNotFound."""
        try:
            return self.api.inspect_image(image)
        except derr.ImageNotFound:
            pass
        except derr.APIError as e:
            raise BackendError(f"cannot inspect image {image!r}: {e.explanation or e}") from None
        where = f"on the engine at {self.base_url}"
        if self.config.pull == "never":
            raise ImageNotFound(f"image {image!r} is not {where} and pull policy is 'never'{hint}")
        repo, tag = docker.utils.parse_repository_tag(image)
        try:
            self.api.pull(repo, tag=tag or "latest")
            return self.api.inspect_image(image)
        except Exception as e:
            detail = getattr(e, "explanation", None) or e
            raise ImageNotFound(f"image {image!r} is not {where} and pulling it failed: {detail}{hint}") from None

    # ------------------------------------------------------------------ network
    def _ensure_network(self) -> None:
        """The internal network for blocked sandboxes, created once; never a routed one."""
        if self._network_ok:
            return
        name = self.config.network
        try:
            net = self.api.inspect_network(name)
        except derr.NotFound:
            try:
                self.api.create_network(name, internal=True, labels={f"{self.config.label_prefix}.managed": "1"})
            except derr.APIError as e:  # fine if another process created it just now
                log.debug("creating network %s: %s", name, e)
            try:
                net = self.api.inspect_network(name)
            except derr.NotFound:
                raise BackendError(f"cannot create network {name!r}") from None
        if not net.get("Internal"):
            raise BackendError(f"network {name!r} exists but is not internal: blocked sandboxes would have "
                               f"network access; remove it or set `network` to another name")
        if self.config.host_guard:
            self._guard(net)
        self._network_ok = True

    def _guard(self, net: dict) -> None:
        """Install the host guard for the network's subnets, or say why it cannot be."""
        subnets = [c["Subnet"] for c in (net.get("IPAM") or {}).get("Config") or [] if c.get("Subnet")]
        if not self.local_engine:  # the rules would belong on the engine's machine, not here
            if self.guard != "remote":
                log.warning("docker backend: host_guard cannot be installed for the remote engine at %s; add "
                            "the rules of backends/host_guard.py on its host (or set host_guard=false)",
                            self.base_url)
            self.guard = "remote"
            return
        if not subnets:
            raise BackendError(f"network {self.config.network!r} reports no subnet: cannot install the host guard "
                               f"(set host_guard=false to run without it)")
        try:
            if os.geteuid() != 0:
                raise host_guard.GuardError("needs root")
            for subnet in subnets:
                host_guard.install(subnet, self.config.host_guard_allow_ports)
        except (host_guard.GuardError, OSError, subprocess.SubprocessError) as e:
            raise BackendError(f"cannot install the host guard (iptables rules refusing connections from blocked "
                               f"sandboxes to this host) for {', '.join(subnets)}: {e}; run as root, or set "
                               f"host_guard=false to let blocked sandboxes reach host services") from None
        self.guard = f"installed for {', '.join(subnets)}"

    # ------------------------------------------------------------------ create
    async def create(self, spec: SandboxSpec) -> SandboxRecord:
        if self.config.reach == "port" and spec.block_network:
            raise InvalidRequest("reach='port' needs block_network=False: engines publish no ports on internal "
                                 "networks; use reach='ip' for blocked sandboxes")
        return await self._run(self._create, spec)

    def _create(self, spec: SandboxSpec) -> SandboxRecord:
        try:
            return self._create_once(spec)
        except _ContainerLost:  # the engine lost the fresh container (see container_lost): once more
            log.warning("the engine lost a fresh container; creating it again")
        except derr.APIError as e:  # ... or a helper container on the way (the agent bundle's filler)
            if not container_lost(e):
                raise
            log.warning("the engine lost a container while preparing a sandbox (%s); once more", e.explanation or e)
        try:
            return self._create_once(spec)
        except _ContainerLost as e:
            raise BackendError(f"the engine lost the container of a new sandbox twice while starting it: {e}") from None

    def _create_once(self, spec: SandboxSpec) -> SandboxRecord:
        cfg = self.config
        sandbox_id = spec.sandbox_id or new_sandbox_id()
        name = self._name(sandbox_id)
        if spec.disk is not None and (why := self.disk_limit_unavailable()):
            raise InvalidRequest(f"disk={spec.disk!r} cannot be held on the docker backend: {why}")
        image = run_image = spec.image or cfg.default_image
        if spec.from_snapshot is not None:  # its files, under the task image's name
            image, run_image = self.snapshots.image_for(spec.from_snapshot, spec.image)
        image_info = self._ensure_image(run_image)
        injector = self._ensure_image(cfg.injector_image, "; build it with scripts/build_injector_image.sh")
        bundle = self.bundle.ensure(injector)  # one shared read-only volume per injector version
        if spec.block_network and not spec.services:
            self._ensure_network()
        workdir = cfg.workdir or (image_info.get("Config") or {}).get("WorkingDir") or DEFAULT_WORKDIR
        token = new_token()
        ours = {self.owner_label: self.owner, self.creator_label: self.identity, self.sandbox_label: sandbox_id}
        meta = {"image": image, "block_network": spec.block_network, "cpu": spec.cpu, "memory": spec.memory,
                "env": spec.env, "created_at": time.time()}
        labels = {**ours, self.role_label: "sandbox", self.spec_label: json.dumps(meta),
                  **{self.user_label + k: v for k, v in spec.labels.items()}}
        network = cfg.network if spec.block_network else cfg.open_network
        hosts: dict[str, str] = {}
        services_made = False
        try:
            if spec.services:  # a network of its own, the services on it (docker_services.py)
                try:
                    network = self.services.make_network(sandbox_id, spec.block_network, ours)
                except NetworkTaken:
                    raise _NameTaken from None
                services_made = True
                hosts = self.services.start(sandbox_id, spec.services, network, ours)
                labels[self.services_label] = json.dumps(sorted(hosts))
            host_config = self.api.create_host_config(
                init=True,  # reaps zombies; the agent is not PID 1
                mounts=[docker.types.Mount(AGENT_DIR, bundle, type="volume", read_only=True, no_copy=True)],
                nano_cpus=int(spec.cpu * 1e9) if spec.cpu else None,
                mem_limit=spec.memory_bytes,
                memswap_limit=spec.memory_bytes,  # no swap beyond the limit: it is a real cap
                network_mode=network, extra_hosts=hosts or None,
                cap_drop=["ALL"], cap_add=list(cfg.capabilities),
                security_opt=["no-new-privileges"],  # setuid binaries gain nothing
                pids_limit=cfg.pids_limit,
                storage_opt={"size": str(spec.disk_bytes)} if spec.disk is not None else None,
                port_bindings={cfg.agent_port: ("127.0.0.1", None)} if cfg.reach == "port" else None,
            )
            try:
                self.api.create_container(
                    run_image, name=name, hostname=sandbox_id, entrypoint=[LOADER], working_dir=workdir,
                    command=AGENT_ARGS + ["--port", str(cfg.agent_port), "--cwd", workdir,
                                          "--max-output", str(cfg.max_output), "--token-sha256", token_sha256(token)],
                    environment={**spec.env, "ORCHARD_SANDBOX": sandbox_id},
                    labels={**labels, self.token_label: token},  # engine-side only: not visible inside
                    host_config=host_config, ports=[cfg.agent_port] if cfg.reach == "port" else None,
                    networking_config=self.api.create_networking_config(
                        {network: self.api.create_endpoint_config(aliases=["main"])}) if hosts else None,
                )
            except derr.APIError as e:
                if name_in_use(e):  # the id is taken (or another create won the race for it)
                    raise _NameTaken from None
                raise
            try:
                self.api.start(name)
                return self._record(self.api.inspect_container(name))
            except derr.APIError as e:
                if container_lost(e):
                    raise _ContainerLost(e.explanation or str(e)) from None
                raise
        except _NameTaken:
            raise InvalidRequest(f"sandbox {sandbox_id} already exists") from None
        except BaseException as e:
            self._destroy(name)
            if services_made:  # no half-made sandbox: its services and network go too
                try:
                    self.services.remove(sandbox_id)
                except Exception as cleanup:  # say so, but raise what went wrong first
                    log.error("sandbox %s: removing its services after a failed create: %s", sandbox_id, cleanup)
            if isinstance(e, _ContainerLost):
                raise
            self._network_ok = False  # check the network again next time (someone may have pruned it)
            if isinstance(e, derr.APIError):
                kind = InvalidRequest if e.is_client_error() else BackendError
                raise kind(f"the engine refused sandbox {sandbox_id}: {e.explanation or e}") from None
            if isinstance(e, Exception) and not isinstance(e, OrchardError):
                raise BackendError(f"cannot start sandbox {sandbox_id}: {e}") from None
            raise

    # ------------------------------------------------------------------ query
    def _record(self, attrs: dict, with_logs: bool = False) -> SandboxRecord:
        cfg, config, state = self.config, attrs.get("Config") or {}, attrs.get("State") or {}
        labels = config.get("Labels") or {}
        meta = json.loads(labels.get(self.spec_label) or "{}")
        env = dict(e.split("=", 1) for e in config.get("Env") or [] if "=" in e)
        status = {"created": "pending", "running": "running", "paused": "running", "restarting": "pending",
                  "removing": "deleting"}.get(state.get("Status"), "failed")
        error = None
        if status == "failed":
            error = f"container {state.get('Status')} with code {state.get('ExitCode')}"
            if state.get("OOMKilled"):
                error += " (killed for memory)"
            if state.get("Error"):
                error += f": {state['Error']}"
            if with_logs:
                try:
                    tail = self.api.logs(attrs["Id"], tail=20).decode("utf-8", "replace").strip()
                except Exception:
                    tail = ""
                error += f"; log tail: {tail[-600:]}" if tail else ""
        net = next(iter(((attrs.get("NetworkSettings") or {}).get("Networks") or {}).values()), None) or {}
        if cfg.reach == "port":
            bound = ((attrs.get("NetworkSettings") or {}).get("Ports") or {}).get(f"{cfg.agent_port}/tcp") or []
            base_url = f"http://127.0.0.1:{bound[0]['HostPort']}" if bound else None
        else:
            base_url = f"http://{net['IPAddress']}:{cfg.agent_port}" if net.get("IPAddress") else None
        token = labels.get(self.token_label) or env.get("ORCHARD_AGENT_TOKEN", "")  # env: made by older versions
        endpoint = AgentEndpoint(base_url=base_url, token=token) if base_url else None
        return SandboxRecord(
            sandbox_id=labels[self.sandbox_label],
            image=meta.get("image", config.get("Image")),
            status=status,
            backend=self.name,
            block_network=meta.get("block_network", True),
            cpu=meta.get("cpu"),
            memory=meta.get("memory"),
            env=meta.get("env", {}),
            labels={k[len(self.user_label):]: v for k, v in labels.items() if k.startswith(self.user_label)},
            workdir=config.get("WorkingDir"),
            created_at=meta.get("created_at", time.time()),
            error=error,
            endpoint=endpoint,
            details={"container": attrs.get("Name", "").lstrip("/"), "container_id": attrs.get("Id"),
                     **({"services": json.loads(labels[self.services_label])} if self.services_label in labels else {}),
                     "ip": net.get("IPAddress"), "host_address": net.get("Gateway"),
                     "owner": labels.get(self.owner_label), "engine": self.engine},
        )

    def _inspect(self, sandbox_id: str) -> dict | None:
        try:
            attrs = self.api.inspect_container(self._name(sandbox_id))
        except derr.NotFound:
            return None
        labels = (attrs.get("Config") or {}).get("Labels") or {}
        return attrs if labels.get(self.role_label) == "sandbox" else None

    async def get(self, sandbox_id: str) -> SandboxRecord | None:
        def get():
            attrs = self._inspect(sandbox_id)
            return self._record(attrs, with_logs=True) if attrs else None
        return await self._run(get)

    async def is_alive(self, sandbox_id: str) -> bool:  # polled by wait_ready: no log fetch
        attrs = await self._run(self._inspect, sandbox_id)
        return attrs is not None and (attrs.get("State") or {}).get("Status") in ("created", "running", "paused")

    async def list(self) -> list[SandboxRecord]:
        """This process's sandboxes (the owner label), like the local backend's root."""
        def list_():
            filters = {"label": [f"{self.owner_label}={self.owner}", f"{self.role_label}=sandbox"]}
            out = []
            for summary in self.api.containers(all=True, filters=filters):
                try:
                    out.append(self._record(self.api.inspect_container(summary["Id"])))
                except derr.NotFound:  # deleted meanwhile
                    continue
            return sorted(out, key=lambda r: r.created_at)
        return await self._run(list_)

    def disk_limit_unavailable(self) -> str | None:
        """The container's storage size (`storage_opt size`) needs a storage driver with quotas;
        asked of the engine once (an engine that still refuses at create says why then)."""
        if self._disk_reason is None:
            self._disk_reason = [storage_quota_reason(self.api.info())]
        return self._disk_reason[0]

    def resources(self) -> dict:
        return {"backend": self.name, "engine": self.engine, "base_url": self.base_url,
                "network": self.config.network, "reach": self.config.reach, "owner": self.owner,
                "host_guard": self.guard, "pids_limit": self.config.pids_limit,
                "capabilities": list(self.config.capabilities)}

    async def sandbox_resources(self, sandbox_id: str) -> dict | None:
        """The base answer plus the engine's accounting (backends/engine_stats.py)."""
        def read():
            attrs = self._inspect(sandbox_id)
            if attrs is None:
                return None
            try:
                stats = self.api.stats(attrs["Id"], stream=False, one_shot=True)
            except derr.InvalidVersion:  # an engine API before 1.41: stats wait for a second sample
                stats = self.api.stats(attrs["Id"], stream=False)
            usage = engine_stats.usage_from_stats(stats)
            if usage["memory_peak_bytes"] is None and self.local_engine:
                usage["memory_peak_bytes"] = engine_stats.host_cgroup_peak((attrs.get("State") or {}).get("Pid"),
                                                                           attrs["Id"])
            return usage
        usage = await self._run(read)
        if usage is None:
            return None
        return {"sandbox_id": sandbox_id, "backend": self.name, "kill": "the engine's (container)",
                "accounting": "engine stats", "usage": usage}

    # ------------------------------------------------------------------ delete
    async def delete(self, sandbox_id: str) -> bool:
        def delete():
            found = self._destroy(self._name(sandbox_id))
            return self.services.remove(sandbox_id) or found  # after the sandbox: it is on their network
        return await self._run(delete)

    def _destroy(self, name: str) -> bool:
        """Kill and remove the container (all its processes die with it), then the per-sandbox
        volume that sandboxes of earlier versions had (the shared bundle volume stays)."""
        found = False
        for remove in (lambda: self.api.remove_container(name, force=True),
                       lambda: self.api.remove_volume(name, force=True)):
            try:
                remove()
                found = True
            except derr.APIError as e:
                if not container_lost(e):  # 404: gone already; Podman's 500 "no such container" too
                    raise
        return found

    def _swept_owner(self, labels: dict) -> bool:
        """A per-process owner (the owner is its creator) on this host that is gone."""
        owner = labels.get(self.owner_label, "")
        return owner == labels.get(self.creator_label, owner) and owner_gone(owner)

    def _sweep(self) -> list[str]:
        """Remove containers and volumes whose per-process owner on this host is gone."""
        mine = {"label": [self.owner_label]}
        removed = set()
        for summary in self.api.containers(all=True, filters=mine):
            labels = summary.get("Labels") or {}
            if self._swept_owner(labels):
                try:
                    self.api.remove_container(summary["Id"], force=True)
                except derr.NotFound:
                    pass
                removed.add(labels.get(self.sandbox_label, summary["Id"][:12]))
        removed.update(self.services.sweep(self._swept_owner))  # their containers went above
        removed.update(self.snapshots.sweep(self._swept_owner))
        for volume in self.api.volumes(filters=mine).get("Volumes") or []:
            labels = volume.get("Labels") or {}
            if self._swept_owner(labels):
                try:
                    self.api.remove_volume(volume["Name"], force=True)
                    removed.add(labels.get(self.sandbox_label, volume["Name"]))
                except derr.APIError as e:  # in use by a container we did not remove
                    log.warning("docker backend: cannot remove volume %s: %s", volume["Name"], e)
        try:  # bundle volumes of injector versions gone from the engine
            current = self.api.inspect_image(self.config.injector_image)["Id"]
        except derr.APIError:
            current = None
        removed.update(self.bundle.sweep(current))
        return sorted(removed)

    async def sweep(self) -> list[str]:
        return await self._run(self._sweep)

    # ------------------------------------------------------------------ snapshots (snapshots_docker.py)
    async def snapshot(self, sandbox_id: str, labels: dict[str, str] | None = None) -> SnapshotRecord:
        def take():
            attrs = self._inspect(sandbox_id)
            if attrs and self.services_label in ((attrs.get("Config") or {}).get("Labels") or {}):
                raise InvalidRequest(f"sandbox {sandbox_id} has services (sidecars): a snapshot would hold the "
                                     f"sandbox's files without their state, so it is refused")
            return self.snapshots.take(sandbox_id, labels)
        return await self._run(take)

    async def delete_snapshot(self, snapshot_id: str) -> bool:
        return await self._run(self.snapshots.delete, snapshot_id)

    async def list_snapshots(self) -> list[SnapshotRecord]:
        return await self._run(self.snapshots.list)

    async def get_snapshot(self, snapshot_id: str) -> SnapshotRecord | None:
        def get():
            attrs = self.snapshots._inspect(snapshot_id) if SNAPSHOT_ID_RE.match(snapshot_id) else None
            return self.snapshots._record(attrs) if attrs else None
        return await self._run(get)

    async def aclose(self) -> None:
        await self._run(self.client.close)


class _NameTaken(Exception):
    """Another create won the container name."""


class _ContainerLost(Exception):
    """The engine lost the container it had just created (see container_lost)."""


QUOTA_DRIVERS = ("btrfs", "zfs", "devicemapper", "windowsfilter")  # a container size without more set-up


def storage_quota_reason(info: dict) -> str | None:
    """Why the engine (its `/info`) cannot cap a container's storage (`storage_opt size`), or
    None. overlay has it only on XFS mounted with pquota, which /info does not show: that
    engine refuses at create, saying so."""
    driver = info.get("Driver") or "unknown"
    status = dict(pair for pair in info.get("DriverStatus") or [] if isinstance(pair, list) and len(pair) == 2)
    if driver in ("overlay", "overlay2"):
        backing = status.get("Backing Filesystem") or "an unknown file system"
        if backing == "xfs":
            return None
        return (f"the engine's storage driver is {driver} on {backing}: a container's size needs overlay on XFS "
                f"mounted with pquota (or the {', '.join(QUOTA_DRIVERS[:3])} driver)")
    return None if driver in QUOTA_DRIVERS else f"the engine's storage driver {driver!r} cannot cap a container's size"
