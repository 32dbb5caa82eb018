"""The layers import downward only: every import statement of the lower packages, at any depth (a lazy import inside
a function counts too), names nothing of this repository above its layer (docs/architecture.md).

    common/         nothing of ours
    driving_data/   common/
    policies/       common/
    envs/           common/, driving_data/

And no module of the project's packages or root scripts imports itself through others: the import graph has no
circle. The tests mirror the packages: ``tests/<package>/.../test_<module>.py`` tests that module.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("agent", "envs", "policies", "driving_data", "common", "benchmarks")
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


def project_modules() -> dict[str, str]:
    """Dotted name -> source of every module of ``PACKAGES`` (a package by its ``__init__.py``) and the root scripts."""
    paths = {p.stem: p for p in REPO.glob("*.py")}
    for package in PACKAGES:
        for p in (REPO / package).rglob("*.py"):
            parts = p.relative_to(REPO).with_suffix("").parts
            paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return {name: p.read_text() for name, p in paths.items()}


def _targets(node: ast.AST, module: str, is_package: bool, names: set[str]) -> list[str]:
    """Dotted names ``node`` may import: an import statement (relative ones resolved, ``from a import b`` may be the
    module ``a.b``), ``import_module("a.b")``, or a string that is exactly a module's name (a table of modules that
    ``import_module`` looks up, as the env catalogue keeps)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            package = module.split(".") if is_package else module.split(".")[:-1]
            base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
        return [base] + [f"{base}.{a.name}" for a in node.names]
    if isinstance(node, ast.Call) and _called(node) == "import_module":
        return [node.args[0].value] if node.args and isinstance(node.args[0], ast.Constant) else []
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
        return [node.value]
    return []


def import_graph(sources: dict[str, str], packages: set[str] = frozenset()) -> dict[str, set[str]]:
    """Module -> the project modules it imports, at module level or inside a function. Importing ``a.b.c`` imports the
    packages ``a`` and ``a.b`` too, except from inside them (a submodule's import of its own package is no circle:
    Python has that package under way already). ``packages``: the names whose source is an ``__init__.py``."""
    names = set(sources)
    graph = {}
    for module, source in sources.items():
        edges = set()
        for node in ast.walk(ast.parse(source, module)):
            for target in _targets(node, module, module in packages, names):
                parts = target.split(".")
                for i in range(1, len(parts) + 1):
                    name = ".".join(parts[:i])
                    if name in names and name != module and not module.startswith(name + "."):
                        edges.add(name)
        graph[module] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The modules of each circle (a strongly connected component of more than one module), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_no_import_circle_among_the_project_modules():
    sources = project_modules()
    packages = {name for name in sources if (REPO / name.replace(".", "/") / "__init__.py").is_file()}
    graph = import_graph(sources, packages)
    assert "envs.registry" in graph and "envs.udacity.spec" in graph["envs.catalog"]  # the graph sees the catalogue
    assert circles(graph) == []


def test_the_circle_check_sees_lazy_relative_and_looked_up_imports():
    sources = {"p": "from .a import x\n", "p.a": "def f():\n    from p.b import y\n",
               "p.b": "TABLE = {'c': 'p.c'}\n", "p.c": "from . import a\n", "q": "import p.a\n"}
    graph = import_graph(sources, packages={"p"})
    assert graph == {"p": {"p.a"}, "p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}, "q": {"p", "p.a"}}
    assert circles(graph) == [["p.a", "p.b", "p.c"]]


def misnamed_tests() -> list[str]:
    """Test files below ``tests/<package>/`` not named ``test_<module>.py`` after a module of the same folder of
    ``<package>/``: tests mirror the packages (whole-repository and CLI tests sit at the top of ``tests/``)."""
    bad = []
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        folder = path.parent.relative_to(REPO / "tests")
        if folder.parts and not (REPO / folder / f"{path.stem[len('test_'):]}.py").is_file():
            bad.append(str(path.relative_to(REPO)))
    return bad


def test_every_test_file_below_the_top_is_named_after_the_module_it_tests():
    assert misnamed_tests() == []


ARGUMENT_OBJECTS = ("TrainArgs", "EvalArgs", "CollectConfig", "PPOTrainArgs")  # the four commands' parsed arguments


def takers_of_whole_arguments(sources: dict[str, str]) -> list[str]:
    """``module.function`` for every function with a parameter annotated with a whole arguments object: past the
    boundary (check_args, resolve) code takes the small frozen configs it uses, so this list stays short."""
    found = []
    for module, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                params = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                if any(p.annotation is not None and ast.unparse(p.annotation).strip("'\"") in ARGUMENT_OBJECTS
                       for p in params):
                    found.append(f"{module}.{node.name}")
    return sorted(found)


def test_arguments_are_taken_whole_only_at_the_boundary():
    takers = takers_of_whole_arguments(project_modules())
    assert len(takers) <= 8, "\n".join(takers)
    seen = takers_of_whole_arguments({"m": "def run(a: 'TrainArgs'): ...\ndef go(plan: TrainPlan): ..."})
    assert seen == ["m.run"]
