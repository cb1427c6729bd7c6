"""The cost ledger (orchard_gym/ledger.py) against known loads, in real sandboxes.

A busy loop of known CPU length: a shell that spins (builtins only, no forks) until the
kernel's own counters for it (/proc/$$/stat utime+stime) reach BUSY_TICKS; the sandbox's
accounted CPU must be at least that and not much more (the agent and the shell's start are
in the sandbox too). A memory hog of known size: `dd bs=64M` holds a 64 MiB buffer filled
from /dev/zero; the peak must be at least that. Tokens: a real episode runner with a
scripted policy and with OpenAIPolicy against the stub model server.
"""

from __future__ import annotations

import asyncio
import math
import os
import zlib

import pytest
from click.testing import CliRunner

from components import variant_limit
from conftest import DOCKER_IMAGES, docker_engine, needs
from orchard_gym import SandboxClient
from orchard_gym.backends import cgroups
from orchard_gym.ledger import (
    Ledger,
    Prices,
    SandboxUsage,
    charge_calls,
    format_summary,
    ledger_stats,
    parse_in_sandbox,
    prices,
    record_tokens,
    summarize,
)
from orchard_gym.trajectory import Trajectory

CLK_TCK = os.sysconf("SC_CLK_TCK")
BUSY_SECONDS = 0.5
BUSY_TICKS = int(BUSY_SECONDS * CLK_TCK)
# spin until this shell's own CPU (utime + stime, fields 14 and 15) reaches the target: builtins only
BUSY = ('while :; do read -r s < /proc/$$/stat; set -- ${s##*") "}; '
        f"[ $(( ${{12}} + ${{13}} )) -ge {BUSY_TICKS} ] && break; done; echo spun")
HOG_MIB = 64
HOG = f"dd if=/dev/zero of=/dev/null bs={HOG_MIB}M count=1 2>/dev/null; echo hogged"
# CPU beyond the loop: the agent's start, the shell, dd, the accounting read (0.08-0.2 s measured here)
SLACK = 0.35


def _run_known_load(config: dict, image: str | None = None, hog: bool = True) -> SandboxUsage:
    with SandboxClient(config) as client:
        box = client.create_sandbox(image=image)
        r = box.exec(BUSY, timeout=300)
        assert r.stdout.strip() == "spun", r.stdout + r.stderr
        if hog:
            r = box.exec(HOG, timeout=120)
            assert r.stdout.strip() == "hogged", r.stdout + r.stderr
        box.delete()
        return box._inner.usage


def _check_cpu(usage: SandboxUsage) -> None:
    assert usage.cpu_seconds is not None, usage
    assert BUSY_SECONDS - 0.02 <= usage.cpu_seconds <= BUSY_SECONDS + SLACK, usage
    assert usage.wall_seconds >= BUSY_SECONDS - 0.02, usage  # one thread cannot spin that much CPU faster


@pytest.mark.parametrize("mode", ["v1", "v2"])
def test_local_cgroup_ledger_matches_a_known_load(local_root, mode):
    driver, why = cgroups.detect(mode, "orchard-gym-test")
    if driver is None:
        variant_limit(f"no usable cgroup {mode} here: {why}")
    usage = _run_known_load({"type": "local", "root": str(local_root), "cgroups": mode,
                             "cgroup_parent": "orchard-gym-test"}, hog=mode == "v1" or "memory" in driver.limits)
    assert usage.source == f"cgroup {mode}" and usage.backend == "local"
    _check_cpu(usage)
    if mode == "v1" or "memory" in driver.limits:
        assert usage.memory_peak_bytes >= HOG_MIB * 2**20, usage
    else:  # a hybrid host's v2 tree has no memory controller: no peak, and the ledger says so
        assert usage.memory_peak_bytes is None and "no peak memory" in usage.note


def test_local_without_cgroups_reports_wall_time_only(local_root):
    with SandboxClient({"type": "local", "root": str(local_root), "cgroups": "off"}) as client:
        box = client.create_sandbox()
        box.exec("true")
        box.delete()
        usage = box._inner.usage
    # the host's cgroupfs is not the sandbox's: never read it as if it were
    assert usage.source == "none" and usage.cpu_seconds is None and usage.wall_seconds > 0


gateway, docker_why_not = docker_engine()


@needs("docker", docker_why_not)
def test_docker_engine_stats_ledger_matches_a_known_load():
    usage = _run_known_load({"type": "docker"}, image=DOCKER_IMAGES["busybox"])
    assert usage.source == "engine stats" and usage.backend == "docker"
    _check_cpu(usage)
    assert usage.memory_peak_bytes is not None and usage.memory_peak_bytes >= HOG_MIB * 2**20, usage


