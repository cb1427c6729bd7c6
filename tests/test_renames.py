"""Modules and names moved by job (docs/architecture.md) still work under their old names: a
moved module under its old import path (orchard_gym/moved.py's MOVED) warns (DeprecationWarning)
and is the same module; a name re-exported from its old home is the same object; the new paths
do not warn, and no file of the tree imports an old path."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from orchard_gym.moved import MOVED, new_name, old_name

ROOT = Path(__file__).resolve().parent.parent
SUBMODULES = {"orchard_gym.wrappers.harnesses.codex": "orchard_gym.wrappers.harness.plugins.codex"}  # inside an old package


def _fresh(name: str) -> None:
    """Forget `name` (and the modules under it) as imported, so the next import runs the import hook."""
    for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
        if new_name(key) is not None:
            del sys.modules[key]


@pytest.mark.parametrize("old, new", sorted({**MOVED, **SUBMODULES}.items()))
def test_a_moved_module_warns_and_is_the_new_one(old, new):
    _fresh(old)
    with pytest.warns(DeprecationWarning, match=f"^{old.replace('.', r'[.]')} is now {new.replace('.', r'[.]')}$"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert sys.modules[old] is module  # one module object under both names, not a second copy


def test_an_old_path_warns_at_the_importing_line_and_from_imports_work():
    _fresh("orchard_gym.wrappers.records")
    _fresh("orchard_gym.cli_exit")
    with pytest.warns(DeprecationWarning) as caught:
        from orchard_gym.cli_exit import exit_if_failed
        from orchard_gym.wrappers.records import RolloutStore
    assert {w.filename for w in caught} == {__file__}, [(w.filename, str(w.message)) for w in caught]
    from orchard_gym.cli.exit import exit_if_failed as new_exit
    from orchard_gym.wrappers.proxy.records import RolloutStore as new_store
    assert exit_if_failed is new_exit and RolloutStore is new_store


def test_old_module_names_of_the_cli_package_warn_and_resolve():
    import orchard_gym.cli
    from orchard_gym.cli.commands import eval_cmd

    with pytest.warns(DeprecationWarning, match=r"^orchard_gym[.]cli[.]eval_cmd is now orchard_gym[.]cli[.]commands[.]eval_cmd$"):
        assert orchard_gym.cli.eval_cmd is eval_cmd
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from orchard_gym.cli import main  # the package's own name: no warning
    assert main is orchard_gym.cli.commands.main


@pytest.mark.parametrize("bad", ["no_such_command", "__no_such_dunder__", "", "eval_cmd.x"])
def test_an_unknown_name_of_an_old_package_is_an_attribute_error(bad):
    import orchard_gym.cli

    with pytest.raises(AttributeError, match="orchard_gym.cli"):
        getattr(orchard_gym.cli, bad)
    with pytest.raises(AttributeError, match="has no attribute"):
        old_name("orchard_gym.not_a_moved_package", "main")


@pytest.mark.parametrize("bad", ["orchard_gym.wrappers.harnesses.no_such_plugin", "orchard_gym.wrappers.proxy_nothing",
                                 "orchard_gym.cli_nothing"])
def test_an_unknown_old_path_is_module_not_found(bad):
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(bad)
    assert bad not in sys.modules


@pytest.mark.parametrize("bad", ["", ".", "orchard_gym", "orchard_gym.", "orchard_gymX.cli_exit", "os.path", "orchard_gym.cli_exitX",
                                 "orchard_gym.wrappers.harnessesX", "\x00", "orchard_gym.images.."])
def test_names_that_are_no_old_path(bad):
    assert new_name(bad) is None


def test_the_new_paths_import_without_a_deprecation_warning():
    """A fresh interpreter imports every new path (and the package names the old code used):
    none of our DeprecationWarnings fires."""
    probe = (
        "import importlib, json, warnings\n"
        "warnings.simplefilter('always')\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        f"    for name in {sorted(set(MOVED.values()) | set(SUBMODULES.values()))!r}:\n"
        "        importlib.import_module(name)\n"
        "    from orchard_gym.cli import main\n"
        "    from orchard_gym.wrappers.proxy import ProxyConfig, RecordingProxy, default_socket_dir, StubUpstream\n"
        "    from orchard_gym.wrappers.harness import MINI_SWE_AGENT, Harness, ShippedVenv, all_harnesses, get_harness\n"
        "    from orchard_gym.wrappers import HarnessEnv, reconstruct, RolloutStore, EchoEnv\n"
        "print(json.dumps([str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    ours = [m for m in json.loads(out.stdout.splitlines()[-1]) if " is now orchard_gym." in m]
    assert not ours, ours


def test_no_file_of_the_tree_imports_an_old_path():
    """Every import statement of the tree (the package folders, tests, scripts) names new paths;
    the old ones are for code outside the tree."""
    folders = {"orchard_gym": "orchard_gym", "backends": "orchard_gym.backends", "envs": "orchard_gym.envs",
               "wrappers": "orchard_gym.wrappers", "algos": "orchard_gym.algos"}
    stale = []
    for top in [*folders, "tests", "scripts"]:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if rel.as_posix() == "tests/test_renames.py":  # imports old paths on purpose
                continue
            module = ".".join([folders.get(top, top), *rel.with_suffix("").parts[1:]])
            package = module if path.name == "__init__.py" else module.rpartition(".")[0]
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    base = node.module or ""
                    if node.level:
                        parts = package.split(".")
                        base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
                    names = [base] + [f"{base}.{a.name}" for a in node.names]
                else:
                    continue
                stale += [f"{rel}:{node.lineno}: {n} (now {new_name(n)})" for n in names if new_name(n)]
    assert not stale, "\n".join(stale)


def test_old_paths_run_as_scripts_and_the_cli_runs_as_a_package():
    """`python -m OLD` runs the new module; `python -m orchard_gym.cli` is the `orchard` command."""
    stub = subprocess.run([sys.executable, "-m", "orchard_gym.wrappers.stub", "--help"], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert stub.returncode == 0 and "stub server" in stub.stdout, stub.stderr
    cli = subprocess.run([sys.executable, "-m", "orchard_gym.cli", "--help"], capture_output=True, text=True, timeout=300,
                         cwd=ROOT)
    assert cli.returncode == 0 and "python -m orchard_gym.cli" in cli.stdout and "eval" in cli.stdout, cli.stderr


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
