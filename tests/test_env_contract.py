"""The env core's contract (envs/base.py): no module outside an env's own class reads or sets
its `_`-prefixed state. Drivers, forking, wrappers and tests use the public contract (`ctx`,
`done`, `elapsed`, `client`, `release_sandbox()`, `clone()`, `arestore()`, `snapshots`, ...).

Parsed with `ast`, nothing imported. A private attribute counts as an env's when it is read
off something named like an env (`env._x`, `self.env._x`, `task_env._x`, `root_env._x`), or
when its name is one of the private attributes `SandboxEnv` itself defines (`child._done`, on
any receiver but `self`/`cls`/`super()`); `getattr`/`hasattr`/`setattr` with such a name count too, and
so does an env's `__dict__`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORE = "envs/base.py"
FOLDERS = ("orchard_gym", "backends", "envs", "wrappers", "algos", "scripts", "tests")
# (file, expression) -> why it is not an env's private state. Short on purpose.
NOT_AN_ENV = {
    ("tests/test_integrations_trl.py", "env._episode"): "TRL's OrchardEnvironment: the test kills the sandbox under it",
    ("tests/test_integrations_gui.py", "env._episode"): "TRL's OrchardEnvironment: the oracle reads its episode's page",
    ("tests/test_integrations_gui.py", "env._observation"): "the OpenEnv-v0 client env's decoding, tested without a server",
}
ENV_NAME = re.compile(r"(^|_)env$|^env_|_env_")  # env, task_env, root_env, self.env, env_2 ...


def core_private_names(root: Path) -> set[str]:
    """The `_x` attributes and methods SandboxEnv defines (and gymnasium's `_np_random`)."""
    tree = ast.parse((root / CORE).read_text())
    names = {"_np_random"}
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SandboxEnv"):
        for node in ast.walk(cls):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(node.name):
                names.add(node.name)
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
                    and isinstance(node.ctx, ast.Store) and _private(node.attr)):
                names.add(node.attr)
    return names


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _receiver(node: ast.expr) -> str | None:
    """The last name of an attribute's receiver: `env` of `env`, `task_env` of `self.task_env`."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "unwrapped":
        return "env"
    return None


def _env_like(node: ast.expr) -> bool:
    name = _receiver(node)
    if isinstance(node, ast.Attribute) and node.attr == "unwrapped":  # env.unwrapped._x
        return True
    return name is not None and bool(ENV_NAME.search(name))


def violations(root: Path, source: str, path: str, core: set[str]) -> list[str]:
    """`path:line: what` for every touch of an env's private state in `source`."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute):
            value = node.value
            if isinstance(value, ast.Name) and value.id in ("self", "cls"):
                continue
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super":
                continue  # a subclass calling its own base: the env's own class
            if (_private(node.attr) and (_env_like(value) or node.attr in core)) or \
                    (node.attr == "__dict__" and _env_like(value)):
                out.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) >= 2):
            target, name = node.args[0], node.args[1]
            if (isinstance(name, ast.Constant) and isinstance(name.value, str) and _private(name.value)
                    and not (isinstance(target, ast.Name) and target.id in ("self", "cls"))
                    and (_env_like(target) or name.value in core)):
                out.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    return out


def tree_violations(root: Path) -> list[str]:
    core = core_private_names(root)
    found = []
    for folder in FOLDERS:
        for file in sorted((root / folder).rglob("*.py")):
            rel = file.relative_to(root).as_posix()
            if rel == CORE or "/sandbox/" in rel:  # the core itself; code that runs inside sandboxes
                continue
            found += [v for v in violations(root, file.read_text(), rel, core)
                      if (rel, v.split(": ", 1)[1]) not in NOT_AN_ENV]
    return found


def test_no_module_touches_an_envs_private_state():
    found = tree_violations(ROOT)
    assert not found, ("these reach into an env's private state; use (or add to) the public contract of "
                       "envs/base.py instead:\n" + "\n".join(found))


def test_no_stale_exceptions():
    for (path, expr), why in NOT_AN_ENV.items():
        assert expr in (ROOT / path).read_text(), f"{path} no longer has {expr} ({why}): drop the entry"


def test_the_core_private_names_are_found():
    names = core_private_names(ROOT)
    assert {"_done", "_started", "_last_obs", "_client", "_info", "_finish"} <= names
    assert "ctx" not in names and "release_sandbox" not in names  # public parts of the contract


@pytest.mark.parametrize("line", [
    "env._done", "self.env._ctx", "task_env._release_sandbox()", "root_env._started", "child._done",
    "parent._last_obs", "env.unwrapped._ctx", "x = getattr(env, '_last_obs', '')", "hasattr(target, '_finish')",
    "env.__dict__['_snapshots']", "env._ctx = None", "self.task_env._get_client()",
])
def test_each_way_of_reaching_in_is_caught(line):
    assert violations(ROOT, line, "m.py", core_private_names(ROOT)), line


@pytest.mark.parametrize("line", [
    "self._done", "env.done", "env.ctx.state", "self.env.release_sandbox()", "client._snapshots",
    "getattr(env, 'trajectory', None)", "cls._registry", "proxy._loop", "super()._info(step=1)",
])
def test_public_and_unrelated_attributes_pass(line):
    assert not violations(ROOT, line, "m.py", core_private_names(ROOT)), line
