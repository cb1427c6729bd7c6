"""The kubernetes backend against the fake API server (tests/fake_k8s): what the conformance
suite cannot see from outside — the pods and policies we build (checked against the
Kubernetes schema), the watch under faults (a stream cut mid-event, 410 Gone, bookmarks),
retries of 429/5xx, the concurrency limit, pods deleted or evicted behind our back, and
(with the Podman kubelet) the injected agent seen from inside and the orchestrator."""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid

import pytest

from conftest import DOCKER_IMAGES, fake_k8s_unavailable, marked_pids, needs, require_module, wait_until
from orchard_gym import ImageNotFound, InvalidRequest, SandboxClient, SandboxFailed
from orchard_gym.backends.config import KubernetesBackendConfig, parse_backend_config
from orchard_gym.errors import BackendError
from orchard_gym.models import SandboxSpec

kubernetes = require_module("kubernetes", "kubernetes")
pytestmark = pytest.mark.kubernetes
SCHEMA_VERSION = "1.31.0"
BUSYBOX = DOCKER_IMAGES["busybox"]
why_not_podman = fake_k8s_unavailable()
needs_podman = needs("kubernetes", why_not_podman)


@pytest.fixture(scope="module")
def instant(tmp_path_factory):
    """A fake cluster whose kubelet runs nothing: pods are Running and Ready 50 ms after
    creation with a made-up IP. For the control plane alone."""
    from fake_k8s import FakeCluster

    cluster = FakeCluster(tmp_path_factory.mktemp("fake-k8s-instant"), kubelet="instant", bookmark_interval=0.2,
                          instant_delay=0.05)
    yield cluster
    cluster.stop()


def control_plane_backend(cluster, **over):
    """A backend of its own owner (so its watch sees only its pods), not calling agents."""
    config = cluster.backend_config(owner=f"t-{uuid.uuid4().hex[:10]}", verify_reach=False, **over)
    return parse_backend_config(config).get_backend()


