"""Starting the Claw service in a sandbox and talking to it from the env.

Everything goes through the sandbox's agent (exec), so it works on every backend. The
interpreter is the agent's own: its command line (read from /proc/$PPID/cmdline of a
command the agent runs) up to the agent script, e.g. `/usr/bin/python3.11 -I -S` on the
local backend (the zygote's, whose fork the agent is there) or the bundle's loader + python on
container backends.

The env and the service agree on an HMAC key by Diffie-Hellman at start (before the
policy acts); snapshots are signed over a fresh nonce, so only the real service can
answer the grader.

Nothing the env runs in the sandbox is a file there: the service's modules go over stdin to
`claw_boot.py`'s text, run with `-c` in isolated mode (`-I`: only the interpreter's own,
read-only library on the import path), and the relay is `-c` text too. The workdir's
`.claw/` holds only the policy's own doors (the `claw` command line, the MCP server), which
it may edit as it likes: they reach the service through the same checked socket protocol.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import shlex
from functools import cache
from pathlib import Path

from orchard_gym.client import AsyncSandboxInstance

from .sandbox import claw_tools
from .sandbox.claw_service import DH_G, DH_P, dh_key, dh_secret

POLICY_FILES = ["claw_wire.py", "claw_cli.py", "claw_mcp.py"]  # the policy's doors: files in its workdir
SERVICE_MODULES = ["claw_tools", "claw_service"]  # sent to claw_boot on stdin, never files in the sandbox
DOJO_MODULES = [*SERVICE_MODULES, "agentdojo_service"]
SOURCE_DIR = Path(__file__).parent / "sandbox"
STATE_DIR = ".claw"  # under the sandbox's working directory


class ServiceError(RuntimeError):
    """The service is gone or answered something the env cannot trust."""


def skill_markdown(tools: list[dict], claw: str) -> str:
    """SKILL.md: how a bash-only harness reaches the tools (the `claw` command line)."""
    lines = ["---", "name: claw-tools",
             "description: Mail, calendar, drive, todo, helpdesk and contacts tools for this task, on the command line.",
             "---", "", "# Claw tools", "",
             f"Call a tool with `{claw} TOOL --json '{{...}}'`; it prints the result as JSON (exit 0) or",
             "`error: ...` on stderr (exit 1: fix the call, or retry if the service said to).",
             f"`{claw} --list` lists the tools, `{claw} --schema TOOL` prints a tool's argument schema.", "",
             "## Tools", ""]
    for tool in tools:
        fn = tool["function"]
        props = fn["parameters"].get("properties", {})
        required = set(fn["parameters"].get("required", []))
        args = ", ".join(f"{k}{'' if k in required else '?'}: {v.get('type')}" for k, v in props.items())
        lines.append(f"- `{fn['name']}` ({args}): {fn['description']}")
    example = f"{claw} mail_list_messages --json '{{\"folder\": \"inbox\"}}'"
    lines += ["", "## Example", "", "```bash", example, "```", ""]
    return "\n".join(lines)


@cache
def source(name: str) -> str:
    return (SOURCE_DIR / name).read_text()


def boot_argv(python: list[str]) -> list[str]:
    """An isolated interpreter running claw_boot.py's text (it reads the modules from stdin)."""
    return [*python, "-I", "-B", "-c", source("claw_boot.py")]


def boot_header(modules: list[str], main: str) -> str:
    """claw_boot's first stdin line: the modules' text, in import order, and which one's main() runs."""
    return json.dumps({"modules": [[name, source(f"{name}.py")] for name in modules], "main": main})


