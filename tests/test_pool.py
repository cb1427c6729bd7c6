"""Warm pools (orchard_gym/pool.py, service/pools.py) with real sandboxes: racing claims
never share a sandbox, a crashed pooled sandbox is replaced and never handed out, every
claim is a fresh sandbox, close leaves nothing behind (no sandboxes, no tasks), an
orchestrator's pooled sandbox belongs to the key that claimed it; garbage pool specs are
refused at the Python API, the env kwarg and `orchard serve --pool`."""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import signal

import gymnasium as gym
import httpx
import pytest
from click.testing import CliRunner
from service_helpers import Orchestrator, remove_all_sandboxes, short_root

from conftest import wait_until
from orchard_gym import AsyncSandboxClient, InvalidRequest, SandboxClient
from orchard_gym.errors import BackendError
from orchard_gym.cli import main as cli_main
from orchard_gym.backends.config import parse_backend_config
from orchard_gym.pool import ControlProvider, PoolSpec, WarmPool, match_key, parse_pool_option, parse_pools

GARBAGE_POOLS = [
    ({"host": -1}, "greater than or equal to 0"),
    ({"host": 1.5}, "whole number"),
    ({"host": True}, "whole number"),
    ({"host": "many"}, "size"),
    ({"host": {"size": 2, "colour": "red"}}, "colour"),
    ({"host": {"size": 1, "cpu": math.inf}}, "cpu"),
    ({"host": {"size": 1, "cpu": math.nan}}, "cpu"),
    ({"host": {"size": 1, "memory": "lots"}}, "memory"),
    ({"host": {"size": 1, "env": {"ORCHARD_SANDBOX": "x"}}}, "reserved"),
    ({"host": 10_000}, "less than or equal"),
    ({3: 1}, "image name is a string"),
    ([{"image": None, "size": 1}, {"image": "host", "size": 2}], "same spec"),
    ("host=3", "must be a dict"),
]


@pytest.mark.parametrize("bad,says", GARBAGE_POOLS)
def test_garbage_pools_refused_by_the_clients_and_the_env(bad, says):
    with pytest.raises(InvalidRequest, match=says):
        parse_pools(bad)
    with pytest.raises(InvalidRequest, match=says):
        AsyncSandboxClient({"type": "local"}, pool=bad, cleanup_at_exit=False)
    with pytest.raises(InvalidRequest, match=says):
        SandboxClient({"type": "local"}, pool=bad, cleanup_at_exit=False)
    with pytest.raises(gym.error.Error, match=says):
        gym.make("Orchard/Toy-v0", backend={"type": "local"}, pool=bad)


@pytest.mark.parametrize("bad,says", [
    ("host=-1", "greater than or equal to 0"), ("host", "IMAGE=N"), ("host=x", "whole number"),
    ("host=2,cpu=inf", "cpu"), ("host=2,cpu=nan", "cpu"), ("host=2,gpu=1", "unknown key 'gpu'"),
    ("host=2,network=maybe", "on or off"), ("host=2,memory", "KEY=VALUE"),
])
def test_garbage_serve_pool_option_refused(bad, says):
    from orchard_gym.cli import main

    with pytest.raises(InvalidRequest, match=says):
        parse_pool_option(bad)
    result = CliRunner().invoke(main, ["serve", "--port", "0", "--pool", bad])
    assert result.exit_code != 0 and "ORCHARD_POOLS" in result.output and says in result.output, result.output


