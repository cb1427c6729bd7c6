"""SDK behaviour beyond one backend: retries, defaults, argument checks."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import pytest

from conftest import AGENT_PY
from orchard_gym import AgentUnavailable, AsyncSandboxClient, InvalidRequest, SandboxClient
from orchard_gym.agent_client import AgentClient
from orchard_gym.models import AgentEndpoint
from orchard_gym.retry import RetryPolicy


async def test_agent_client_retries_until_the_agent_comes_up(tmp_path):
    sock = str(tmp_path / "late.sock")
    client = AgentClient(AgentEndpoint(uds=sock, token="t"), RetryPolicy(attempts=20, initial=0.05, maximum=0.2))

    async def start_late():
        await asyncio.sleep(0.4)
        return subprocess.Popen([sys.executable, str(AGENT_PY), "--socket", sock, "--cwd", str(tmp_path)],
                                env={**os.environ, "ORCHARD_AGENT_TOKEN": "t"})

    starter = asyncio.create_task(start_late())
    try:
        files = await client.list_files(".")  # refused at first: retried with backoff
        assert any(f.name == "late.sock" for f in files)
    finally:
        (await starter).terminate()
        await client.aclose()


async def test_agent_client_gives_up_with_a_typed_error(tmp_path):
    client = AgentClient(AgentEndpoint(uds=str(tmp_path / "none.sock"), token="t"),
                         RetryPolicy(attempts=4, initial=0.01, maximum=0.05, deadline=2))
    started = time.monotonic()
    with pytest.raises(AgentUnavailable):
        await client.list_files(".")
    assert time.monotonic() - started < 3
    await client.aclose()


def test_defaults_to_the_local_backend(local_root, monkeypatch):
    monkeypatch.delenv("ORCHARD_BASE_URL", raising=False)
    monkeypatch.setenv("ORCHARD_LOCAL_ROOT", str(local_root))
    with SandboxClient() as client:
        assert client.backend.name == "local"
        assert client.create_sandbox().exec("echo ok").stdout == "ok\n"


@pytest.mark.parametrize("kwargs", [
    {"backend": {"type": "local"}, "base_url": "http://x"},
    {"backend": {"type": "warp-drive"}},
    {"backend": {"type": "local", "isolation": "maybe"}},
    {"backend": {"type": "local", "unknown": 1}},
    {"backend": 42},
])
def test_bad_client_arguments_are_refused(kwargs):
    with pytest.raises(InvalidRequest):
        AsyncSandboxClient(cleanup_at_exit=False, **kwargs)


async def test_download_stream_chunks_and_early_stop_do_not_poison_the_pool(agent):
    (agent.cwd / "blob").write_bytes(os.urandom(3 * 2**20 + 5))
    client = AgentClient(AgentEndpoint(uds=agent.socket, token=agent.token))
    try:
        size, chunks = await client.download_stream("blob")
        got = b"".join([c async for c in chunks])
        assert size == len(got) == 3 * 2**20 + 5 and got == (agent.cwd / "blob").read_bytes()
        size, chunks = await client.download_stream("blob")
        async for _ in chunks:  # stop after the first chunk: that connection must be dropped,
            break
        await chunks.aclose()
        assert await client.download("blob") == got  # not reused with half a body in it
        with pytest.raises(FileNotFoundError):
            await client.download_stream("missing")
        with pytest.raises(InvalidRequest, match="outside"):
            await client.download_stream("/etc/hostname")
    finally:
        await client.aclose()


async def test_agent_client_cancel(agent):
    client = AgentClient(AgentEndpoint(uds=agent.socket, token=agent.token))
    try:
        from orchard_gym.models import ExecRequest

        task = asyncio.create_task(client.exec(ExecRequest(command="sleep 300", job_id="sdk-c1")))
        deadline = time.monotonic() + 10
        while not await client.cancel("sdk-c1"):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        result = await asyncio.wait_for(task, 10)
        assert result.cancelled and result.exit_code == -9 and result.job_id == "sdk-c1"
        assert await client.cancel("sdk-c1") is False
    finally:
        await client.aclose()
