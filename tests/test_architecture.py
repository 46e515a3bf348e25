"""The walls docs/architecture.md draws, read from the source with ``ast`` (imports anywhere in a file).

* **The core imports no plugin**: no module of ``ascend_kernel`` (the CLI, the
  ops seam and the conformance kit included) imports an ``ascend_kernel_plugins``
  module, not even inside a function or under ``TYPE_CHECKING``; ``hookspecs.py``
  names no plugin class. What the CLI needs of a plugin comes through a hook, what
  the conformance kit checks are contract types the core (or the seam) owns.
* **Families meet through their package**: a plugin family
  (``ascend_kernel_plugins.<family>``) uses another family only through that
  family's package ``__init__`` (its public surface, as ``pytest`` is to
  ``_pytest``), never ``ascend_kernel_plugins.<other>.<module>``.
* **No import cycle between modules**: every import statement counts, at module
  level or inside a function (a function-level import hides a cycle, it does not
  break it); only ``if TYPE_CHECKING:`` blocks, which never run, are left out.
* **No file over 500 lines** in ``ascend_kernel/`` and ``plugins/``.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE, PLUGINS = "ascend_kernel", "ascend_kernel_plugins"
#: import package -> its folder in this checkout
PACKAGES = {CORE: ROOT / "ascend_kernel", PLUGINS: ROOT / "plugins"}
MAX_FILE_LINES = 500


@dataclass(frozen=True)
class Edge:
    """One import statement's target: a project module (``target``), where it is, and whether it ever runs."""

    source: str
    target: str
    line: int
    type_checking: bool

    def __str__(self) -> str:
        return f"{self.source}:{self.line} imports {self.target}" + (" (TYPE_CHECKING)" if self.type_checking else "")


def project_modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the project's packages."""
    modules = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement in ``tree`` (functions, classes, branches included), with its TYPE_CHECKING flag."""
    found: list[tuple[ast.Import | ast.ImportFrom, bool]] = []

    def visit(node: ast.AST, type_checking: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append((child, type_checking))
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    visit_one(stmt, True)
                for stmt in child.orelse:
                    visit_one(stmt, type_checking)
            else:
                visit(child, type_checking)

    def visit_one(stmt: ast.stmt, type_checking: bool) -> None:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            found.append((stmt, type_checking))
        else:
            visit(stmt, type_checking)

    visit(tree, False)
    return found


def import_edges(modules: dict[str, Path] | None = None) -> list[Edge]:
    """Every import of a project module by a project module, anywhere in the file."""
    modules = project_modules() if modules is None else modules

    def known(name: str) -> str | None:
        while name and name not in modules:  # ``import a.b.c`` of a name inside a module: the module
            name = name.rpartition(".")[0]
        return name or None

    edges: list[Edge] = []
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node, type_checking in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = name.split(".") if is_package else name.split(".")[:-1]
                    anchor = anchor[:len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                           for alias in node.names]
            for target in {t for t in map(known, targets) if t is not None and t != name}:
                edges.append(Edge(name, target, node.lineno, type_checking))
    return edges


def import_graph(edges: list[Edge] | None = None) -> dict[str, set[str]]:
    """Module -> the project modules it imports (statements that can run: TYPE_CHECKING blocks left out)."""
    edges = import_edges() if edges is None else edges
    graph: dict[str, set[str]] = {name: set() for name in project_modules()}
    for edge in edges:
        if not edge.type_checking:
            graph.setdefault(edge.source, set()).add(edge.target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def family(module: str) -> str | None:
    """The plugin family a module belongs to (``ascend_kernel_plugins.<family>...``), or None."""
    parts = module.split(".")
    return parts[1] if parts[0] == PLUGINS and len(parts) > 1 else None


def core_imports_of_plugins(edges: list[Edge]) -> list[Edge]:
    return [e for e in edges if e.source.split(".")[0] == CORE and e.target.split(".")[0] == PLUGINS]


def cross_family_reaches(edges: list[Edge]) -> list[Edge]:
    """Imports of another family's module (not its package ``__init__``)."""
    return [e for e in edges if family(e.source) and family(e.target) and family(e.source) != family(e.target)
            and e.target != f"{PLUGINS}.{family(e.target)}"]


# -- the finder finds ------------------------------------------------------------------------------------------


