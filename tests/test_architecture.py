"""The layers import downward only: every import statement of the lower packages, at any depth (a lazy import inside
a function counts too), names nothing of this repository above its layer (docs/architecture.md).

    common/         nothing of ours
    driving_data/   common/
    policies/       common/
    envs/           common/, driving_data/

Inside agent/, each stage imports only the stages ``STAGES`` names (the rules of docs/architecture.md as data),
again at any depth. And no module of the project's packages or root scripts imports itself through others: the
import graph has no circle. docs/architecture.md names every file of agent/. The tests mirror the packages:
``tests/<package>/.../test_<module>.py`` tests that module. No module is over 650 lines, no function over 80.
"""
from __future__ import annotations

import ast
import re
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


BELOW = frozenset({"common", "driving_data", "envs", "policies"})  # the layers below agent/: every stage may use them
STAGES = {  # a stage of agent/ (a package, or a module named on its own) -> the stages it may import besides itself
    "agent": frozenset(),  # agent/__init__.py
    "agent.runtime": BELOW,  # what the CLIs share: progress bars, ratios
    "agent.workers": BELOW,  # worker processes
    "agent.controllers": BELOW,  # who drives: the expert or a policy
    "agent.experts": BELOW,  # no other stage
    "agent.data": BELOW | {"agent.experts", "agent.controllers", "agent.workers", "agent.runtime"},
    "agent.training": BELOW | {"agent.runtime"},
    "agent.training.dagger": BELOW | {"agent.training", "agent.data"},  # runs data/'s collection between trainings
    "agent.evaluation": BELOW | {"agent.experts", "agent.controllers", "agent.workers", "agent.runtime"},
    "agent.udacity": frozenset(),  # agent/udacity/__init__.py: its modules are stages of their own
    "agent.udacity.recordings": BELOW,
    "agent.udacity.pool": BELOW,
    "agent.udacity.bridge": frozenset({"common", "policies"}),  # a checkpoint and a socket: no env, no dataset
}


def _stage(name: str, rules: dict) -> str:
    """The stage of a dotted module name: the longest key of ``rules`` it is or lies in, else its top-level name."""
    keys = [k for k in rules if name == k or name.startswith(k + ".")]
    return max(keys, key=len) if keys else name.split(".")[0]