async def eventually(predicate, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        await asyncio.sleep(0.02)


def owner_patched(cluster, backend, sandbox_id: str) -> bool:
    """The background ownerReferences patch has landed on the sandbox's Secret and NetworkPolicy."""
    name = backend._name(sandbox_id)
    objects = [cluster.kube("GET", cluster.pod_path(name, kind="secrets")),
               cluster.kube("GET", cluster.pod_path(f"{name}-egress", kind="networkpolicies"))]
    return all(status == 404 or body["metadata"].get("ownerReferences") for status, body in objects)


# --------------------------------------------------------------------------- config
@pytest.mark.parametrize("bad", [
    {"namespace": "Not_A_Namespace"},
    {"namespace": ""},
    {"agent_port": 0},
    {"workers": 0},
    {"api_timeout": -1},
    {"api_retries": -1},
    {"delete_grace_seconds": -5},
    {"watch_timeout": 1},
    {"memory_request": "lots"},
    {"default_memory": -1},
    {"cpu_request": 0},
    {"egress_allow": ["not-an-address"]},
    {"egress_allow": ["10.0.0.1:99999"]},
    {"tolerations": [{"effect": "Sometimes"}]},
    {"tolerations": "all"},
    {"node_selector": {"zone": "has spaces"}},
    {"image_pull_secrets": ["Bad Name"]},
    {"image_pull_policy": "Sometimes"},
    {"token_source": "file"},
    {"security": "none"},
    {"run_as_user": 0},
    {"owner": "has:colons"},
    {"label_prefix": "Upper"},
    {"workdir": "relative"},
    {"unknown_field": 1},
])
def test_garbage_config_values_are_refused(bad):
    with pytest.raises(InvalidRequest):
        parse_backend_config({"type": "kubernetes", **bad})


def test_unreachable_or_missing_cluster_is_a_clear_error(tmp_path):
    with pytest.raises(BackendError, match="does not exist"):
        KubernetesBackendConfig(kubeconfig=tmp_path / "nope.yaml").get_backend()
    from fake_k8s.__main__ import write_kubeconfig
    from service_helpers import free_port

    dead = tmp_path / "dead.yaml"
    write_kubeconfig(str(dead), f"http://127.0.0.1:{free_port()}", "tok")
    started = time.monotonic()
    with pytest.raises(BackendError, match="cannot reach the Kubernetes API"):
        KubernetesBackendConfig(kubeconfig=dead).get_backend()
    assert time.monotonic() - started < 5
    garbage = tmp_path / "garbage.yaml"
    garbage.write_text("clusters: [oops\n")
    with pytest.raises(BackendError, match="cannot load the Kubernetes config"):
        KubernetesBackendConfig(kubeconfig=garbage).get_backend()


# --------------------------------------------------------------------------- manifests
def test_the_objects_we_build_match_the_kubernetes_schema(instant):
    kubernetes_validate = require_module("kubernetes-validate", "kubernetes_validate")
    variants = [
        {},
        {"security": "restricted", "token_source": "env", "default_cpu": 2, "default_memory": "1Gi",
         "node_selector": {"pool": "sandboxes"}, "tolerations": [{"key": "sandbox", "operator": "Exists",
                                                                    "effect": "NoSchedule"}],
         "image_pull_secrets": ["regcred"], "service_account": "sandbox", "runtime_class": "gvisor",
         "egress_allow": ["10.0.0.7/32:8080", "192.168.0.0/16"]},
    ]
    for over in variants:
        backend = control_plane_backend(instant, **over)
        try:
            spec = SandboxSpec(image="python:3.11", cpu=0.5, memory="64m", env={"A": "1"}, labels={"k": "v w"},
                               block_network=False)
            pod = backend.pod_manifest(spec, "sb-1", "token", "nonce")
            objects = [pod, backend.secret_manifest("sb-1", "token"), backend.deny_policy_manifest(),
                       backend.allow_policy_manifest("sb-1")]
            if backend.egress_allow_manifest():
                objects.append(backend.egress_allow_manifest())
            # a fork's pod: an emptyDir workdir that an init container fills from the snapshot store
            objects.append(backend.snapshots.restore_into(backend.pod_manifest(spec, "sb-2", "t", "n"),
                                                          "snap-0123456789abcdef"))
            for obj in objects:
                kubernetes_validate.validate(obj, SCHEMA_VERSION, strict=True)
            spec_ = pod["spec"]
            assert spec_["automountServiceAccountToken"] is False and spec_["restartPolicy"] == "Never"
            main = spec_["containers"][0]
            assert main["resources"]["limits"] == {"cpu": "500m", "memory": str(64 * 2**20)}
            assert main["resources"]["requests"]["memory"] == str(64 * 2**20)  # capped at the limit
            assert main["volumeMounts"][0] == {"name": "orchard-agent", "mountPath": "/opt/orchard-agent",
                                               "readOnly": True}
            assert main["startupProbe"]["httpGet"]["path"] == "/health"
            assert main["securityContext"]["allowPrivilegeEscalation"] is False
            # the pod gets the token's SHA-256 only; the token stays in the Secret or an annotation
            assert not any(e["name"].startswith("ORCHARD_AGENT_TOKEN") for e in main["env"])
            assert "token" not in main["args"] and hashlib.sha256(b"token").hexdigest() in main["args"]
            annotations = pod["metadata"]["annotations"]
            if backend.config.token_source == "secret":
                assert "orchard-gym/agent-token" not in annotations
            else:
                assert annotations["orchard-gym/agent-token"] == "token"
            if backend.config.security == "restricted":
                assert main["securityContext"]["capabilities"]["drop"] == ["ALL"]
                assert main["securityContext"]["runAsNonRoot"] is True
                rules = backend.egress_allow_manifest()["spec"]["egress"]
                assert rules[0] == {"to": [{"ipBlock": {"cidr": "10.0.0.7/32"}}],
                                    "ports": [{"protocol": "TCP", "port": 8080}]}
        finally:
            asyncio.run(backend.aclose())


# --------------------------------------------------------------------------- control plane
async def test_ready_is_woken_by_the_watch_without_polling(instant):
    backend = control_plane_backend(instant)
    try:
        await backend.list()  # synced
        instant.reset_stats()
        record = await backend.create(SandboxSpec(image=BUSYBOX))
        assert record.status == "pending" and record.endpoint is None  # no pod IP yet
        started = time.monotonic()
        ready = await backend.wait_ready(record, 10)
        assert ready.status == "running" and ready.endpoint.base_url.startswith("http://10.244.")
        assert time.monotonic() - started < 2
        stats = instant.stats()
        # the whole create + wait: the deny policy, the Secret, the pod, the owner patch; no GET of the pod
        assert stats.get("GET pods/name", 0) == 0 and stats.get("GET pods", 0) == 0, stats
        got = await backend.get(record.sandbox_id)
        assert got.status == "running" and got.endpoint == ready.endpoint
        assert [r.sandbox_id for r in await backend.list()] == [record.sandbox_id]
        assert instant.stats().get("GET pods/name", 0) == 0  # get() and list() answer from the watch
        assert await backend.delete(record.sandbox_id)
        assert await backend.get(record.sandbox_id) is None
        assert not await backend.delete(record.sandbox_id)
    finally:
        await backend.aclose()


async def test_watch_cut_midway_resumes_from_its_resource_version(instant):
    backend = control_plane_backend(instant)
    lost = []
    backend.on_lost(lambda sid, reason: lost.append((sid, reason)))
    try:
        a, b = [await backend.create(SandboxSpec(image=BUSYBOX)) for _ in range(2)]
        for r in (a, b):
            await backend.wait_ready(r, 10)
        w = backend.watcher
        assert w.stats["lists"] == 1 and w.stats["resumes"] == 0
        # cut every watch in the middle of an event, and refuse the next reconnects for a while
        instant.fault(cut_watches=True, refuse_watches=3)
        assert await eventually(lambda: w.stats["errors"] >= 1)
        # meanwhile, behind our back: one pod deleted, one evicted, one of ours created
        status, _ = instant.kube("DELETE", instant.pod_path(backend._name(a.sandbox_id)))
        assert status == 200
        instant.fail_pod(backend._name(b.sandbox_id), reason="Evicted", message="The node was low on memory")
        assert await eventually(lambda: w.stats["resumes"] >= 1, 10), w.stats
        assert await eventually(lambda: len(lost) == 2, 5), lost
        assert w.stats["lists"] == 1 and w.stats["gone"] == 0  # resumed, never listed again
        reasons = dict(lost)
        assert "deleted by someone else" in reasons[a.sandbox_id]
        assert "Evicted" in reasons[b.sandbox_id] and "low on memory" in reasons[b.sandbox_id]
        for sid in (a.sandbox_id, b.sandbox_id):
            got = await backend.get(sid)
            assert got.status == "failed" and got.error == reasons[sid]
    finally:
        await backend.aclose()


def test_a_stop_while_the_watch_request_is_on_its_way_ends_the_watch(instant, monkeypatch):
    """stop() shuts the watch's open answer to end its blocking read; a stop that lands after
    the watch was requested but before its answer was published finds nothing to shut. The
    thread must see the stop before it reads, not block until the next event or bookmark
    (each client close took 5 s of the conformance suite's, one bookmark interval)."""
    import threading

    from orchard_gym.backends import kubernetes_watch

    read_after_stop, stopper = [], []
    real_watch = kubernetes.client.CoreV1Api.list_namespaced_pod
    real_lines = kubernetes_watch.iter_resp_lines

    def watch_then_stop(api, *args, **kwargs):
        resp = real_watch(api, *args, **kwargs)
        if kwargs.get("watch") and not stopper:  # the answer is here, not yet published: stop now
            w = backend.watcher
            stopper.append(threading.Thread(target=w.stop))
            stopper[0].start()
            assert w._stop.wait(5)
        return resp

    def lines(resp):
        read_after_stop.append(backend.watcher._stop.is_set())
        yield from real_lines(resp)

    monkeypatch.setattr(kubernetes.client.CoreV1Api, "list_namespaced_pod", watch_then_stop)
    monkeypatch.setattr(kubernetes_watch, "iter_resp_lines", lines)
    backend = control_plane_backend(instant)
    try:
        assert wait_until(lambda: stopper, 10), "the watch was never requested"
        stopper[0].join(10)
        assert not backend.watcher._thread.is_alive(), "the watch thread outlived stop()"
        assert True not in read_after_stop, "the watch read its answer after stop()"
    finally:
        asyncio.run(backend.aclose())


async def test_410_gone_lists_again_and_misses_nothing(instant):
    backend = control_plane_backend(instant)
    lost = []
    backend.on_lost(lambda sid, reason: lost.append(sid))
    try:
        a = await backend.create(SandboxSpec(image=BUSYBOX))
        await backend.wait_ready(a, 10)
        w = backend.watcher
        instant.fault(cut_watches=True, refuse_watches=2)
        assert await eventually(lambda: w.stats["errors"] >= 1)
        instant.kube("DELETE", instant.pod_path(backend._name(a.sandbox_id)))  # while we are away
        instant.fault(compact=True)  # ... and the history that event sat in is gone
        assert await eventually(lambda: w.stats["gone"] >= 1 and w.stats["lists"] >= 2, 10), w.stats
        assert await eventually(lambda: lost == [a.sandbox_id]), lost  # found by the new list's difference
        assert (await backend.get(a.sandbox_id)).status == "failed"
        b = await backend.create(SandboxSpec(image=BUSYBOX))  # and the new watch delivers events again
        assert (await backend.wait_ready(b, 10)).status == "running"
        assert instant.stats()["watch_410"] >= 1
    finally:
        await backend.aclose()


async def test_a_create_during_a_slow_list_is_not_taken_for_a_pod_deleted_meanwhile(instant):
    """A 410 makes the watch list again; a pod our own create seeds while that list is on its
    way is missing from the (older) answer, and must not be reported lost."""
    backend = control_plane_backend(instant)
    lost = []
    backend.on_lost(lambda sid, reason: lost.append((sid, reason)))
    try:
        a = await backend.create(SandboxSpec(image=BUSYBOX))
        await backend.wait_ready(a, 10)  # the watch is up
        w = backend.watcher
        instant.fault(slow_lists=3.0)  # the next list is answered 3 s after the server read it
        instant.fault(cut_watches=True, refuse_watches=2)  # the watch goes away for a while ...
        assert await eventually(lambda: w.stats["errors"] >= 1), w.stats
        status, _ = instant.kube("POST", instant.pod_path(kind="secrets"),  # ... the cluster moves on ...
                                 {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"bump-{uuid.uuid4().hex[:8]}"}})
        assert status == 201
        instant.fault(compact=True)  # ... and forgets the history: the watch's resume gets 410, it lists again
        assert await eventually(lambda: w.stats["gone"] >= 1, 10), w.stats
        box = await backend.create(SandboxSpec(image=BUSYBOX))  # while that list is on its way
        assert await eventually(lambda: w.stats["lists"] >= 2, 15), w.stats
        assert (await backend.wait_ready(box, 10)).status == "running"
        assert lost == []
    finally:
        instant.fault(slow_lists=0)
        await backend.aclose()


