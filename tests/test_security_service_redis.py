"""Redis as the orchestrators' shared store, with authentication (issue 11): `requirepass`,
the ACL of deploy/k8s/base/redis.yaml, `redis://user:pass@`, `rediss://` and `unix://`
URLs, each against a real `redis-server` started here; a wrong or missing password, an
ACL that does not cover the prefix, an unverifiable certificate or garbage in the URL
stop `orchard serve` at start with one clear line (never a 500 later, never the password)."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from service_helpers import REPO, Orchestrator, RedisServer, free_port, need_redis_server, remove_all_sandboxes, short_root

from conftest import require, require_module

require_module("server", "fastapi")


def _serve(redis_url: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """`orchard serve` that must fail at start: its exit status and output."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("ORCHARD_")}
    root = short_root("rauth")
    try:
        return subprocess.run(
            [sys.executable, "-m", "orchard_gym.cli", "serve", "--port", str(free_port()), "--redis-url", redis_url],
            env={**base, "ORCHARD_BACKEND_CONFIG": json.dumps({"root": str(root)}), **env}, cwd=REPO,
            capture_output=True, text=True, timeout=60)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _works(orch: Orchestrator) -> None:
    """The store really is used: create, wait (a pub/sub wake-up), exec, job, delete."""
    with orch.http() as http:
        banner = http.get("/").json()
        assert banner["store"] == "redis" and http.get("/health").json()["store"] == "ok"
        sid = http.post("/sandboxes", json={}).json()["sandbox_id"]
        assert http.get(f"/sandboxes/{sid}/wait", params={"timeout": 30}).json()["status"] == "running"
        job = http.post(f"/sandboxes/{sid}/exec", json={"command": "echo via-redis"}).json()
        assert http.get(f"/jobs/{job['job_id']}/wait", params={"timeout": 20}).json()["stdout"] == "via-redis\n"
        assert http.delete(f"/sandboxes/{sid}").json()["status"] == "deleted"


@pytest.fixture
def password() -> str:
    return secrets.token_hex(16)


def test_redis_requirepass_right_password_works_wrong_or_missing_fails_at_start(tmp_path, password):
    need_redis_server()
    server = RedisServer(tmp_path, args=["--requirepass", password])
    root = short_root("rpass")
    try:
        with_url = Orchestrator(root, log_dir=tmp_path, redis_url=f"redis://:{password}@127.0.0.1:{server.port}/0")
        try:
            _works(with_url)
            assert password not in with_url.logs()
        finally:
            with_url.stop()
        from_secret = Orchestrator(root, log_dir=tmp_path, redis_url=server.url, redis_password=password)
        try:
            _works(from_secret)
        finally:
            from_secret.stop()
        for url, env, why in ((f"redis://:wrong-{password}@127.0.0.1:{server.port}/0", {}, "refused our credentials"),
                              (server.url, {"ORCHARD_REDIS_PASSWORD": "nope-" + password}, "refused our credentials"),
                              (server.url, {}, "requires a password and none is set")):
            started = time.monotonic()
            r = _serve(url, tmp_path, **env)
            out = r.stdout + r.stderr
            assert r.returncode != 0 and why in out and "ORCHARD_REDIS_PASSWORD" in out, out[-2000:]
            assert "Traceback" not in out and password not in out
            assert time.monotonic() - started < 50  # it stops at start, it does not hang
    finally:
        remove_all_sandboxes(root)
        shutil.rmtree(root, ignore_errors=True)
        server.close()


def _deployed_redis_args(password: str) -> list[str]:
    """The redis-server arguments of deploy/k8s/base/redis.yaml, password filled in as the kubelet does."""
    doc = next(d for d in yaml.safe_load_all((REPO / "deploy/k8s/base/redis.yaml").read_text())
               if d and d["kind"] == "Deployment")
    container = doc["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"]}
    assert env["REDIS_PASSWORD"] == {"name": "orchard-redis-auth", "key": "password"}
    return [a.replace("$(REDIS_PASSWORD)", password) for a in container["args"]]


def test_the_deployed_redis_acl_admits_the_orchestrator_user_only(tmp_path, password):
    need_redis_server()
    import redis

    args = _deployed_redis_args(password)
    assert "--requirepass" in args or "--user" in args
    server = RedisServer(tmp_path, args=args)
    root = short_root("racl")
    try:
        user_url = f"redis://orchard:{password}@127.0.0.1:{server.port}/0"
        a = Orchestrator(root, log_dir=tmp_path, redis_url=user_url, replica_id="acl-a", reconcile_interval=0.3)
        b = Orchestrator(root, log_dir=tmp_path, redis_url=f"redis://orchard@127.0.0.1:{server.port}/0",
                         redis_password=password, replica_id="acl-b", reconcile_interval=0.3)
        try:
            _works(a)
            with a.http() as ha, b.http() as hb:  # cross-replica wake-ups go through the ACL's channels
                sid = ha.post("/sandboxes", json={}).json()["sandbox_id"]
                assert hb.get(f"/sandboxes/{sid}/wait", params={"timeout": 30}).json()["status"] == "running"
                assert hb.delete(f"/sandboxes/{sid}").status_code == 200
            errors = [x for x in a.logs().splitlines() + b.logs().splitlines()
                      if x.startswith("{") and json.loads(x).get("level") in ("warning", "error", "critical")]
            assert not [e for e in errors if "NOPERM" in e or "redis" in e.lower()], errors[:3]
        finally:
            a.stop()
            b.stop()
        # without the user, and with the user but outside its key prefix: refused
        for url, env, why in ((server.url, {}, "requires a password"),
                              (f"redis://default:{password}@127.0.0.1:{server.port}/0", {}, "refused our credentials"),
                              (user_url, {"ORCHARD_REDIS_PREFIX": "elsewhere"}, "'elsewhere:'")):
            r = _serve(url, tmp_path, **env)
            out = r.stdout + r.stderr
            assert r.returncode != 0 and why in out and "Traceback" not in out, (url, env, out[-1500:])
        direct = redis.Redis(host="127.0.0.1", port=server.port, username="orchard", password=password)
        with pytest.raises(redis.exceptions.NoPermissionError):
            direct.flushall()  # @dangerous is off
        direct.close()
    finally:
        remove_all_sandboxes(root)
        shutil.rmtree(root, ignore_errors=True)
        server.close()


