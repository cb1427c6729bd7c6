"""deploy/: every Kubernetes manifest validates against the Kubernetes schema (offline, with
the schemas kubernetes-validate ships, pinned to one version), the kustomize layout holds
together, RBAC stays least-privilege, and the orchestrator's config is one our backend
accepts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from conftest import require_module

from orchard_gym.backends.config import KubernetesBackendConfig, parse_backend_config

kubernetes_validate = require_module("kubernetes-validate", "kubernetes_validate")

REPO = Path(__file__).resolve().parents[1]
K8S = REPO / "deploy" / "k8s"
SCHEMA_VERSION = "1.31.0"  # a version kubernetes-validate ships schemas for; kind/k3s of that age run these


def manifests() -> list[Path]:
    return sorted(p for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml")


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def all_objects() -> list[tuple[Path, dict]]:
    return [(p, d) for p in manifests() for d in documents(p)]


def test_there_is_a_base_and_an_overlay():
    assert (K8S / "base" / "kustomization.yaml").is_file()
    assert list((K8S / "overlays").glob("*/kustomization.yaml"))
    assert (REPO / "deploy" / "Dockerfile.orchestrator").is_file()


@pytest.mark.parametrize("path", manifests(), ids=lambda p: str(p.relative_to(K8S)))
def test_manifest_validates_against_the_kubernetes_schema(path):
    docs = documents(path)
    assert docs, f"{path} is empty"
    for doc in docs:  # overlays' patches too: a partial object must still be a valid one
        kubernetes_validate.validate(doc, SCHEMA_VERSION, strict=True)


def test_kustomizations_reference_what_exists_and_nothing_is_orphaned():
    referenced = set()
    for kfile in K8S.rglob("kustomization.yaml"):
        k = yaml.safe_load(kfile.read_text())
        assert k["apiVersion"] == "kustomize.config.k8s.io/v1beta1" and k["kind"] == "Kustomization"
        for res in k.get("resources") or []:
            target = (kfile.parent / res).resolve()
            assert target.exists(), f"{kfile}: resource {res} does not exist"
            if target.is_dir():
                assert (target / "kustomization.yaml").is_file()
            referenced.add(target)
        for patch in k.get("patches") or []:
            if "path" in patch:
                target = (kfile.parent / patch["path"]).resolve()
                assert target.is_file(), f"{kfile}: patch {patch['path']} does not exist"
                referenced.add(target)
            else:
                assert patch.get("target") and patch.get("patch")
    orphans = [p for p in manifests() if p.resolve() not in referenced]
    assert not orphans, f"manifests no kustomization uses: {orphans}"


def test_images_in_the_overlay_name_images_the_base_uses():
    base_images = {c["image"].split(":")[0] for _, d in all_objects() if d.get("kind") == "Deployment"
                   for c in d["spec"]["template"]["spec"]["containers"]}
    for kfile in (K8S / "overlays").glob("*/kustomization.yaml"):
        for image in yaml.safe_load(kfile.read_text()).get("images") or []:
            assert image["name"] in base_images, f"{kfile}: image {image['name']} is not used by the base"


def test_rbac_is_least_privilege_in_the_sandbox_namespace_only():
    objs = [d for _, d in all_objects()]
    assert not [d for d in objs if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    roles = [d for d in objs if d["kind"] == "Role"]
    assert [r["metadata"]["namespace"] for r in roles] == ["orchard-sandboxes"]
    allowed = {("", "pods"): {"get", "list", "watch", "create", "delete"},
               ("", "secrets"): {"get", "list", "create", "delete", "patch"},
               ("networking.k8s.io", "networkpolicies"): {"get", "list", "create", "delete", "patch"}}
    for rule in roles[0]["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                assert "*" not in rule["verbs"] and set(rule["verbs"]) <= allowed[(group, resource)], rule
    binding = next(d for d in objs if d["kind"] == "RoleBinding")
    assert binding["metadata"]["namespace"] == "orchard-sandboxes"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "orchard-orchestrator",
                                    "namespace": "orchard-system"}]


def test_orchestrator_deployment_has_replicas_probes_and_its_config():
    objs = {(d["kind"], d["metadata"]["name"]): d for _, d in all_objects() if d["metadata"].get("name")}
    dep = objs[("Deployment", "orchard-orchestrator")]
    assert dep["spec"]["replicas"] >= 2
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "orchard-orchestrator"
    c = pod["containers"][0]
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    assert {"configMapRef": {"name": "orchard-orchestrator"}} in c["envFrom"]
    assert ("Service", "orchard-orchestrator") in objs and ("Service", "orchard-redis") in objs
    configs = [d for p, d in all_objects() if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "orchard-orchestrator"]
    assert len(configs) == 2  # the base and the overlay's patch
    for cm in configs:
        backend = json.loads(cm["data"]["ORCHARD_BACKEND_CONFIG"])
        config = parse_backend_config({"type": "kubernetes", **backend})  # our backend takes it
        assert isinstance(config, KubernetesBackendConfig)
        assert config.namespace == "orchard-sandboxes" and config.owner  # shared by every replica
        assert config.kubeconfig is None  # in the cluster: the service account
    assert configs[0]["data"].get("ORCHARD_BACKEND", "kubernetes") == "kubernetes"


def test_sandbox_namespace_denies_egress_and_admits_only_the_orchestrator():
    policies = [d for _, d in all_objects() if d["kind"] == "NetworkPolicy"
                and d["metadata"]["namespace"] == "orchard-sandboxes"]
    deny = next(p for p in policies if p["spec"]["podSelector"] == {})
    assert deny["spec"]["policyTypes"] == ["Egress"] and deny["spec"]["egress"] == []
    ingress = next(p for p in policies if "Ingress" in p["spec"]["policyTypes"])
    assert ingress["spec"]["ingress"][0]["ports"] == [{"protocol": "TCP", "port": 8765}]


def test_orchestrator_dockerfile_installs_the_server_and_the_kubernetes_client():
    text = (REPO / "deploy" / "Dockerfile.orchestrator").read_text()
    assert '".[server,k8s]"' in text and "USER 10001" in text
    assert 'ENTRYPOINT ["orchard"]' in text
    ignore = (REPO / "deploy" / "Dockerfile.orchestrator.dockerignore").read_text().split()
    assert ignore[0] == "*" and "!orchard_gym/" in ignore  # no .venv in the build context
