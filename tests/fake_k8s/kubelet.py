"""Fake kubelets for the fake API server.

`PodmanKubelet` really runs each pod with Podman (through its Docker-compatible API):

- scheduling: sets spec.nodeName and the PodScheduled condition;
- volumes: each `emptyDir` is a fresh Podman volume, mode 0777 like a real emptyDir; a
  `hostPath` is a bind mount of that path of this machine (the node); an `image` volume
  (KEP-4639) is mounted read-only, always; deviation: the fake copies the mount's subPath
  of that image into a fresh Podman volume (so that image needs /bin/sh), where a real
  kubelet mounts the image's filesystem;
- init containers run first, one at a time, without network; a non-zero exit fails the
  pod (restartPolicy Never, the only one sandboxes use);
- the main containers: command/args, env (value, secretKeyRef read from the store,
  fieldRef for metadata.name/namespace), volume mounts (readOnly honoured), memory and CPU
  limits, securityContext (runAsUser/Group, readOnlyRootFilesystem, capabilities,
  allowPrivilegeEscalation=false -> no-new-privileges, privileged), hostname,
  shareProcessNamespace -> an init process at PID 1 (the pause container's role);
- the pod IP is the container's IP; NetworkPolicies decide the network: a pod selected by
  an Egress policy that allows no open egress joins an *internal* Podman network (no
  route out; like backends/docker.py), any other pod joins the default bridge. Policies
  are evaluated when the pod starts, not re-applied later;
- startup and readiness probes really GET the httpGet path on the pod IP. Deviation, on
  purpose: until the first success the kubelet probes every `fast_probe` seconds (a real
  kubelet waits periodSeconds, at least 1 s), so benchmarks through the fake measure the
  backend's overhead rather than the probe period; after that, periodSeconds;
- a container that exits fails the pod (phase Failed, terminated state with exit code and
  OOMKilled); missing images give ErrImageNeverPull / ErrImagePull (the fake never pulls);
- deleting a pod stops its containers (grace period honoured) and removes them and its
  volumes; then the object goes.

Everything it creates carries the label `fake-k8s.instance`; leftovers of fake servers
that died are removed at start.

`InstantKubelet` runs nothing: pods become Running and Ready (after `delay`) with a
made-up IP. For tests of the control plane alone (watches, retries).
"""

from __future__ import annotations

import base64
import http.client
import itertools
import logging
import os
import threading
import time
from datetime import datetime, UTC

from .apiserver import Store, label_selector_matches, now_iso

log = logging.getLogger("fake_k8s.kubelet")
INSTANCE_LABEL = "fake-k8s.instance"
FATAL = object()


def parse_quantity(q) -> float:
    """A Kubernetes quantity ('500m', '64Mi', '1G', '2', '1e3') as a number."""
    s = str(q).strip()
    suffixes = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
                "n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
    for suffix in sorted(suffixes, key=len, reverse=True):
        if s.endswith(suffix):
            return float(s[: -len(suffix)]) * suffixes[suffix]
    return float(s)


def _cond(status: dict, ctype: str, value: bool, reason: str | None = None, message: str | None = None) -> None:
    conds = status.setdefault("conditions", [])
    want = "True" if value else "False"
    for c in conds:
        if c["type"] == ctype:
            if c["status"] != want:
                c.update(status=want, lastTransitionTime=now_iso())
            if reason:
                c["reason"] = reason
            if message:
                c["message"] = message
            return
    c = {"type": ctype, "status": want, "lastProbeTime": None, "lastTransitionTime": now_iso()}
    if reason:
        c["reason"] = reason
    if message:
        c["message"] = message
    conds.append(c)


class _Killed(Exception):
    pass


class PodRuntime:
    def __init__(self, uid: str, ns: str, name: str):
        self.uid, self.ns, self.name = uid, ns, name
        self.lock = threading.Lock()
        self.killed = False
        self.containers: list[str] = []
        self.volumes: list[str] = []
        self.main: str | None = None
        self.ip: str | None = None
        self.readiness: dict | None = None
        self.port: int | None = None
        self.failures = 0
        self.next_probe = 0.0
        self.ready = False


