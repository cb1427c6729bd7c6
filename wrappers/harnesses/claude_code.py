"""Claude Code (`@anthropic-ai/claude-code` from npm) as a harness, run unchanged and
headless (`claude -p`), its model calls going to the proxy's Anthropic Messages door.

The npm package is a launcher plus a native (self-contained) binary per platform; it is
installed once, pinned, into a cached npm prefix on the host (`install()`, also what
scripts/install_claude_code.sh runs), which local sandboxes see read-only, like
mini-swe-agent's venv. Its base URL is the rollout's root (`ANTHROPIC_BASE_URL`, the
client adds `/v1/messages`), its API key the rollout token; telemetry, error reports,
auto-update and non-essential traffic are off, and every model it would ask for (the
main one and the small/fast one) is the rollout's model, so all its calls are recorded.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
from pathlib import Path

from pydantic import Field

from ..harness import HARNESSES, Harness

CLAUDE_CODE_VERSION = "2.1.332"
PACKAGE = "@anthropic-ai/claude-code"


class NpmHarness(Harness):
    """A harness installed from npm into a cached prefix: `$ORCHARD_HARNESS_VENV` is that
    prefix (its programs are under `node_modules/.bin`)."""

    npm: list[str] = Field(default_factory=list, description="npm packages, pinned (name@version)")
    check: str = Field("", description="a program under node_modules/.bin run with --version after installing")

    def install(self) -> Path | None:
        if not self.npm:
            return super().install()
        from orchard_gym.envs.swe.venvs import cache_root

        key = "+".join(p.replace("/", "_").replace("@", "") for p in sorted(self.npm))
        prefix = cache_root() / "harness" / "npm" / key
        if (prefix / ".ready").exists():
            return prefix
        npm = shutil.which("npm")
        if npm is None:
            raise RuntimeError(f"{self.name} needs npm (Debian's nodejs/npm; scripts/setup_system.sh)")
        prefix.parent.mkdir(parents=True, exist_ok=True)
        with open(prefix.parent / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if (prefix / ".ready").exists():
                return prefix
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(prefix)  # a half-done earlier try
            run = subprocess.run([npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund",
                                  "--no-update-notifier", "--loglevel=error", *self.npm],
                                 capture_output=True, text=True, timeout=1800)
            if run.returncode != 0:
                raise RuntimeError(f"npm install {' '.join(self.npm)} failed ({run.returncode}): "
                                   f"{(run.stderr or run.stdout)[-2000:]}")
            if self.check:
                exe = prefix / "node_modules" / ".bin" / self.check
                out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=120)
                if out.returncode != 0:
                    raise RuntimeError(f"{exe} --version failed ({out.returncode}): {out.stderr[-1000:]}")
            (prefix / ".ready").write_text(" ".join(self.npm) + "\n")
            os.chmod(prefix, 0o755)
        return prefix


CLAUDE_CODE = NpmHarness(
    name="claude-code",
    npm=[f"{PACKAGE}@{CLAUDE_CODE_VERSION}"],
    check="claude",
    # headless: the task as the prompt, every tool allowed (the sandbox is the boundary), the
    # whole session as stream-json in harness.log; the rollout's root as its Anthropic base URL
    command=('export ANTHROPIC_BASE_URL="${OPENAI_BASE_URL%/v1}" ANTHROPIC_API_KEY="$OPENAI_API_KEY" \\\n'
             '  ANTHROPIC_SMALL_FAST_MODEL="$ORCHARD_MODEL" ANTHROPIC_DEFAULT_HAIKU_MODEL="$ORCHARD_MODEL"\n'
             'exec "$ORCHARD_HARNESS_VENV/node_modules/.bin/claude" -p "$(cat "$ORCHARD_TASK_FILE")" '
             '--output-format stream-json --verbose --model "$ORCHARD_MODEL" --dangerously-skip-permissions '
             '--max-turns 100 < /dev/null'),
    env={
        "CLAUDE_CONFIG_DIR": "{harness_dir}/claude",      # its settings and session files, not $HOME's
        "IS_SANDBOX": "1",                                # skipping permissions as root is allowed in a sandbox
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_NON_ESSENTIAL_MODEL_CALLS": "1",
        "DISABLE_COST_WARNINGS": "1",
        "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1",
        "NO_COLOR": "1", "TERM": "dumb", "PAGER": "cat",
    },
)

HARNESSES[CLAUDE_CODE.name] = CLAUDE_CODE
