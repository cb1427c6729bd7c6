"""Public SWE datasets' records (SWE-bench, SWE-Gym, SWE-rebench, R2E-Gym, SWE-smith), the
SWE-bench image layout graded through swebench's eval script on docker, and
`orchard tasks check`."""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import json
import os
import subprocess
import sys
import tarfile
import types

import gymnasium as gym
import pytest

import orchard_gym  # noqa: F401 - registers the env ids
from components import require_module
from conftest import REPO, needs
from orchard_gym.envs.swe.datasets import TaskFormatError, kind_for_source, swebench_image
from orchard_gym.envs.swe.tasks import load_tasks

LAYOUT_TASK = "semver-3.0.2"

# a record shaped as SWE-bench publishes it (FAIL_TO_PASS / PASS_TO_PASS as JSON strings)
SWEBENCH_RECORD = {
    "repo": "astropy/astropy", "instance_id": "astropy__astropy-12907",
    "base_commit": "d16bfe05a744909de4b27f5875fe0d4ed41ce607",
    "patch": "diff --git a/astropy/modeling/separable.py b/astropy/modeling/separable.py\n--- a/astropy/modeling/"
             "separable.py\n+++ b/astropy/modeling/separable.py\n@@ -242,7 +242,7 @@\n-        cright[-right.shape[0]:"
             ", -right.shape[1]:] = 1\n+        cright[-right.shape[0]:, -right.shape[1]:] = right\n",
    "test_patch": "diff --git a/astropy/modeling/tests/test_separable.py b/astropy/modeling/tests/test_separable.py\n"
                  "--- a/astropy/modeling/tests/test_separable.py\n+++ b/astropy/modeling/tests/test_separable.py\n"
                  "@@ -28,6 +28,7 @@\n+p = 1\n",
    "problem_statement": "Modeling's `separability_matrix` does not compute separability correctly for nested "
                         "CompoundModels", "hints_text": "", "created_at": "2022-03-03T15:14:54Z", "version": "4.3",
    "FAIL_TO_PASS": '["astropy/modeling/tests/test_separable.py::test_separable[compound_model6-result6]"]',
    "PASS_TO_PASS": '["astropy/modeling/tests/test_separable.py::test_coord_matrix"]',
    "environment_setup_commit": "298ccb478e6bf092953bca67a3d29dc6c35f6752",
}


def _layout_script():
    spec = importlib.util.spec_from_file_location("swebench_layout", REPO / "scripts/build_swebench_layout_images.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


# ------------------------------------------------------------------ loading records as published
def test_swebench_records_load_from_json_jsonl_parquet_and_datasets_folders(tmp_path):
    pq = require_module("swe-datasets", "pyarrow.parquet")
    datasets = require_module("swe-datasets", "datasets")
    import pyarrow as pa

    other = {**SWEBENCH_RECORD, "instance_id": "django__django-11099", "repo": "django/django"}
    (tmp_path / "two.json").write_text(json.dumps([SWEBENCH_RECORD, other]))
    write_jsonl(tmp_path / "two.jsonl", [SWEBENCH_RECORD, other])
    pq.write_table(pa.Table.from_pylist([SWEBENCH_RECORD, other]), tmp_path / "two.parquet")
    datasets.Dataset.from_list([SWEBENCH_RECORD, other]).save_to_disk(str(tmp_path / "ds"))
    datasets.DatasetDict({"test": datasets.Dataset.from_list([SWEBENCH_RECORD]),
                          "dev": datasets.Dataset.from_list([other])}).save_to_disk(str(tmp_path / "dd"))
    (tmp_path / "snap" / "data").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([other]), tmp_path / "snap" / "data" / "dev-00000-of-00001.parquet")

    for source in ("two.json", "two.jsonl", "two.parquet", "ds"):
        tasks = load_tasks(tmp_path / source)
        assert sorted(tasks) == ["astropy__astropy-12907", "django__django-11099"], source
        t = tasks["astropy__astropy-12907"]
        assert t.image == "swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest"
        assert t.workdir == "/testbed" and t.in_image and t.dataset == "swe-bench"
        assert t.FAIL_TO_PASS == ["astropy/modeling/tests/test_separable.py::test_separable[compound_model6-result6]"]
        assert t.test_files == ["astropy/modeling/tests/test_separable.py"]
        assert t.model_extra["environment_setup_commit"] == SWEBENCH_RECORD["environment_setup_commit"]
    assert list(load_tasks(tmp_path / "dd")) == ["astropy__astropy-12907"]  # split "test" by default
    assert list(load_tasks(tmp_path / "dd", split="dev")) == ["django__django-11099"]
    assert list(load_tasks(tmp_path / "snap", split="dev")) == ["django__django-11099"]
    with pytest.raises(TaskFormatError, match="no split 'train'.*dev, test"):
        load_tasks(tmp_path / "dd", split="train")
    prefixed = load_tasks(tmp_path / "two.jsonl", image_prefix="mirror.example:5000/sb")
    assert prefixed["django__django-11099"].image == "mirror.example:5000/sb/sweb.eval.x86_64.django_1776_django-11099:latest"
    env = gym.make("Orchard/SWE-v0", tasks=str(tmp_path / "two.parquet"), image_prefix="localhost/x")
    assert env.unwrapped.task_ids() == ["astropy__astropy-12907", "django__django-11099"]
    assert env.unwrapped.get_task("astropy__astropy-12907").image.startswith("localhost/x/sweb.eval.x86_64.astropy")
    env.close()


