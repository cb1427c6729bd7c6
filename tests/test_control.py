"""The one control plane (`orchard_gym/control.py`): the SDK uses it in-process and the
orchestrator serves it over HTTP (`service/sandboxes.py` subclasses it). Its calls on a
real local backend: a sandbox's run, files and teardown, and what garbage ids get."""

from __future__ import annotations

import asyncio

import pytest

from orchard_gym import SandboxNotFound
from orchard_gym.backends.config import parse_backend_config
from orchard_gym.control import InProcessControl
from orchard_gym.models import ExecRequest, SandboxSpec


def test_the_calls_both_control_planes_share_on_a_real_sandbox(tmp_path):
    async def main():
        control = InProcessControl(parse_backend_config({"type": "local", "root": str(tmp_path)}).get_backend())
        try:
            record = await control.create(SandboxSpec(), wait_ready=True, timeout=60)
            sid = record.sandbox_id
            assert await control.use(sid) is None  # in-process: the agent call itself says what is wrong
            done = await control.run(sid, ExecRequest(command="printf ab > f; echo ran", timeout=30))
            assert (done.stdout, done.exit_code, done.status, done.sandbox_id) == ("ran\n", 0, "succeeded", sid)
            size, chunks = await control.download_stream(sid, "f")
            assert size == 2 and b"".join([c async for c in chunks]) == b"ab"
            assert await control.destroy(sid) is True
            assert await control.destroy(sid) is False  # nothing left to delete
            with pytest.raises(SandboxNotFound):
                await control.get(sid)
        finally:
            await control.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("garbage", ["", "no-such-sandbox", "../../etc", "x" * 300, "a\x00b"])
def test_garbage_sandbox_ids_are_not_found(tmp_path, garbage):
    async def main():
        control = InProcessControl(parse_backend_config({"type": "local", "root": str(tmp_path)}).get_backend())
        try:
            for call in (control.run(garbage, ExecRequest(command="true")), control.download_stream(garbage, "f"),
                         control.upload(garbage, "f", b"x", None), control.open_pty(garbage, {})):
                with pytest.raises(SandboxNotFound):
                    await call
            assert await control.destroy(garbage) is False
        finally:
            await control.aclose()

    asyncio.run(main())
