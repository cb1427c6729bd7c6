"""Sidecar services of a docker sandbox (`SandboxSpec.services`): what a compose file's
services other than the agent's are, run by the docker backend.

A sandbox with services gets a network of its own, `PREFIX-<sandbox id>` (internal, with the
host guard for its subnet, when the sandbox is blocked; routed when it is not), instead of the
shared one. Every service is a container `PREFIX-<sandbox id>-<service>` on it, started in
dependency order (a `service_healthy` dependency is waited for first), confined as the sandbox
is (capabilities, no-new-privileges, pids limit, an init), never pulled. Names resolve through
`/etc/hosts` (`extra_hosts`: the service's address under its name), not through the engine's
DNS: on a blocked sandbox's network the host guard refuses every packet to the host, the DNS
server on the gateway included (which would forward any name outside: a way out), so only
names written into the containers resolve there; the sandbox knows every service, a service
the ones started before it. Once all are started, each service with a healthcheck must turn
healthy before the sandbox starts (`docker compose up --wait`); the probes are run by this
module (`exec` in the service), not by the engine: Podman without systemd never runs them.

Everything carries the sandbox's owner labels and `PREFIX.sandbox=<id>`: `remove` (on delete,
and on any failure half-way through a create) takes the services, the guard's rules for the
subnet and the network away; the backend's sweep takes what dead owners left.
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from typing import Any

from orchard_gym.errors import BackendError, InvalidRequest
from orchard_gym.models import ServiceHealthcheck, ServiceSpec

from . import host_guard

try:
    import docker
    from docker import errors as derr
except ImportError:  # pragma: no cover - the extra is missing
    docker = None

log = logging.getLogger(__name__)
POLL = 0.5  # seconds between a failed probe and the next one (at most: `interval` when shorter)


class ServiceFailed(BackendError):
    """A service exited or did not turn healthy."""


class NetworkTaken(Exception):
    """The sandbox's network exists already (so does the sandbox, most likely)."""