def test_each_datasets_schema_and_image_rule(tmp_path):
    gym_rec = {**SWEBENCH_RECORD, "instance_id": "getmoto__moto-5752", "repo": "getmoto/moto"}
    rebench = {**SWEBENCH_RECORD, "instance_id": "oemof__tespy-653", "repo": "oemof/tespy",
               "docker_image": "swerebench/sweb.eval.x86_64.oemof_1776_tespy-653",
               "install_config": {"python": "3.9", "test_cmd": "pytest --no-header -rA --tb=no -p no:cacheprovider",
                                  "log_parser": "parse_log_pytest"}}
    r2e = {"repo_name": "aiohttp", "docker_image": "namanjain12/aiohttp_final:f0d74880deec8fcd982bce639c93c5e130d41198",
           "commit_hash": "f0d74880deec8fcd982bce639c93c5e130d41198", "problem_statement": "ClientSession leaks",
           "expected_output_json": json.dumps({"test_a.py::test_ok": "PASSED", "test_a.py::test_xfail": "FAILED"})}
    smith = {"instance_id": "pandas-dev__pandas.95280573.pr_53652", "repo": "swesmith/pandas-dev__pandas.95280573",
             "patch": "diff --git a/pandas/x.py b/pandas/x.py\n", "FAIL_TO_PASS": ["pandas/tests/t.py::test_x"],
             "PASS_TO_PASS": [], "image_name": "jyangballin/swesmith.x86_64.pandas-dev_1776_pandas.95280573",
             "problem_statement": "x is wrong", "created_at": "2025-01-01"}
    write_jsonl(tmp_path / "gym.jsonl", [gym_rec])
    t = load_tasks(tmp_path / "gym.jsonl", dataset="swe-gym")["getmoto__moto-5752"]
    assert t.image == "xingyaoww/sweb.eval.x86_64.getmoto_s_moto-5752:latest"
    write_jsonl(tmp_path / "mixed.jsonl", [rebench, r2e, smith])
    tasks = load_tasks(tmp_path / "mixed.jsonl", image_prefix="localhost/mirror")
    rb = tasks["oemof__tespy-653"]
    assert (rb.dataset, rb.image) == ("swe-rebench", "localhost/mirror/sweb.eval.x86_64.oemof_1776_tespy-653")
    assert rb.test_cmd.startswith("pytest --no-header -rA")
    r = tasks["aiohttp_final-f0d74880deec8fcd982bce639c93c5e130d41198"]
    assert (r.dataset, r.repo, r.base_commit, r.test_cmd) == ("r2e-gym", "aiohttp", r2e["commit_hash"], "bash run_tests.sh")
    assert r.FAIL_TO_PASS == ["test_a.py::test_ok"] and r.image.startswith("localhost/mirror/aiohttp_final:")
    s = tasks["pandas-dev__pandas.95280573.pr_53652"]
    assert (s.dataset, s.patch, s.bug_patch) == ("swe-smith", "", smith["patch"])
    assert s.image == "localhost/mirror/swesmith.x86_64.pandas-dev_1776_pandas.95280573"
    assert swebench_image("sympy__sympy-20590") == "swebench/sweb.eval.x86_64.sympy_1776_sympy-20590:latest"
    # a hub name implies its schema; a local file's name does not
    assert [kind_for_source(n) for n in ("SWE-Gym/SWE-Gym", "swe-rebench", "SWE-bench/SWE-bench_Verified")] == \
        ["swe-gym", "swe-rebench", None]
    named = write_jsonl(tmp_path / "swe-gym-like-name.jsonl", [SWEBENCH_RECORD])
    assert load_tasks(named)["astropy__astropy-12907"].dataset == "swe-bench"