def test_in_sandbox_cgroup_text_parses_both_versions():
    v2 = parse_in_sandbox("v2\ncpu_usec 1500000\npeak 73400320\ncurrent 1000\n")
    assert v2 == {"cpu_seconds": 1.5, "memory_peak_bytes": 73400320, "memory_bytes": 1000}
    v1 = parse_in_sandbox("v1\ncpu_ns 2500000000\npeak 5\n")
    assert v1 == {"cpu_seconds": 2.5, "memory_peak_bytes": 5, "memory_bytes": None}
    assert parse_in_sandbox("v1\n")["cpu_seconds"] is None  # nothing readable: unknown, not 0


# --------------------------------------------------------------------------- tokens


def _toy(client):
    import gymnasium as gym

    import orchard_gym  # noqa: F401

    return gym.spec("Orchard/Toy-v0").make(client=client, max_steps=3, kinds=["write"], num_tasks=2).unwrapped


def test_tokens_of_concurrent_episodes_stay_apart_and_sandboxes_are_charged(local_root):
    from orchard_gym.client import AsyncSandboxClient
    from orchard_gym.envs.rollout import run_episodes

    from orchard_gym.screenshots import observation_text

    tally: dict[str, int] = {}

    async def policy(messages, tools):  # scripted: (10 * turn + a hash of the task text, 3) tokens per call
        turn = sum(1 for m in messages if m["role"] == "assistant")
        task = observation_text(messages[1]["content"] if isinstance(messages[1]["content"], str)
                                else "".join(p.get("text", "") for p in messages[1]["content"]))
        prompt = 10 * (turn + 1) + zlib.crc32(task.encode()) % 1000
        tally[task] = tally.get(task, 0) + prompt
        await asyncio.sleep(0.01)  # let the other episode's call interleave
        assert record_tokens(prompt, 3)
        return {"name": "bash", "arguments": {"command": "true"}} if turn < 2 else {"name": "submit", "arguments": {}}

    async def run():
        client = AsyncSandboxClient({"type": "local", "root": str(local_root)})
        try:
            return await run_episodes(_toy, policy, ["write-000", "write-001"], concurrency=2, client=client,
                                      progress=False)
        finally:
            await client.aclose()

    trajectories = asyncio.run(run())
    assert len(set(tally.values())) == 2  # the two episodes reported different totals
    for t in trajectories:
        assert t.ok and t.steps == 3, t.error
        assert t.ledger.model_calls == 3 and t.ledger.completion_tokens == 9 and t.ledger.token_source == "policy"
        assert t.ledger.prompt_tokens == tally[t.metadata["task"]]  # no call of the other episode leaked in
        assert len(t.ledger.sandboxes) == 1 and t.ledger.sandboxes[0].sandbox_id == t.sandbox_id
        assert t.ledger.sandbox_seconds > 0
    assert not record_tokens(1, 1)  # outside an episode: nothing to charge
    loaded = Trajectory.model_validate_json(trajectories[0].model_dump_json())
    assert loaded.ledger == trajectories[0].ledger


def test_openai_policy_tokens_equal_the_servers_usage(local_root):
    from components import require_module

    require_module("server", "starlette")
    from orchard_gym.client import AsyncSandboxClient
    from orchard_gym.envs.rollout import run_episodes
    from orchard_gym.policies import OpenAIPolicy
    from orchard_gym.wrappers.proxy.stub import StubUpstream

    stub = StubUpstream().start()
    seen: list[dict] = []

    async def run():
        policy = OpenAIPolicy(f"{stub.url}#stub-tool")

        async def keep(response):  # the ground truth: what the server sent
            await response.aread()
            seen.append(response.json()["usage"])
        policy.http.event_hooks["response"].append(keep)
        client = AsyncSandboxClient({"type": "local", "root": str(local_root)})
        try:
            return await run_episodes(_toy, policy, ["write-000"], client=client, progress=False)
        finally:
            await client.aclose()
            await policy.aclose()

    try:
        [t] = asyncio.run(run())
    finally:
        stub.stop()
    assert seen and t.ledger.model_calls == len(seen) == t.steps
    assert t.ledger.prompt_tokens == sum(u["prompt_tokens"] for u in seen) > 0
    assert t.ledger.completion_tokens == sum(u["completion_tokens"] for u in seen) > 0


def test_proxy_records_are_summed_once():
    from orchard_gym.wrappers.proxy.records import CallRecord

    calls = [CallRecord(index=0, call_id="a", request={}, usage={"prompt_tokens": 100, "completion_tokens": 7}),
             CallRecord(index=1, call_id="b", request={}, endpoint="messages",
                        usage={"input_tokens": 50, "output_tokens": 5}),
             CallRecord(index=2, call_id="c", request={}, usage=None, error="upstream 500")]
    t = Trajectory(env_id="x", task_id="y")
    charge_calls(t, calls)
    charge_calls(t, calls)  # an episode ends once: a second charge adds nothing
    assert (t.ledger.prompt_tokens, t.ledger.completion_tokens, t.ledger.model_calls) == (150, 12, 2)
    assert t.ledger.token_source == "proxy"


# --------------------------------------------------------------------------- totals, prices, garbage


