"""Harness egress on kubernetes (the fake cluster, tests/fake_k8s: the real wire protocol,
pods run by Podman): a blocked sandbox, as `HarnessEnv(network="proxy")` creates one, with
the proxy as its only allowed egress (`egress_allow=["PROXY_IP/32:PORT"]`). What is checked
is the NetworkPolicy set the backend created (the fake cluster does not enforce policies;
docker's egress is probed from inside in test_harness_docker.py)."""

from __future__ import annotations

import pytest

from conftest import DOCKER_IMAGES, fake_k8s_unavailable, needs, require_module

require_module("server", "fastapi")

from orchard_gym import SandboxClient  # noqa: E402

PROXY_IP, PROXY_PORT = "10.89.0.1", 8111


@pytest.mark.timeout(600)
@needs("kubernetes", fake_k8s_unavailable())
def test_blocked_harness_pod_may_reach_the_proxy_only(fake_k8s):
    config = fake_k8s.backend_config(egress_allow=[f"{PROXY_IP}/32:{PROXY_PORT}"])
    with SandboxClient(config) as client:
        box = client.create_sandbox(image=DOCKER_IMAGES["busybox"], block_network=True)  # what network="proxy" asks
        try:
            pod = box.record.details["pod"]
            status, listing = fake_k8s.kube("GET", fake_k8s.pod_path(kind="networkpolicies"))
            assert status == 200
            policies = {p["metadata"]["name"]: p["spec"] for p in listing["items"]}
            deny = next(spec for name, spec in policies.items() if name.endswith("-deny-egress"))
            allow = next(spec for name, spec in policies.items() if name.endswith("-egress-allow"))
            status, live = fake_k8s.kube("GET", fake_k8s.pod_path(pod))
            labels = live["metadata"]["labels"]
            # every sandbox pod (this one included): no egress at all ...
            assert deny["policyTypes"] == ["Egress"] and deny["egress"] == []
            assert all(labels.get(k) == v for k, v in deny["podSelector"]["matchLabels"].items())
            # ... but TCP to the proxy's address and port
            assert allow["podSelector"] == deny["podSelector"] and allow["policyTypes"] == ["Egress"]
            assert allow["egress"] == [{"to": [{"ipBlock": {"cidr": f"{PROXY_IP}/32"}}],
                                        "ports": [{"protocol": "TCP", "port": PROXY_PORT}]}]
            assert f"{pod}-egress" not in policies  # no allow-anywhere policy for a blocked sandbox
        finally:
            box.delete()