def test_eval_script_comes_from_swebench_make_test_spec():
    require_module("swe-datasets", "datasets")
    from orchard_gym.envs.swe.image_eval import eval_script

    (record,) = _layout_script().records([LAYOUT_TASK])
    task = load_tasks_from_records([record], "localhost/orchard")[record["instance_id"]]
    script = eval_script(task)
    # make_test_spec: its header, and the exit-status capture it inserts before the end marker
    assert script.startswith("#!/bin/bash\nset -uxo pipefail\n")
    assert "SWEBENCH_TEST_EXIT_CODE=$?\n: '>>>>> End Test Output'\necho \">>>>> Test Exit Code: " in script
    assert "source /opt/miniconda3/bin/activate\nconda activate testbed\ncd /testbed" in script
    assert task.test_patch.splitlines()[0] in script
    # a record with a test command only (SWE-rebench): a script of the same shape; with neither: refused
    rebench = {**SWEBENCH_RECORD, "docker_image": "swerebench/x", "install_config": {"test_cmd": "pytest -rA -x"}}
    rb = load_tasks_from_records([rebench], None)["astropy__astropy-12907"]
    script = eval_script(rb)
    start, end = script.index(">>>>> Start Test Output"), script.index(">>>>> End Test Output")
    assert "pytest -rA -x" in script[start:end] and "git apply --verbose --reject -" in script[:start]
    assert f"git checkout {SWEBENCH_RECORD['base_commit']} -- astropy/modeling/tests/test_separable.py" in script
    bare = load_tasks_from_records([{**SWEBENCH_RECORD, "instance_id": "a__b-1"}], None)["a__b-1"]
    with pytest.raises(ValueError, match="ships neither an eval_script nor a test_cmd"):
        eval_script(bare)


def load_tasks_from_records(records, prefix, tmp=None):
    import tempfile
    from pathlib import Path

    folder = Path(tmp or tempfile.mkdtemp(prefix="orchard-sweb-"))
    return load_tasks(write_jsonl(folder / "records.jsonl", records), image_prefix=prefix)


# ------------------------------------------------------------------ size and malformed files
def make_records(n: int) -> list[dict]:
    hunk = "".join(f"-    old_line_{i} = compute({i})\n+    new_line_{i} = compute({i}, fixed=True)\n" for i in range(40))
    return [{**SWEBENCH_RECORD, "instance_id": f"owner__repo-{i}", "patch": SWEBENCH_RECORD["patch"] + hunk,
             "problem_statement": "word " * 400,
             "PASS_TO_PASS": json.dumps([f"tests/test_m.py::test_{j}" for j in range(300)])} for i in range(n)]


