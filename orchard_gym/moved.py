"""Old import paths of moved modules (docs/architecture.md): one map and one import hook.

Importing a module by its old path (a key of MOVED, or a module inside an old package path)
warns (DeprecationWarning, pointing at the importing line) and gives the module at its new
path: the same module object, never a second copy. `python -m OLD` runs the new module.
`install()` (called by `orchard_gym/__init__.py`) puts the hook first on `sys.meta_path`, so an
old path inside an old package (`orchard_gym.wrappers.harnesses.codex`) is never loaded again
from the new package's folder.

A module that became a package of the same name (`orchard_gym.cli`) keeps its public names in
the package; its other old names are found by `old_name` (OLD_NAMES says where they live now).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import CodeType, ModuleType
from typing import Any

_W = "orchard_gym.wrappers"

# old module -> new module; a package's submodules follow it
MOVED: dict[str, str] = {
    # the CLI: orchard_gym/cli/ (orchard_gym.cli itself is now that package)
    **{f"orchard_gym.cli_{m}": f"orchard_gym.cli.{m}" for m in ("exit", "export", "harness", "tasks", "value", "view")},
    # the recording proxy: wrappers/proxy/ (orchard_gym.wrappers.proxy itself is now that package)
    f"{_W}.proxy_app": f"{_W}.proxy.app",
    f"{_W}.proxy_calls": f"{_W}.proxy.calls",
    f"{_W}.proxy_models": f"{_W}.proxy.models",
    **{f"{_W}.{m}": f"{_W}.proxy.{m}"
       for m in ("relay", "records", "reconstruct", "openai_format", "anthropic_format", "stub")},
    # the harnesses: wrappers/harness/ (orchard_gym.wrappers.harness itself is now that package)
    **{f"{_W}.harness_{m}": f"{_W}.harness.{m}" for m in ("env", "eval", "install", "python")},
    f"{_W}.harnesses": f"{_W}.harness.plugins",
    # renamed earlier (their names read as something else)
    "orchard_gym.images": "orchard_gym.screenshots",
    "orchard_gym.algos.pool": "orchard_gym.algos.trajectory_pool",
    "orchard_gym.service.agents": "orchard_gym.agent_pool",  # moved down: the SDK's control plane uses it too
}

# old module, now a package of the same name -> the module holding the rest of its old names
OLD_NAMES: dict[str, str] = {
    "orchard_gym.cli": "orchard_gym.cli.commands",
}


def new_name(old: str) -> str | None:
    """The new path of an old module path (None: not moved)."""
    if not old.startswith("orchard_gym.") or not all(part.isidentifier() for part in old.split(".")):
        return None
    head, tail = old, ""
    while head:
        if head in MOVED:
            return MOVED[head] + tail
        head, dot, last = head.rpartition(".")
        tail = f"{dot}{last}{tail}"
    return None


def _warn(old: str, new: str) -> None:
    # stacklevel 3: past this helper and the hook's method to the importing line (the import
    # system's own frames are skipped by `warnings`)
    warnings.warn(f"{old} is now {new}", DeprecationWarning, stacklevel=3)


class _OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """The import hook: an old path loads as a placeholder that puts the new module in its place."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        new = new_name(fullname)
        if new is None:
            return None
        found = importlib.util.find_spec(new)  # imports the new path's parent packages, not the module
        if found is None:
            return None  # no such module under the new path either: the old one is not found
        return importlib.util.spec_from_loader(fullname, self, origin=found.origin)  # origin: `python -m OLD`'s argv[0]

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # a placeholder, replaced by exec_module

    def exec_module(self, module: ModuleType) -> None:
        old = module.__name__
        new = new_name(old)
        assert new is not None
        _warn(old, new)
        # the import system returns what sys.modules holds under the old name once this returns
        sys.modules[old] = importlib.import_module(new)

    def get_code(self, fullname: str) -> CodeType | None:  # `python -m OLD` (runpy)
        new = new_name(fullname)
        assert new is not None
        _warn(fullname, new)
        spec = importlib.util.find_spec(new)
        if spec is None or not isinstance(spec.loader, importlib.abc.InspectLoader):
            raise ImportError(f"{fullname} is now {new}, which has no code to run", name=fullname)
        return spec.loader.get_code(new)


_HOOK = _OldPaths()


def install() -> None:
    """Put the hook first on sys.meta_path (once)."""
    if not any(isinstance(finder, _OldPaths) for finder in sys.meta_path):
        sys.meta_path.insert(0, _HOOK)


def old_name(package: str, name: str) -> Any:
    """`package.name` where `package` is an old module that became a package (its `__getattr__`):
    the name from the module that holds it now, with a DeprecationWarning."""
    home = OLD_NAMES.get(package)
    if home is None or name.startswith("__"):
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(home), name)
    except AttributeError:
        raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
    warnings.warn(f"{package}.{name} is now {home}.{name}", DeprecationWarning, stacklevel=3)
    return value
