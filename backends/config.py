"""Backend configs: one pydantic model per backend, told apart by `type`.

Each config builds its backend with `get_backend()`; the backend modules are imported
only then, so `import orchard_gym` never pulls in docker or kubernetes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from orchard_gym.models import Memory


def default_injector_image() -> str:
    """$ORCHARD_INJECTOR_IMAGE, else the image scripts/build_injector_image.sh builds."""
    return os.environ.get("ORCHARD_INJECTOR_IMAGE") or "localhost/orchard/agent-injector:latest"


class LocalBackendConfig(BaseModel):
    """Sandboxes as local processes, in bubblewrap namespaces where available."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["local"] = "local"
    root: Path | None = Field(None, description="where sandbox folders live (default: $ORCHARD_LOCAL_ROOT or /tmp/orchard-gym-UID)")
    isolation: Literal["auto", "bwrap", "none"] = Field(
        "auto", description="bwrap: PID/mount/network namespaces; none: a plain process; auto: bwrap when present"
    )
    spawner: Literal["auto", "zygote", "bwrap"] = Field(
        default_factory=lambda: os.environ.get("ORCHARD_LOCAL_SPAWNER") or "auto",
        description="how a bwrap-isolated sandbox starts: zygote (forked from one warm agent, see "
                    "backends/zygote.py), bwrap (a bwrap + python3 per sandbox), auto: the zygote where it can "
                    "run (root, Linux 5.12+), else bwrap (default: $ORCHARD_LOCAL_SPAWNER)")
    die_with_client: bool = Field(True, description="kill sandboxes when the creating process dies")
    max_output: int = Field(4 * 1024 * 1024, gt=0, description="bytes of stdout/stderr kept per command")
    cgroups: Literal["auto", "v1", "v2", "off"] = Field(
        "auto", description="a cgroup per sandbox and per command (freeze-then-kill, limits, accounting); auto: the "
                            "hierarchy that can limit most, else the environment-marker kill (see docs/backends.md)")
    cgroup_parent: str = Field("orchard-gym", pattern=r"^/?[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$",
                               description="folder of the sandbox cgroups: relative to this process's own cgroup, "
                                           "or absolute from the hierarchy's root")
    pids_limit: int | None = Field(1024, ge=8, le=4194304, description="processes and threads per sandbox "
                                   "(cgroups only; None: unlimited)")
    hide: list[Path] = Field(default_factory=list, description="host folders no sandbox may read (an empty tmpfs "
                             "covers each), e.g. task folders holding solutions; Orchard/Claw-v0's Harbor tasks add theirs")
    read_only_paths: list[Path] = Field(
        default_factory=lambda: [Path(p) for p in os.environ.get("ORCHARD_LOCAL_READ_ONLY", "").split(os.pathsep) if p],
        description="host paths an isolated sandbox also sees, read-only at the same path, besides its minimal view "
                    "(the userland, a filtered /etc, the interpreter, the agent and the orchard cache's shared "
                    "folders; see backends/local_view.py) (default: $ORCHARD_LOCAL_READ_ONLY, ':'-separated)")
    # Limits of every sandbox (docs/backends.md, "Default limits"); None: unlimited. A command
    # that hits one gets it said in its result (JobResult.error, and a line on stderr).
    default_memory: Memory | None = Field("4g", description="memory of a sandbox whose spec asks for none "
                                          "(/tmp's pages count too); held by its cgroup, not enforced without one")
    tmp_size: Memory | None = Field("1g", description="size of the sandbox's private /tmp (a tmpfs: host memory)")
    workdir_size: Memory | None = Field("10g", description="size of the workdir: a loop-mounted ext4 image per "
                                        "sandbox (root, losetup and mkfs.ext4 needed; else not enforced)")
    snapshots: Literal["auto", "layers", "copy"] = Field(
        "auto", description="layers: a snapshot is an overlay layer of what changed and a fork an overlay mount "
                            "(root; backends/layers.py); copy: both copy the whole workdir; auto: layers where they work")
    any_image_as_host: bool = Field(
        default_factory=lambda: os.environ.get("ORCHARD_LOCAL_ANY_IMAGE", "").lower() in ("1", "true", "yes", "on"),
        description="run a sandbox asking for any image on the host's userland (one warning) instead of refusing "
                    "it with 422: for image-agnostic benchmarks (default: $ORCHARD_LOCAL_ANY_IMAGE)")

    @field_validator("cgroup_parent")
    @classmethod
    def _no_dots(cls, v: str) -> str:
        if any(part in (".", "..") for part in v.split("/")):
            raise ValueError("cgroup_parent must not hold '.' or '..' components")
        return v

    @field_validator("read_only_paths")
    @classmethod
    def _absolute(cls, v: list[Path]) -> list[Path]:
        for path in v:
            if not path.is_absolute() or str(path) == "/":
                raise ValueError(f"read_only_paths must be absolute paths below / (not {str(path)!r})")
        return v

    def get_backend(self):
        from orchard_gym.backends.local import LocalBackend

        return LocalBackend(self)


