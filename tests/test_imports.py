"""The packages' import graphs: no cycle in either, and the core's layers go one way.

Every module of ``chainoffload`` and of ``chainoffload_torch`` is parsed with ``ast``; every
import of a module of its own package counts (the adapter's imports of the core are the one
arrow between the packages, always down), at module level or inside a function (a lazy import
still runs, and still makes a cycle), except those under ``if TYPE_CHECKING:`` (never run). A
kernel module reached through ``chainoffload._kernels.lazy("name")`` counts as an import of
``chainoffload._kernels.name`` (it is imported on first use). An edge goes to the module named:
``from . import x`` to the submodule ``x`` if there is one, else to the package; importing
``a.b`` is not counted as importing the package ``a`` too (its ``__init__`` runs, but that is
Python's doing, not a dependency the module chose). Imports by name at run time (the solver
registry's ``"module:function"`` targets, and ``chainoffload._compile``'s warm-up targets) are
not in the graph: they go from the registry down to the solvers.

The layers, lowest first: the model (chains, platforms, units, the fixed order's arithmetic,
the shipped examples, the progress and Ctrl-C helpers), the schedule, the simulator (with the analysis and the drawing of its
timelines: the stalls, the plots), the solvers (with the result type and schedule files, the
bounds, the planner and their kernels), then the front ends (CLI, the trade-off sweep, verify,
the testing helpers, the package's own ``__init__``). An import goes to the same layer or
below, with no exception (``UPWARD_ALLOWED`` is empty): ``Timeline.plot`` and ``Tradeoff.plot``
import ``chainoffload.plot``, which draws from the fields of what it is given and imports only
the stalls and the units, so ``plot`` sits in the simulator's layer and both arrows point down.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "chainoffload"
TORCH_PACKAGE = PACKAGE.parent / "chainoffload_torch"

LAYERS = {
    "model": [
        "chainoffload._jsonio",
        "chainoffload._kernels",
        "chainoffload._kernels.config",
        "chainoffload._progress",
        "chainoffload._interrupt",
        "chainoffload._cost",
        "chainoffload.chain",
        "chainoffload.platform",
        "chainoffload.units",
        "chainoffload.order",
        "chainoffload.generators",
        "chainoffload.examples",
        "chainoffload.networks",
    ],
    "schedule": ["chainoffload.schedule", "chainoffload._kernels.structure"],
    "simulate": ["chainoffload.simulate", "chainoffload._kernels.simulate", "chainoffload.stalls", "chainoffload.plot"],
    "solvers": [
        "chainoffload.result",
        "chainoffload.schedule_file",
        "chainoffload.bounds",
        "chainoffload.bounds.*",
        "chainoffload.planner",
        "chainoffload._compile",
        "chainoffload.exact",
        "chainoffload.solvers",
        "chainoffload.solvers.*",
        "chainoffload._kernels.dp",
        "chainoffload._kernels.joint",
        "chainoffload._kernels.joint_exact",
        "chainoffload._kernels.planner",
        "chainoffload._kernels.rotor",
    ],
    "front": [
        "chainoffload",
        "chainoffload.__main__",
        "chainoffload.cli",
        "chainoffload.cli.*",
        "chainoffload.tradeoff",
        "chainoffload.verify",
        "chainoffload.testing",
        "chainoffload.testing.*",
    ],
}
ORDER = list(LAYERS)
UPWARD_ALLOWED = set()  # (from, to) imports allowed to go up a layer: none

# Inside ``chainoffload.solvers``: the option validators are a leaf, the registry sits on them,
# the front door (solve, judge, minimum_memory) on both, and the package's ``__init__`` only
# re-exports. A method module may import the validators, the registry and other methods, never
# the package itself nor the front door (that would make a method depend on the code that
# judges it, and the package's import on every method).
SOLVERS_LEAF = "chainoffload.solvers._options"
SOLVERS_FRONT = ("chainoffload.solvers", "chainoffload.solvers._front")



def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules(package: Path = PACKAGE) -> dict[str, Path]:
    return {module_name(p, package): p for p in sorted(package.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of its own package ``name`` imports, lazily or not (TYPE_CHECKING blocks excluded)."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    here = name.split(".") if is_package else name.split(".")[:-1]
    root = name.split(".")[0]
    found: set[str] = set()

    def ours(target: str) -> bool:
        return target == root or target.startswith(root + ".")

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                if ours(alias.name):
                    found.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if ours(target):
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    found.add(sub if sub in modules else target)
        elif (
            root == "chainoffload"
            and isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", None)) == "lazy"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.add(f"chainoffload._kernels.{node.args[0].value}")  # _kernels.lazy("name")
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    found.discard(name)
    unknown = sorted(m for m in found if m not in modules)
    assert not unknown, f"{name} imports modules that do not exist: {unknown}"
    return found


def layer_of(name: str) -> str:
    for layer, names in LAYERS.items():
        for pattern in names:
            if name == pattern or (pattern.endswith(".*") and name.startswith(pattern[:-1])):
                return layer
    raise AssertionError(f"{name} has no layer: add it to LAYERS in tests/test_imports.py")


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = all_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of the graph as a list of modules (first = last), or None."""
    color = dict.fromkeys(graph, 0)  # 0 unseen, 1 on the stack, 2 done
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        color[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if color[nxt] == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if color[nxt] == 0:
                cycle = dfs(nxt)
                if cycle:
                    return cycle
        stack.pop()
        color[node] = 2
        return None

    for node in sorted(graph):
        if color[node] == 0:
            cycle = dfs(node)
            if cycle:
                return cycle
    return None


def test_the_import_graph_has_no_cycle(graph):
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


# Imports of the adapter allowed to close a circle while it is being taken apart: none. (The last,
# profiler <-> plans, went with issue 34: the recorder is _recorder.py and the coverage
# _coverage.py, below both the public profile API and the plans.) An entry must still be in the
# graph (the test below says when to drop it).
TORCH_CYCLE_EDGES_ALLOWED: set[tuple[str, str]] = set()


@pytest.fixture(scope="module")
def torch_graph() -> dict[str, set[str]]:
    modules = all_modules(TORCH_PACKAGE)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def test_the_adapters_import_graph_has_no_cycle(torch_graph):
    assert "chainoffload_torch._copy" in torch_graph and "chainoffload_torch" in torch_graph["chainoffload_torch.testing"]
    stale = sorted(e for e in TORCH_CYCLE_EDGES_ALLOWED if e[1] not in torch_graph.get(e[0], ()))
    assert not stale, f"these imports are gone: drop them from TORCH_CYCLE_EDGES_ALLOWED: {stale}"
    pruned = {a: {b for b in targets if (a, b) not in TORCH_CYCLE_EDGES_ALLOWED} for a, targets in torch_graph.items()}
    cycle = find_cycle(pruned)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_core_imports_neither_torch_nor_the_adapter():
    # The one arrow between the packages goes from the adapter to the core; the core needs no
    # PyTorch installed. Any import anywhere in a module counts, lazy ones included.
    found = []
    for name, path in all_modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                tops = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                tops = [node.module.split(".")[0]]
            else:
                continue
            found += [f"{name}: {top}" for top in tops if top in ("torch", "chainoffload_torch")]
    assert not found, "the core imports PyTorch or the adapter:\n" + "\n".join(found)


def test_layers_go_one_way(graph):
    upward = [
        f"{a} ({layer_of(a)}) -> {b} ({layer_of(b)})"
        for a, targets in graph.items()
        for b in targets
        if ORDER.index(layer_of(b)) > ORDER.index(layer_of(a)) and (a, b) not in UPWARD_ALLOWED
    ]
    assert not upward, "imports that go up a layer:\n" + "\n".join(sorted(upward))


def test_the_checker_sees_lazy_imports_and_cycles(tmp_path):
    # The parser counts an import inside a function, skips TYPE_CHECKING, and finds a cycle.
    pkg = tmp_path / "chainoffload"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import c\ndef f():\n    from .b import g\n")
    (pkg / "b.py").write_text("from . import a\n")
    (pkg / "c.py").write_text("from ._kernels import lazy\n_k = lazy('k')\n")
    (pkg / "_kernels").mkdir()
    (pkg / "_kernels" / "__init__.py").write_text("")
    (pkg / "_kernels" / "k.py").write_text("")
    modules = {module_name(p, pkg): p for p in pkg.rglob("*.py")}
    edges = {name: imports_of(name, path, modules) for name, path in modules.items()}
    assert edges["chainoffload.a"] == {"chainoffload.b"}
    assert edges["chainoffload.c"] == {"chainoffload._kernels", "chainoffload._kernels.k"}
    assert find_cycle(edges) == ["chainoffload.a", "chainoffload.b", "chainoffload.a"]



def test_the_solvers_package_is_split_into_leaf_registry_and_front(graph):
    solvers = {m for m in graph if m.startswith("chainoffload.solvers.")}
    assert {SOLVERS_LEAF, "chainoffload.solvers._registry", "chainoffload.solvers._front"} <= solvers
    leaf = {t for t in graph[SOLVERS_LEAF] if t.startswith("chainoffload.solvers")}
    assert not leaf, f"{SOLVERS_LEAF} must not import the solvers package: {sorted(leaf)}"
    registry = {t for t in graph["chainoffload.solvers._registry"] if t.startswith("chainoffload.solvers")}
    assert registry <= {SOLVERS_LEAF}, f"the registry imports {sorted(registry)}"
    methods = solvers - {SOLVERS_LEAF, "chainoffload.solvers._registry", "chainoffload.solvers._front"}
    up = sorted(f"{m} -> {t}" for m in methods for t in graph[m] if t in SOLVERS_FRONT)
    assert not up, "method modules import the package or its front door:\n" + "\n".join(up)


def _direct_kernel_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and (node.module.startswith("_kernels.") or node.module.startswith("chainoffload._kernels.")):
            if not node.module.endswith(".config"):
                found.append(node.module)
        if isinstance(node, ast.ImportFrom) and node.module == "_kernels" and node.level:
            found += [f"_kernels.{a.name}" for a in node.names if a.name not in ("lazy", "module", "INTERPRETED", "config")]
    return found


def test_kernels_are_reached_only_through_lazy():
    # One mechanism, so a cold start can run every method's kernels interpreted and `import
    # chainoffload` never imports Numba (NOTE [ lazy kernels ]): no module outside _kernels
    # imports a kernel module directly (the config module, which has no kernels, is allowed).
    offenders = {
        name: found
        for name, path in all_modules().items()
        if not name.startswith("chainoffload._kernels") and name != "chainoffload._compile"
        for found in [_direct_kernel_imports(path)]
        if found
    }
    assert not offenders, f"kernel modules imported directly, not through _kernels.lazy: {offenders}"