def test_a_200_instance_file_loads_and_a_malformed_one_names_its_line(tmp_path):
    good = write_jsonl(tmp_path / "good.jsonl", make_records(200))
    tasks = load_tasks(good)
    assert len(tasks) == 200 and len(tasks["owner__repo-199"].PASS_TO_PASS) == 300
    rows = [json.dumps(r) for r in make_records(200)]
    rows[136] = rows[136][:-40]  # line 137: cut short
    with pytest.raises(TaskFormatError, match=r"bad\.jsonl:137: not valid JSON"):
        load_tasks(write_jsonl(tmp_path / "bad.jsonl", rows))
    rows = make_records(5)
    rows[2]["FAIL_TO_PASS"] = 7
    del rows[3]["repo"]
    with pytest.raises(TaskFormatError) as e:
        load_tasks(write_jsonl(tmp_path / "typed.jsonl", rows))
    assert "typed.jsonl:3: task 'owner__repo-2': field 'FAIL_TO_PASS'" in str(e.value)
    assert "validation error" not in str(e.value) and "pydantic" not in str(e.value)
    with pytest.raises(TaskFormatError, match=r"typed2\.jsonl:4: task 'owner__repo-3': field 'repo': Field required"):
        load_tasks(write_jsonl(tmp_path / "typed2.jsonl", [rows[0], rows[1], rows[4], rows[3]]))
    dup = make_records(2)
    dup[1]["instance_id"] = dup[0]["instance_id"]
    with pytest.raises(TaskFormatError, match=r"dup\.jsonl:2: duplicate instance_id 'owner__repo-0'"):
        load_tasks(write_jsonl(tmp_path / "dup.jsonl", dup))


@pytest.mark.parametrize("content,expect", [
    (None, "no SWE tasks at"),
    ("", "tasks.json: not valid JSON"),
    ("[1, 2]", "item 0: a task: a task record is a JSON object, not int"),
    ("\"just a string\"", "a task record is a JSON object, not str"),
    ("{\"instance_id\": \"x\"}", "field 'repo': Field required"),
    ("{\"instance_id\": \"x\", \"repo\": \"a/b\", \"problem_statement\": \"p\", \"FAIL_TO_PASS\": \"[oops\"}",
     "field 'FAIL_TO_PASS'"),
    ("{\"instance_id\": \"x\", \"repo\": \"a/b\", \"problem_statement\": \"p\", \"FAIL_TO_PASS\": [],"
     " \"source_archive\": null, \"workdir\": null}", "needs source_archive"),
    ("{\"instance_id\": \"x\", \"repo\": \"a/b\", \"problem_statement\": \"p\", \"FAIL_TO_PASS\": [], \"workdir\": "
     "\"relative\", \"image\": \"i\", \"source_archive\": \"a.tar.gz\"}", "field 'workdir'"),
])
def test_garbage_task_files_get_readable_errors(tmp_path, content, expect):
    path = tmp_path / "tasks.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises((TaskFormatError, FileNotFoundError)) as e:
        load_tasks(path)
    assert expect in str(e.value) and "Traceback" not in str(e.value)
    with pytest.raises((TaskFormatError, FileNotFoundError)):
        gym.make("Orchard/SWE-v0", tasks=str(path))
    (tmp_path / "bin.parquet").write_bytes(b"\x00\x01 not parquet")
    with pytest.raises(Exception, match="(?i)parquet|magic"):
        load_tasks(tmp_path / "bin.parquet")
    with pytest.raises(TaskFormatError, match="no tasks found"):
        load_tasks(write_jsonl(tmp_path / "empty.jsonl", ["", "  "]))
    for bad in ({"image_prefix": 5}, {"split": ""}, {"dataset": ["swe-gym"]}):
        with pytest.raises(gym.error.Error, match=f"{next(iter(bad))} must be a non-empty string"):
            gym.make("Orchard/SWE-v0", tasks="builtin", **bad)
    with pytest.raises(TaskFormatError, match="unknown dataset kind 'nope'"):
        load_tasks(write_jsonl(tmp_path / "k.jsonl", [SWEBENCH_RECORD]), dataset="nope")