_NAME = r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$"  # what engines accept as network/object names

# What a root agent in a task image needs (apt drops to _apt: SETUID/SETGID; dpkg and pip chown
# and chmod files they do not own: CHOWN/DAC_OVERRIDE/FOWNER/FSETID; KILL for its own jobs;
# servers on ports < 1024). Not kept from the engines' defaults: NET_RAW (raw sockets,
# ARP/ICMP spoofing on the bridge), MKNOD, SYS_CHROOT, SETPCAP, SETFCAP, AUDIT_WRITE.
DOCKER_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "NET_BIND_SERVICE")
LINUX_CAPABILITIES = frozenset(
    "CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP LINUX_IMMUTABLE "
    "NET_BIND_SERVICE NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER SYS_MODULE SYS_RAWIO SYS_CHROOT "
    "SYS_PTRACE SYS_PACCT SYS_ADMIN SYS_BOOT SYS_NICE SYS_RESOURCE SYS_TIME SYS_TTY_CONFIG MKNOD LEASE "
    "AUDIT_WRITE AUDIT_CONTROL SETFCAP MAC_OVERRIDE MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND AUDIT_READ "
    "PERFMON BPF CHECKPOINT_RESTORE".split())


class DockerBackendConfig(BaseModel):
    """Sandboxes as containers of any image on Docker Engine or Podman's Docker API,
    with the agent injected from `injector_image` (see docs/backends.md)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["docker"] = "docker"
    base_url: str | None = Field(
        None, pattern=r"^(unix|tcp|http|https|ssh|npipe)://.+",
        description="engine API (default: $DOCKER_HOST, else unix:///run/podman/podman.sock if present, "
                    "else Docker's unix:///var/run/docker.sock)")
    default_image: str = Field("localhost/orchard/bookworm:latest", min_length=1,
                               description="image of sandboxes created with image=None")
    injector_image: str = Field(default_factory=lambda: default_injector_image(), min_length=1,
                                description="copies the agent bundle into each sandbox's volume")
    pull: Literal["never", "if-missing"] = Field(
        "if-missing", description="if-missing: pull a missing image once, then fail; never: local images only")
    network: str = Field("orchard-internal", pattern=_NAME,
                         description="internal network (no egress) of blocked sandboxes; created if missing")
    open_network: str = Field("bridge", pattern=_NAME, description="network of sandboxes with block_network=False")
    reach: Literal["ip", "port"] = Field(
        "ip", description="ip: the container's IP; port: a published 127.0.0.1 port (block_network=False only)")
    agent_port: int = Field(8765, ge=1, le=65535, description="the agent's port inside the container")
    label_prefix: str = Field("orchard-gym", pattern=r"^[a-z0-9][a-z0-9.-]{0,40}$",
                              description="prefix of labels and of container/volume names")
    workdir: str | None = Field(None, pattern=r"^/", description="default cwd of commands "
                                "(default: the image's WORKDIR, else /workspace)")
    max_output: int = Field(4 * 1024 * 1024, gt=0, description="bytes of stdout/stderr kept per command")
    workers: int = Field(16, ge=1, le=256, description="engine API calls in flight at once")
    api_timeout: float = Field(120.0, gt=0, le=3600, description="seconds for one engine API call")
    owner: str | None = Field(None, pattern=_NAME,
                              description="ownership label shared by every process using this config (the "
                                          "orchestrator's replicas); never swept by process liveness; default: "
                                          "this process, whose sandboxes list() then shows alone")
    capabilities: list[Annotated[str, Field(pattern=r"^[A-Z_]{2,32}$")]] = Field(
        default_factory=lambda: list(DOCKER_CAPABILITIES),
        description="capabilities kept (all others dropped) for commands run as root in the task image")
    pids_limit: int = Field(1024, ge=16, le=4_194_304, description="processes and threads at once per sandbox")
    host_guard: bool = Field(True, description="an iptables rule (root, local engine) refusing new connections "
                                               "from blocked sandboxes to this host's own addresses")
    host_guard_allow_ports: list[Annotated[int, Field(ge=1, le=65535)]] = Field(
        default_factory=list, description="TCP ports on the host that blocked sandboxes may still open "
                                          "(e.g. a recording proxy's)")

    @field_validator("capabilities")
    @classmethod
    def _known_caps(cls, v: list[str]) -> list[str]:
        names = [c.removeprefix("CAP_") for c in v]
        unknown = sorted(set(names) - LINUX_CAPABILITIES)
        if unknown:
            raise ValueError(f"unknown capabilities {unknown}; known: {sorted(LINUX_CAPABILITIES)}")
        return names

    def get_backend(self):
        from orchard_gym.backends.docker import DockerBackend

        return DockerBackend(self)


_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
_LABEL_VALUE = r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$"
_LABEL_KEY = r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"


class Toleration(BaseModel):
    """A pod toleration, as in the Kubernetes API (camelCase fields)."""

    model_config = ConfigDict(extra="forbid")

    key: str | None = Field(None, pattern=_LABEL_KEY)
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = Field(None, pattern=_LABEL_VALUE)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    tolerationSeconds: int | None = Field(None, ge=0)


class KubernetesBackendConfig(BaseModel):
    """Sandboxes as pods of any image on a Kubernetes cluster, with the agent injected by an
    init container; exec goes straight to the pod IP (see docs/kubernetes.md)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["kubernetes"] = "kubernetes"
    kubeconfig: Path | None = Field(None, description="kubeconfig file (default: the in-cluster service account "
                                    "inside a pod, else $KUBECONFIG or ~/.kube/config)")
    context: str | None = Field(None, min_length=1, description="kubeconfig context (default: its current one)")
    namespace: str = Field("orchard-sandboxes", pattern=_DNS_LABEL, description="namespace of the sandbox pods")
    default_image: str = Field("localhost/orchard/bookworm:latest", min_length=1,
                               description="image of sandboxes created with image=None")
    injector_image: str = Field(default_factory=lambda: default_injector_image(), min_length=1,
                                description="init container image that copies the agent bundle into the pod")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    injector_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    agent_volume: Literal["init", "image"] = Field(
        "init", description="init: an init container copies the bundle into an emptyDir per pod; image: the "
                            "injector image is mounted read-only as an image volume (its /bundle, no copy; needs "
                            "Kubernetes >= 1.33 with the ImageVolume feature gate)")
    image_pull_secrets: list[Annotated[str, Field(pattern=_DNS_SUBDOMAIN)]] = Field(default_factory=list)
    service_account: str | None = Field(None, pattern=_DNS_SUBDOMAIN,
                                        description="of the sandbox pods (its token is never mounted)")
    node_selector: dict[Annotated[str, Field(pattern=_LABEL_KEY)], Annotated[str, Field(pattern=_LABEL_VALUE)]] = \
        Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    runtime_class: str | None = Field(None, pattern=_DNS_SUBDOMAIN, description="e.g. gvisor or kata")
    owner: str | None = Field(None, min_length=1, pattern=_LABEL_VALUE,
                              description="ownership label shared by every process using this config (set it for "
                                          "the orchestrator's replicas); default: this process, whose sandboxes "
                                          "list() then shows alone")
    label_prefix: str = Field("orchard-gym", pattern=r"^[a-z0-9]([-a-z0-9.]{0,38}[a-z0-9])?$",
                              description="prefix of label and annotation keys and of object names")
    agent_port: int = Field(8765, ge=1, le=65535, description="the agent's port in the pod")
    workdir: str = Field("/workspace", pattern=r"^/", description="default cwd of commands")
    max_output: int = Field(4 * 1024 * 1024, gt=0, description="bytes of stdout/stderr kept per command")
    cpu_request: float = Field(0.1, gt=0, le=1024, description="cores requested per sandbox (capped at its limit)")
    memory_request: int | str = Field("128m", description="memory requested per sandbox (capped at its limit)")
    default_cpu: float | None = Field(None, gt=0, le=1024, description="CPU limit of sandboxes that ask for none")
    default_memory: int | str | None = Field(None, description="memory limit of sandboxes that ask for none")
    token_source: Literal["secret", "env"] = Field(
        "secret", description="secret: a per-sandbox Secret the pod reads (not in the pod spec); env: in the pod spec")
    security: Literal["baseline", "restricted"] = Field(
        "baseline", description="baseline: root allowed, no privilege escalation, NET_RAW dropped, RuntimeDefault "
                                "seccomp; restricted: also non-root, every capability dropped")
    run_as_user: int | None = Field(None, ge=1, le=2**31 - 1, description="uid of sandboxes (restricted: 65532)")
    egress_allow: list[str] = Field(default_factory=list, description="addresses every sandbox may reach even with "
                                    "block_network=True: 'CIDR' or 'CIDR:PORT' (e.g. a recording proxy)")
    manage_network_policies: bool = Field(True, description="create the deny-egress policy and per-sandbox allowing "
                                          "ones (off: the cluster's admins manage egress)")
    delete_grace_seconds: int = Field(0, ge=0, le=3600, description="0: the pod object goes at once and its "
                                      "processes are killed right after")
    startup_timeout: int = Field(300, ge=1, le=86400, description="seconds the startup probe allows the agent")
    workers: int = Field(16, ge=1, le=256, description="API calls in flight at once")
    api_timeout: float = Field(30.0, gt=0, le=3600, description="seconds for one API call")
    api_retries: int = Field(6, ge=0, le=50, description="retries of a call answered 429, 5xx or cut off")
    watch_timeout: int = Field(300, ge=5, le=3600, description="seconds one watch request lasts before it resumes")
    verify_reach: bool = Field(True, description="call the agent once when its pod turns ready, so that a pod IP "
                               "this process cannot reach fails at once with a clear error")
    snapshot_dir: Path | None = Field(None, description="where snapshots' tarballs are kept (default "
                                      "$ORCHARD_CACHE/k8s-snapshots); pods read them through snapshot_volume")
    snapshot_volume: dict | None = Field(None, description="the pod volume source holding snapshot_dir's files "
                                         "(default: a hostPath of snapshot_dir, for single-node clusters; else a "
                                         "ReadWriteMany persistentVolumeClaim mounted at snapshot_dir here)")

    @field_validator("memory_request", "default_memory")
    @classmethod
    def _memory(cls, v):
        from orchard_gym.models import parse_memory

        parse_memory(v)
        return v

    @field_validator("egress_allow")
    @classmethod
    def _egress(cls, v: list[str]) -> list[str]:
        import ipaddress

        for entry in v:
            cidr, _, port = entry.rpartition(":") if entry.count(":") == 1 else (entry, "", "")
            cidr = cidr or entry
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                raise ValueError(f"egress_allow entry {entry!r} is not 'CIDR' or 'CIDR:PORT'") from None
            if port and not (port.isdigit() and 1 <= int(port) <= 65535):
                raise ValueError(f"egress_allow entry {entry!r}: bad port {port!r}")
        return v

    def get_backend(self):
        from orchard_gym.backends.kubernetes import KubernetesBackend

        return KubernetesBackend(self)


BackendConfig = Annotated[LocalBackendConfig | DockerBackendConfig | KubernetesBackendConfig,
                          Field(discriminator="type")]
_adapter: TypeAdapter = TypeAdapter(BackendConfig)


def parse_backend_config(data: dict | str | BaseModel) -> BaseModel:
    """A config object from a dict like {"type": "local", ...}, or a bare type name ("local",
    "docker", "kubernetes": that backend's defaults, as the CLI's --backend says it)."""
    from orchard_gym.errors import InvalidRequest

    if isinstance(data, BaseModel):
        return data
    if isinstance(data, str):
        data = {"type": data}
    try:
        return _adapter.validate_python(data)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'config'}: {err['msg']}" for err in e.errors())
        raise InvalidRequest(f"bad backend config {data!r}: {problems}") from None