def test_a_lagging_watch_does_not_fail_another_replicas_sandbox(instant, tmp_path):
    """Two replicas over Redis: the leader's watch cache has not heard of the pod the other
    replica just created (its watch is down). The reconciler asks the API before it calls
    the sandbox vanished."""
    from service_helpers import Orchestrator, RedisServer, need_redis_server

    need_redis_server()
    config = instant.backend_config(owner=f"t-{uuid.uuid4().hex[:10]}", verify_reach=False)
    for d in ("redis", "a", "b"):
        (tmp_path / d).mkdir()
    redis = RedisServer(tmp_path / "redis")
    replicas = []
    try:
        for name in ("a", "b"):
            replicas.append(Orchestrator(tmp_path / name, backend="kubernetes", backend_config=config,
                                         redis_url=redis.url, replica_id=f"lag-{name}", reconcile_interval=0.2))
        assert wait_until(lambda: sum(r.reconcile_passes() for r in replicas) >= 2, 30)
        leader, other = sorted(replicas, key=lambda r: r.reconcile_passes(), reverse=True)
        instant.fault(cut_watches=True, refuse_watches=10**6)  # every watch down: caches stop where they are
        with other.client() as client:
            box = client.create_sandbox(image=BUSYBOX, wait_ready=False)  # seeded in the other's cache only
            passes = leader.reconcile_passes()
            assert wait_until(lambda: leader.reconcile_passes() >= passes + 5, 30)
            assert box.refresh().status != "failed", box.record
            instant.fault(refuse_watches=0)  # the watches come back and tell of the pod
            assert wait_until(lambda: box.refresh().status == "running", 30), box.record
            box.delete()
    finally:
        instant.fault(refuse_watches=0)
        for r in replicas:
            r.stop()
        redis.close()


