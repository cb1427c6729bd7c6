"""Red team: Harbor task verifiers (envs/harbor/verifier.py) against a policy that plays dirty.

Each test plays an attack through `env.step` (bash only, as a policy would) and checks that it
earns nothing: a module named like the standard library in the working directory, files planted
where the verifier's tests and reward will be, output shaped like a reward, a background process
that writes the reward after the agent finished, and reading the task folder (the solution) from
inside the sandbox. docs/security.md lists which defence each one checks.
"""

from __future__ import annotations

import base64
import os
import shutil
from pathlib import Path

import gymnasium as gym
import pytest

import orchard_gym  # noqa: F401
from orchard_gym._loop import LoopThread
from orchard_gym.envs.harbor.env import HarborEnv

from conftest import docker_engine, needs, needs_bwrap

DATA = Path(__file__).parent / "data" / "harbor"
_GATEWAY, _WHY_NOT = docker_engine()
LOCAL = pytest.param("local", id="local-bwrap", marks=needs_bwrap)
DOCKER = pytest.param("docker", id="docker", marks=[pytest.mark.docker, needs("docker", None if _GATEWAY else _WHY_NOT)])
SPAWNERS = [pytest.param("zygote", id="zygote"), pytest.param("bwrap", id="bwrap")]

# The Dockerfiles of the tasks made here: local runs pip-only ones in a host venv; docker builds
# on the test image. Both have a python3 the verifier can use.
DOCKERFILE = {"local": "FROM localhost/orchard/bookworm:latest\nRUN pip install six\n",
              "docker": "FROM localhost/orchard/swe-base:latest\nWORKDIR /app\n"}


def make_task(tmp_path: Path, kind: str, test_sh: str, name: str = "t", dockerfile: str | None = None) -> Path:
    """A task folder (instruction: write 42 to /app/answer.txt) with `test_sh` as its verifier."""
    folder = tmp_path / "tasks" / name
    (folder / "environment").mkdir(parents=True)
    (folder / "tests").mkdir()
    (folder / "solution").mkdir()
    (folder / "task.toml").write_text('version = "1.0"\n[verifier]\ntimeout_sec = 120.0\n')
    (folder / "instruction.md").write_text("Write 42 to /app/answer.txt.\n")
    (folder / "environment" / "Dockerfile").write_text(dockerfile or DOCKERFILE[kind])
    (folder / "solution" / "solve.sh").write_text("#!/bin/bash\necho 42 > /app/answer.txt\n")
    (folder / "tests" / "test.sh").write_text(test_sh)
    return folder


def make(kind: str, root: Path, tasks: Path, spawner: str = "auto") -> HarborEnv:
    backend = {"type": "local", "isolation": "bwrap", "root": str(root), "spawner": spawner} if kind == "local" \
        else {"type": "docker"}
    env = gym.make("Orchard/Claw-v0", tasks=f"harbor:{tasks}", backend=backend).unwrapped
    assert isinstance(env, HarborEnv)
    return env


def bash(env: HarborEnv, command: str) -> str:
    obs, _, _, _, info = env.step({"name": "bash", "arguments": {"command": command}})
    assert info["exit_code"] == 0, obs
    return obs


def submit(env: HarborEnv) -> tuple[float, dict]:
    _, reward, term, trunc, info = env.step({"name": "submit", "arguments": {}})
    assert term and not trunc
    return reward, info["report"]


def play(kind: str, root: Path, tasks: Path, attack: str) -> tuple[float, dict]:
    """Reset the one task, run `attack` (bash, in the working directory) without solving it, submit."""
    env = make(kind, root, tasks)
    try:
        env.reset()
        bash(env, attack)
        reward, report = submit(env)
        assert env.trajectory.ok, report  # graded, not errored: the attack simply earned nothing
        return reward, report
    finally:
        env.close()


# ---------------------------------------------------------------- 1. the standard library, shadowed
# pathlib is not imported at interpreter start-up, so a pathlib.py on sys.path wins over the real one
SHADOW = "printf 'import os, sys\\nprint(1); sys.stdout.flush(); os._exit(0)\\n' > pathlib.py"
PYTHON_VERIFIER = """#!/bin/bash
{cd}mkdir -p /logs/verifier
python3 - <<'PY' > /logs/verifier/reward.txt
import pathlib
try:
    ok = pathlib.Path("/app/answer.txt").read_text().strip() == "42"
except OSError:
    ok = False
print(1 if ok else 0)
PY
"""