def test_what_must_match():
    spec = parse_pool_option("localhost/orchard/bookworm:latest=3,cpu=500m,memory=256m,network=on")
    assert (spec.image, spec.size, spec.cpu, spec.block_network) == ("localhost/orchard/bookworm:latest", 3, 0.5, False)
    from orchard_gym.models import SandboxSpec

    same = SandboxSpec(image=spec.image, cpu="500m", memory=256 * 2**20, block_network=False, timeout=5)
    assert match_key(same) == spec.key()  # memory as bytes; timeout does not count
    for other in ({"cpu": 1}, {"memory": "512m"}, {"block_network": True}, {"env": {"A": "1"}},
                  {"labels": {"team": "a"}}, {"sandbox_id": "fixed-id"}, {"image": "other"},
                  {"services": SandboxSpec(services=[{"name": "db", "image": "x"}]).services}):
        assert match_key(same.model_copy(update=other)) != spec.key(), other
    assert match_key(SandboxSpec(image="host")) == match_key(SandboxSpec()) == PoolSpec(size=1).key()


# --------------------------------------------------------------------------- real sandboxes (local)
@pytest.fixture
def root():
    path = short_root("pool")
    yield path
    remove_all_sandboxes(path)
    shutil.rmtree(path, ignore_errors=True)


def _own_tasks() -> set[asyncio.Task]:
    return {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}


async def _left_in(root) -> list[str]:
    backend = parse_backend_config({"type": "local", "root": str(root)}).get_backend()
    try:
        return [r.sandbox_id for r in await backend.list()]
    finally:
        await backend.aclose()


def test_200_claims_racing_on_a_pool_of_50(root):
    async def main():
        before = _own_tasks()
        backend = parse_backend_config({"type": "local", "root": str(root)}).get_backend()
        from orchard_gym.control import InProcessControl

        control = InProcessControl(backend)
        pool = WarmPool(PoolSpec(size=50, parallel=8), ControlProvider(control))
        assert await pool.wait_full(240), pool.stats()
        claims = await asyncio.gather(*(pool.claim() for _ in range(200)))
        got = [r.sandbox_id for r in claims if r is not None]
        assert len(got) == len(set(got)), "a sandbox was handed out twice"
        assert 50 <= len(got) < 200 and pool.stats()["claimed"] == len(got)
        assert pool.stats()["missed"] == 200 - len(got)
        results = await asyncio.gather(*(control.exec(i, _echo(i)) for i in got))  # each is ready and its own
        assert [r.stdout.strip() for r in results] == got
        await pool.aclose()
        await asyncio.gather(*(control.delete(i) for i in got))
        assert await _left_in(root) == []
        assert _own_tasks() == before  # no refill, watch or delete task outlives close
        await control.aclose()

    asyncio.run(main())


async def _eventually(predicate, timeout: float) -> None:
    for _ in range(int(timeout / 0.05)):
        if predicate():
            return
        await asyncio.sleep(0.05)
    assert predicate()


def _echo(sandbox_id: str):
    from orchard_gym.models import ExecRequest

    return ExecRequest(command='echo "$ORCHARD_SANDBOX"', timeout=30)


def test_a_crashed_pooled_sandbox_is_replaced_and_never_handed_out(root):
    async def main():
        async with AsyncSandboxClient({"type": "local", "root": str(root)}, pool={"host": 2}) as client:
            assert await client.wait_pools(120)
            pool = next(iter(client._pools.pools.values()))
            pool.check_interval = 0.2
            dead = pool.idle_ids()[0]
            pid = (await client.backend.get(dead)).details["pid"]["pid"]
            os.kill(pid, signal.SIGKILL)  # the agent (bubblewrap's or the bare one) as the backend knows it
            await _eventually(lambda: pool.stats()["replaced"] >= 1, 30)
            assert await client.wait_pools(120) and dead not in pool.idle_ids()
            boxes = [await client.create_sandbox() for _ in range(2)]
            assert dead not in {b.id for b in boxes}
            assert [(await b.exec("echo ok")).stdout for b in boxes] == ["ok\n"] * 2
            assert dead not in await _left_in(root)  # deleted, not just skipped
        assert await _left_in(root) == []

    asyncio.run(main())