class Sidecars:
    def __init__(self, backend: Any):  # the DockerBackend (not imported: it imports this module)
        self.b = backend
        self.api = backend.api

    def network_name(self, sandbox_id: str) -> str:
        return f"{self.b.config.label_prefix}-{sandbox_id}"

    def container_name(self, sandbox_id: str, service: str) -> str:
        return f"{self.b.config.label_prefix}-{sandbox_id}-{service}"

    # ------------------------------------------------------------------ network
    def make_network(self, sandbox_id: str, blocked: bool, ours: dict[str, str]) -> str:
        """The sandbox's own network (internal and guarded when `blocked`)."""
        name = self.network_name(sandbox_id)
        labels = {**ours, self.b.role_label: "network"}
        try:
            self.api.inspect_network(name)
            raise NetworkTaken(name)
        except derr.NotFound:
            pass
        try:
            self.api.create_network(name, internal=blocked, labels=labels)
        except derr.APIError as e:
            if e.status_code == 409 or "already exists" in str(e).lower():
                raise NetworkTaken(name) from None
            raise BackendError(f"cannot create the network {name!r} of sandbox {sandbox_id}: "
                               f"{e.explanation or e}") from None
        if blocked and self.b.config.host_guard:
            self._guard(name)
        return name

    def _subnets(self, name: str) -> list[str]:
        net = self.api.inspect_network(name)
        return [c["Subnet"] for c in (net.get("IPAM") or {}).get("Config") or [] if c.get("Subnet")]

    def _guard(self, name: str) -> None:
        if not self.b.local_engine:
            raise BackendError(f"the host guard cannot be installed for the remote engine at {self.b.base_url}: a "
                               f"blocked sandbox with services needs it for its own network (or set host_guard=false)")
        subnets = self._subnets(name)
        if not subnets:
            raise BackendError(f"network {name!r} reports no subnet: cannot install the host guard")
        try:
            for subnet in subnets:
                host_guard.install(subnet, self.b.config.host_guard_allow_ports)
        except (host_guard.GuardError, OSError, subprocess.SubprocessError) as e:
            raise BackendError(f"cannot install the host guard for {', '.join(subnets)} (network {name}): {e}; run "
                               f"as root, or set host_guard=false") from None

    # ------------------------------------------------------------------ start
    def start(self, sandbox_id: str, services: list[ServiceSpec], network: str,
              ours: dict[str, str]) -> dict[str, str]:
        """Start the services (in dependency order) and wait until those with a healthcheck are
        healthy; {service name: its address on `network`}. The caller removes all on failure."""
        cfg, hosts = self.b.config, {}
        healthy: set[str] = set()
        by_name = {s.name: s for s in services}
        for s in services:  # check_services (SandboxSpec) put them in dependency order
            for dep, condition in s.depends_on.items():
                if condition == "service_healthy" and dep not in healthy:
                    self.wait_healthy(sandbox_id, by_name[dep])
                    healthy.add(dep)
            self.b._ensure_image(s.image, f"; service {s.name!r} of sandbox {sandbox_id} (nothing is pulled)")
            name = self.container_name(sandbox_id, s.name)
            host_config = self.api.create_host_config(
                init=True, network_mode=network, extra_hosts=dict(hosts) or None,
                cap_drop=["ALL"], cap_add=list(cfg.capabilities), security_opt=["no-new-privileges"],
                pids_limit=cfg.pids_limit)
            try:
                self.api.create_container(
                    s.image, name=name, hostname=s.name, command=s.command, entrypoint=s.entrypoint,
                    environment=s.env, working_dir=s.workdir, user=s.user or "",
                    labels={**ours, self.b.role_label: "service", f"{cfg.label_prefix}.service": s.name},
                    host_config=host_config,
                    networking_config=self.api.create_networking_config(
                        {network: self.api.create_endpoint_config(aliases=[s.name])}))
                self.api.start(name)
            except derr.APIError as e:
                kind = InvalidRequest if e.is_client_error() else BackendError
                raise kind(f"the engine refused service {s.name!r} of sandbox {sandbox_id}: "
                           f"{e.explanation or e}") from None
            hosts[s.name] = self._address(sandbox_id, s.name, network)
        for s in services:  # `compose up --wait`: all healthy before the sandbox starts
            if s.name not in healthy:
                self.wait_healthy(sandbox_id, s)
        return hosts

    def _address(self, sandbox_id: str, service: str, network: str) -> str:
        attrs = self.api.inspect_container(self.container_name(sandbox_id, service))
        if (attrs.get("State") or {}).get("Status") != "running":  # exited already: it lost its address too
            raise ServiceFailed(f"service {service!r} of sandbox {sandbox_id} is not running: {self._state(attrs)}")
        ip = (((attrs.get("NetworkSettings") or {}).get("Networks") or {}).get(network) or {}).get("IPAddress")
        if not ip:
            raise ServiceFailed(f"service {service!r} of sandbox {sandbox_id} has no address on {network}: "
                                f"{self._state(attrs)}")
        return ip

    def _state(self, attrs: dict) -> str:
        state = attrs.get("State") or {}
        text = f"{state.get('Status')} (exit code {state.get('ExitCode')})"
        try:
            tail = self.api.logs(attrs["Id"], tail=10).decode("utf-8", "replace").strip()
        except Exception:
            tail = ""
        return text + (f"; log tail: {tail[-500:]}" if tail else "")

    def _probe(self, container: str, check: ServiceHealthcheck) -> bool:
        """One run of the probe in the service: exit 0 within `timeout`. Run attached, on a
        thread of its own (Podman 4's detached execs never report their exit); a probe past its
        timeout is a failure, its thread left to end with the probe (or the container)."""
        done: dict[str, int] = {}

        def run() -> None:
            try:
                exec_id = self.api.exec_create(container, check.test)["Id"]
                self.api.exec_start(exec_id)
                done["code"] = self.api.exec_inspect(exec_id).get("ExitCode", -1)
            except Exception as e:  # the container went away, the engine refused: not healthy
                log.debug("probe in %s: %s", container, e)
        worker = threading.Thread(target=run, daemon=True, name=f"probe-{container}")
        worker.start()
        worker.join(check.timeout)
        return done.get("code") == 0

    def wait_healthy(self, sandbox_id: str, service: ServiceSpec) -> None:
        """Until the service's probe passes (no healthcheck: until it runs); ServiceFailed when it
        exits or its time is up (start_period + retries * interval + timeout)."""
        name = self.container_name(sandbox_id, service.name)
        check = service.healthcheck
        limit = check.start_period + check.retries * check.interval + check.timeout if check else 0.0
        ends = time.monotonic() + limit
        while True:
            attrs = self.api.inspect_container(name)
            if (attrs.get("State") or {}).get("Status") != "running":
                raise ServiceFailed(f"service {service.name!r} of sandbox {sandbox_id} is not running: "
                                    f"{self._state(attrs)}")
            if check is None or self._probe(name, check):
                return
            if time.monotonic() >= ends:
                raise ServiceFailed(f"service {service.name!r} of sandbox {sandbox_id} did not turn healthy within "
                                    f"{limit:.0f} s (healthcheck {check.test!r}): {self._state(attrs)}")
            time.sleep(min(POLL, check.interval))

    # ------------------------------------------------------------------ remove
    def remove(self, sandbox_id: str) -> bool:
        """The sandbox's services, its guard rules and its network; True if anything was there."""
        found = False
        filters = {"label": [f"{self.b.sandbox_label}={sandbox_id}", f"{self.b.role_label}=service"]}
        for summary in self.api.containers(all=True, filters=filters):
            found |= self._remove_container(summary["Id"])
        return self._remove_network(self.network_name(sandbox_id)) or found

    def _remove_container(self, ident: str) -> bool:
        try:
            self.api.remove_container(ident, force=True)
            return True
        except derr.APIError as e:
            if e.status_code == 404 or "no such container" in str(e).lower():
                return False
            raise

    def _remove_network(self, name: str) -> bool:
        try:
            net = self.api.inspect_network(name)
        except derr.NotFound:
            return False
        if (net.get("Labels") or {}).get(self.b.role_label) != "network":
            return False  # not a sandbox's network: never ours to remove
        if net.get("Internal") and self.b.local_engine:  # rules first: the subnet is still this network's
            for c in (net.get("IPAM") or {}).get("Config") or []:
                if c.get("Subnet"):
                    try:
                        host_guard.remove(c["Subnet"])
                    except (host_guard.GuardError, OSError, subprocess.SubprocessError) as e:
                        log.warning("docker backend: cannot remove the host guard rules of %s: %s", c["Subnet"], e)
        try:
            self.api.remove_network(name)
        except derr.NotFound:
            return False
        return True

    def sweep(self, gone) -> list[str]:
        """Networks of sandboxes whose per-process owner is gone (their containers are swept
        with the sandboxes'); the sandbox ids."""
        removed = []
        filters = {"label": [self.b.owner_label, f"{self.b.role_label}=network"]}
        for net in self.api.networks(filters=filters):
            labels = net.get("Labels") or {}
            if gone(labels):
                try:
                    if self._remove_network(net["Name"]):
                        removed.append(labels.get(self.b.sandbox_label, net["Name"]))
                except derr.APIError as e:  # still in use by a container we did not remove
                    log.warning("docker backend: cannot remove network %s: %s", net["Name"], e)
        return removed
