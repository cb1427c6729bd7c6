"""The tier table (tests/tiers.py) names only tests that exist, and the hook marks what it says."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from tiers import FULL_ONLY_COMPONENTS, SLOW, cost_of, group_of, why_slow

from conftest import REPO
from components import COMPONENTS


@pytest.mark.parametrize("entry", sorted(SLOW))
def test_every_slow_entry_names_a_test_that_exists(entry):
    module, _, name = entry.partition("::")
    path = REPO / module
    assert path.is_file(), f"tests/tiers.py SLOW: {module} does not exist (moved? update the table)"
    if name:
        test = name.split("[")[0]
        assert re.search(rf"^(async )?def {re.escape(test)}\(", path.read_text(), re.M), \
            f"tests/tiers.py SLOW: no test {test} in {module} (renamed? update the table)"


def test_full_only_components_are_known():
    assert FULL_ONLY_COMPONENTS <= set(COMPONENTS)


class _Item:
    def __init__(self, nodeid, *marks):
        self.nodeid, self.marks = nodeid, marks

    def get_closest_marker(self, name):
        return next((m for m in self.marks if m.name == name), None)

    def iter_markers(self, name):
        return (m for m in self.marks if m.name == name)


def test_the_hook_sends_containers_heavy_components_and_listed_tests_to_the_full_suite():
    from components import needs

    assert why_slow(_Item("tests/test_x.py::test_a")) is None
    assert why_slow(_Item("tests/test_x.py::test_a[docker]", pytest.mark.docker.mark))
    assert why_slow(_Item("tests/test_x.py::test_a", needs("gui", "").mark))
    assert why_slow(_Item("tests/test_x.py::test_a", needs("bwrap", "").mark)) is None
    assert why_slow(_Item("tests/test_train_grpo.py::test_anything"))
    assert why_slow(_Item("tests/test_conformance.py::test_memory_limit[local-bwrap]"))
    assert why_slow(_Item("tests/test_conformance.py::test_memory_limit_other[local-bwrap]")) is None


def test_groups_are_modules_podman_and_docs_pages_with_slow_tests_costing_more():
    assert group_of(_Item("tests/test_x.py::test_a")) == group_of(_Item("tests/test_x.py::test_b[1]")) == "tests/test_x.py"
    assert group_of(_Item("tests/test_x.py::test_a[docker]", pytest.mark.docker.mark)) == "podman"
    docs = "tests/test_docs_examples.py"
    page = group_of(_Item(f"{docs}::test_doc_example[docs/a.md:12]"))
    assert page == group_of(_Item(f"{docs}::test_doc_example[docs/a.md:140]")) == f"{docs}::docs/a.md"
    assert group_of(_Item(f"{docs}::test_doc_example[README.md:9]")) == f"{docs}::README.md"
    assert group_of(_Item(f"{docs}::test_every_block_is_labelled_and_marked_well")) == docs
    assert cost_of(_Item("tests/test_x.py::test_a", pytest.mark.slow.mark)) > cost_of(_Item("tests/test_x.py::test_a"))


def test_measured_durations_order_the_groups_and_the_log_parser_reads_them(tmp_path, monkeypatch):
    """A test tests/durations.json lists costs what it measured; one it does not list, the floor
    (a fast one: the run listed every test over its --durations-min); garbage there: the guess."""
    import json

    import tiers

    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from test_durations import main, parse
    finally:
        sys.path.remove(str(REPO / "scripts"))
    log = ["1796324133 61.96s call     tests/test_a.py::test_b[x y]", "0.51s setup    tests/test_a.py::test_b[x y]",
           "12.00s call     tests/test_a.py::test_c", "============ slowest durations ====", "garbage 3s call"]
    assert parse(log) == {"tests/test_a.py::test_b[x y]": 62.5, "tests/test_a.py::test_c": 12.0}
    assert main([str(tmp_path / "missing.log")]) == 2 and main([]) == 2
    (tmp_path / "empty.log").write_text("nothing here\n")
    assert main([str(tmp_path / "empty.log")]) == 1
    for text, long, short in ((json.dumps(parse(log)), 62.5, tiers.MEASURED_FLOOR),
                              ("[not a dict", tiers.FAST_COST, tiers.FAST_COST)):
        (tmp_path / "durations.json").write_text(text)
        monkeypatch.setattr(tiers, "DURATIONS", str(tmp_path / "durations.json"))
        monkeypatch.setattr(tiers, "_measured", None)
        assert cost_of(_Item("tests/test_a.py::test_b[x y]")) == long
        assert cost_of(_Item("tests/test_a.py::test_other")) == short


def test_loadgroup_keeps_each_module_in_one_worker_in_order():
    """pytest 9 broke xdist's own `--dist loadgroup` (it appends the group to `Item._nodeid`, which
    pytest 9 no longer reads): every test was scheduled alone, and a docs page's blocks ran in two
    workers. tiers.py's scheduler groups them again."""
    # two quick modules (this one's other tests are file reads): the child runs cost their start-ups
    modules, others = ["tests/test_http1.py", "tests/test_tiers.py"], "not test_loadgroup"
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup",
                        "-v", "-k", others, *modules], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:]
    ran: dict[str, list[tuple[str, str]]] = {}
    for line in r.stdout.splitlines():
        m = re.match(r"\[(gw\d+)\] \[ *\d+%\] (?:PASSED|FAILED|SKIPPED|ERROR) (tests/[^:]+)::(.+?) *$", line)
        if m:
            ran.setdefault(m.group(2), []).append((m.group(1), m.group(3)))
    assert sorted(ran) == modules, r.stdout[-3000:]
    listed = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q",
                             "-k", others, *modules], cwd=REPO, capture_output=True, text=True, timeout=300).stdout
    for module, runs in ran.items():
        assert len({worker for worker, _ in runs}) == 1, (module, runs)
        assert len(runs) > 3, runs
        assert [name for _, name in runs] == [line.split("::", 1)[1] for line in listed.splitlines()
                                              if line.startswith(module + "::")]