def test_env_resets_get_a_fresh_pooled_sandbox_each_time_and_close_leaves_nothing(root):
    env = gym.make("Orchard/Toy-v0", backend={"type": "local", "root": str(root)}, kinds=["write"],
                   num_tasks=3, pool={"host": 2})
    seen = []
    try:
        for i in range(4):
            env.reset(options={"task_id": f"write-00{i % 3}"})
            box = env.unwrapped.sandbox
            assert box.id not in seen
            seen.append(box.id)
            out = env.step({"name": "bash", "arguments": {"command": "ls; touch left-by-previous"}})[0]
            assert "left-by-previous" not in out  # nothing of an earlier episode
        stats = env.unwrapped.client.pool_stats()[0]
        assert stats["claimed"] >= 2 and stats["size"] == 2, stats
    finally:
        env.close()
    assert asyncio.run(_left_in(root)) == []


class _FlakyProvider(ControlProvider):
    """A real in-process control whose engine refuses the first `failures` creates."""

    def __init__(self, control, failures: float):
        super().__init__(control)
        self.failures = failures

    async def create(self, spec):
        if self.failures > 0:
            self.failures -= 1
            raise BackendError("engine hiccup")
        return await super().create(spec)


def test_failed_creates_are_retried_with_backoff_and_close_cuts_the_wait(root):
    async def main():
        from orchard_gym.control import InProcessControl

        before = _own_tasks()
        control = InProcessControl(parse_backend_config({"type": "local", "root": str(root)}).get_backend())
        pool = WarmPool(PoolSpec(size=1, parallel=1), _FlakyProvider(control, 2))
        assert await pool.wait_full(120), pool.stats()
        stats = pool.stats()
        assert stats["failed_creates"] == 2 and "engine hiccup" in stats["last_error"], stats
        await pool.aclose()
        await asyncio.gather(*(control.delete(i) for i in pool.idle_ids()))

        stuck = WarmPool(PoolSpec(size=1, parallel=1), _FlakyProvider(control, math.inf))
        stuck.start()
        await _eventually(lambda: stuck.stats()["failed_creates"] >= 5, 60)  # waits of 0.5, 1, 2, 4, then 8 s ...
        await asyncio.wait_for(stuck.aclose(), 5)  # ... which close cuts short
        assert _own_tasks() == before
        await control.aclose()

    asyncio.run(main())
    assert asyncio.run(_left_in(root)) == []


def test_close_while_filling_leaves_nothing(root):
    async def main():
        before = _own_tasks()
        client = AsyncSandboxClient({"type": "local", "root": str(root)}, pool={"host": {"size": 6, "parallel": 3}})
        await _eventually(lambda: client.pool_stats()[0]["creating"] > 0, 30)  # creations in flight
        await client.aclose()
        assert client.pool_stats()[0]["ready"] == 0
        assert _own_tasks() == before

    asyncio.run(main())
    assert asyncio.run(_left_in(root)) == []


# --------------------------------------------------------------------------- the orchestrator
ALICE, BOB = "alice-key-" + "a" * 20, "bob-key-" + "b" * 20