# ------------------------------------------------------------------ orchard tasks check / eval
def cli(*args):
    """`orchard ARGS` in-process (CliRunner); an exception other than the exit is a failure."""
    from click.testing import CliRunner

    from orchard_gym.cli import main

    result = CliRunner().invoke(main, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    return types.SimpleNamespace(returncode=result.exit_code, stdout=result.stdout, stderr=result.stderr)


def test_tasks_check_as_a_command():
    """The installed command (one process); a hub name without a network: a readable error, not a
    traceback (offline: no attempt to connect)."""
    r = subprocess.run([sys.executable, "-m", "orchard_gym.cli", "tasks", "check", "no-such-org/no-such-dataset"],
                       capture_output=True, text=True, cwd=REPO, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 1 and "cannot load 'no-such-org/no-such-dataset' (split 'test') from the Hugging Face hub" \
        in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_tasks_check_passes_the_builtin_tasks_and_flags_each_pitfall(tmp_path):
    ok = cli("tasks", "check", str(REPO / "envs/swe/tasks/builtin/tasks.jsonl"))
    assert ok.returncode == 0 and "10 task(s) read: 0 error(s), 0 warning(s)" in ok.stdout, ok.stdout + ok.stderr
    base = json.loads((REPO / "envs/swe/tasks/builtin/tasks.jsonl").read_text().splitlines()[1])  # semver
    base["source_archive"] = str(REPO / "envs/swe/tasks/builtin" / base["source_archive"])
    folder = tmp_path / "src"
    (folder / "semver-3.0.1" / "src").mkdir(parents=True)
    (folder / "semver-3.0.1" / "src" / "x.py").write_text("x = 1\n")
    with tarfile.open(tmp_path / "nested.tar.gz", "w:gz") as tar:
        tar.add(folder / "semver-3.0.1", arcname="semver-3.0.1")
    rows = [
        {**base, "instance_id": "no-ra", "test_cmd": "python -m pytest -p no:cacheprovider tests/test_subclass.py"},
        {**base, "instance_id": "spaces", "PASS_TO_PASS": ["tests/t.py::test_x[a b]"]},
        {**base, "instance_id": "tmp-cache", "env": {"XDG_CACHE_HOME": "/tmp/cache"}},
        {**base, "instance_id": "nested", "source_archive": str(tmp_path / "nested.tar.gz")},
        {**base, "instance_id": "gold-edits-tests", "patch": base["test_patch"]},
        {**base, "instance_id": "bad-field", "FAIL_TO_PASS": {"not": "a list"}},
    ]
    r = cli("tasks", "check", str(write_jsonl(tmp_path / "mine.jsonl", rows)))
    out = r.stdout + r.stderr
    assert r.returncode == 1 and "6 task(s) read: 1 error(s), 6 warning(s)" in out, out  # nested: also its gold paths
    for needle in ("mine.jsonl:1: task 'no-ra': test_cmd runs pytest without -rA",
                   "mine.jsonl:2: task 'spaces': 1 test id(s) with spaces",
                   "mine.jsonl:3: task 'tmp-cache': /tmp in env XDG_CACHE_HOME",
                   "mine.jsonl:4: task 'nested': source_archive has one top-level folder semver-3.0.1/",
                   "mine.jsonl:5: task 'gold-edits-tests': the gold patch changes protected path",
                   "mine.jsonl:6: task 'bad-field': field 'FAIL_TO_PASS': Input should be a valid list"):
        assert needle in out, (needle, out)
    assert [line.split(":")[0] for line in out.splitlines() if "'bad-field'" in line] == ["error"]
    assert "Traceback" not in out
    strict = cli("tasks", "check", "--strict", str(write_jsonl(tmp_path / "warn.jsonl", rows[:1])))
    assert strict.returncode == 1 and "0 error(s), 1 warning(s)" in strict.stdout


@pytest.mark.parametrize("args,expect", [
    (["tasks", "check", "/no/such/file.jsonl"], "no SWE tasks at /no/such/file.jsonl"),
    (["tasks", "check"], "Missing argument"),
    (["tasks", "check", "--dataset", "nope", "README.md"], "error"),
    (["tasks", "explode"], "No such command"),
    (["eval", "--tasks", "/no/such/file.jsonl"], "--tasks"),
])
def test_tasks_cli_garbage(args, expect, tmp_path):
    r = cli(*args)
    assert r.returncode != 0 and expect in r.stdout + r.stderr and "Traceback" not in r.stderr, r.stderr


def test_orchard_eval_names_the_bad_line_of_a_task_file(tmp_path):
    rows = [json.dumps(r) for r in make_records(3)]
    rows[1] = "{broken"
    r = cli("eval", "--tasks", str(write_jsonl(tmp_path / "t.jsonl", rows)), "--split", "test")
    assert r.returncode == 2 and "t.jsonl:2: not valid JSON" in r.stderr and "Traceback" not in r.stderr, r.stderr


# ------------------------------------------------------------------ the SWE-bench image layout on docker
@functools.cache
def layout_image_missing() -> str | None:
    from conftest import docker_engine

    gateway, why_not = docker_engine()
    if gateway is None:
        return why_not
    script = _layout_script()
    task = load_tasks("builtin")[LAYOUT_TASK]
    image = script.image_name(script.instance_id(task))
    if subprocess.run(["podman", "image", "exists", image], capture_output=True).returncode != 0:
        return f"{image} missing (python scripts/build_swebench_layout_images.py)"
    return None


PASS_ALL = """\

@__import__("pytest").hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    outcome.get_result().outcome = "passed"
"""


@pytest.mark.docker
@needs("swe-images", layout_image_missing())
def test_swebench_layout_image_gold_resolves_and_empty_does_not(tmp_path):
    """A built-in task as a SWE-bench record and image (/testbed, conda activation): graded by
    swebench's eval script in a fresh container, gold 1.0, no change 0.0."""
    require_module("swe-datasets", "datasets")
    from orchard_gym import AsyncSandboxClient
    from orchard_gym.envs.swe.env import SWEEnv

    (record,) = _layout_script().records([LAYOUT_TASK])
    source = write_jsonl(tmp_path / "sweb.jsonl", [record])
    iid = record["instance_id"]

    async def episode(actions):
        async with AsyncSandboxClient({"type": "docker", "pull": "never"}) as client:
            env = SWEEnv(client=client, tasks=str(source), image_prefix="localhost/orchard")
            obs, _ = await env.areset(options={"task_id": iid})
            seen = []
            for action in actions:
                obs, reward, terminated, truncated, info = await env.astep(action)
                seen.append(obs)
            await env.aclose()
            return reward, info["report"], seen

    gold_apply = {"name": "bash", "arguments": {
        "command": f"which python && pwd && git apply <<'EOF_PATCH'\n{record['patch']}\nEOF_PATCH"}}

    plant_conftest = {"name": "bash", "arguments": {"command": (
        f"git apply <<'EOF_PATCH'\n{record['test_patch']}\nEOF_PATCH\ncat >> tests/conftest.py <<'EOF'\n{PASS_ALL}EOF\n"
        "PYTHONPATH=src python -m pytest -rA -q tests/test_subclass.py | tail -1")}}

    async def both():
        return await asyncio.gather(episode([gold_apply, {"name": "submit"}]),
                                    episode([plant_conftest, {"name": "submit"}]))

    (gold, gold_report, gold_obs), (empty, empty_report, planted) = asyncio.run(both())
    assert "/opt/miniconda3/envs/testbed/bin/python\n/testbed" in gold_obs[0]  # the policy's shell: env activated
    # no fix, but the test patch and a conftest.py that passes every test: in its own sandbox the F2P test passes...
    assert "2 passed" in planted[0] and "failed" not in planted[0], planted[0]
    # ...and grading drops it
    assert gold == 1.0 and gold_report["resolved"], gold_report
    assert gold_report["graded_in"] == "fresh_sandbox"
    # the tamper defence ran its verdict run through the same eval script, and agreed
    assert gold_report["tampering"] == [] and gold_report["verdicts"]["status"] == "RESOLVED_FULL", gold_report
    assert gold_report["tests_status"]["FAIL_TO_PASS"]["success"] == json.loads(record["FAIL_TO_PASS"])
    # the output came from swebench's script: its markers and recorded exit status
    assert ">>>>> Test Exit Code: 0" in gold_report["test_output_tail"]
    assert "conda activate testbed" in gold_report["test_output_tail"]
    assert empty == 0.0 and not empty_report["resolved"] and "error_kind" not in empty_report, empty_report
    assert {"path": "tests/conftest.py", "reason": "conftest.py"} in empty_report["dropped"]
    assert empty_report["tests_status"]["FAIL_TO_PASS"]["failure"] == json.loads(record["FAIL_TO_PASS"])
    assert ">>>>> Test Exit Code: 1" in empty_report["test_output_tail"]