async def test_bookmarks_keep_the_resume_point_fresh(instant):
    backend = control_plane_backend(instant)
    try:
        await backend.list()
        w = backend.watcher
        # writes the watch does not select (someone else's secrets) move the server's resourceVersion on
        for _ in range(3):
            name = f"unrelated-{uuid.uuid4().hex[:8]}"
            instant.kube("POST", instant.pod_path(kind="secrets"), {"metadata": {"name": name}, "stringData": {"a": "b"}})
            instant.kube("DELETE", instant.pod_path(name, kind="secrets"))
        server_rv = str(instant.stats()["resource_version"])
        assert await eventually(lambda: w.resource_version == server_rv, 3), (w.resource_version, server_rv)
        assert w.stats["bookmarks"] >= 1
        instant.fault(compact=True, cut_watches=True)  # a resume from the bookmark's version is still valid
        assert await eventually(lambda: w.stats["resumes"] >= 1, 5)
        # the resumed watch carries on: it catches up with a later write, with no 410 and no re-list
        name = f"unrelated-{uuid.uuid4().hex[:8]}"
        instant.kube("POST", instant.pod_path(kind="secrets"), {"metadata": {"name": name}, "stringData": {"a": "b"}})
        server_rv = str(instant.stats()["resource_version"])
        assert await eventually(lambda: w.resource_version == server_rv, 5), (w.resource_version, server_rv)
        assert w.stats["gone"] == 0 and w.stats["lists"] == 1, w.stats
    finally:
        await backend.aclose()


