"""One name, one class: no class name is defined twice in the project (agent/, envs/, policies/, common/,
benchmarks/ and the root scripts), so a name in a traceback, a card or an import points at one thing."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("agent", "envs", "policies", "common", "benchmarks")


def classes_defined(root: Path, paths: list[Path]) -> dict[str, list[str]]:
    """Each class name -> where it is defined (file:line under ``root``), nested classes included."""
    where: dict[str, list[str]] = defaultdict(list)
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                where[node.name].append(f"{path.relative_to(root)}:{node.lineno}")
    return where


def test_no_class_name_is_defined_twice():
    paths = [p for d in PACKAGES for p in (REPO / d).rglob("*.py")] + sorted(REPO.glob("*.py"))
    where = classes_defined(REPO, paths)
    assert len(where) > 100  # the whole project was read
    twice = {name: places for name, places in where.items() if len(places) > 1}
    assert not twice, f"class names defined more than once: {twice}"


def test_the_check_finds_a_name_defined_twice(tmp_path):
    (tmp_path / "a.py").write_text("class Args:\n    pass\n")
    (tmp_path / "b.py").write_text("def f():\n    class Args:\n        pass\n")
    assert classes_defined(tmp_path, [tmp_path / "a.py", tmp_path / "b.py"]) == {"Args": ["a.py:1", "b.py:2"]}
