"""Isolation attacks through the sandbox spec, on every backend.

A spec's `env` once could name another sandbox (`ORCHARD_SANDBOX=<victim>`): on the local
backend the attacker's agent then killed the victim's processes when it shut down, and
the host's marker kill missed the attacker's own. `ORCHARD_*` names are now refused by
`SandboxSpec`, and every backend merges its reserved keys last, so a spec that skips
validation (a backend called directly) still cannot rename its sandbox.
"""

from __future__ import annotations

import os
import signal

import httpx
import pytest

from conftest import HAS_BWRAP, client_kwargs, wait_until
from orchard_gym import InvalidRequest, SandboxClient
from orchard_gym.backends import procs
from orchard_gym.models import SandboxSpec

RESERVED = ("ORCHARD_SANDBOX", "ORCHARD_AGENT_TOKEN", "ORCHARD_JOB", "ORCHARD_ANYTHING_NEW")


def test_reserved_env_names_are_refused_by_the_spec():
    for name in RESERVED:
        with pytest.raises(ValueError, match="reserved"):
            SandboxSpec(env={name: "x"})
    assert SandboxSpec(env={"ORCHARDX": "1", "orchard_sandbox": "2", "MY_ORCHARD_SANDBOX": "3"}).env["ORCHARDX"] == "1"


def test_reserved_env_names_are_refused_by_the_sdk(backend_case):
    with SandboxClient(**client_kwargs(backend_case)) as client:
        for name in RESERVED:
            with pytest.raises(InvalidRequest, match=f"{name}.*reserved"):
                client.create_sandbox(image=backend_case["image"], env={name: "sb-victim"})
        assert not any(set(r.env) & set(RESERVED) for r in client.list_sandboxes())


def test_reserved_env_names_get_a_422_from_the_orchestrator(remote_orchestrator):
    headers = {"X-API-Key": remote_orchestrator.api_key}
    with httpx.Client(base_url=remote_orchestrator.url, headers=headers, timeout=30) as http:
        before = http.get("/sandboxes").json()
        for name in RESERVED:
            resp = http.post("/sandboxes", json={"env": {name: "sb-victim"}})
            assert resp.status_code == 422, resp.text
            assert "reserved" in resp.text
        assert http.get("/sandboxes").json() == before  # nothing was made


def test_backends_merge_their_reserved_env_last(backend_case):
    """Called without validation, each backend still sets its own id and token."""
    if backend_case.get("remote"):  # a body that skips the SDK's validation meets the server's
        body = {"env": {"ORCHARD_SANDBOX": "sb-victim"}}
        resp = httpx.post(f"{backend_case['base_url']}/sandboxes", json=body, timeout=30,
                          headers={"X-API-Key": backend_case["api_key"]})
        assert resp.status_code == 422 and "reserved" in resp.text, resp.text
        return
    spec = SandboxSpec.model_construct(image=backend_case["image"],
                                       env={"ORCHARD_SANDBOX": "sb-victim", "ORCHARD_AGENT_TOKEN": "guessed",
                                            "KEPT": "yes"})
    with SandboxClient(**client_kwargs(backend_case)) as client:
        record = client._loop.run(client._async._control.create(spec, True, 180))
        try:
            assert record.endpoint.token != "guessed"
            box = client.get_sandbox(record.sandbox_id)
            out = box.exec("echo $ORCHARD_SANDBOX $KEPT").stdout.split()
            assert out == [record.sandbox_id, "yes"]
        finally:
            client.delete_sandbox(record.sandbox_id)


@pytest.mark.parametrize("cgroups", ["auto", "off"])
@pytest.mark.parametrize("isolation", [pytest.param("bwrap", marks=pytest.mark.skipif(not HAS_BWRAP, reason="no bwrap")),
                                       "none"])
def test_a_sandbox_named_after_another_cannot_kill_it(local_root, isolation, cgroups):
    """The reproduced attack, with validation skipped: the attacker's agent shuts down
    (SIGTERM, as when its parent dies) and the victim's agent and job live on."""
    config = {"type": "local", "root": str(local_root), "isolation": isolation, "cgroups": cgroups}
    with SandboxClient(config) as client:
        victim = client.create_sandbox()
        job = victim.exec("sleep 1000 >/dev/null 2>&1 & echo $!").stdout.strip()
        spec = SandboxSpec.model_construct(env={"ORCHARD_SANDBOX": victim.sandbox_id})
        attacker = client._loop.run(client._async._control.create(spec, True, 60))
        try:
            agent = attacker.details["pid"]
            os.kill(agent["pid"], signal.SIGTERM)
            assert wait_until(lambda: not procs.alive(agent), timeout=10)
            assert procs.alive(victim.record.details["pid"])
            assert victim.exec("echo alive").stdout == "alive\n"
            assert victim.exec(f"kill -0 {job}").succeeded
        finally:
            client.delete_sandbox(attacker.sandbox_id)