async def test_429_and_5xx_are_retried_with_backoff(instant):
    backend = control_plane_backend(instant, api_retries=3)
    try:
        await backend.list()
        instant.reset_stats()
        instant.fault(throttle=3)
        record = await backend.create(SandboxSpec(image=BUSYBOX))  # the first calls are refused, then pass
        assert instant.stats()["fault_429"] == 3 and backend.counters["throttled"] == 3
        instant.fault(errors=2, error_code=503)
        assert await backend.delete(record.sandbox_id)
        assert backend.counters["retried"] >= 2
        instant.fault(throttle=1, retry_after=1)  # Retry-After is honoured
        started = time.monotonic()
        record = await backend.create(SandboxSpec(image=BUSYBOX))
        assert time.monotonic() - started >= 1.0
        assert await eventually(lambda: owner_patched(instant, backend, record.sandbox_id), 5)  # off the critical path
        instant.fault(throttle=100)  # never relenting: a typed error after the retries
        instant.reset_stats()
        with pytest.raises(BackendError, match="429"):
            await backend.create(SandboxSpec(image=BUSYBOX))
        assert instant.stats()["fault_429"] == 4  # 1 + api_retries
        instant.fault(throttle=0)
    finally:
        instant.fault(throttle=0)
        await backend.aclose()


async def test_concurrency_limit_bounds_api_calls_in_flight(instant):
    backend = control_plane_backend(instant, workers=2)
    try:
        await backend.list()
        await backend.create(SandboxSpec(image=BUSYBOX))  # set-up done (the deny policy)
        instant.reset_stats()
        records = await asyncio.gather(*(backend.create(SandboxSpec(image=BUSYBOX)) for _ in range(12)))
        await asyncio.gather(*(backend.wait_ready(r, 10) for r in records))
        stats = instant.stats()
        assert stats["POST pods"] == 12 and stats["max_in_flight"] <= 2, stats
        assert all(await asyncio.gather(*(backend.delete(r.sandbox_id) for r in records)))
    finally:
        await backend.aclose()


