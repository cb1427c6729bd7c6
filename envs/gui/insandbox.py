"""Run the GUI's sandbox-side helpers (sandbox/*.py, standard library only) in the sandbox
from memory: the sources go on the interpreter's stdin, the agent's Python runs isolated
(-I: no PYTHONPATH, no user site, not the cwd). The env's verifier uses it, because every
file in the sandbox's home, the uploaded daemon's copies included, is the policy's to
rewrite on a desktop task (it has a terminal).

    out = await run_helper(sandbox, python, ["procwatch", "quiesce"], {"keep": {...}})
"""

from __future__ import annotations

import json

from orchard_gym.client import AsyncSandboxInstance
from orchard_gym.errors import SandboxFailed

from .display import SANDBOX_DIR
# each module in order becomes importable by the next; the last one's main(args) runs
LOADER = ("import json, sys, types\n"
          "job = json.loads(sys.stdin.read())\n"
          "for name, code in job['modules']:\n"
          "    sys.modules[name] = module = types.ModuleType(name)\n"
          "    exec(compile(code, name + '.py', 'exec'), module.__dict__)\n"
          "module.main(job['args'])\n")


async def run_helper(sandbox: AsyncSandboxInstance, python: list[str], modules: list[str], args: dict,
                     timeout: float = 120):
    """The JSON the last module's main(args) printed (its last line)."""
    job = {"modules": [(name, (SANDBOX_DIR / f"{name}.py").read_text()) for name in modules], "args": args}
    r = await sandbox.exec([*python, "-I", "-c", LOADER], stdin=json.dumps(job), timeout=timeout)
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise SandboxFailed(f"{modules[-1]} failed in the sandbox (exit {r.exit_code}): "
                            f"{(r.stderr or r.stdout)[-1000:]}") from None
