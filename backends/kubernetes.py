"""The kubernetes backend: a sandbox is a pod of the task's own image with the agent injected
into it; commands go straight to the pod IP, never through the API server.

The pod (`pod_manifest()`, in backends/kubernetes_manifests.py; every field is validated
against the Kubernetes schema in tests/test_kubernetes_backend.py):

- an init container from `injector_image` copies the self-contained agent bundle (its own
  loader, libc and Python; docs/agent_bundle.md) into an `emptyDir`;
- the task container runs the task image with that volume mounted read-only at
  /opt/orchard-agent and the bundle's loader as its command, so the image's entrypoint
  never runs and the image needs neither Python nor glibc;
- startup and readiness probes GET the agent's /health; CPU/memory requests and limits;
  `restartPolicy: Never` (a sandbox whose agent died has lost its state: it is failed, not
  restarted); `shareProcessNamespace` puts the pause process at PID 1, which reaps the
  zombies of double-forked commands; `automountServiceAccountToken: false` and
  `enableServiceLinks: false` keep cluster credentials and service addresses out of it;
- the per-sandbox agent token lives in a Secret of the same name that the pod reads into
  its environment (`token_source="secret"`, the default), or in the pod spec itself
  (`token_source="env"`). The Secret costs one more API write per sandbox (and one
  ownerReferences patch, off the critical path, so the cluster's garbage collector removes
  it with the pod), but the token is then not readable by whoever may read pods, is not
  shown by `kubectl describe/get -o yaml` of the pod, can be encrypted at rest, and RBAC
  can grant pods and secrets separately. `env` is one write less per create;
- labels `PREFIX/role=sandbox`, `PREFIX/sandbox=ID`, `PREFIX/owner=OWNER`; the spec the
  sandbox was created from and the owner's identity in annotations.

Network: a deny-egress NetworkPolicy (`PREFIX-deny-egress`) selecting every sandbox pod
of the namespace is created once; a sandbox with `block_network=False` gets an allowing
policy of its own (`PREFIX-ID-egress`); `egress_allow` adds one policy letting every
sandbox reach the given addresses (e.g. a recording proxy) and nothing else. Policies are
only enforced by CNIs that implement them (Calico, Cilium, k3s' kube-router; not kindnet
or flannel alone): see docs/kubernetes.md.

Watching (`PodWatcher`, in backends/kubernetes_watch.py): one LIST + WATCH of this owner's sandbox pods per backend, in a
thread, with resourceVersion tracking, bookmarks, a re-list on 410 Gone and reconnects
with backoff. It caches every pod (phase, IP, readiness), wakes the coroutines waiting for
a sandbox the moment its pod changes (no per-sandbox polling), and reports pods that
failed, were evicted or were deleted by someone else to `on_lost()` subscribers (the
orchestrator's reconciler marks them failed at once); `get()` reports those as failed.

Control-plane calls are blocking (the official client is sync): each runs on its own
thread, at most `workers` at once, and is retried with exponential backoff and jitter on
429 (honouring Retry-After), 5xx and broken connections; a create retried after a broken
connection recognises its own object by a nonce annotation.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import os
import re
import threading
import time
from collections import Counter, OrderedDict
from datetime import datetime, UTC

from orchard_gym._loop import run_in_thread
from orchard_gym.agent_client import AgentClient
from orchard_gym.errors import (
    BackendError,
    ImageNotFound,
    InvalidRequest,
    OrchardError,
    SandboxFailed,
    SandboxTimeout,
)
from orchard_gym.models import AgentEndpoint, SandboxRecord, SandboxSpec, SnapshotRecord

from .base import Backend, new_sandbox_id, new_token
from .config import KubernetesBackendConfig
from .docker import owner_gone, owner_identity
from .kubernetes_api import ApiCalls
from .kubernetes_manifests import TASK_CONTAINER, PodManifests
from .snapshots_k8s import DirectorySnapshotStore, KubernetesSnapshots, default_snapshot_dir
from .kubernetes_watch import (
    TOMBSTONES,
    PodWatcher,
    pod_is_ready,
    pod_status,
    pod_summary,
    remember,
)
from .kubernetes_errors import api_message

try:
    import kubernetes
    from kubernetes.client.rest import ApiException
except ImportError:  # pragma: no cover - the extra is missing
    kubernetes = None

log = logging.getLogger(__name__)



# --------------------------------------------------------------------------- backend
class KubernetesBackend(PodManifests, ApiCalls, Backend):
    name = "kubernetes"

    def __init__(self, config: KubernetesBackendConfig | None = None):
        if kubernetes is None:
            raise BackendError("the kubernetes backend needs the kubernetes client: pip install 'orchard-gym[k8s]'")
        self.config = cfg = config or KubernetesBackendConfig()
        self.namespace = cfg.namespace
        p = cfg.label_prefix
        self.role_label, self.sandbox_label, self.owner_label = f"{p}/role", f"{p}/sandbox", f"{p}/owner"
        self.spec_annotation, self.identity_annotation, self.nonce_annotation = f"{p}/spec", f"{p}/owner-identity", \
            f"{p}/nonce"
        self.token_annotation = f"{p}/agent-token"  # token_source="env" only; the pod has its SHA-256
        self.identity = owner_identity()
        self.owner = cfg.owner or _process_owner(self.identity)
        self.counters: Counter = Counter()
        self._slots = threading.BoundedSemaphore(cfg.workers)
        self._setup_lock = threading.Lock()
        self._setup_done = False
        self._tokens: OrderedDict[str, str] = OrderedDict()  # sandbox id -> agent token (known here)
        self._created_here: OrderedDict[str, None] = OrderedDict()
        self._known = threading.Lock()  # guards both: worker threads and the loop use them
        self.swept: list[str] = []
        self.snapshots = KubernetesSnapshots(self, DirectorySnapshotStore(
            cfg.snapshot_dir or default_snapshot_dir(), cfg.snapshot_volume))
        self.api_client = self._client()
        self.core = kubernetes.client.CoreV1Api(self.api_client)
        self.net = kubernetes.client.NetworkingV1Api(self.api_client)
        self.server = self.api_client.configuration.host
        try:  # fail fast, with the address, when the cluster cannot be reached
            version = self._call(kubernetes.client.VersionApi(self.api_client).get_code, retries=1)
        except (OrchardError, ApiException) as e:
            self.api_client.close()
            detail = f"{e.status} {api_message(e)}" if isinstance(e, ApiException) else str(e)
            raise BackendError(f"cannot reach the Kubernetes API at {self.server}: {detail}") from None
        self.version = (version or {}).get("gitVersion", "?")
        self.watcher = PodWatcher(self, f"{self.role_label}=sandbox,{self.owner_label}={self.owner}")
        self.watcher.start()

    def _client(self):
        cfg = self.config
        conf = kubernetes.client.Configuration()
        try:
            if cfg.kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
                kubernetes.config.load_incluster_config(client_configuration=conf)
            else:
                if cfg.kubeconfig is not None and not cfg.kubeconfig.is_file():
                    raise BackendError(f"kubeconfig {cfg.kubeconfig} does not exist")
                kubernetes.config.load_kube_config(config_file=str(cfg.kubeconfig) if cfg.kubeconfig else None,
                                                   context=cfg.context, client_configuration=conf,
                                                   persist_config=False)
        except BackendError:
            raise
        except Exception as e:
            where = cfg.kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
            raise BackendError(f"cannot load the Kubernetes config ({where}, context {cfg.context or 'current'}): "
                               f"{e}") from None
        conf.retries = 0  # we retry, with backoff, ourselves
        conf.connection_pool_maxsize = cfg.workers + 4
        return kubernetes.client.ApiClient(conf)

    async def _run(self, fn, *args):
        return await run_in_thread(fn, *args)

    def _setup(self) -> None:
        """Namespace-wide policies, once per backend."""
        if self._setup_done or not self.config.manage_network_policies:
            return
        with self._setup_lock:
            if self._setup_done:
                return
            for manifest in (self.deny_policy_manifest(), self.egress_allow_manifest()):
                if manifest is None:
                    continue
                name = manifest["metadata"]["name"]
                try:
                    self._call(self.net.create_namespaced_network_policy, self.namespace, manifest)
                except ApiException as e:
                    if e.status == 409:  # there already (another process, or the deploy manifests)
                        if manifest["metadata"]["labels"][self.role_label] == "egress-allow":
                            self._api(f"update NetworkPolicy {name}", self.net.patch_namespaced_network_policy,
                                      name, self.namespace, {"spec": manifest["spec"]})
                        continue
                    raise BackendError(
                        f"cannot create NetworkPolicy {name} in {self.namespace} ({e.status}: {api_message(e)}): "
                        f"without it sandboxes would have network access. Grant networkpolicies create "
                        f"(deploy/k8s/base/rbac.yaml), or set manage_network_policies=false if the cluster's "
                        f"admins manage egress") from None
            self._setup_done = True

    def disk_limit_unavailable(self) -> str | None:
        return None  # the pod's ephemeral-storage limit (kubernetes_manifests.py)

    async def create(self, spec: SandboxSpec) -> SandboxRecord:
        return await self._run(self._create, spec)

    def _create(self, spec: SandboxSpec) -> SandboxRecord:
        cfg = self.config
        sandbox_id = spec.sandbox_id or new_sandbox_id()
        for key in spec.env:
            if not re.fullmatch(r"[-._a-zA-Z][-._a-zA-Z0-9]*", key):
                raise InvalidRequest(f"env name {key!r} is not allowed in a pod (letters, digits, '-', '.', '_'; "
                                     f"not starting with a digit)")
        snapshot = self.snapshots.source(spec.from_snapshot, spec.image) if spec.from_snapshot else None
        if snapshot is not None:
            spec = spec.model_copy(update={"image": snapshot.get("image")})
        self._setup()
        token, nonce = new_token(), new_token()[:16]
        name = self._name(sandbox_id)
        made: list[tuple] = []
        try:
            if cfg.token_source == "secret":
                self._create_obj("Secret", self.core.create_namespaced_secret, self.core.read_namespaced_secret,
                                 self.secret_manifest(sandbox_id, token), sandbox_id, check_token=token)
                made.append((self.core.delete_namespaced_secret, name))
            if not spec.block_network and cfg.manage_network_policies:
                policy = self.allow_policy_manifest(sandbox_id)
                try:
                    self._call(self.net.create_namespaced_network_policy, self.namespace, policy)
                    made.append((self.net.delete_namespaced_network_policy, policy["metadata"]["name"]))
                except ApiException as e:
                    if e.status != 409:  # 409: left by an earlier sandbox of that id; it says the same
                        raise
            manifest = self.pod_manifest(spec, sandbox_id, token, nonce)
            if snapshot is not None:  # the workdir unpacked from the snapshot by an init container
                manifest = self.snapshots.restore_into(manifest, spec.from_snapshot)
            pod = self._create_obj("Pod", self.core.create_namespaced_pod, self.core.read_namespaced_pod,
                                   manifest, sandbox_id, nonce=nonce)
        except BaseException as e:
            for delete, obj in made:  # only what this call made: never another sandbox's objects
                try:
                    self._call(delete, obj, self.namespace, retries=2)
                except Exception:
                    pass
            if isinstance(e, ApiException):
                message = api_message(e)
                if e.status in (400, 422):
                    raise InvalidRequest(f"the cluster refused sandbox {sandbox_id}: {message}") from None
                raise BackendError(f"cannot create sandbox {sandbox_id}: {e.status} {message}") from None
            raise
        self.counters["created"] += 1
        self._keep_token(sandbox_id, token)
        with self._known:
            remember(self._created_here, sandbox_id, limit=TOMBSTONES)
        self.watcher.seed(pod)
        owned = [("Secret", name)] if cfg.token_source == "secret" else []
        if not spec.block_network and cfg.manage_network_policies:
            owned.append(("NetworkPolicy", f"{name}-egress"))
        if owned:
            threading.Thread(target=self._own, args=(pod, owned), daemon=True).start()
        return self._record(pod, token)

    def _create_obj(self, kind: str, create, read, manifest: dict, sandbox_id: str, nonce: str | None = None,
                    check_token: str | None = None) -> dict:
        """Create; a 409 is "already exists", unless a retry met our own object from an attempt
        whose answer was lost (then its nonce, or the Secret's token, says so)."""
        uncertain: list = []
        try:
            return self._call(create, self.namespace, manifest, idempotent=False, uncertain=uncertain)
        except ApiException as e:
            if e.status != 409:
                raise
            if uncertain:
                existing = self._api(f"read {kind}", read, manifest["metadata"]["name"], self.namespace, ok=(404,))
                if existing is not None:
                    if nonce and (existing["metadata"].get("annotations") or {}).get(self.nonce_annotation) == nonce:
                        return existing
                    if check_token and _secret_token(existing) == check_token:
                        return existing
            raise InvalidRequest(f"sandbox {sandbox_id} already exists") from None

    def _own(self, pod: dict, owned: list[tuple[str, str]]) -> None:
        """Make the pod the owner of its Secret/NetworkPolicy: the garbage collector then
        removes them with the pod, even when no orchard-gym process is left to do it."""
        ref = {"apiVersion": "v1", "kind": "Pod", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
        patch = {"metadata": {"ownerReferences": [ref]}}
        for kind, name in owned:
            fn = self.core.patch_namespaced_secret if kind == "Secret" else self.net.patch_namespaced_network_policy
            try:
                self._call(fn, name, self.namespace, patch)
            except Exception as e:  # gone already (deleted with its sandbox), or not allowed
                log.debug("could not set the owner of %s %s: %s", kind, name, e)

    # ------------------------------------------------------------------ query
    def _record(self, pod: dict, token: str | None) -> SandboxRecord:
        meta, st = pod["metadata"], pod.get("status") or {}
        info = json.loads((meta.get("annotations") or {}).get(self.spec_annotation) or "{}")
        container = next((c for c in pod["spec"]["containers"] if c["name"] == TASK_CONTAINER),
                         pod["spec"]["containers"][0])
        status, error, _ = pod_status(pod)
        if status == "running" and not pod_is_ready(pod) and not st.get("podIP"):
            status = "pending"
        ip = st.get("podIP")
        endpoint = None
        if ip and token:
            host = f"[{ip}]" if ":" in ip else ip
            endpoint = AgentEndpoint(base_url=f"http://{host}:{self.config.agent_port}", token=token)
        return SandboxRecord(
            sandbox_id=meta["labels"][self.sandbox_label],
            image=info.get("image", container.get("image")),
            status=status,
            backend=self.name,
            block_network=info.get("block_network", True),
            cpu=info.get("cpu"),
            memory=info.get("memory"),
            env=info.get("env", {}),
            labels=info.get("labels", {}),
            workdir=container.get("workingDir"),
            created_at=info.get("created_at", time.time()),
            error=error,
            endpoint=endpoint,
            details={"pod": meta["name"], "namespace": meta.get("namespace"), "uid": meta.get("uid"),
                     "node": pod["spec"].get("nodeName"), "ip": ip, "phase": st.get("phase"),
                     "owner": (meta.get("labels") or {}).get(self.owner_label), "server": self.server},
        )

    def _tomb_record(self, sandbox_id: str, reason: str) -> SandboxRecord:
        return SandboxRecord(sandbox_id=sandbox_id, status="failed", backend=self.name, error=reason,
                             details={"namespace": self.namespace, "pod": self._name(sandbox_id)})

    def _token_of(self, sandbox_id: str, pod: dict) -> str | None:
        token = self._tokens.get(sandbox_id)
        if token is not None:
            return token
        token = ((pod.get("metadata") or {}).get("annotations") or {}).get(self.token_annotation)
        if token is None and self.config.token_source == "secret":
            secret = self._api("read the token Secret", self.core.read_namespaced_secret, self._name(sandbox_id),
                               self.namespace, ok=(404,))
            token = _secret_token(secret) if secret else None
        container = pod["spec"]["containers"][0]
        for e in container.get("env") or [] if token is None else []:  # pods made by older versions
            if e.get("name") == "ORCHARD_AGENT_TOKEN":
                if "value" in e:
                    token = e["value"]
                else:
                    ref = e["valueFrom"]["secretKeyRef"]
                    secret = self._api("read the token Secret", self.core.read_namespaced_secret, ref["name"],
                                       self.namespace, ok=(404,))
                    token = _secret_token(secret, ref.get("key", "token")) if secret else None
        if token is not None:
            self._keep_token(sandbox_id, token)
        return token

    def _keep_token(self, sandbox_id: str, token: str) -> None:
        with self._known:
            self._tokens[sandbox_id] = token
            self._tokens.move_to_end(sandbox_id)
            while len(self._tokens) > TOMBSTONES:
                self._tokens.popitem(last=False)

    def _read_pod(self, sandbox_id: str) -> dict | None:
        pod = self._api("read pod", self.core.read_namespaced_pod, self._name(sandbox_id), self.namespace, ok=(404,))
        labels = (pod or {}).get("metadata", {}).get("labels") or {}
        return pod if pod is not None and labels.get(self.sandbox_label) == sandbox_id else None

    async def _synced(self) -> None:
        await self.watcher.wait_synced(self.config.api_timeout)

    async def get(self, sandbox_id: str) -> SandboxRecord | None:
        await self._synced()
        pod, tomb, deleting = self.watcher.lookup(sandbox_id)
        if tomb is not None:
            return self._tomb_record(sandbox_id, tomb)
        if deleting:
            return None
        if pod is None:  # not ours, or not delivered by the watch yet: ask the API
            pod = await self._run(self._read_pod, sandbox_id)
            if pod is None:
                return None
        if pod["metadata"].get("deletionTimestamp"):
            return None
        token = self._tokens.get(sandbox_id)
        if token is None:
            token = await self._run(self._token_of, sandbox_id, pod)
        return self._record(pod, token)

    async def is_alive(self, sandbox_id: str) -> bool:
        record = await self.get(sandbox_id)
        return record is not None and record.status in ("pending", "running")

    async def list(self) -> list[SandboxRecord]:
        """This owner's sandboxes (the owner label), from the watch's cache."""
        await self._synced()
        out = []
        for pod in self.watcher.snapshot():
            if pod["metadata"].get("deletionTimestamp"):
                continue
            sid = pod["metadata"]["labels"][self.sandbox_label]
            out.append(self._record(pod, self._tokens.get(sid)))
        return sorted(out, key=lambda r: r.created_at)

    def on_lost(self, callback) -> None:
        """Call `callback(sandbox_id, reason)` (a function or a coroutine function, run on the
        loop this was called from) when a sandbox's pod fails, is evicted or is deleted by
        someone else. The orchestrator's reconciler subscribes."""
        self.watcher.subscribe(callback)

    async def wait_ready(self, record: SandboxRecord, timeout: float) -> SandboxRecord:
        """Woken by the watch when the pod changes; no polling."""
        sid = record.sandbox_id
        deadline = time.monotonic() + timeout
        await self._synced()
        while True:
            fut = self.watcher.waiter(sid)  # before the look, so no change slips between
            try:
                pod, tomb, deleting = self.watcher.lookup(sid)
                if tomb is not None:
                    raise SandboxFailed(f"sandbox {sid} failed to start: {tomb}")
                if deleting or (pod is not None and pod["metadata"].get("deletionTimestamp")):
                    raise SandboxFailed(f"sandbox {sid} is being deleted")
                watched = pod is not None
                if pod is None:  # another owner's pod, outside our watch: read it (and poll, below)
                    pod = await self._run(self._read_pod, sid)
                    if pod is None or pod["metadata"].get("deletionTimestamp"):
                        raise SandboxFailed(f"sandbox {sid} failed to start: its pod does not exist")
                status, error, kind = pod_status(pod)
                if status == "failed":
                    if kind == "image":
                        raise ImageNotFound(f"sandbox {sid}: {error}")
                    raise SandboxFailed(f"sandbox {sid} failed to start: {error}")
                if pod_is_ready(pod):
                    return await self._ready(record, pod)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SandboxTimeout(f"sandbox {sid} not ready after {timeout:.0f}s ({pod_summary(pod)})")
                try:
                    await asyncio.wait_for(fut, left if watched else min(left, 0.5))
                except TimeoutError:
                    pass
            finally:
                self.watcher.drop_waiter(sid, fut)

    async def _ready(self, record: SandboxRecord, pod: dict) -> SandboxRecord:
        sid = record.sandbox_id
        token = self._tokens.get(sid) or await self._run(self._token_of, sid, pod)
        if token is None:
            raise SandboxFailed(f"sandbox {sid}: its token Secret is gone")
        fresh = self._record(pod, token)
        if self.config.verify_reach:
            client = AgentClient(fresh.endpoint)
            until = time.monotonic() + 5.0
            try:
                while True:
                    try:
                        await client.health(timeout=max(0.2, min(2.0, until - time.monotonic())))
                        break
                    except Exception as e:
                        if time.monotonic() >= until:
                            raise SandboxFailed(
                                f"sandbox {sid}: its pod is ready but its agent at {fresh.endpoint.base_url} does "
                                f"not answer from here ({type(e).__name__}: {e}). This process must reach pod "
                                f"IPs: run it in the cluster, and let NetworkPolicies admit it to port "
                                f"{self.config.agent_port}") from None
                        await asyncio.sleep(0.05)
            finally:
                await client.aclose()
        record.status, record.error = "running", None
        record.endpoint, record.workdir = fresh.endpoint, fresh.workdir
        record.details = {**record.details, **fresh.details}
        return record

    def resources(self) -> dict:
        w = self.watcher
        return {"backend": self.name, "server": self.server, "version": self.version, "namespace": self.namespace,
                "owner": self.owner, "token_source": self.config.token_source,
                "watch": {**w.stats, "resource_version": w.resource_version, "synced": w.synced.is_set(),
                          "cached": len(w.pods), "last_error": w.last_error},
                "api": dict(self.counters)}

    # ------------------------------------------------------------------ delete
    async def delete(self, sandbox_id: str) -> bool:
        pod, tomb = self.watcher.begin_delete(sandbox_id)
        uid = None
        try:
            uid, found = await self._run(self._delete, sandbox_id, pod)
        finally:
            self.watcher.end_delete(sandbox_id, uid)
        with self._known:
            self._tokens.pop(sandbox_id, None)
            self._created_here.pop(sandbox_id, None)
        return found or tomb

    def _delete(self, sandbox_id: str, pod: dict | None) -> tuple[str | None, bool]:
        cfg, name = self.config, self._name(sandbox_id)
        gone = self._api(f"delete pod {name}", self.core.delete_namespaced_pod, name, self.namespace,
                         grace_period_seconds=cfg.delete_grace_seconds, propagation_policy="Background", ok=(404,))
        uid = (gone or {}).get("metadata", {}).get("uid")
        found = gone is not None
        extra = []
        if cfg.token_source == "secret" or pod is None:
            extra.append((self.core.delete_namespaced_secret, name))
        block = json.loads(((pod or {}).get("metadata", {}).get("annotations") or {}).get(self.spec_annotation)
                           or "{}").get("block_network", None)
        if cfg.manage_network_policies and block is not True:
            extra.append((self.net.delete_namespaced_network_policy, f"{name}-egress"))
        for delete, obj in extra:
            if self._api(f"delete {obj}", delete, obj, self.namespace, ok=(404,)) is not None and not found:
                found = True
        return uid, found

    def _reap(self, sandbox_id: str) -> None:
        """A pod we created was deleted behind our back: remove its Secret and policy (the
        garbage collector does too, once ownerReferences are set; this covers the moments
        before, and clusters without it)."""
        if sandbox_id not in self._created_here:
            return

        def reap():
            name = self._name(sandbox_id)
            for delete, obj in ((self.core.delete_namespaced_secret, name),
                                (self.net.delete_namespaced_network_policy, f"{name}-egress")):
                try:
                    self._call(delete, obj, self.namespace, retries=2)
                except Exception:
                    pass
            self.counters["reaped"] += 1
        threading.Thread(target=reap, daemon=True).start()

    def _after_first_sync(self) -> None:
        try:
            self.swept = self._sweep()
            if self.swept:
                log.info("kubernetes backend: swept %d sandboxes of dead owners", len(self.swept))
        except Exception as e:  # never fail over someone else's leftovers
            log.warning("kubernetes backend: sweep at start-up failed: %s", e)

    def _sweep(self) -> list[str]:
        """Delete pods whose owner (a process on this host) is gone, and Secrets/policies left
        without their pod for more than ten minutes."""
        removed = set()
        pods = self._call(self.core.list_namespaced_pod, self.namespace, label_selector=f"{self.role_label}=sandbox")
        live = set()
        for pod in pods.get("items") or []:
            meta = pod["metadata"]
            sid = (meta.get("labels") or {}).get(self.sandbox_label)
            identity = (meta.get("annotations") or {}).get(self.identity_annotation, "")
            per_process = (meta.get("labels") or {}).get(self.owner_label) == _process_owner(identity)
            if sid and per_process and owner_gone(identity):
                self._api("delete pod", self.core.delete_namespaced_pod, meta["name"], self.namespace,
                          grace_period_seconds=0, ok=(404,))
                removed.add(sid)
            elif sid:
                live.add(sid)
        cutoff = time.time() - 600  # a create held up by a throttled API is not an orphan
        for kind, lister, deleter in (
                ("Secret", self.core.list_namespaced_secret, self.core.delete_namespaced_secret),
                ("NetworkPolicy", self.net.list_namespaced_network_policy, self.net.delete_namespaced_network_policy)):
            items = self._call(lister, self.namespace, label_selector=self.sandbox_label).get("items") or []
            for obj in items:
                meta = obj["metadata"]
                sid = (meta.get("labels") or {}).get(self.sandbox_label)
                if sid in live or _created(meta) > cutoff:
                    continue
                self._api(f"delete {kind}", deleter, meta["name"], self.namespace, ok=(404,))
                removed.add(sid)
        removed.update(self.snapshots.sweep(lambda m: m.get("owner") == _process_owner(m.get("identity", ""))
                                            and owner_gone(m.get("identity", ""))))
        return sorted(removed)

    async def sweep(self) -> list[str]:
        return await self._run(self._sweep)

    # ------------------------------------------------------------------ snapshots (snapshots_k8s.py)
    async def snapshot(self, sandbox_id: str, labels: dict[str, str] | None = None) -> SnapshotRecord:
        return await self.snapshots.take(sandbox_id, labels)

    async def delete_snapshot(self, snapshot_id: str) -> bool:
        return await self._run(self.snapshots.delete, snapshot_id)

    async def list_snapshots(self) -> list[SnapshotRecord]:
        return await self._run(self.snapshots.list)

    async def get_snapshot(self, snapshot_id: str) -> SnapshotRecord | None:
        return self.snapshots.get(snapshot_id)

    async def aclose(self) -> None:
        await self._run(self.watcher.stop)
        await self._run(self.api_client.close)


def _process_owner(identity: str) -> str:
    """The owner label of a process (a label value cannot hold the identity's colons)."""
    return "p-" + hashlib.sha256(identity.encode()).hexdigest()[:20]


def _secret_token(secret: dict | None, key: str = "token") -> str | None:
    data = (secret or {}).get("data") or {}
    try:
        return base64.b64decode(data[key]).decode() if key in data else None
    except (ValueError, TypeError):
        return None


def _created(meta: dict) -> float:
    try:
        return datetime.strptime(meta.get("creationTimestamp", ""), "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=UTC).timestamp()
    except ValueError:
        return time.time()