async def test_deleted_behind_our_back_is_failed_and_reaped(instant):
    backend = control_plane_backend(instant)
    try:
        record = await backend.wait_ready(await backend.create(SandboxSpec(image=BUSYBOX, block_network=False)), 10)
        name = backend._name(record.sandbox_id)
        assert await eventually(lambda: instant.kube("GET", instant.pod_path(name, kind="secrets"))[1]
                                .get("metadata", {}).get("ownerReferences"))  # the pod owns its Secret
        instant.kube("DELETE", instant.pod_path(name))
        assert await eventually(lambda: backend.watcher.lookup(record.sandbox_id)[1] is not None)
        got = await backend.get(record.sandbox_id)
        assert got.status == "failed" and "deleted by someone else" in got.error
        assert not await backend.is_alive(record.sandbox_id)
        assert record.sandbox_id not in {r.sandbox_id for r in await backend.list()}
        # its Secret and its allowing NetworkPolicy went with it
        assert await eventually(lambda: instant.kube("GET", instant.pod_path(name, kind="secrets"))[0] == 404)
        assert await eventually(
            lambda: instant.kube("GET", instant.pod_path(f"{name}-egress", kind="networkpolicies"))[0] == 404)
        assert await backend.delete(record.sandbox_id)  # the record of its failure goes too
        assert await backend.get(record.sandbox_id) is None
    finally:
        await backend.aclose()


async def test_taken_id_is_refused_without_harming_the_owner(instant):
    backend = control_plane_backend(instant)
    try:
        first = await backend.wait_ready(await backend.create(SandboxSpec(image=BUSYBOX, sandbox_id="taken")), 10)
        with pytest.raises(InvalidRequest, match="already exists"):
            await backend.create(SandboxSpec(image=BUSYBOX, sandbox_id="taken", block_network=False))
        assert instant.kube("GET", instant.pod_path(backend._name("taken"), kind="secrets"))[0] == 200
        assert (await backend.get("taken")).endpoint == first.endpoint
        with pytest.raises(InvalidRequest, match="env name"):
            await backend.create(SandboxSpec(image=BUSYBOX, env={"1BAD": "x"}))
        await backend.delete("taken")
    finally:
        await backend.aclose()


# --------------------------------------------------------------------------- real pods (Podman kubelet)
@pytest.fixture
def k8s_client(fake_k8s):
    c = SandboxClient(fake_k8s.backend_config())
    yield c
    c.close()


@needs_podman
def test_agent_injected_into_busybox_seen_from_inside(k8s_client, fake_k8s):
    with k8s_client.create_sandbox(image=BUSYBOX) as box:
        assert box.exec("which python3").exit_code != 0
        assert box.exec("ls /usr/lib /lib 2>/dev/null | wc -l").stdout.strip() == "0"  # no libc either
        r = box.exec(["busybox", "sh", "-c", "echo $((6*7)) $ORCHARD_SANDBOX $(hostname); pwd"])
        assert r.stdout == f"42 {box.sandbox_id} {box.sandbox_id}\n/workspace\n"
        assert "ORCHARD_AGENT_TOKEN" not in box.exec("env").stdout
        assert box.exec("touch /opt/orchard-agent/x").exit_code != 0  # the bundle is read-only
        assert "NoNewPrivs:\t1" in box.exec("cat /proc/self/status").stdout
        assert box.exec("ls /var/run/secrets/kubernetes.io 2>&1").exit_code != 0  # no service account token
        details = box.record.details
        assert details["ip"] and box.record.endpoint.base_url == f"http://{details['ip']}:8765"
        status, pod = fake_k8s.kube("GET", fake_k8s.pod_path(details["pod"]))
        env = pod["spec"]["containers"][0]["env"]
        assert all("value" not in e for e in env if e["name"] == "ORCHARD_AGENT_TOKEN")  # not in the pod spec