def test_orchestrator_pool_claims_belong_to_the_claiming_key(tmp_path):
    root = short_root("pool-srv")
    orch = Orchestrator(root, log_dir=tmp_path, api_key=ALICE, api_keys=f"{ALICE},{BOB}", pools="host=1")
    try:
        alice = httpx.Client(base_url=orch.url, headers={"X-API-Key": ALICE}, timeout=30)
        bob = httpx.Client(base_url=orch.url, headers={"X-API-Key": BOB}, timeout=30)
        pools = lambda: alice.get("/resources").json()["pools"][0]
        wait_until(lambda: pools()["ready"] == 1, 60)
        idle = set(asyncio.run(_left_in(root)))
        assert alice.get("/sandboxes").json() == [] and bob.get("/sandboxes").json() == []  # idle: nobody's
        r = alice.post("/sandboxes", params={"wait": "true"}, json={})
        assert r.status_code == 200 and r.json()["status"] == "running", r.text
        sid = r.json()["sandbox_id"]
        assert sid in idle and pools()["claimed"] == 1
        job = alice.post(f"/sandboxes/{sid}/exec", json={"command": "echo mine", "wait": True}).json()
        assert job["stdout"] == "mine\n"
        assert bob.get(f"/sandboxes/{sid}").status_code == 404
        assert bob.post(f"/sandboxes/{sid}/exec", json={"command": "echo pwned", "wait": True}).status_code == 404
        assert bob.delete(f"/sandboxes/{sid}").status_code == 404
        assert [s["sandbox_id"] for s in alice.get("/sandboxes").json()] == [sid]
        assert bob.get("/sandboxes").json() == []
        labelled = alice.post("/sandboxes", json={"labels": {"team": "a"}}).json()["sandbox_id"]  # never pooled
        assert labelled not in idle and pools()["claimed"] == 1
        wait_until(lambda: pools()["ready"] == 1, 60)
        refilled = set(asyncio.run(_left_in(root))) - {sid, labelled}
        assert len(refilled) == 1  # the refill: idle, so listed to nobody
        assert {s["sandbox_id"] for s in alice.get("/sandboxes").json()} == {sid, labelled}
        gc = CliRunner().invoke(cli_main, ["sandbox", "gc", "--root", str(root)])
        assert gc.exit_code == 0 and gc.output == "removed 0 sandbox(es): -\n", gc.output  # a live server's pool
        orch.stop()  # drains the idle ones; claimed ones live on like any other sandbox
        assert set(asyncio.run(_left_in(root))) == {sid, labelled}
        alice.close()
        bob.close()
        # gc finds the claim the stopped server's in-memory record alone made anyone's; the
        # plain sandbox (its owner label is on it) stays for a restart to adopt
        gc = CliRunner().invoke(cli_main, ["sandbox", "gc", "--root", str(root)])
        assert gc.exit_code == 0 and gc.output == f"removed 1 sandbox(es): {sid}\n", gc.output
        assert set(asyncio.run(_left_in(root))) == {labelled}
        # a restart (state in memory: the records are gone, pools or not): the plain sandbox is adopted
        orch = Orchestrator(root, log_dir=tmp_path, api_key=ALICE, api_keys=f"{ALICE},{BOB}")
        with orch.http() as again:
            assert wait_until(lambda: set(asyncio.run(_left_in(root))) == {labelled}, 30), asyncio.run(_left_in(root))
            assert [s["sandbox_id"] for s in again.get("/sandboxes").json()] == [labelled]
    finally:
        orch.stop()
        remove_all_sandboxes(root)
        shutil.rmtree(root, ignore_errors=True)


# --------------------------------------------------------------------------- docker
@pytest.mark.docker  # drives Podman: the full suite, in the one Podman xdist group (tests/tiers.py)
def test_docker_stopped_pooled_container_is_never_handed_out():
    from conftest import DOCKER_IMAGES, docker_engine, require

    require("docker", docker_engine()[1])
    image = DOCKER_IMAGES["busybox"]
    client = SandboxClient({"type": "docker"}, pool={image: 1})
    backend = client.backend
    try:
        assert client.wait_pools(300), client.pool_stats()
        pool = next(iter(client._async._pools.pools.values()))
        dead = pool.idle_ids()[0]
        backend.api.stop(backend._name(dead), timeout=0)  # the container dies while idle
        claimed = client._loop.run(pool.claim())  # the pool's only sandbox is dead: nothing to hand out
        assert claimed is None and client.pool_stats()[0]["replaced"] == 1, client.pool_stats()
        ids = [dead]
    finally:  # waits for the replacement in flight, then deletes it
        client.close()
    fresh = parse_backend_config({"type": "docker"}).get_backend()  # the client's is closed
    api = fresh.api
    assert api.containers(all=True, filters={"name": [backend._name(i) for i in ids]}) == []  # the dead one, the refill
    assert [v for v in api.volumes().get("Volumes") or [] if v["Name"] in {backend._name(i) for i in ids}] == []
    asyncio.run(fresh.aclose())