class ClawService:
    """The env's handle on one sandbox's service."""

    def __init__(self, sandbox: AsyncSandboxInstance, home: str, python: list[str], key: bytes, hardened: bool):
        self.sandbox, self.home, self.python, self._key, self.hardened = sandbox, home, python, key, hardened

    @property
    def socket(self) -> str:
        return f"{self.home}/claw.sock"

    @property
    def claw(self) -> str:
        """The sandbox path of the `claw` command."""
        return f"{self.home}/bin/claw"

    def argv(self, script: str, *args: str) -> list[str]:
        """The command line of a script among the policy's files (tests drive the doors with it)."""
        return [*self.python, f"{self.home}/{script}", *args]

    @classmethod
    async def start(cls, sandbox: AsyncSandboxInstance, seed: dict, faults: list, allowed: list | None,
                    timeout: float = 60, *, world: dict | None = None, world_python: str | None = None,
                    tools: list[dict] | None = None) -> ClawService:
        """Upload the files and start the service. `world`/`world_python`/`tools`: another world
        (AgentDojo: agentdojo_service.py under a Python that has agentdojo, with its tools)."""
        base = sandbox.workdir or "/workspace"
        home = f"{base}/{STATE_DIR}"
        python = await agent_python(sandbox)
        for name in POLICY_FILES:
            await sandbox.upload_content(source(name).encode(), f"{home}/{name}")
        launcher = "#!/bin/sh\nexec " + " ".join(map(shlex.quote, [*python, f"{home}/claw_cli.py"])) + ' "$@"\n'
        await sandbox.upload_content(launcher.encode(), f"{home}/bin/claw", mode=0o755)
        mcp = "#!/bin/sh\nexec " + " ".join(map(shlex.quote, [*python, f"{home}/claw_mcp.py"])) + ' "$@"\n'
        await sandbox.upload_content(mcp.encode(), f"{home}/bin/claw-mcp", mode=0o755)
        if tools is None:
            tools = [claw_tools.schema(n) for n in claw_tools.TOOLS if not allowed or n in allowed]
        await sandbox.upload_content(skill_markdown(tools, "claw").encode(), f"{home}/SKILL.md")
        secret = dh_secret()
        config = {"seed": seed, "faults": faults, "allowed": allowed, "dh": str(pow(DH_G, secret, DH_P))}
        service, header = boot_argv(python), boot_header(SERVICE_MODULES, "claw_service")
        if world is not None:
            config.update(world)
            probe = await sandbox.exec([world_python, "-I", "-c", "import agentdojo"], timeout=timeout)
            if probe.exit_code != 0:
                raise ServiceError(f"this sandbox has no Python with agentdojo at {world_python} (AgentDojo tasks run "
                                   f"on the local backend, whose sandboxes see the host's cached venv): "
                                   f"{(probe.stderr or probe.stdout)[-300:]}")
            service, header = boot_argv([world_python]), boot_header(DOJO_MODULES, "agentdojo_service")
        r = await sandbox.exec([*service, "--socket", f"{home}/claw.sock"],
                               stdin=header + "\n" + json.dumps(config) + "\n", timeout=timeout)
        try:
            hello = json.loads(r.stdout.strip().splitlines()[-1])
            key = dh_key(int(hello["dh"]), secret)
        except (ValueError, KeyError, IndexError) as e:
            raise ServiceError(f"the claw service did not start (exit {r.exit_code}): {r.stderr[-2000:]}") from e
        return cls(sandbox, home, python, key, bool(hello.get("hardened")))

    async def request(self, request: dict, timeout: float = 60) -> dict:
        """One raw request through the relay in the sandbox; errors come back as answers."""
        relay = [*self.python, "-I", "-c", source("claw_relay.py"), self.socket]  # text: no file the policy edits
        r = await self.sandbox.exec(relay, stdin=json.dumps(request), timeout=timeout)
        try:
            answer = json.loads(r.stdout)
        except ValueError:
            return {"ok": False, "error": f"no answer from the claw service (exit {r.exit_code}): {r.stderr[-500:]}"}
        return answer if isinstance(answer, dict) else {"ok": False, "error": "the claw service answered garbage"}

    async def call(self, tool: str, args: dict, door: str = "function") -> dict:
        return await self.request({"op": "call", "tool": tool, "args": args, "door": door})

    async def snapshot(self) -> dict:
        """The world state and call log, verified: ServiceError unless the real service signed it."""
        nonce = secrets.token_hex(16)
        answer = await self.request({"op": "snapshot", "nonce": nonce})
        if not answer.get("ok") or not isinstance(answer.get("payload"), str) or not isinstance(answer.get("mac"), str):
            raise ServiceError(f"the claw service gave no snapshot: {answer.get('error', answer)}")
        mac = hmac.new(self._key, answer["payload"].encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(mac, answer["mac"]):
            raise ServiceError("the snapshot's signature is wrong: the service was replaced or the answer forged")
        body = json.loads(answer["payload"])
        if body.get("nonce") != nonce:
            raise ServiceError("the snapshot answers another request (replayed)")
        return body


async def agent_python(sandbox: AsyncSandboxInstance) -> list[str]:
    """The agent's interpreter argv (everything before the agent script on its command line)."""
    r = await sandbox.exec("cat /proc/$PPID/cmdline", timeout=30)
    argv = [a for a in r.stdout.split("\0") if a]
    for i, arg in enumerate(argv):
        # the agent's folder (or an old agent.py); on the local backend's zygote, the agent is a
        # fork of zygote_server.py, whose command line it keeps
        if arg.rstrip("/").endswith(("/agent", "agent.py", "/zygote_server.py")) and i > 0:
            return argv[:i]
    raise ServiceError(f"cannot find the agent's python from its command line {argv[:8]!r}")