@needs_podman
def test_agent_from_an_image_volume_no_init_container(fake_k8s):
    """agent_volume="image": the injector image is mounted read-only (its /bundle), nothing is copied."""
    kubernetes_validate = require_module("kubernetes-validate", "kubernetes_validate")
    with SandboxClient(fake_k8s.backend_config(agent_volume="image")) as client:
        cfg = client.backend.config
        pod = client.backend.pod_manifest(SandboxSpec(image=BUSYBOX), "sb-1", "token")
        kubernetes_validate.validate(pod, SCHEMA_VERSION, strict=True)
        assert "initContainers" not in pod["spec"]
        assert pod["spec"]["volumes"][0] == {"name": "orchard-agent", "image": {
            "reference": cfg.injector_image, "pullPolicy": cfg.injector_pull_policy}}
        assert pod["spec"]["containers"][0]["volumeMounts"][0] == {
            "name": "orchard-agent", "mountPath": "/opt/orchard-agent", "readOnly": True, "subPath": "bundle"}
        with client.create_sandbox(image=BUSYBOX) as box:
            assert box.exec("echo $((6*7))").stdout == "42\n"
            assert box.exec("touch /opt/orchard-agent/x").exit_code != 0  # read-only
            _, live = fake_k8s.kube("GET", fake_k8s.pod_path(box.record.details["pod"]))
            assert "initContainers" not in live["spec"] and not live["status"].get("initContainerStatuses")


@needs_podman
def test_exec_before_the_pod_has_an_ip_waits_for_it(k8s_client):
    box = k8s_client.create_sandbox(image=BUSYBOX, wait_ready=False)
    try:
        assert box.record.endpoint is None  # not scheduled yet: no address
        assert box.exec("echo early").stdout == "early\n"
    finally:
        box.delete()


@needs_podman
def test_restricted_profile_runs_as_non_root_with_no_capabilities(fake_k8s):
    with SandboxClient(fake_k8s.backend_config(security="restricted")) as client:
        with client.create_sandbox(image=BUSYBOX) as box:
            assert box.exec("id -u").stdout.strip() == "65532"
            assert "CapEff:\t0000000000000000" in box.exec("cat /proc/self/status").stdout
            assert box.exec("echo hi > f && cat f").stdout == "hi\n"  # the workdir is writable
            assert box.exec("echo x > /etc/x").exit_code != 0


@needs_podman
def test_missing_image_fails_fast_with_image_not_found(fake_k8s):
    with SandboxClient(fake_k8s.backend_config(image_pull_policy="Never")) as client:
        started = time.monotonic()
        with pytest.raises(ImageNotFound, match="ErrImageNeverPull"):
            client.create_sandbox(image="localhost/orchard/does-not-exist:1", timeout=60)
        assert time.monotonic() - started < 30
        assert not client.list_sandboxes()


@needs_podman
def test_real_pod_deleted_behind_our_back(k8s_client, fake_k8s):
    box = k8s_client.create_sandbox(image=BUSYBOX)
    box.exec("sleep 331 >/dev/null 2>&1 &")
    marker = f"ORCHARD_SANDBOX={box.sandbox_id}"
    assert marked_pids(marker)
    fake_k8s.kube("DELETE", fake_k8s.pod_path(box.record.details["pod"]) + "?gracePeriodSeconds=0")
    assert wait_until(lambda: not marked_pids(marker), 10)  # the kubelet killed it all
    with pytest.raises(SandboxFailed, match="deleted by someone else"):
        box.exec("echo still?", timeout=5)
    assert box.refresh().status == "failed"
    box.delete()


@needs_podman
def test_orchestrator_marks_a_lost_sandbox_failed_at_once(fake_k8s, tmp_path):
    """The orchestrator in the cluster: the watch reports a pod deleted behind its back
    long before a reconciliation pass would notice."""
    from service_helpers import Orchestrator

    orch = Orchestrator(tmp_path, backend="kubernetes", reconcile_interval=120, log_dir=tmp_path,
                        backend_config=fake_k8s.backend_config(owner="orchestrator-test"))
    try:
        with orch.client() as client:
            box = client.create_sandbox(image=BUSYBOX, wait_ready=False)
            assert box.exec("echo hi").stdout == "hi\n"  # before the pod had an IP: waits for it
            pod = f"orchard-gym-{box.sandbox_id}"
            fake_k8s.kube("DELETE", fake_k8s.pod_path(pod))
            assert wait_until(lambda: box.refresh().status == "failed", 10), box.record
            assert "deleted by someone else" in box.record.error
            with pytest.raises(SandboxFailed):
                box.exec("echo still?", timeout=5)
            box.delete()
            assert not [r for r in client.list_sandboxes() if r.sandbox_id == box.sandbox_id]
    finally:
        orch.stop()
