"""The mistakes a new user makes, fed to each subcommand: one line on stderr (no traceback),
a non-zero exit, and nothing left running (every process the command started, daemons
included, carries a marker in its environment; none may be alive afterwards)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from conftest import REPO, marked_pids, wait_until
from service_helpers import short_root

DEAD = "openai:http://127.0.0.1:9/v1#m"  # port 9 (discard): nothing listens
TOY = ["--env", "Orchard/Toy-v0", "--env-kwargs", '{"kinds": ["write"], "num_tasks": 2}']


def run_cli(args, tmp_path, *, block_module: str | None = None, timeout: float = 240):
    """`orchard ARGS` in a child process (optionally with MODULE uninstalled, as without its extra)."""
    mark = uuid.uuid4().hex
    prelude = f"import sys; sys.modules[{block_module!r}] = None; " if block_module else "import sys; "
    code = prelude + "from orchard_gym.cli import main; sys.argv = ['orchard', *sys.argv[1:]]; main()"
    # a short root: under xdist, tmp_path (.../popen-gwN/test_<long name>0/) put the agent's unix socket
    # past its 108-byte limit, and every sandbox failed to start
    root = short_root("cli")
    env = {**os.environ, "ORCHARD_CLI_MISTAKE": mark, "ORCHARD_LOCAL_ROOT": str(root)}
    r = subprocess.run([sys.executable, "-c", code, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=timeout)
    wait_until(lambda: not marked_pids(f"ORCHARD_CLI_MISTAKE={mark}"), timeout=10)
    left = marked_pids(f"ORCHARD_CLI_MISTAKE={mark}")
    if not left:
        shutil.rmtree(root, ignore_errors=True)
    return r, left


def one_line_error(r) -> str:
    assert r.returncode != 0, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr[-3000:]
    return lines[0]


MISTAKES = [
    pytest.param(["train", "grpo", "--model", "runs/nope", *TOY], "not a model folder", None, id="grpo-missing-model"),
    pytest.param(["train", "grpo", "--model", "MODEL", "--env", "Orchard/Nope-v0"], "--env", None,
                 id="grpo-unknown-env"),
    pytest.param(["train", "grpo", "--model", "MODEL", "--env", "Orchard/Toy-v0", "--env-kwargs", '{"nope": 1}'],
                 "--env-kwargs", None, id="grpo-bad-env-kwargs"),
    pytest.param(["eval", "--env", "Orchard/Nope-v0"], "--env", None, id="eval-unknown-env"),
    pytest.param(["eval", "--env", "Orchard/Toy-v0", "--env-kwargs", '{"nope": 1}'], "--env-kwargs", None,
                 id="eval-bad-env-kwargs"),
    pytest.param(["eval", "--env", "Orchard/Toy-v0", "--env-kwargs", "{nope"], "--env-kwargs", None,
                 id="eval-env-kwargs-not-json"),
    pytest.param(["eval", "--env", "Orchard/Toy-v0", "--policy", "gpt"], "--policy", None, id="eval-unknown-policy"),
    pytest.param(["eval", "--harness", "codex", "--env", "Orchard/Toy-v0", "--policy", "nothing"], "server extra",
                 "fastapi", id="eval-harness-without-server-extra"),
    pytest.param(["serve", "--port", "0"], "server extra", "fastapi", id="serve-without-server-extra"),
    pytest.param(["proxy", "--port", "0"], "server extra", "fastapi", id="proxy-without-server-extra"),
    pytest.param(["train", "grpo", "--model", "MODEL", *TOY], "train extra", "trl", id="grpo-without-train-extra"),
    pytest.param(["eval", *TOY, "--policy", DEAD, "-n", "2", "--max-steps", "2"], "all 2 episodes failed", None,
                 id="eval-dead-endpoint"),
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """Something that looks like a model folder: the checks under test come before any loading."""
    d = tmp_path_factory.mktemp("model")
    (d / "config.json").write_text("{}")
    return d


@pytest.mark.parametrize("args, says, block, ", MISTAKES)
def test_a_mistake_gets_one_line_and_leaves_nothing_running(args, says, block, tmp_path, model_dir):
    args = [str(model_dir) if a == "MODEL" else a for a in args]
    if block is None and args[0] == "eval" and "--policy" in args and DEAD in args:
        # the run's summary goes to stdout; the verdict is the last line of stderr
        r, left = run_cli(args, tmp_path)
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
        last = r.stderr.strip().splitlines()[-1]
    else:
        r, left = run_cli(args, tmp_path, block_module=block)
        last = one_line_error(r)
    assert says in last, last
    assert not left, f"still running: {left}"


def test_a_threshold_lets_a_partly_failed_run_pass(tmp_path):
    """--max-error-rate 1.0: failures are reported, the exit is 0."""
    r, left = run_cli(["eval", *TOY, "--policy", DEAD, "-n", "1", "--max-steps", "2", "--max-error-rate", "1.0"],
                      tmp_path)
    assert r.returncode == 0 and "ERROR" in r.stdout, (r.stdout[-2000:], r.stderr[-2000:])
    assert not left


def test_the_nothing_policy_is_a_baseline(tmp_path):
    r, left = run_cli(["eval", *TOY, "--policy", "nothing", "--out", "runs/n.jsonl"], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "resolved 0/2" in r.stdout and "infrastructure errors 0" in r.stdout, r.stdout
    assert Path(tmp_path / "runs/n.jsonl").read_text().count("\n") == 2
    assert not left


def test_repo_is_importable_from_tmp():  # the child processes import the worktree's package
    assert str(REPO) in subprocess.run([sys.executable, "-c", "import orchard_gym; print(orchard_gym.__file__)"],
                                       capture_output=True, text=True, cwd="/").stdout


# when the Ctrl-C lands, waited for on the sandbox root rather than guessed with a sleep (6 s and
# 12 s were during the imports on a loaded machine): the first sandbox is there (set-up), or at
# least eight have been made, so episodes have come and gone (mid-run; four run at once)
WHEN = {"set-up": 1, "mid-run": 8}


@pytest.mark.parametrize("when", list(WHEN))
def test_ctrl_c_on_eval_says_so_and_leaves_nothing_running(when, tmp_path):
    import signal

    mark = uuid.uuid4().hex
    # a short root: under xdist, tmp_path (.../popen-gwN/test_<long name>0/) put the agent's unix socket
    # past its 108-byte limit, and every sandbox failed to start
    root = short_root("cli")
    env = {**os.environ, "ORCHARD_CLI_MISTAKE": mark, "ORCHARD_LOCAL_ROOT": str(root)}
    p = subprocess.Popen([sys.executable, "-m", "orchard_gym.cli", "eval", *TOY, "--policy", "oracle", "-n", "20000"],  # far longer than the wait, at any speed
                         cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    made: set[str] = set()

    def sandboxes_made() -> bool:
        made.update(d.name for d in root.glob("sb-*"))  # none while the root is not there yet
        return p.poll() is not None or len(made) >= WHEN[when]

    wait_until(sandboxes_made, timeout=300)
    assert p.poll() is None, p.communicate()[1][-3000:]
    p.send_signal(signal.SIGINT)  # what Ctrl-C sends (to the foreground process)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130 and "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1].startswith("Error: interrupted"), err[-3000:]
    wait_until(lambda: not marked_pids(f"ORCHARD_CLI_MISTAKE={mark}"), timeout=10)
    assert not marked_pids(f"ORCHARD_CLI_MISTAKE={mark}")


@pytest.mark.parametrize("loaded", ["click.core", "gymnasium.core"])  # early and late in the package's imports
def test_ctrl_c_during_the_imports_is_one_line(loaded, tmp_path):
    """Ctrl-C while `orchard` is still importing (a second or two under load): one line and
    exit 130, not the traceback of whatever module was loading. -X importtime reports each
    module as it is loaded: the signal goes once LOADED is, with more imports to come."""
    import signal

    p = subprocess.Popen([sys.executable, "-X", "importtime", "-m", "orchard_gym.cli", "eval", *TOY, "--policy", "nothing"],
                         cwd=tmp_path, env={**os.environ, "ORCHARD_LOCAL_ROOT": str(short_root("cli"))},
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen = []
    for line in p.stderr:
        seen.append(line)
        if line.split("|")[-1].strip() == loaded:
            p.send_signal(signal.SIGINT)  # what Ctrl-C sends (to the foreground process)
            break
    else:
        p.kill()
    # the rest through the same reader: communicate() with two pipes reads the raw fds and loses
    # what the line iteration had buffered (once half a line, which then read as output)
    err = p.stderr.read()
    p.wait(120)
    said = [ln for ln in [*seen, *err.splitlines()] if ln.strip() and not ln.startswith("import time:")]
    assert p.returncode == 130 and said == ["Error: interrupted (nothing had started yet)"], "".join(seen) + err


def test_a_dependency_warning_is_shown_once_even_across_catch_warnings():
    """TRL/transformers open a catch_warnings block each training step, which resets what
    filterwarnings("once") remembers: the same deprecation then printed every step."""
    code = ("import warnings\nfrom orchard_gym.warnings_once import install\ninstall()\n"
            "for step in range(3):\n    with warnings.catch_warnings():\n"
            "        warnings.simplefilter('default')\n        warnings.warn('x is deprecated', FutureWarning)\n"
            "warnings.warn('another one', UserWarning)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr.count("x is deprecated") == 1 and "another one" in r.stderr, r.stderr


def test_ctrl_c_on_train_grpo_is_one_line_and_exit_130(tmp_path):
    """Mid-training Ctrl-C: once the run is cleaned up, the command leaves without the
    interpreter's teardown, where torch's C++ threads aborted it about every other time
    ('terminate called without an active exception', exit 134)."""
    import signal
    import time

    from components import require_module

    require_module("train", "trl")
    from orchard_gym.algos.tiny import build_tiny_model, toy_corpus
    from orchard_gym.envs.toy.env import make_tasks

    kwargs = {"kinds": ["write"], "num_tasks": 2}
    build_tiny_model(toy_corpus(make_tasks(**kwargs).values()), tmp_path / "tiny")
    mark = uuid.uuid4().hex
    env = {**os.environ, "ORCHARD_CLI_MISTAKE": mark, "ORCHARD_LOCAL_ROOT": str(short_root("cli"))}
    p = subprocess.Popen([sys.executable, "-m", "orchard_gym.cli", "train", "grpo", "--model", str(tmp_path / "tiny"),
                          *TOY, "--steps", "200", "--group-size", "2", "--prompts-per-step", "1", "--step-budget", "3",
                          "--max-new-tokens", "16", "--out", str(tmp_path / "run")],
                         cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # interrupt once training steps are under way (the metrics file has a line)
    wait_until(lambda: p.poll() is not None or (tmp_path / "run" / "metrics.jsonl").exists()
               and (tmp_path / "run" / "metrics.jsonl").read_text().count("\n") >= 2, timeout=300)
    assert p.poll() is None, p.communicate()[1][-3000:]
    time.sleep(1)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, err[-3000:]
    assert "terminate called" not in err and "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1].endswith("Error: interrupted (what it had started was stopped)"), err[-3000:]
    wait_until(lambda: not marked_pids(f"ORCHARD_CLI_MISTAKE={mark}"), timeout=10)
    assert not marked_pids(f"ORCHARD_CLI_MISTAKE={mark}")