def test_the_finder_sees_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_finder_reads_imports_anywhere(tmp_path: Path) -> None:
    (tmp_path / "core").mkdir()
    (tmp_path / "plugs" / "fam").mkdir(parents=True)
    (tmp_path / "plugs" / "other").mkdir(parents=True)
    files = {
        "core/a.py": "import os\ndef f():\n    from ascend_kernel_plugins.fam import mod\n",
        "core/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ascend_kernel.a import f\n"
                     "class C:\n    def g(self):\n        import ascend_kernel.a\n",
        "plugs/fam/__init__.py": "from .mod import X\n",
        "plugs/fam/mod.py": "X = 1\ntry:\n    from ascend_kernel_plugins.other.deep import Y\nexcept ImportError:\n    pass\n",
        "plugs/other/__init__.py": "",
        "plugs/other/deep.py": "from ascend_kernel_plugins.fam import X\nfrom .. import fam\n",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    modules = {"ascend_kernel.a": tmp_path / "core/a.py", "ascend_kernel.b": tmp_path / "core/b.py",
               "ascend_kernel_plugins.fam": tmp_path / "plugs/fam/__init__.py",
               "ascend_kernel_plugins.fam.mod": tmp_path / "plugs/fam/mod.py",
               "ascend_kernel_plugins.other": tmp_path / "plugs/other/__init__.py",
               "ascend_kernel_plugins.other.deep": tmp_path / "plugs/other/deep.py"}
    edges = import_edges(modules)
    assert {str(e) for e in core_imports_of_plugins(edges)} == \
        {"ascend_kernel.a:3 imports ascend_kernel_plugins.fam.mod"}
    assert {str(e) for e in cross_family_reaches(edges)} == \
        {"ascend_kernel_plugins.fam.mod:3 imports ascend_kernel_plugins.other.deep"}
    assert any(e.type_checking and e.source == "ascend_kernel.b" for e in edges)
    graph = import_graph(edges)
    assert graph["ascend_kernel.b"] == {"ascend_kernel.a"}  # the method's import counts, TYPE_CHECKING does not
    assert cycles(graph) == [["ascend_kernel_plugins.fam", "ascend_kernel_plugins.fam.mod",
                              "ascend_kernel_plugins.other.deep"]]


def test_the_graph_reads_the_project() -> None:
    graph = import_graph()
    assert "ascend_kernel.ops.opaque" in graph["ascend_kernel_plugins.attention.ascend.sfa_order"]
    assert "ascend_kernel.ops.moe_fakes" in graph["ascend_kernel.ops.opaque"]


# -- the walls -------------------------------------------------------------------------------------------------


def _none_of(found: list[Edge], why: str) -> None:
    assert not found, why + ":\n" + "\n".join(map(str, found))


def test_the_core_imports_no_plugin() -> None:
    _none_of(core_imports_of_plugins(import_edges()),
             "the core (ascend_kernel/, CLI and conformance kit included) imports plugins; ask a hook, read a "
             "declared setting or move the shared piece to the seam or the core's contract types")


def test_the_hook_contract_names_no_plugin() -> None:
    text = (PACKAGES[CORE] / "hookspecs.py").read_text()
    assert PLUGINS not in text, "hookspecs.py describes the contract in terms of a plugin's classes"


def test_families_meet_through_their_package() -> None:
    _none_of(cross_family_reaches(import_edges()),
             "a plugin imports another family's module; import the family's package (ascend_kernel_plugins.<family>, "
             "its public surface) or move the piece down to the seam")


def test_no_import_cycles() -> None:
    found = cycles(import_graph())
    assert not found, "import cycles (imports anywhere in a file; break each):\n" + \
        "\n".join(" -> ".join(c) for c in found)


def test_no_file_over_500_lines() -> None:
    long = sorted(f"{path.relative_to(ROOT)}: {n} lines" for path in project_modules().values()
                  if (n := len(path.read_text().splitlines())) > MAX_FILE_LINES)
    assert not long, f"files over {MAX_FILE_LINES} lines (split them by job):\n" + "\n".join(long)


def redefined_functions(source: str) -> list[str]:
    """Module-level functions defined twice in one module: the later silently replaces the earlier (a hookimpl
    merged in from two branches, say, of which pluggy then registers only one)."""
    seen: set[str] = set()
    twice = []
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.name in seen:
                twice.append(node.name)
            seen.add(node.name)
    return twice


def test_the_redefinition_finder_sees_one() -> None:
    assert redefined_functions("def a():\n    pass\n\n\ndef b():\n    pass\n\n\ndef a():\n    pass\n") == ["a"]


def test_no_module_defines_a_function_twice() -> None:
    found = {str(path.relative_to(ROOT)): names for path in project_modules().values()
             if (names := redefined_functions(path.read_text()))}
    assert found == {}, found
