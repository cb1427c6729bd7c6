"""The tier table (tests/tiers.py) names only tests that exist, and the hook marks what it says."""

from __future__ import annotations

import re

import pytest
from tiers import FULL_ONLY_COMPONENTS, SLOW, why_slow

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
