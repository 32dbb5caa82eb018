"""The layers import downward only: every import statement of the lower packages, at any depth (a lazy import inside
a function counts too), names nothing of this repository above its layer (docs/architecture.md).

    common/         nothing of ours
    driving_data/   common/
    policies/       common/
    envs/           common/, driving_data/
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ALLOWED = {
    "common": {"common"},
    "driving_data": {"common", "driving_data"},
    "policies": {"common", "policies"},
    "envs": {"common", "driving_data", "envs"},
}


def _ours() -> set[str]:
    """Top-level names this repository defines: its packages and its root scripts."""
    return {p.parent.name for p in REPO.glob("*/__init__.py")} | {p.stem for p in REPO.glob("*.py")}


def _imported(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, top-level module) of every absolute import in the tree; relative ones stay in their package."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name.split(".")[0]) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
        elif isinstance(node, ast.Call) and _called(node) == "import_module":  # importlib.import_module("envs.x")
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                found.append((node.lineno, node.args[0].value.split(".")[0]))
    return found


def _called(call: ast.Call) -> str | None:
    return getattr(call.func, "attr", getattr(call.func, "id", None))


def upward_imports(package: str) -> list[str]:
    """``file:line imports name`` for every import of ``package`` that reaches above its layer."""
    ours = _ours()
    bad = []
    for path in sorted((REPO / package).rglob("*.py")):
        for line, name in _imported(ast.parse(path.read_text(), str(path))):
            if name in ours and name not in ALLOWED[package]:
                bad.append(f"{path.relative_to(REPO)}:{line} imports {name}")
    return bad


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_a_lower_package_imports_nothing_above_it(package):
    assert (REPO / package / "__init__.py").is_file(), f"{package}/ is not a package"
    assert upward_imports(package) == []


def test_the_check_sees_a_lazy_import_inside_a_function():
    tree = ast.parse("def f():\n    import json\n    from agent.data import merge\n"
                     "    importlib.import_module('envs.x')\n")
    assert [name for _, name in _imported(tree)] == ["json", "agent", "envs"]