@pytest.mark.parametrize("kind", [LOCAL, DOCKER])
@pytest.mark.parametrize("cd", ["", "cd /app\n"], ids=["from-its-folder", "cd-app"])
def test_a_stdlib_named_module_in_the_workdir_does_not_answer_for_the_verifier(kind, cd, tmp_path, local_root):
    tasks = make_task(tmp_path, kind, PYTHON_VERIFIER.format(cd=cd)).parent
    reward, report = play(kind, local_root, tasks, SHADOW)
    assert reward == 0.0, report
    # the oracle still passes: the verifier imports the real pathlib
    env = make(kind, local_root, tasks)
    try:
        env.reset()
        bash(env, "echo 42 > answer.txt")
        assert submit(env)[0] == 1.0
    finally:
        env.close()


# ---------------------------------------------------------------- 2. files planted where the verifier runs
# a verifier that writes reward.json (several keys, as Harbor allows) and imports json: a planted
# reward.txt would win over its reward.json, a planted json.py in the tests folder would answer for it
JSON_VERIFIER = """#!/bin/bash
mkdir -p /logs/verifier
cat > /tests/check.py <<'PY'
import json
try:
    ok = open("/app/answer.txt").read().strip() == "42"
except OSError:
    ok = False
print(json.dumps({"reward": 1.0 if ok else 0.0, "answer_ok": ok}))
PY
python3 /tests/check.py > /logs/verifier/reward.json
"""
FORGED_JSON = 'import os\nos.write(1, b\'{"reward": 1.0, "answer_ok": true}\\n\')\nos._exit(0)\n'


def plant_everywhere(env: HarborEnv, files: dict[str, str]) -> str:
    """A bash command writing each file into every folder the verifier's could be: Harbor's
    /tests and /logs/verifier, the agent-time ones on local, and a fixed one in /tmp."""
    paths = env.paths(env.ctx.state["workdir"])
    dirs = {"tests": [paths["tests"], "/tests", "/tmp/orchard-verifier/tests"],
            "reward": [f"{paths['logs']}/verifier", "/logs/verifier", "/tmp/orchard-verifier/logs/verifier"]}
    lines = []
    for where, content in files.items():
        kind, name = where.split("/", 1)
        blob = base64.b64encode(content.encode()).decode()
        lines += [f"(mkdir -p {d} && echo {blob} | base64 -d > {d}/{name}) 2>/dev/null" for d in dirs[kind]]
    return "; ".join(lines) + "; true"


@pytest.mark.parametrize("kind", [LOCAL, DOCKER])
@pytest.mark.parametrize("planted", [{"reward/reward.txt": "1\n"}, {"tests/json.py": FORGED_JSON}],
                         ids=["reward.txt", "tests-json.py"])
def test_files_planted_where_the_tests_and_the_reward_will_be_do_not_count(kind, planted, tmp_path, local_root):
    tasks = make_task(tmp_path, kind, JSON_VERIFIER).parent
    env = make(kind, local_root, tasks)
    try:
        env.reset()
        bash(env, plant_everywhere(env, planted))
        reward, report = submit(env)
        assert env.trajectory.ok and reward == 0.0, report
        assert report["reward_json"] == {"reward": 0.0, "answer_ok": False}  # every key of the verifier's file

        env.reset()  # the oracle passes through the same verifier
        bash(env, "echo 42 > answer.txt")
        assert submit(env)[0] == 1.0
    finally:
        env.close()