def _traj(cpu, wall, peak, prompt, completion):
    ledger = Ledger(sandboxes=[SandboxUsage(sandbox_id="s", cpu_seconds=cpu, wall_seconds=wall,
                                            memory_peak_bytes=peak, source="cgroup v1")],
                    prompt_tokens=prompt, completion_tokens=completion, model_calls=1)
    return Trajectory(env_id="x", task_id="y", ledger=ledger)


def test_summary_sums_and_prices_exactly():
    old = Trajectory.model_validate_json('{"env_id": "x", "task_id": "old", "reward": 1.0}')  # from before the ledger
    assert old.ledger is None
    ts = [_traj(1800.0, 3600.0, 2**20, 600, 400), _traj(1800.0, 60.0, 2**30, 1000, 0), old]
    totals = summarize(ts, Prices(cpu_hour=0.5, per_1k_tokens=0.25))
    assert totals["cpu_seconds"] == 3600.0 and totals["sandbox_seconds"] == 3660.0
    assert totals["tokens"] == 2000 and totals["memory_peak_bytes"] == 2**30 and totals["episodes"] == 3
    assert (totals["cost_cpu"], totals["cost_tokens"], totals["cost"]) == (0.5, 0.5, 1.0)
    assert "cost: 1 (CPU 0.5, tokens 0.5; 0.3333/episode)" in format_summary(totals)
    assert summarize(ts)["cost"] is None  # unpriced: no cost at all, not 0
    stats = ledger_stats(ts, Prices(cpu_hour=0.5), informative_groups=3)
    assert stats["ledger/informative_groups_per_cost"] == 3 / 0.5
    assert stats["ledger/informative_groups_per_cpu_hour"] == 3.0


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, -math.inf])
def test_garbage_prices_are_refused(bad):
    with pytest.raises(ValueError, match="finite, non-negative"):
        prices(cpu_hour=bad)
    with pytest.raises(ValueError, match="--price-1k-tokens"):
        prices(per_1k_tokens=bad)
    assert prices() is None and prices(0.0).cpu_hour == 0.0
    with pytest.raises(ValueError, match="non-negative integer"):
        Ledger().add_tokens(-1, 0)
    with pytest.raises(ValueError, match="non-negative integer"):
        Ledger().add_tokens(1.5, 0)


@pytest.mark.parametrize("args, message", [
    (["--price-cpu-hour", "-1"], "finite, non-negative"),
    (["--price-1k-tokens", "nan"], "finite, non-negative"),
    (["--price-cpu-hour", "inf"], "finite, non-negative"),
    (["--price-cpu-hour", "cheap"], "not a valid float"),
])
def test_cli_refuses_garbage_prices_before_running_anything(args, message):
    from orchard_gym.cli import main

    for command in (["eval", "--env", "Orchard/Toy-v0"], ["train", "grpo", "--model", "nowhere"]):
        result = CliRunner().invoke(main, [*command, *args])
        assert result.exit_code == 2, result.output
        assert message in result.output and "Traceback" not in result.output


def test_remote_delete_reads_the_usage_through_the_orchestrator(remote_orchestrator):
    from components import require_module

    require_module("server", "fastapi")
    with SandboxClient(base_url=remote_orchestrator.url, api_key=remote_orchestrator.api_key) as client:
        box = client.create_sandbox()
        assert box.exec(BUSY.replace(f"-ge {BUSY_TICKS}", f"-ge {BUSY_TICKS // 2}")).stdout.strip() == "spun"
        box.delete()
        usage = box._inner.usage
    # the orchestrator's local backend reads the sandbox's cgroup (GET /sandboxes/{id}/resources)
    assert usage.backend == "local" and usage.source.startswith("cgroup v"), usage
    assert BUSY_SECONDS / 2 - 0.02 <= usage.cpu_seconds <= BUSY_SECONDS / 2 + SLACK, usage


def test_orchard_eval_prints_and_writes_the_priced_ledger(local_root, tmp_path, monkeypatch):
    from orchard_gym.cli import main

    monkeypatch.setenv("ORCHARD_LOCAL_ROOT", str(local_root))
    out = tmp_path / "eval.jsonl"
    result = CliRunner().invoke(main, ["eval", "--env", "Orchard/Toy-v0", "--policy", "oracle", "-n", "2",
                                       "--price-cpu-hour", "3600", "--out", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    trajectories = [Trajectory.model_validate_json(line) for line in out.read_text().splitlines()]
    totals = summarize(trajectories, Prices(cpu_hour=3600))
    assert totals["sandboxes"] == 2 and totals["cpu_seconds"] > 0
    # at 3600 per CPU-hour the cost is the CPU-seconds; the measured value goes through a float division
    # and multiplication, so equal up to rounding (an exact == passed or failed with the measured value)
    assert totals["cost"] == pytest.approx(totals["cpu_seconds"], rel=1e-12, abs=0)
    assert format_summary(totals) in result.output  # what was printed is what the file holds
