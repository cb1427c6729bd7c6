"""What the kubernetes backend writes to the API server: the sandbox pod (the task's image
with the agent injected by an init container, or mounted from an image volume with
agent_volume="image"), its token Secret and the NetworkPolicies.
A mixin of `KubernetesBackend` (backends/kubernetes.py), which provides `config`,
`namespace`, the label names and `owner`."""

from __future__ import annotations

import json
import time

from orchard_gym.models import SandboxSpec, parse_memory

from .base import token_sha256
from .docker import AGENT_ARGS, AGENT_DIR, LOADER

AGENT_VOLUME = "orchard-agent"
TASK_CONTAINER = "sandbox"
INJECT_CONTAINER = "inject-agent"
RESTRICTED_UID = 65532
INJECTOR_BUNDLE_DIR = "bundle"  # where deploy/Dockerfile.agent-injector keeps the bundle


class PodManifests:
    """The manifests of one backend's sandboxes (pure functions of its config)."""

    def _name(self, sandbox_id: str) -> str:
        return f"{self.config.label_prefix}-{sandbox_id}"

    # ------------------------------------------------------------------ manifests
    def _labels(self, sandbox_id: str) -> dict:
        return {self.role_label: "sandbox", self.sandbox_label: sandbox_id, self.owner_label: self.owner,
                "app.kubernetes.io/managed-by": "orchard-gym"}

    def pod_manifest(self, spec: SandboxSpec, sandbox_id: str, token: str, nonce: str = "") -> dict:
        cfg = self.config
        image = spec.image or cfg.default_image
        restricted = cfg.security == "restricted"
        uid = cfg.run_as_user or (RESTRICTED_UID if restricted else None)
        meta = {"image": image, "block_network": spec.block_network, "cpu": spec.cpu, "memory": spec.memory,
                "disk": spec.disk, "env": spec.env, "labels": spec.labels, "created_at": time.time()}
        cpu = spec.cpu or cfg.default_cpu
        memory = spec.memory_bytes or (parse_memory(cfg.default_memory) if cfg.default_memory else None)
        requests = {"cpu": quantity_cpu(min(cfg.cpu_request, cpu or cfg.cpu_request)),
                    "memory": str(min(parse_memory(cfg.memory_request), memory or parse_memory(cfg.memory_request)))}
        limits = {}
        if cpu:
            limits["cpu"] = quantity_cpu(cpu)
        if memory:
            limits["memory"] = str(memory)
        if spec.disk is not None:  # the kubelet evicts the pod past it (its request defaults to it: reserved)
            limits["ephemeral-storage"] = str(spec.disk_bytes)
        name = self._name(sandbox_id)
        env = [{"name": k, "value": v} for k, v in spec.env.items()
               if k not in ("ORCHARD_AGENT_TOKEN", "ORCHARD_SANDBOX")]
        env.append({"name": "ORCHARD_SANDBOX", "value": sandbox_id})
        # The pod gets only the token's SHA-256 (--token-sha256); the token stays in the Secret
        # (token_source="secret") or in an annotation (="env"), neither of which the pod sees.
        annotations = {} if cfg.token_source == "secret" else {self.token_annotation: token}
        security = {"allowPrivilegeEscalation": False, "privileged": False,
                    "capabilities": {"drop": ["ALL"] if restricted else ["NET_RAW"]}}
        if uid is not None:
            security.update(runAsUser=uid, runAsNonRoot=True)
        probe = {"httpGet": {"path": "/health", "port": "agent"}, "timeoutSeconds": 2}
        mounts = [{"name": AGENT_VOLUME, "mountPath": AGENT_DIR, "readOnly": True}]
        volumes = [{"name": AGENT_VOLUME, "emptyDir": {"sizeLimit": "256Mi"}}]
        if uid is not None:  # a non-root user cannot write the root-owned workdir the runtime creates
            mounts.append({"name": "workspace", "mountPath": cfg.workdir})
            volumes.append({"name": "workspace", "emptyDir": {"sizeLimit": str(spec.disk_bytes)} if spec.disk else {}})
        container = {
            "name": TASK_CONTAINER, "image": image, "imagePullPolicy": cfg.image_pull_policy,
            "command": [LOADER],
            "args": AGENT_ARGS + ["--port", str(cfg.agent_port), "--cwd", cfg.workdir,
                                  "--max-output", str(cfg.max_output), "--token-sha256", token_sha256(token)],
            "workingDir": cfg.workdir,
            "env": env,
            "ports": [{"name": "agent", "containerPort": cfg.agent_port, "protocol": "TCP"}],
            "volumeMounts": mounts,
            "resources": {"requests": requests, **({"limits": limits} if limits else {})},
            "startupProbe": {**probe, "periodSeconds": 1, "failureThreshold": cfg.startup_timeout},
            "readinessProbe": {**probe, "periodSeconds": 5, "failureThreshold": 3},
            "securityContext": security,
        }
        injector = {
            "name": INJECT_CONTAINER, "image": cfg.injector_image, "imagePullPolicy": cfg.injector_pull_policy,
            "args": ["/agent"],
            "volumeMounts": [{"name": AGENT_VOLUME, "mountPath": "/agent"}],
            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "256Mi"}},
            "securityContext": {"allowPrivilegeEscalation": False, "privileged": False, "readOnlyRootFilesystem": True,
                                "capabilities": {"drop": ["ALL"]},
                                **({"runAsUser": uid, "runAsNonRoot": True} if uid is not None else {})},
        }
        init_containers = [injector]
        if cfg.agent_volume == "image":  # the injector image itself, read-only: nothing to copy, no init container
            volumes[0] = {"name": AGENT_VOLUME,
                          "image": {"reference": cfg.injector_image, "pullPolicy": cfg.injector_pull_policy}}
            mounts[0] = {**mounts[0], "subPath": INJECTOR_BUNDLE_DIR}
            init_containers = []
        pod_spec = {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "shareProcessNamespace": True,
            "hostname": sandbox_id,
            "terminationGracePeriodSeconds": 2,
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"},
                                **({"runAsNonRoot": True, "fsGroup": uid} if uid is not None else {})},
            **({"initContainers": init_containers} if init_containers else {}),
            "containers": [container],
            "volumes": volumes,
        }
        if cfg.service_account:
            pod_spec["serviceAccountName"] = cfg.service_account
        if cfg.node_selector:
            pod_spec["nodeSelector"] = dict(cfg.node_selector)
        if cfg.tolerations:
            pod_spec["tolerations"] = [t.model_dump(exclude_none=True) for t in cfg.tolerations]
        if cfg.image_pull_secrets:
            pod_spec["imagePullSecrets"] = [{"name": n} for n in cfg.image_pull_secrets]
        if cfg.runtime_class:
            pod_spec["runtimeClassName"] = cfg.runtime_class
        return {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": self.namespace, "labels": self._labels(sandbox_id),
                         "annotations": {self.spec_annotation: json.dumps(meta, separators=(",", ":")),
                                         self.identity_annotation: self.identity, self.nonce_annotation: nonce,
                                         **annotations}},
            "spec": pod_spec,
        }

    def secret_manifest(self, sandbox_id: str, token: str) -> dict:
        return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": self._name(sandbox_id), "namespace": self.namespace,
                             "labels": {**self._labels(sandbox_id), self.role_label: "token"}},
                "stringData": {"token": token}}

    def _policy(self, name: str, selector: dict, egress: list, role: str, sandbox_id: str | None = None) -> dict:
        labels = {self.role_label: role, "app.kubernetes.io/managed-by": "orchard-gym"}
        if sandbox_id:
            labels.update({self.sandbox_label: sandbox_id, self.owner_label: self.owner})
        return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": {"name": name, "namespace": self.namespace, "labels": labels},
                "spec": {"podSelector": {"matchLabels": selector}, "policyTypes": ["Egress"], "egress": egress}}

    def deny_policy_manifest(self) -> dict:
        """Every sandbox pod of the namespace: no egress at all, unless another policy allows it."""
        return self._policy(f"{self.config.label_prefix}-deny-egress", {self.role_label: "sandbox"}, [],
                            "deny-egress")

    def allow_policy_manifest(self, sandbox_id: str) -> dict:
        """One sandbox (block_network=False): egress anywhere."""
        return self._policy(f"{self._name(sandbox_id)}-egress", {self.sandbox_label: sandbox_id}, [{}],
                            "allow-egress", sandbox_id)

    def egress_allow_manifest(self) -> dict | None:
        """Every sandbox: egress to the `egress_allow` addresses only."""
        if not self.config.egress_allow:
            return None
        rules = []
        for entry in self.config.egress_allow:
            cidr, port = (entry.rsplit(":", 1) if entry.count(":") == 1 else (entry, None))
            if "/" not in cidr:
                cidr += "/128" if ":" in cidr else "/32"
            rule = {"to": [{"ipBlock": {"cidr": cidr}}]}
            if port:
                rule["ports"] = [{"protocol": "TCP", "port": int(port)}]
            rules.append(rule)
        return self._policy(f"{self.config.label_prefix}-egress-allow", {self.role_label: "sandbox"}, rules,
                            "egress-allow")

    # ------------------------------------------------------------------ create


def quantity_cpu(cores: float) -> str:
    """Cores as a Kubernetes quantity in millicores (at least 1m)."""
    return f"{max(1, round(cores * 1000))}m"