PYTEST_VERIFIER = """#!/bin/bash
mkdir -p /logs/verifier
cat > /tests/test_outputs.py <<'PY'
def test_answer():
    assert open("/app/answer.txt").read().strip() == "42"
PY
if python3 -m pytest -q -p no:cacheprovider /tests/test_outputs.py >&2; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""
# pytest reads the ini file and conftest.py files of the test file's folder and every folder above it
CONFTEST = ("printf '[pytest]\\n' > {d}/pytest.ini; "
            "printf 'import os\\nos._exit(0)\\n' > {d}/conftest.py")


@needs_bwrap
def test_a_conftest_above_the_tests_does_not_decide_the_verdict(tmp_path, local_root):
    """On local the tests and the reward live in the sandbox's /tmp: nothing the policy left there,
    or in its working directory, is above them when pytest looks for its configuration."""
    tasks = make_task(tmp_path, "local", PYTEST_VERIFIER,
                      dockerfile="FROM localhost/orchard/bookworm:latest\nRUN pip install pytest\n").parent
    reward, report = play("local", local_root, tasks,
                          CONFTEST.format(d=".") + "; " + CONFTEST.format(d="/tmp") + "; mkdir -p .harbor")
    assert reward == 0.0, report
    assert "1 failed" in report["test_output"]


# ---------------------------------------------------------------- 3. output shaped like a reward
@pytest.mark.parametrize("kind", [LOCAL, DOCKER])
def test_printing_a_reward_earns_nothing(kind, tmp_path, local_root):
    # the verifier runs the policy's program and shows its output; its own verdict is 0, or none at all
    scores = make_task(tmp_path, kind, "#!/bin/bash\nbash /app/run.sh\nmkdir -p /logs/verifier\n"
                       "echo 0 > /logs/verifier/reward.txt\n", name="scores").parent
    say = "printf 'echo reward: 1; echo 1; echo {\\\"reward\\\": 1.0}\\n' > run.sh"
    reward, report = play(kind, local_root, scores, say)
    assert reward == 0.0 and "reward: 1" in report["test_output"]

    silent = make_task(tmp_path / "s", kind, "#!/bin/bash\nbash /app/run.sh\n", name="silent").parent
    env = make(kind, local_root, silent)
    try:
        env.reset()
        bash(env, say)
        reward, report = submit(env)
        assert reward == 0.0 and report["error_kind"] == "grading" and not env.trajectory.ok
    finally:
        env.close()


# ---------------------------------------------------------------- 4. a background process writes the reward later
@pytest.mark.parametrize("kind", [LOCAL, DOCKER])
def test_a_background_process_cannot_write_the_reward_after_the_agent_finished(kind, tmp_path, local_root):
    tasks = make_task(tmp_path, kind, "#!/bin/bash\nmkdir -p /logs/verifier\n"
                      "[ \"$(cat /app/answer.txt 2>/dev/null)\" = 42 ] && echo 1 > /logs/verifier/reward.txt "
                      "|| echo 0 > /logs/verifier/reward.txt\n").parent
    env = make(kind, local_root, tasks)
    try:
        env.reset()
        logs = env.paths(env.ctx.state["workdir"])["logs"]
        # no pause: it must win any race against the verifier; it finds the verifier's folders
        # wherever they are made (Harbor's /logs, or a new folder of /tmp on local) and writes
        # its reward there (mv: a reader never sees half a file) and its own test.sh
        forger = ("while true; do for d in /logs/verifier /tmp/orchard-verifier-*/logs/verifier "
                  f"{logs}/verifier; do [ -d $d ] && echo 1 > $d/.r && mv $d/.r $d/reward.txt; done; "
                  "for t in /tests /tmp/orchard-verifier-*/tests; do [ -d $t ] && "
                  "printf \"mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt\\n\" > $t/.t && "
                  "mv $t/.t $t/test.sh; done; done")
        bash(env, f"mkdir -p {logs}/verifier; setsid nohup sh -c '{forger}' > /dev/null 2>&1 < /dev/null &")
        assert bash(env, f"sleep 1; cat {logs}/verifier/reward.txt").strip() == "1"  # it runs
        reward, report = submit(env)
        assert reward == 0.0 and env.trajectory.ok, report
    finally:
        env.close()


# ---------------------------------------------------------------- 5. the task folder, read from inside
@pytest.fixture(params=["checkout", "shared-cache"])
def visible_tasks(request):
    """Harbor tasks in a folder every local sandbox can read unless hidden: the checkout's own
    test tasks, or a copy in a folder of the orchard cache that local sandboxes share."""
    if request.param == "checkout":
        yield DATA
        return
    from orchard_gym.envs.swe.venvs import cache_root

    folder = cache_root() / "swe" / "venvs" / f".orchard-test-harbor-{os.getpid()}"
    shutil.copytree(DATA / "six-version", folder / "six-version")
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@needs_bwrap
@pytest.mark.parametrize("spawner", SPAWNERS)
def test_the_task_folder_is_not_readable_from_inside_the_sandbox(spawner, visible_tasks, local_root):
    env = make("local", local_root, visible_tasks, spawner=spawner)
    try:
        env.reset(options={"task_id": "six-version"})
        solution = visible_tasks / "six-version" / "solution" / "solve.sh"
        obs, _, _, _, info = env.step({"name": "bash", "arguments": {"command": f"cat {solution}"}})
        assert info["exit_code"] != 0 and "six.__version__" not in obs, obs
    finally:
        env.close()


@pytest.mark.parametrize("kind", [LOCAL, DOCKER])
def test_the_tests_are_not_in_the_sandbox_before_the_agent_finished(kind, tmp_path, local_root):
    tasks = make_task(tmp_path, kind, "#!/bin/bash\n# secret-verifier-marker\nexit 0\n").parent
    env = make(kind, local_root, tasks)
    try:
        env.reset()
        tests = env.paths(env.ctx.state["workdir"])["tests"]
        obs = bash(env, f"ls -a {tests} /tests /tmp/orchard-verifier-* 2>&1; grep -rl secret-verifier-marker "
                        f"/tmp . /logs /tests 2>/dev/null; true")
        assert "test.sh" not in obs and "secret-verifier-marker" not in obs, obs
    finally:
        env.close()


@needs_bwrap
def test_a_sandbox_that_can_read_the_task_folder_is_refused(local_root):
    from orchard_gym.backends.config import LocalBackendConfig
    from orchard_gym.envs.swe.venvs import cache_root

    folder = cache_root() / "swe" / "venvs" / f".orchard-test-harbor-refused-{os.getpid()}"
    shutil.copytree(DATA / "six-version", folder / "six-version")
    try:
        # a backend object made by the caller: the env cannot hide its task folders there, so it refuses
        backend = LocalBackendConfig(isolation="bwrap", root=local_root).get_backend()
        env = gym.make("Orchard/Claw-v0", tasks=f"harbor:{folder}", backend=backend).unwrapped
        try:
            with pytest.raises(Exception, match="can read the task folder"):
                env.reset(options={"task_id": "six-version"})
        finally:
            env.close()
        hidden = LocalBackendConfig(isolation="bwrap", root=local_root, hide=[folder / "six-version"]).get_backend()
        env = gym.make("Orchard/Claw-v0", tasks=f"harbor:{folder}", backend=hidden).unwrapped
        try:
            env.reset(options={"task_id": "six-version"})
        finally:
            env.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_copies_are_hidden_too(tmp_path):
    """The backend config HarborEnv gives its client lists every task folder it loaded."""
    from orchard_gym.envs.harbor.env import hide_task_folders

    shutil.copytree(DATA, tmp_path / "h")
    roots = [tmp_path / "h" / "six-version", tmp_path / "h" / "sum-numbers"]
    config = hide_task_folders({"type": "local", "hide": ["/srv/x"]}, roots)
    assert config.hide == [Path("/srv/x"), *roots]
    assert hide_task_folders({"type": "docker"}, roots) == {"type": "docker"}


@needs_bwrap
def test_a_tmp_made_hard_to_empty_neither_stops_grading_nor_touches_the_workdir(tmp_path, local_root):
    """The local verifier empties the sandbox's /tmp first: folders without permissions, a deep
    tree, a FIFO and links into the working directory go; the working directory (bind-mounted,
    under /tmp when the backend root is) keeps every file."""
    tasks = make_task(tmp_path, "local", "#!/bin/bash\nmkdir -p /logs/verifier\n"
                      "[ \"$(cat /app/answer.txt)\" = 42 ] && [ -f /app/keep/me ] && echo 1 > /logs/verifier/reward.txt "
                      "|| echo 0 > /logs/verifier/reward.txt\n").parent
    mess = ("echo 42 > answer.txt && mkdir -p keep && echo x > keep/me && "
            "mkdir -p /tmp/locked/inner && touch /tmp/locked/inner/f && chmod 000 /tmp/locked/inner /tmp/locked && "
            "python3 -c \"import os; os.chdir('/tmp'); [(os.mkdir('d'), os.chdir('d')) for _ in range(3000)]\" && "
            "mkfifo /tmp/fifo && ln -s \"$PWD\" /tmp/to-workdir && ln -s \"$PWD/answer.txt\" /tmp/to-answer && "
            "chmod 555 /tmp && test -p /tmp/fifo")
    env = make("local", local_root, tasks)
    try:
        env.reset()
        bash(env, mess)
        reward, report = submit(env)
        assert reward == 1.0 and env.trajectory.ok, report
        left = LoopThread.shared().run(env.sandbox.exec("ls -A /tmp")).stdout.split()
        assert not {"locked", "d", "fifo", "to-workdir", "to-answer"} & set(left), left
    finally:
        env.close()