def _module_imports(tree: ast.AST, module: str, is_package: bool, names: set[str]) -> list[tuple[int, str]]:
    """(line, dotted name) of every import in the tree, at any depth: ``from a import b`` is the module ``a.b`` where
    there is one (else ``a``), relative imports resolved, ``import_module("a.b")`` counted."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            [base, *subs] = _targets(node, module, is_package, names)
            found += [(node.lineno, t) for t in dict.fromkeys(sub if sub in names else base for sub in subs)]
        elif isinstance(node, (ast.Import, ast.Call)):
            found += [(node.lineno, t) for t in _targets(node, module, is_package, names)]
    return found


def stage_violations(root: Path, rules: dict = STAGES) -> list[str]:
    """``file:line: stage imports name (a stage it may not import)`` for every import of a module of ``root/agent``,
    at any depth, that reaches a project module outside its own stage and the stages ``rules`` give it."""
    ours = {p.parent.name for p in root.glob("*/__init__.py")} | {p.stem for p in root.glob("*.py")}
    paths = {}
    for package in ours:
        for p in (root / package).rglob("*.py") if (root / package).is_dir() else ():
            parts = p.relative_to(root).with_suffix("").parts
            paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    names = set(paths) | ours
    bad = []
    for module, path in sorted(paths.items()):
        if module.split(".")[0] != "agent":
            continue
        stage = _stage(module, rules)
        tree = ast.parse(path.read_text(), str(path))
        for line, target in _module_imports(tree, module, path.name == "__init__.py", names):
            other = _stage(target, rules)
            if target.split(".")[0] in ours and other != stage and other not in rules[stage]:
                bad.append(f"{path.relative_to(root)}:{line}: {stage} imports {target} (stage {other})")
    return bad


def test_each_stage_of_agent_imports_only_the_stages_it_may():
    assert stage_violations(REPO) == []


def test_every_stage_in_the_rules_is_a_module_of_agent():
    for stage in STAGES:
        path = REPO / stage.replace(".", "/")
        assert (path / "__init__.py").is_file() or path.with_suffix(".py").is_file(), stage


def _plant(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_the_stage_check_refuses_an_upward_or_forbidden_import(tmp_path):
    files = {f"agent/{p}/__init__.py": "" for p in ("", "experts", "training", "data", "udacity")}
    files |= {"common/__init__.py": "", "common/files.py": "", "envs/__init__.py": "", "envs/registry.py": "",
              "agent/training/loop.py": "", "agent/data/card.py": "", "agent/controllers.py": "",
              "agent/experts/expert.py": "from common.files import x\nfrom envs import registry\n",  # below: fine
              "agent/data/collection.py": "from agent.experts import expert\nfrom .card import c\n"}  # allowed
    root = _plant(tmp_path, files)
    assert stage_violations(root) == []
    _plant(root, {"agent/experts/ppo.py": "def f():\n    from agent.data.card import c\n",  # lazy, another stage
                  "agent/training/windows.py": "import importlib\nimportlib.import_module('agent.controllers')\n",
                  "agent/udacity/bridge.py": "from envs.registry import get_spec\n",  # the bridge uses only policies/
                  "agent/data/merge.py": "from agent import controllers\nfrom ..training import loop\n"})
    assert stage_violations(root) == [
        "agent/data/merge.py:2: agent.data imports agent.training.loop (stage agent.training)",
        "agent/experts/ppo.py:2: agent.experts imports agent.data.card (stage agent.data)",
        "agent/training/windows.py:2: agent.training imports agent.controllers (stage agent.controllers)",
        "agent/udacity/bridge.py:1: agent.udacity.bridge imports envs.registry (stage envs)"]


def _documented_files(text: str) -> set[str]:
    """The files of agent/ that docs/architecture.md names: ``agent/x.py`` anywhere, and ``y.py`` in the bullet of a
    folder (``* `agent/x/`: `y.py` (...), ...``)."""
    named = set(re.findall(r"`(agent/[\w/]+\.py)`", text))
    for bullet in re.split(r"\n(?=\* )|\n\n", text):  # a bullet ends at the next one or at a blank line
        folder = re.match(r"\* `(agent/[\w/]+/)`:", bullet)
        if folder:
            named |= {folder.group(1) + name for name in re.findall(r"`(\w+\.py)`", bullet)}
    return named


def test_the_architecture_doc_names_every_file_of_agent():
    named = _documented_files((REPO / "docs" / "architecture.md").read_text())
    files = {str(p.relative_to(REPO)) for p in (REPO / "agent").rglob("*.py") if p.name != "__init__.py"}
    assert sorted(files - named) == [], "files of agent/ the doc does not name"
    assert sorted(named - files) == [], "files the doc names that agent/ does not hold"
    doc = ("* `agent/x/`: `a.py` (one),\n  `b.py`; `agent/c.py`\n* `common/`: `d.py`\n"
           "* `agent/y/`: `e.py`\n\nThen `f.py`")
    assert _documented_files(doc) == {"agent/x/a.py", "agent/x/b.py", "agent/c.py", "agent/y/e.py"}


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


MAX_MODULE_LINES, MAX_FUNCTION_LINES = 650, 80  # past these a module mixes jobs, a function mixes steps


def oversized(sources: dict[str, str]) -> list[str]:
    """Modules over ``MAX_MODULE_LINES`` lines and functions (methods and nested ones too, decorators excluded) over
    ``MAX_FUNCTION_LINES``, as ``name: N lines``."""
    found = []
    for name, source in sources.items():
        if (lines := len(source.splitlines())) > MAX_MODULE_LINES:
            found.append(f"{name}: {lines} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found.append(f"{name}.{node.name}: {length} lines")
    return found


def test_no_module_or_function_of_the_project_or_its_tests_is_oversized():
    sources = {**project_modules(), **{f"tests.{'.'.join(p.relative_to(REPO / 'tests').with_suffix('').parts)}":
                                       p.read_text() for p in (REPO / "tests").rglob("*.py")}}
    assert oversized(sources) == []


def test_the_size_check_sees_a_long_function_and_a_long_module():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    assert oversized({"m": f"def f():\n{body}\n"}) == [f"m.f: {MAX_FUNCTION_LINES + 1} lines"]
    assert oversized({"m": "x = 1\n" * (MAX_MODULE_LINES + 1)}) == [f"m: {MAX_MODULE_LINES + 1} lines"]
    assert oversized({"m": f"def f():\n{body[:-12]}\n"}) == []
