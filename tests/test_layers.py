"""The layers of docs/architecture.md: no module imports one of a layer above its own.

Every import in the tree counts (module level, inside functions, under TYPE_CHECKING), parsed
with `ast`, nothing imported. The few lower-to-higher imports the design keeps are listed in
EXCEPTIONS, each with its reason; each must stay lazy (inside a function, so importing the
lower module never loads the higher one) and must still exist (no stale entries).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# the repository's top-level folders, as the installed package names them (pyproject.toml)
FOLDERS = {"orchard_gym": "orchard_gym", "backends": "orchard_gym.backends", "envs": "orchard_gym.envs",
           "wrappers": "orchard_gym.wrappers", "algos": "orchard_gym.algos"}

# layer -> the layers it may import (besides its own); bottom to top, as docs/architecture.md draws them
MAY_IMPORT: dict[str, set[str]] = {
    "agent": set(),  # runs inside sandboxes: stdlib only, nothing of the package
    "ground": {"agent"},
    "backends": {"ground", "agent"},
    "service": {"ground", "agent", "backends"},
    "envs": {"ground", "agent", "backends"},
    "wrappers": {"ground", "agent", "backends", "envs"},
    "integrations": {"ground", "agent", "backends", "envs", "wrappers"},
    "algos": {"ground", "agent", "backends", "envs", "wrappers"},
    "cli": {"ground", "agent", "backends", "service", "envs", "wrappers", "integrations", "algos"},
}

# (file, imported package) -> why the design keeps this import of a higher layer. Short on purpose.
EXCEPTIONS = {
    ("orchard_gym/client.py", "orchard_gym.backends"):
        "the SDK's in-process mode builds the backend its config names (remote mode never loads backends)",
    ("orchard_gym/registration.py", "orchard_gym.wrappers"):
        "gym.make(ENV, harness=...) wraps the env in a HarnessEnv (env ids name their envs by string)",
}


def layer_of(module: str) -> str | None:
    """The layer of a dotted module name of the package (None: not ours)."""
    parts = module.split(".")
    if parts[0] != "orchard_gym":
        return None
    second = parts[1] if len(parts) > 1 else ""
    if second in ("backends", "envs", "wrappers", "algos", "service", "integrations", "agent"):
        return second
    if second == "cli":  # the orchard_gym/cli/ folder
        return "cli"
    return "ground"


def module_name(root: Path, path: Path) -> str | None:
    rel = path.relative_to(root)
    package = FOLDERS.get(rel.parts[0])
    if package is None:
        return None
    inner = list(rel.with_suffix("").parts[1:])
    if inner and inner[-1] == "__init__":
        inner = inner[:-1]
    return ".".join([package, *inner])


def imports(path: Path, module: str) -> list[tuple[str, int, bool]]:
    """(imported module, line, lazy) for every import of `path`; `lazy`: inside a function."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                out.extend((alias.name, child.lineno, lazy) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = package.split(".")
                    parts = parts[: len(parts) - (child.level - 1)]
                    base = ".".join(parts + ([base] if base else []))
                for top, name in FOLDERS.items():  # an import by the repository's folder name
                    if top != "orchard_gym" and (base == top or base.startswith(top + ".")):
                        base = name + base[len(top):]
                out.extend((f"{base}.{alias.name}", child.lineno, lazy) for alias in child.names)
            visit(child, inner)

    visit(tree, False)
    return out


def scan(root: Path) -> tuple[list[str], set[tuple[str, str]]]:
    """(violations as 'file:line: layer imports module (layer)', the exceptions used)."""
    violations, used = [], set()
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            module = module_name(root, path)
            layer = layer_of(module) if module else None
            if layer is None:
                continue
            rel = path.relative_to(root).as_posix()
            for target, line, lazy in imports(path, module):
                other = layer_of(target)
                if other is None or other == layer or other in MAY_IMPORT[layer]:
                    continue
                key = (rel, f"orchard_gym.{target.split('.')[1]}")
                if key in EXCEPTIONS and lazy:
                    used.add(key)
                    continue
                why = " (a listed exception, but at module level: keep it inside a function)" if key in EXCEPTIONS else ""
                violations.append(f"{rel}:{line}: {layer} imports {target} ({other}){why}")
    return violations, used


def test_no_lower_layer_imports_a_higher_one():
    violations, used = scan(ROOT)
    assert not violations, "imports of a higher layer (docs/architecture.md):\n" + "\n".join(violations)
    assert used == set(EXCEPTIONS), f"stale exceptions, no longer needed: {sorted(set(EXCEPTIONS) - used)}"


def test_the_check_catches_a_deliberate_violation(tmp_path):
    """The same scan over a small tree with one ground-floor module importing the trainers, one
    envs module importing a wrapper, and a listed exception moved to module level."""
    (tmp_path / "orchard_gym" / "cli").mkdir(parents=True)
    (tmp_path / "envs").mkdir()
    (tmp_path / "orchard_gym" / "models.py").write_text("from orchard_gym.algos.grpo import AgentGRPOArgs\n")
    (tmp_path / "orchard_gym" / "client.py").write_text("from orchard_gym.backends.config import parse_backend_config\n")
    (tmp_path / "orchard_gym" / "cli" / "commands.py").write_text("from orchard_gym.algos import grpo\n")  # the top room: fine
    (tmp_path / "envs" / "base.py").write_text("def f():\n    from ..wrappers.timeout import WallClockTimeout\n")
    violations, _ = scan(tmp_path)
    assert sorted(v.split(":")[0] for v in violations) == ["envs/base.py", "orchard_gym/client.py",
                                                          "orchard_gym/models.py"], violations
    assert any("ground imports orchard_gym.algos.grpo.AgentGRPOArgs (algos)" in v for v in violations)
    assert any("envs imports orchard_gym.wrappers.timeout.WallClockTimeout (wrappers)" in v for v in violations)
    assert any("at module level" in v for v in violations)
