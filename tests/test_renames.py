"""Modules and names moved by job (docs/architecture.md) still work under their old names: a
moved module under its old import path warns (DeprecationWarning) and is the same module; a name
re-exported from its old home is the same object."""

from __future__ import annotations

import importlib
import sys
import warnings

import pytest


@pytest.mark.parametrize("old, new", [("orchard_gym.algos.pool", "orchard_gym.algos.trajectory_pool"),
                                      ("orchard_gym.images", "orchard_gym.screenshots")])
def test_a_moved_module_warns_and_is_the_new_one(old, new):
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=new.replace(".", r"\.")):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)


@pytest.mark.parametrize("old, new, name", [
    ("orchard_gym.envs.rollout", "orchard_gym.envs.episode", "play"),
    ("orchard_gym.envs.rollout", "orchard_gym.envs.episode", "assistant_message"),
    ("orchard_gym.envs.claw.tasks", "orchard_gym.envs.claw.task_model", "ClawTask"),
    ("orchard_gym.envs.gui.oracles", "orchard_gym.envs.gui.oracle_page", "ORACLES"),
    ("orchard_gym.backends.docker", "orchard_gym.backends.owners", "owner_identity"),
    ("orchard_gym.algos.agent_rollout", "orchard_gym.algos.chat_render", "ChatRenderer"),
    ("orchard_gym.wrappers.proxy.openai_format", "orchard_gym.chat", "assistant_message"),
    ("orchard_gym.wrappers.proxy.openai_format", "orchard_gym.chat", "FormatError"),
])
def test_a_moved_name_is_still_in_its_old_home(old, new, name):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a re-export is no deprecation
        assert getattr(importlib.import_module(old), name) is getattr(importlib.import_module(new), name)


def test_the_built_in_harnesses_are_found_from_either_module():
    from orchard_gym.wrappers.harness import MINI_SWE_AGENT, all_harnesses, get_harness
    from orchard_gym.wrappers.harness.plugins import builtin_harnesses

    assert {"mini-swe-agent", "codex", "claude-code"} <= set(all_harnesses())
    assert set(builtin_harnesses()) == set(all_harnesses())
    assert get_harness("mini-swe-agent") == MINI_SWE_AGENT