class PodmanKubelet:
    def __init__(self, store: Store, base_url: str, *, node: str = "fake-node", open_network: str = "bridge",
                 internal_network: str = "fake-k8s-internal", fast_probe: float = 0.05, start_workers: int = 8):
        import docker

        self.docker = docker
        self.store, self.node = store, node
        self.open_network, self.internal_network = open_network, internal_network
        self.fast_probe = fast_probe
        self.api = docker.APIClient(base_url=base_url, timeout=120, max_pool_size=64)
        self.api.ping()
        self.instance = f"{os.getpid()}-{int(time.time())}"
        self.pods: dict[str, PodRuntime] = {}
        self.lock = threading.Lock()
        self._starts = threading.BoundedSemaphore(start_workers)
        self._stopped = threading.Event()
        self.counters = {"started": 0, "failed": 0, "killed": 0}
        self._sweep()
        self._ensure_internal_network()
        store.listeners.append(self.on_event)
        threading.Thread(target=self._prober, name="fake-kubelet-prober", daemon=True).start()

    # ------------------------------------------------------------------ set-up
    def _sweep(self) -> None:
        """Remove what fake servers that are gone left behind."""
        def dead(instance: str) -> bool:
            try:
                pid = int(instance.split("-", 1)[0])
                os.kill(pid, 0)
                return False
            except (ValueError, ProcessLookupError):
                return True
            except PermissionError:
                return False

        for c in self.api.containers(all=True, filters={"label": [INSTANCE_LABEL]}):
            if dead((c.get("Labels") or {}).get(INSTANCE_LABEL, "")):
                self._quiet(self.api.remove_container, c["Id"], force=True)
        for v in self.api.volumes(filters={"label": INSTANCE_LABEL}).get("Volumes") or []:
            if dead((v.get("Labels") or {}).get(INSTANCE_LABEL, "")):
                self._quiet(self.api.remove_volume, v["Name"], force=True)

    def _ensure_internal_network(self) -> None:
        try:
            net = self.api.inspect_network(self.internal_network)
        except self.docker.errors.NotFound:
            try:
                self.api.create_network(self.internal_network, internal=True)
            except self.docker.errors.APIError as e:
                if e.status_code != 409:
                    raise
            net = self.api.inspect_network(self.internal_network)
        if not net.get("Internal"):
            raise RuntimeError(f"network {self.internal_network} exists but is not internal")

    @staticmethod
    def _quiet(fn, *args, **kw):
        try:
            return fn(*args, **kw)
        except Exception:
            return None

    def stats(self) -> dict:
        with self.lock:
            return {**self.counters, "pods": len(self.pods)}

    # ------------------------------------------------------------------ events
    def on_event(self, etype: str, plural: str, obj: dict) -> None:
        if plural != "pods" or self._stopped.is_set():
            return
        meta = obj["metadata"]
        uid = meta["uid"]
        if etype == "ADDED":
            threading.Thread(target=self._run_pod, args=(meta["namespace"], meta["name"], uid),
                             name=f"fake-kubelet-{meta['name']}", daemon=True).start()
        elif etype == "DELETED":
            threading.Thread(target=self._kill_pod, args=(uid, 0, False), daemon=True).start()
        elif etype == "MODIFIED" and meta.get("deletionTimestamp"):
            with self.lock:
                rt = self.pods.get(uid)
            if rt is not None and not rt.killed:
                threading.Thread(target=self._kill_pod, args=(uid, int(meta.get("deletionGracePeriodSeconds", 0)),
                                                              True), daemon=True).start()
            elif rt is None:  # nothing runs (any more): the object can go
                self.store.remove("pods", meta["namespace"], meta["name"], uid=uid)

    def kill_pod_containers(self, ns: str, name: str) -> None:
        """Kill a pod's containers without touching the object (eviction, node failure)."""
        with self.lock:
            rts = [rt for rt in self.pods.values() if rt.ns == ns and rt.name == name]
        for rt in rts:
            with rt.lock:
                rt.killed = True
                containers = list(rt.containers)
            for cid in containers:
                self._quiet(self.api.kill, cid)

    # ------------------------------------------------------------------ pod start
    def _update(self, rt: PodRuntime, fn) -> dict | None:
        def wrapped(pod):
            fn(pod.setdefault("status", {}))
        return self.store.update("pods", rt.ns, rt.name, wrapped, uid=rt.uid)

    def _track(self, rt: PodRuntime, kind: str, ident: str) -> None:
        with rt.lock:
            if rt.killed:
                raise _Killed(ident)
            (rt.containers if kind == "container" else rt.volumes).append(ident)

    def _run_pod(self, ns: str, name: str, uid: str) -> None:
        rt = PodRuntime(uid, ns, name)
        with self.lock:
            self.pods[uid] = rt
        try:
            with self._starts:
                pod = self.store.get("pods", ns, name)
                if pod is None or pod["metadata"]["uid"] != uid or pod["metadata"].get("deletionTimestamp"):
                    raise _Killed("gone before start")
                main = self._start(rt, pod)
            if main is not FATAL:
                self._probe_until_started(rt, pod)
                self._wait_exit(rt)
        except _Killed as e:  # deleted while starting: remove what was made after the kill
            self._quiet(self.api.remove_container, str(e), force=True)
            self._quiet(self.api.remove_volume, str(e), force=True)
        except Exception as e:
            log.exception("fake kubelet: pod %s/%s failed", ns, name)
            self._fail(rt, "Failed", f"fake kubelet: {type(e).__name__}: {e}")

    def _fail(self, rt: PodRuntime, reason: str, message: str, container_state: dict | None = None) -> None:
        with self.lock:
            self.counters["failed"] += 1

        def fail(st):
            st.update(phase="Failed", reason=reason, message=message)
            _cond(st, "Ready", False, "PodFailed")
            _cond(st, "ContainersReady", False, "PodFailed")
            if container_state is not None:
                for cs in st.get("containerStatuses") or []:
                    cs.update(ready=False, state=container_state)

        self._update(rt, fail)

    def _start(self, rt: PodRuntime, pod: dict):
        spec = pod["spec"]
        self._update(rt, lambda st: _cond(st, "PodScheduled", True))
        self.store.update("pods", rt.ns, rt.name, lambda p: p["spec"].__setitem__("nodeName", self.node), uid=rt.uid)
        volumes = {}
        for v in spec.get("volumes") or []:
            if "hostPath" in v:
                path = v["hostPath"]["path"]
                if v["hostPath"].get("type") == "Directory" and not os.path.isdir(path):
                    self._fail(rt, "Pending", f"hostPath type check failed: {path} is not a directory")
                    return FATAL
                volumes[v["name"]] = ("bind", path)
                continue
            if "image" in v:
                volumes[v["name"]] = v["image"]  # made per mount (its subPath), in _create
                continue
            if "emptyDir" not in v:
                self._fail(rt, "Failed", f"fake kubelet: volume {v['name']!r}: only emptyDir, hostPath and image "
                                         "are supported")
                return FATAL
            vname = f"fk8s-{rt.uid[:13]}-{v['name']}"[:60]
            self.api.create_volume(vname, labels={INSTANCE_LABEL: self.instance, "fake-k8s.pod-uid": rt.uid})
            self._track(rt, "volume", vname)
            mountpoint = self.api.inspect_volume(vname)["Mountpoint"]
            os.chmod(mountpoint, 0o777)  # what a real emptyDir is
            volumes[v["name"]] = vname
        init_statuses = []
        for c in spec.get("initContainers") or []:
            cid = self._create(rt, pod, c, volumes, "none", role="init")
            if cid is FATAL:
                return FATAL
            self.api.start(cid)
            code = self.api.wait(cid, timeout=600).get("StatusCode")
            info = self.api.inspect_container(cid)
            terminated = {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                          "startedAt": now_iso(), "finishedAt": now_iso(), "containerID": f"podman://{cid}"}
            if code != 0:
                tail = self._quiet(self.api.logs, cid, tail=5) or b""
                terminated["message"] = tail.decode("utf-8", "replace")[-500:]
            self._quiet(self.api.remove_container, cid, force=True)
            init_statuses.append({"name": c["name"], "image": c["image"], "imageID": info.get("Image", ""),
                                  "ready": code == 0, "restartCount": 0, "state": {"terminated": terminated}})
            self._update(rt, lambda st: st.update(initContainerStatuses=list(init_statuses)))
            if code != 0:
                self._fail(rt, "Failed", f"init container {c['name']} exited with code {code}")
                return FATAL
        self._update(rt, lambda st: _cond(st, "Initialized", True))
        network = self._network_for(pod)
        containers = spec["containers"]
        if len(containers) != 1:
            self._fail(rt, "Failed", "fake kubelet: exactly one container per pod is supported")
            return FATAL
        c = containers[0]
        cid = self._create(rt, pod, c, volumes, network, role="main")
        if cid is FATAL:
            return FATAL
        self.api.start(cid)
        info = self.api.inspect_container(cid)
        nets = (info.get("NetworkSettings") or {}).get("Networks") or {}
        ip = next((n.get("IPAddress") for n in nets.values() if n.get("IPAddress")), None)
        rt.main, rt.ip = cid, ip
        started = now_iso()

        def running(st):
            st.update(phase="Running", podIP=ip, podIPs=[{"ip": ip}] if ip else [], hostIP="127.0.0.1",
                      hostIPs=[{"ip": "127.0.0.1"}], startTime=started)
            _cond(st, "ContainersReady", False, "ContainersNotReady")
            _cond(st, "Ready", False, "ContainersNotReady")
            st["containerStatuses"] = [{"name": c["name"], "image": c["image"], "imageID": info.get("Image", ""),
                                        "containerID": f"podman://{cid}", "ready": False, "started": False,
                                        "restartCount": 0, "state": {"running": {"startedAt": started}}}]

        self._update(rt, running)
        with self.lock:
            self.counters["started"] += 1
        return cid

    def _create(self, rt: PodRuntime, pod: dict, c: dict, volumes: dict, network: str, role: str):
        docker = self.docker
        spec, meta = pod["spec"], pod["metadata"]
        try:
            self.api.inspect_image(c["image"])
        except docker.errors.ImageNotFound:
            never = c.get("imagePullPolicy") == "Never"
            reason = "ErrImageNeverPull" if never else "ErrImagePull"
            message = (f'Container image "{c["image"]}" is not present with pull policy of Never' if never else
                       f'fake kubelet: image "{c["image"]}" is not present and the fake never pulls')
            key = "initContainerStatuses" if role == "init" else "containerStatuses"
            self._update(rt, lambda st: st.update({key: [{"name": c["name"], "image": c["image"], "imageID": "",
                                                          "ready": False, "restartCount": 0,
                                                          "state": {"waiting": {"reason": reason,
                                                                                "message": message}}}]}))
            return FATAL
        env = {}
        for e in c.get("env") or []:
            if "value" in e or "valueFrom" not in e:
                env[e["name"]] = e.get("value", "")
                continue
            src = e["valueFrom"]
            if "secretKeyRef" in src:
                ref = src["secretKeyRef"]
                value = self._secret_value(rt, c, ref)
                if value is None:
                    continue
                env[e["name"]] = value
            elif "fieldRef" in src:
                path = src["fieldRef"]["fieldPath"]
                env[e["name"]] = {"metadata.name": meta["name"], "metadata.namespace": meta["namespace"],
                                  "metadata.uid": meta["uid"], "spec.nodeName": self.node}.get(path, "")
        mounts = []
        for m in c.get("volumeMounts") or []:
            source = volumes[m["name"]]
            if isinstance(source, dict):  # an image volume: read-only whatever the mount says
                source = self._image_volume(rt, m["name"], source, m.get("subPath", ""))
                if source is FATAL:
                    return FATAL
                mounts.append(docker.types.Mount(m["mountPath"], source, type="volume", read_only=True))
                continue
            mounts.append(docker.types.Mount(m["mountPath"], *_source(source), read_only=bool(m.get("readOnly"))))
        limits = (c.get("resources") or {}).get("limits") or {}
        mem = int(parse_quantity(limits["memory"])) if "memory" in limits else None
        cpus = parse_quantity(limits["cpu"]) if "cpu" in limits else None
        sc = {**(spec.get("securityContext") or {}), **(c.get("securityContext") or {})}
        caps = sc.get("capabilities") or {}
        user = None
        if sc.get("runAsUser") is not None:
            user = str(sc["runAsUser"]) + (f":{sc['runAsGroup']}" if sc.get("runAsGroup") is not None else "")
        host_config = self.api.create_host_config(
            mounts=mounts, network_mode=network, init=bool(spec.get("shareProcessNamespace")) and role == "main",
            mem_limit=mem, memswap_limit=mem, nano_cpus=int(cpus * 1e9) if cpus else None,
            cap_drop=caps.get("drop"), cap_add=caps.get("add"), privileged=bool(sc.get("privileged")),
            read_only=bool(sc.get("readOnlyRootFilesystem")),
            security_opt=["no-new-privileges"] if sc.get("allowPrivilegeEscalation") is False else None,
        )
        name = f"fk8s-{rt.uid[:13]}-{c['name']}"[:60]
        cid = self.api.create_container(
            c["image"], name=name, hostname=(spec.get("hostname") or meta["name"])[:63],
            entrypoint=c.get("command"), command=c.get("args"), working_dir=c.get("workingDir"),
            environment=env, user=user, host_config=host_config,
            labels={INSTANCE_LABEL: self.instance, "fake-k8s.pod-uid": rt.uid, "fake-k8s.role": role,
                    "fake-k8s.pod": f"{meta['namespace']}/{meta['name']}"},
        )["Id"]
        self._track(rt, "container", cid)
        return cid

    def _image_volume(self, rt: PodRuntime, name: str, ref: dict, sub_path: str):
        """A Podman volume holding `sub_path` of the image `ref["reference"]` (see the module doc)."""
        image = ref.get("reference", "")
        try:
            self.api.inspect_image(image)
        except self.docker.errors.ImageNotFound:
            self._fail(rt, "Failed", f"fake kubelet: image volume {name!r}: image {image!r} is not present "
                                     f"(the fake never pulls)")
            return FATAL
        vname = f"fk8s-{rt.uid[:13]}-{name}-img"[:60]
        self.api.create_volume(vname, labels={INSTANCE_LABEL: self.instance, "fake-k8s.pod-uid": rt.uid})
        self._track(rt, "volume", vname)
        filler = self.api.create_container(
            image, entrypoint=["/bin/sh", "-c", 'cp -a "/$1/." /fk8s-fill/', "fill", sub_path.strip("/")],
            labels={INSTANCE_LABEL: self.instance, "fake-k8s.pod-uid": rt.uid},
            host_config=self.api.create_host_config(network_mode="none", mounts=[
                self.docker.types.Mount("/fk8s-fill", vname, type="volume")]))["Id"]
        try:
            self.api.start(filler)
            code = self.api.wait(filler, timeout=600).get("StatusCode")
        finally:
            self._quiet(self.api.remove_container, filler, force=True)
        if code != 0:
            self._fail(rt, "Failed", f"fake kubelet: image volume {name!r}: no {sub_path!r} in {image!r}")
            return FATAL
        return vname

    def _secret_value(self, rt: PodRuntime, c: dict, ref: dict) -> str | None:
        """The secret's key, waiting (like a kubelet retrying CreateContainerConfigError) until it exists."""
        deadline = time.monotonic() + 60
        while True:
            secret = self.store.get("secrets", rt.ns, ref["name"])
            if secret is not None and ref["key"] in (secret.get("data") or {}):
                return base64.b64decode(secret["data"][ref["key"]]).decode()
            if ref.get("optional"):
                return None
            message = f'secret "{ref["name"]}" not found' if secret is None else \
                f"couldn't find key {ref['key']} in Secret {rt.ns}/{ref['name']}"
            self._update(rt, lambda st: st.update(containerStatuses=[{
                "name": c["name"], "image": c["image"], "imageID": "", "ready": False, "restartCount": 0,
                "state": {"waiting": {"reason": "CreateContainerConfigError", "message": message}}}]))
            if rt.killed or time.monotonic() > deadline:
                raise _Killed("secret never came")
            time.sleep(0.2)

    def _network_for(self, pod: dict) -> str:
        """Internal network when Egress policies select the pod and none opens egress to all."""
        labels = pod["metadata"].get("labels") or {}
        policies, _ = self.store.list("networkpolicies", pod["metadata"]["namespace"])
        selecting = []
        for p in policies:
            spec = p.get("spec") or {}
            types = spec.get("policyTypes") or (["Ingress", "Egress"] if "egress" in spec else ["Ingress"])
            if "Egress" in types and label_selector_matches(spec.get("podSelector"), labels):
                selecting.append(spec)
        if not selecting:
            return self.open_network
        for spec in selecting:
            for rule in spec.get("egress") or []:
                to = rule.get("to")
                if not rule.get("ports") and (not to or any((peer.get("ipBlock") or {}).get("cidr") == "0.0.0.0/0"
                                                            and not peer["ipBlock"].get("except") for peer in to)):
                    return self.open_network
        return self.internal_network

    # ------------------------------------------------------------------ probes
    def _http_probe(self, ip: str | None, probe: dict) -> bool:
        get = probe.get("httpGet")
        if get is None or ip is None:
            return True  # no probe: ready as soon as it runs
        port = get["port"]
        conn = http.client.HTTPConnection(ip, int(port), timeout=float(probe.get("timeoutSeconds", 1)))
        try:
            conn.request("GET", get.get("path", "/"))
            return 200 <= conn.getresponse().status < 400
        except OSError:
            return False
        finally:
            conn.close()

    def _probe_until_started(self, rt: PodRuntime, pod: dict) -> None:
        c = pod["spec"]["containers"][0]
        startup = c.get("startupProbe") or c.get("readinessProbe") or {}
        ports = {p.get("name"): p["containerPort"] for p in c.get("ports") or []}

        def resolve(probe):
            if probe and "httpGet" in probe and isinstance(probe["httpGet"]["port"], str):
                probe = {**probe, "httpGet": {**probe["httpGet"], "port": ports[probe["httpGet"]["port"]]}}
            return probe

        startup = resolve(startup)
        readiness = resolve(c.get("readinessProbe"))
        budget = float(startup.get("periodSeconds", 10)) * float(startup.get("failureThreshold", 3)) + \
            float(startup.get("initialDelaySeconds", 0))
        deadline = time.monotonic() + budget
        while not self._http_probe(rt.ip, startup):
            if rt.killed:
                return
            if time.monotonic() > deadline:
                self._quiet(self.api.kill, rt.main)
                self._fail(rt, "Failed", "startup probe failed", {"terminated": {
                    "exitCode": 137, "reason": "Error", "message": "startup probe failed",
                    "finishedAt": now_iso()}})
                return
            time.sleep(self.fast_probe)
        if rt.killed:
            return

        def started(st):
            for cs in st.get("containerStatuses") or []:
                cs["started"] = True
        self._update(rt, started)
        if readiness and not self._http_probe(rt.ip, readiness):
            ok = False
        else:
            ok = True
        self._set_ready(rt, ok)
        rt.readiness = readiness
        rt.next_probe = time.monotonic() + float((readiness or {}).get("periodSeconds", 10))

    def _set_ready(self, rt: PodRuntime, ready: bool) -> None:
        if rt.ready == ready and ready:
            return
        rt.ready = ready

        def mark(st):
            if st.get("phase") != "Running":
                return
            _cond(st, "ContainersReady", ready, None if ready else "ContainersNotReady")
            _cond(st, "Ready", ready, None if ready else "ContainersNotReady")
            for cs in st.get("containerStatuses") or []:
                cs["ready"] = ready
        self._update(rt, mark)

    def _prober(self) -> None:
        """Periodic readiness probes of started pods."""
        while not self._stopped.wait(0.2):
            with self.lock:
                due = [rt for rt in self.pods.values()
                       if rt.readiness and not rt.killed and rt.next_probe <= time.monotonic()]
            for rt in due:
                probe = rt.readiness
                ok = self._http_probe(rt.ip, probe)
                rt.failures = 0 if ok else rt.failures + 1
                if ok and not rt.ready:
                    self._set_ready(rt, True)
                elif not ok and rt.ready and rt.failures >= int(probe.get("failureThreshold", 3)):
                    self._set_ready(rt, False)
                rt.next_probe = time.monotonic() + float(probe.get("periodSeconds", 10))

    def _wait_exit(self, rt: PodRuntime) -> None:
        """Block until the main container exits; then the pod is over (restartPolicy Never)."""
        try:
            code = self.api.wait(rt.main, timeout=None).get("StatusCode")
        except Exception:
            code = None
        with rt.lock:
            if rt.killed and code is None:
                return
        info = self._quiet(self.api.inspect_container, rt.main) or {}
        state = info.get("State") or {}
        if code is None:
            code = state.get("ExitCode", -1)
        if rt.killed and not self._pod_alive(rt):
            return
        oom = bool(state.get("OOMKilled"))
        reason = "OOMKilled" if oom else ("Completed" if code == 0 else "Error")
        terminated = {"exitCode": code, "reason": reason, "finishedAt": now_iso(),
                      "containerID": f"podman://{rt.main}"}
        rt.readiness = None

        def done(st):
            if st.get("phase") == "Failed":  # evicted meanwhile: keep that reason
                for cs in st.get("containerStatuses") or []:
                    cs.update(ready=False, state={"terminated": terminated})
                return
            st["phase"] = "Succeeded" if code == 0 else "Failed"
            _cond(st, "Ready", False, "PodCompleted" if code == 0 else "PodFailed")
            _cond(st, "ContainersReady", False, "PodCompleted" if code == 0 else "PodFailed")
            for cs in st.get("containerStatuses") or []:
                cs.update(ready=False, started=False, state={"terminated": terminated})

        self._update(rt, done)

    def _pod_alive(self, rt: PodRuntime) -> bool:
        pod = self.store.get("pods", rt.ns, rt.name)
        return pod is not None and pod["metadata"]["uid"] == rt.uid and not pod["metadata"].get("deletionTimestamp")

    # ------------------------------------------------------------------ pod stop
    def _kill_pod(self, uid: str, grace: int, finalize: bool) -> None:
        with self.lock:
            rt = self.pods.get(uid)
        if rt is None:
            return
        with rt.lock:
            rt.killed = True
            rt.readiness = None
            containers, volumes = list(rt.containers), list(rt.volumes)
        for cid in containers:
            if grace > 0:
                self._quiet(self.api.stop, cid, timeout=grace)
            self._quiet(self.api.remove_container, cid, force=True)
        for v in volumes:
            self._quiet(self.api.remove_volume, v, force=True)
        with self.lock:
            self.pods.pop(uid, None)
            self.counters["killed"] += 1
        if finalize:
            self.store.remove("pods", rt.ns, rt.name, uid=uid)

    def shutdown(self) -> None:
        """Remove every container and volume this kubelet made (the objects stay)."""
        self._stopped.set()
        with self.lock:
            uids = list(self.pods)
        threads = [threading.Thread(target=self._kill_pod, args=(uid, 0, False)) for uid in uids]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        self._sweep_mine()

    def _sweep_mine(self) -> None:
        for c in self.api.containers(all=True, filters={"label": [f"{INSTANCE_LABEL}={self.instance}"]}):
            self._quiet(self.api.remove_container, c["Id"], force=True)
        for v in self.api.volumes(filters={"label": f"{INSTANCE_LABEL}={self.instance}"}).get("Volumes") or []:
            self._quiet(self.api.remove_volume, v["Name"], force=True)


