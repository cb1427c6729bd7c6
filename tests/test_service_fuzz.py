"""Property-based fuzzing of the orchestrator from its own OpenAPI document (schemathesis):
valid and invalid bodies, queries and path parameters on every route, against a real
`orchard serve` with real sandboxes. Zero 5xx answers, zero crashes."""

from __future__ import annotations

import json
import shutil
import zlib

import httpx
import pytest
from service_helpers import Orchestrator, remove_all_sandboxes, short_root

from conftest import HAS_BWRAP, require_module

schemathesis = require_module("schemathesis", "schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402

EXAMPLES = 30  # per route and mode: the whole run stays well under a minute


@pytest.fixture(scope="module")
def fuzz_orchestrator(tmp_path_factory):
    root = short_root("fuzz")
    # short server-side waits keep generated `timeout=` values from stalling the run
    orch = Orchestrator(root, log_dir=tmp_path_factory.mktemp("fuzz-logs"), max_wait=0.5, ready_timeout=10)
    yield orch
    orch.stop()
    remove_all_sandboxes(root)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def fuzz_box(fuzz_orchestrator):
    """A real sandbox that about half of the generated cases are aimed at."""
    with fuzz_orchestrator.http() as http:
        sid = http.post("/sandboxes", json={"sandbox_id": "fuzz-target"}).json()["sandbox_id"]
        http.get(f"/sandboxes/{sid}/wait", params={"timeout": 30})
    return sid


def _aim(case, fuzz_box: str) -> None:
    """Point half of the cases with a sandbox id at the real sandbox (never DELETE: it must
    live on), and keep commands run there short."""
    params = case.path_parameters or {}
    if "sandbox_id" not in params or case.method.upper() == "DELETE":
        return
    body = case.body if isinstance(case.body, dict) else {}
    if zlib.crc32(repr((params, case.query, body)).encode()) % 2:
        return
    if case.path.endswith(("/exec", "/exec/stream")) and not HAS_BWRAP:
        return  # generated commands run only inside namespaces
    params["sandbox_id"] = fuzz_box
    if "timeout_seconds" in body and isinstance(body["timeout_seconds"], (int, float)) \
            and not isinstance(body["timeout_seconds"], bool) and body["timeout_seconds"] > 2:
        body["timeout_seconds"] = 2


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
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
        @given(case=op.as_strategy(generation_mode=mode))
        @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        def fuzz(case):
            _aim(case, fuzz_box)
            response = case.call(base_url=fuzz_orchestrator.url, headers=fuzz_orchestrator.headers, timeout=30)
            case.validate_response(response, checks=[not_a_server_error])

        try:
            fuzz()
        except Unsatisfiable:
            assert mode == GenerationMode.NEGATIVE  # no parameters or body: nothing invalid to send


def test_fuzzing_left_no_crash_behind(fuzz_orchestrator):
    """Runs after the fuzzing (same module): no logged exception, the server still serves."""
    errors = [line for line in fuzz_orchestrator.logs().splitlines()
              if line.startswith("{") and json.loads(line).get("level") in ("error", "critical")]
    assert not errors, errors[:3]
    assert fuzz_orchestrator.proc.poll() is None
    assert httpx.get(fuzz_orchestrator.url + "/health", timeout=5).json()["status"] == "ok"
