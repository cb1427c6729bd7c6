"""Property-based fuzzing of the orchestrator from its own OpenAPI document (schemathesis):
valid and invalid bodies, queries and path parameters on every route, against a real
`orchard serve` with real sandboxes. Zero 5xx answers, zero crashes — and every route is
really fuzzed: the cases sent are counted, so the test cannot pass without sending any."""

from __future__ import annotations

import json
import shutil
import zlib

import httpx
import pytest
from service_helpers import API_KEY, Orchestrator, remove_all_sandboxes, short_root

from conftest import HAS_BWRAP, require_module

schemathesis = require_module("schemathesis", "schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402

EXAMPLES = 30  # per route and mode: the whole run stays well under a minute
SENT: dict[str, dict[str, int]] = {}  # operation -> {mode: cases sent and answered}
INTRUDER_KEY = "intruder-key-0123456789"  # valid, but not the key that made the fuzzed sandbox


@pytest.fixture(scope="module")
def fuzz_orchestrator(tmp_path_factory):
    root = short_root("fuzz")
    # short server-side waits keep generated `timeout=` values from stalling the run
    orch = Orchestrator(root, log_dir=tmp_path_factory.mktemp("fuzz-logs"), max_wait=0.5, ready_timeout=10,
                        api_keys=f"{API_KEY},{INTRUDER_KEY}")
    yield orch
    orch.stop()
    remove_all_sandboxes(root)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def fuzz_box(fuzz_orchestrator):
    """A real sandbox that about half of the generated cases are aimed at."""
    with fuzz_orchestrator.http() as http:
        made = http.post("/sandboxes", json={"sandbox_id": "fuzz-target"})
        assert made.is_success, (made.status_code, made.text)
        sid = made.json()["sandbox_id"]
        ready = http.get(f"/sandboxes/{sid}/wait", params={"timeout": 30})
        assert ready.is_success and ready.json().get("status") == "running", (ready.status_code, ready.text)
    return sid


def _aim(case, fuzz_box: str) -> str | None:
    """Point half of the cases with a sandbox id at the real sandbox, and keep commands run
    there short. A third of those go with another valid key (the intruder), which must never
    get a 2xx; only the intruder's DELETEs are aimed (the sandbox must live on). Returns
    "owner", "intruder" or None (not aimed)."""
    params = case.path_parameters or {}
    if "sandbox_id" not in params:
        return None
    body = case.body if isinstance(case.body, dict) else {}
    digest = zlib.crc32(repr((params, case.query, body)).encode())
    if digest % 2:
        return None
    who = "intruder" if digest % 3 == 0 else "owner"
    if case.method.upper() == "DELETE" and who == "owner":
        return None
    if case.path.endswith(("/exec", "/exec/stream")) and not HAS_BWRAP:
        return None  # generated commands run only inside namespaces
    params["sandbox_id"] = fuzz_box
    if "timeout_seconds" in body and isinstance(body["timeout_seconds"], (int, float)) \
            and not isinstance(body["timeout_seconds"], bool) and body["timeout_seconds"] > 2:
        body["timeout_seconds"] = 2
    return who


def _operations():
    """Every route of the API, from the app's own OpenAPI document (no server needed)."""
    require_module("server", "fastapi")
    from orchard_gym.service import ServiceSettings, create_app

    paths = create_app(ServiceSettings()).openapi()["paths"]
    return [f"{method.upper()} {path}" for path, item in paths.items() for method in item]


@pytest.mark.parametrize("operation", _operations())
def test_api_fuzz_never_answers_5xx(operation, fuzz_orchestrator, fuzz_box):
    """Valid (positive) and invalid (negative) inputs generated from the live server's
    OpenAPI document; the check is schemathesis's own `not_a_server_error`."""
    from hypothesis import given
    from schemathesis import GenerationMode

    schema = schemathesis.openapi.from_url(fuzz_orchestrator.url + "/openapi.json")
    method, path = operation.split(" ", 1)
    op = schema[path][method]
    sent = SENT.setdefault(operation, {})
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
        sent[mode.value] = 0

        @given(case=op.as_strategy(generation_mode=mode))
        @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        def fuzz(case):
            who = _aim(case, fuzz_box)
            headers = {"X-API-Key": INTRUDER_KEY} if who == "intruder" else fuzz_orchestrator.headers
            response = case.call(base_url=fuzz_orchestrator.url, headers=headers, timeout=30)
            sent[mode.value] += 1
            sent["intruder"] = sent.get("intruder", 0) + (who == "intruder")
            case.validate_response(response, checks=[not_a_server_error])
            if who == "intruder":  # someone else's sandbox: refused, whatever the input
                assert 400 <= response.status_code < 500, (case.method, case.path, response.status_code)

        try:
            fuzz()
        except Unsatisfiable:
            assert mode == GenerationMode.NEGATIVE  # no parameters or body: nothing invalid to send
            sent[mode.value] = None
    # hypothesis may shrink a run to few cases, never to none: zero means nothing was fuzzed
    assert sent[GenerationMode.POSITIVE.value] > 0, (operation, sent)
    assert sent[GenerationMode.NEGATIVE.value] is None or sent[GenerationMode.NEGATIVE.value] > 0, (operation, sent)


def test_fuzzing_left_no_crash_behind(fuzz_orchestrator):
    """Runs after the fuzzing (same module): no logged exception, the server still serves,
    and (when the whole module ran) every route was sent cases."""
    if SENT:  # empty when this test is run alone
        assert all(modes.get("positive", 0) > 0 for modes in SENT.values()), SENT
        if HAS_BWRAP:
            assert sum(modes.get("intruder", 0) for modes in SENT.values()) > 0, SENT
    with fuzz_orchestrator.http() as http:  # the intruder's deletes did nothing
        target = http.get("/sandboxes/fuzz-target")
        assert target.is_success and target.json()["status"] == "running", (target.status_code, target.text)
    errors = [line for line in fuzz_orchestrator.logs().splitlines()
              if line.startswith("{") and json.loads(line).get("level") in ("error", "critical")]
    assert not errors, errors[:3]
    assert fuzz_orchestrator.proc.poll() is None
    assert httpx.get(fuzz_orchestrator.url + "/health", timeout=5).json()["status"] == "ok"