class InstantKubelet:
    """Pods turn Running and Ready after `delay` seconds with a made-up IP; nothing runs."""

    def __init__(self, store: Store, delay: float = 0.0, node: str = "fake-node"):
        self.store, self.delay, self.node = store, delay, node
        self._ips = itertools.count(1)
        self.counters = {"started": 0}
        self.ready_at: dict[str, float] = {}  # pod name -> time.time() it turned Ready (benchmarks' wake-up latency)
        store.listeners.append(self.on_event)

    def stats(self) -> dict:
        return dict(self.counters)

    def on_event(self, etype: str, plural: str, obj: dict) -> None:
        if plural != "pods":
            return
        meta = obj["metadata"]
        if etype == "ADDED":
            threading.Thread(target=self._start, args=(meta["namespace"], meta["name"], meta["uid"]),
                             daemon=True).start()
        elif etype == "MODIFIED" and meta.get("deletionTimestamp"):
            self.store.remove("pods", meta["namespace"], meta["name"], uid=meta["uid"])

    def kill_pod_containers(self, ns: str, name: str) -> None:
        pass

    def _start(self, ns: str, name: str, uid: str) -> None:
        n = next(self._ips)
        ip = f"10.244.{n // 250 % 250}.{n % 250 + 1}"
        self.store.update("pods", ns, name, lambda p: p["spec"].__setitem__("nodeName", self.node), uid=uid)
        if self.delay:
            time.sleep(self.delay)
        started = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

        def ready(pod):
            st = pod.setdefault("status", {})
            if st.get("phase") != "Pending":
                return False
            c = pod["spec"]["containers"][0]
            st.update(phase="Running", podIP=ip, podIPs=[{"ip": ip}], hostIP="127.0.0.1", startTime=started)
            for ctype in ("PodScheduled", "Initialized", "ContainersReady", "Ready"):
                _cond(st, ctype, True)
            st["containerStatuses"] = [{"name": c["name"], "image": c["image"], "imageID": "", "ready": True,
                                        "started": True, "restartCount": 0,
                                        "state": {"running": {"startedAt": started}}}]
        self.store.update("pods", ns, name, ready, uid=uid)
        self.ready_at[name] = time.time()
        self.counters["started"] += 1

    def shutdown(self) -> None:
        pass


def _source(volume) -> tuple[str, str]:
    """(source, mount type) of a pod volume: a Podman volume's name, or a hostPath's bind."""
    return (volume[1], "bind") if isinstance(volume, tuple) else (volume, "volume")
