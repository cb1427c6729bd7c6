"""Every code block of README.md and docs/*.md runs as written, or says why it cannot
(tests/doc_examples.py has the markers; docs/testing.md the rules).

Each page gets a scratch folder that links the repository's top-level entries (scripts/,
tests/, .venv/, ...), so `.venv/bin/orchard ...` and `runs/...` work as in a checkout while
what a block writes stays out of the tree. The blocks of a page run in order in that folder,
each in its own process group, which is killed when the block ends: nothing is left running.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from components import require
from conftest import marked_pids
from doc_examples import CODE, REPO, all_blocks, continued

BLOCKS = all_blocks()
PART_OF_NEXT = continued(BLOCKS)
TO_RUN = [b for b in BLOCKS if b.runnable and b.id not in PART_OF_NEXT]


def _module(name: str, hint: str) -> str:
    return "" if importlib.util.find_spec(name) else f"{name} is not installed ({hint})"


def _harbor() -> str:
    from orchard_gym.integrations.harbor_venv import harbor_python
    from orchard_gym.wrappers.harness.install import HarnessInstallError

    try:
        harbor_python(build=False)
    except HarnessInstallError as e:
        return str(e)
    return ""


def _docker() -> str:
    from conftest import docker_engine
    return docker_engine()[1]


def _claude_code() -> str:
    from orchard_gym.wrappers.harness.plugins.claude_code import HARNESS
    try:
        prefix = HARNESS.install_npm()
    except Exception as e:  # any failure: the reason is the skip/fail message
        return f"{type(e).__name__}: {e}"
    return "" if os.access(prefix / "node_modules" / ".bin" / "claude", os.X_OK) else f"no claude under {prefix}"


def _image(name: str) -> bool:
    """Whether any tag of repository `name` is there (`podman image exists` looks for :latest only,
    and the SWE task images are tagged by version)."""
    out = subprocess.run(["podman", "images", "-q", name], capture_output=True, text=True)
    return out.returncode == 0 and bool(out.stdout.strip())


WHY_NOT = {  # component -> () -> why it is missing ("" when present)
    "server": lambda: _module("fastapi", "bash scripts/install.sh server"),
    "train": lambda: _module("trl", "bash scripts/install.sh train"),
    "anthropic": lambda: _module("anthropic", "bash scripts/install.sh dev"),
    "openai": lambda: _module("openai", "bash scripts/install.sh dev"),
    "swe-datasets": lambda: _module("datasets", "bash scripts/install.sh swe"),
    "gui": lambda: _module("miniwob", "bash scripts/install.sh gui") or
    ("" if shutil.which("Xvfb") else "Xvfb is not installed (scripts/setup_system.sh)"),
    "bwrap": lambda: "" if shutil.which("bwrap") else "bwrap is not on PATH",
    "chromium": lambda: "" if shutil.which("chromium") else "no chromium on PATH",
    "harnesses": lambda: "" if shutil.which("npm") and shutil.which("node") else "node/npm are not installed",
    "docker": _docker,
    "swe-images": lambda: _docker() or ("" if _image("localhost/orchard/swe-semver") else
                                        "no SWE task images (scripts/build_swe_images.py)"),
    "claude-code": lambda: _module("fastapi", "bash scripts/install.sh server") or _claude_code(),
    "harbor": lambda: _harbor(),
    "verifiers": lambda: _verifiers_venv(),
}


def _verifiers_venv() -> str:
    from orchard_gym.integrations.verifiers_run import venv_missing
    return venv_missing() or ""


def test_every_block_is_labelled_and_marked_well():
    problems = [f"{b.id}: {p}" for b in BLOCKS for p in b.problems]
    problems += [f"{b.id}: needs unknown component {n!r}" for b in BLOCKS for n in b.needs if n not in WHY_NOT]
    assert not problems, "\n".join(problems)
    assert any(b.lang in CODE for b in BLOCKS)


@pytest.fixture(scope="session")
def page_dirs(tmp_path_factory):
    made: dict[str, Path] = {}

    def get(page: str) -> Path:
        if page not in made:
            d = tmp_path_factory.mktemp(Path(page).stem)
            for entry in REPO.iterdir():
                if entry.name not in {"runs", ".git"} and not entry.name.startswith(".example"):
                    (d / entry.name).symlink_to(entry)
            made[page] = d
        return made[page]

    return get


def _params():
    for b in TO_RUN:
        marks = [pytest.mark.slow] if b.slow else []
        yield pytest.param(b, id=b.id, marks=marks)


@pytest.mark.parametrize("block", _params())
def test_doc_example(block, page_dirs):
    for name in block.needs:
        require(name, WHY_NOT[name]())
    cwd = page_dirs(block.page)
    with _served(block) as code:
        _run(block, code, cwd)


@contextlib.contextmanager
def _served(block):
    """The block's code, and for a `serve` block the orchestrator it talks to (at a free port)."""
    if "serve" not in block.markers:
        yield block.code
        return
    require("server", WHY_NOT["server"]())
    from service_helpers import Orchestrator, remove_all_sandboxes, short_root

    root = short_root("doc")
    orch = Orchestrator(root, api_key="secret")
    try:
        yield re.sub(r"(127\.0\.0\.1|localhost):8000\b", f"127.0.0.1:{orch.port}", block.code)
    finally:
        orch.stop()
        remove_all_sandboxes(root)
        shutil.rmtree(root, ignore_errors=True)


def _run(block, code: str, cwd: Path) -> None:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONUNBUFFERED": "1"}
    if block.lang == "python":
        script = cwd / f".example-{block.line}.py"
        script.write_text(block.prefix + code)
        cmd = [sys.executable, script.name]
    else:
        cmd = ["bash", "-eo", "pipefail", "-c", code]
    mark = f"ORCHARD_DOC_EXAMPLE={uuid.uuid4().hex}"  # finds what the block left behind, daemons included
    env[mark.split("=")[0]] = mark.split("=")[1]
    log = cwd / f".example-{block.line}.log"
    with open(log, "w") as out:  # a file, not a pipe: a server the block put in the background keeps a pipe open
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            proc.wait(timeout=block.timeout)
        except subprocess.TimeoutExpired:
            pass
        finally:  # what the block started in the background ends with it
            for pid in [proc.pid, *marked_pids(mark)]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait()
    text = log.read_text(errors="replace")[-4000:]
    assert proc.returncode is not None and proc.returncode >= 0, \
        f"{block.id} ran past {block.timeout}s (mark it slow, give it a timeout, or make it quicker):\n{text}"
    assert proc.returncode == 0, f"{block.id} exited {proc.returncode}:\n{text}"