def test_redis_over_a_unix_socket_with_a_password(tmp_path, password):
    need_redis_server()
    sock = Path(short_root("rsock")) / "redis.sock"
    server = RedisServer(tmp_path, args=["--requirepass", password], unixsocket=sock)
    root = short_root("runix")
    try:
        orch = Orchestrator(root, log_dir=tmp_path, redis_url=f"unix://:{password}@{sock}?db=2")
        try:
            _works(orch)
        finally:
            orch.stop()
        r = _serve(f"unix://{sock}?db=2", tmp_path)
        assert r.returncode != 0 and "requires a password and none is set" in r.stdout + r.stderr
    finally:
        remove_all_sandboxes(root)
        shutil.rmtree(root, ignore_errors=True)
        server.close()
        shutil.rmtree(sock.parent, ignore_errors=True)


def _certificates(where: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1 (openssl CLI)."""
    ca_key, ca, key, csr, cert, ext = (where / n for n in ("ca.key", "ca.crt", "srv.key", "srv.csr", "srv.crt", "ext"))
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run = lambda *a: subprocess.run(["openssl", *a], check=True, capture_output=True, timeout=60)
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca), "-days", "1",
        "-subj", "/CN=orchard-test-ca")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", "/CN=localhost")
    run("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial", "-out", str(cert),
        "-days", "1", "-extfile", str(ext))
    return ca, cert, key


def test_rediss_with_a_password_and_a_ca(tmp_path, password):
    need_redis_server()
    require("openssl", None if shutil.which("openssl") else "the openssl CLI makes the test certificates")
    ca, cert, key = _certificates(tmp_path)
    tls_port = free_port()
    server = RedisServer(tmp_path, args=["--requirepass", password, "--tls-port", str(tls_port),
                                         "--tls-cert-file", str(cert), "--tls-key-file", str(key),
                                         "--tls-ca-cert-file", str(ca), "--tls-auth-clients", "no"])
    root = short_root("rtls")
    url = f"rediss://:{password}@127.0.0.1:{tls_port}/0"
    try:
        orch = Orchestrator(root, log_dir=tmp_path, redis_url=url, redis_ca_certs=str(ca))
        try:
            _works(orch)
        finally:
            orch.stop()
        r = _serve(url, tmp_path)  # no CA: the server's certificate cannot be verified
        out = r.stdout + r.stderr
        assert r.returncode != 0 and "cannot reach Redis" in out and "certificate" in out.lower(), out[-1500:]
        assert password not in out
    finally:
        remove_all_sandboxes(root)
        shutil.rmtree(root, ignore_errors=True)
        server.close()


@pytest.mark.parametrize("url, message", [
    ("http://127.0.0.1:6379/0", "must start with redis://"),
    ("127.0.0.1:6379", "must start with redis://"),
    ("redis://", "no host"),
    ("redis://127.0.0.1:notaport/0", "cannot parse"),
    ("redis://127.0.0.1:99999/0", "cannot parse"),
    ("unix://", "socket path"),
    ("redis://redis.example.internal:6379/0", "without a password"),
    ("rediss://10.0.0.5:6380/0", "without a password"),
    ("redis://:pw@10.0.0.5:6379/0?x", None),
])
def test_redis_url_garbage_is_refused_with_a_clear_error(url, message):
    from pydantic import ValidationError

    from orchard_gym.service.settings import ServiceSettings

    if message is None:
        assert ServiceSettings(redis_url=url).redis_url == url
        return
    with pytest.raises(ValidationError, match=re.escape(message)):
        ServiceSettings(redis_url=url)


def test_redis_settings_edge_cases():
    from pydantic import ValidationError

    from orchard_gym.service.settings import ServiceSettings, redact_url

    with pytest.raises(ValidationError, match="set twice"):
        ServiceSettings(redis_url="redis://:a@127.0.0.1:6379/0", redis_password="b")
    with pytest.raises(ValidationError, match="set twice"):
        ServiceSettings(redis_url="redis://u@127.0.0.1:6379/0", redis_username="v")
    assert ServiceSettings(redis_url="redis://10.0.0.5:6379/0", redis_allow_no_auth=True).redis_url
    s = ServiceSettings(redis_url="redis://orchard@10.0.0.5:6379/0", redis_password="pw")
    assert s.redis_options() == {"password": "pw"} and "pw" not in repr(s.redis_password)
    assert redact_url("redis://u:pw@h:1/0") == "redis://u:***@h:1/0"
    assert redact_url("unix://:pw@/run/r.sock?db=1") == "unix://:***@/run/r.sock?db=1"
    assert redact_url("redis://h:1/0") == "redis://h:1/0"


def test_bad_redis_url_on_the_command_line_is_one_clear_line(tmp_path):
    r = _serve("http://nope", tmp_path)
    assert r.returncode != 0 and "ORCHARD_REDIS_URL" in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = _serve("redis://127.0.0.1:1/0", tmp_path)  # nothing listens there: refused at start, clearly
    assert r.returncode != 0 and "cannot reach Redis at redis://127.0.0.1:1/0" in r.stdout + r.stderr
