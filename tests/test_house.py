"""The house: the package's import graph has no circles (module-level and deferred imports alike).

The graph is built from the source with ``ast``: every ``import``/``from ... import`` anywhere in a
module of the ``kernelmap`` package (frameworks/ and reports/ are its subpackages), resolved to the
package's own modules; importing ``a.b.c`` imports ``a`` and ``a.b`` too (their ``__init__``).
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "kernelmap"


def package_modules(root: Path = ROOT) -> dict[str, Path]:
    """Module name -> file, for every .py of the package (following frameworks/ and reports/)."""
    mods = {}
    for dirpath, dirs, files in os.walk(root / PACKAGE, followlinks=True):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for f in files:
            if f.endswith(".py"):
                parts = list((Path(dirpath) / f).relative_to(root).with_suffix("").parts)
                mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = Path(dirpath) / f
    return mods


def _targets(module: str, path: Path, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The dotted names an import statement asks for (``from x import y``: ``x.y`` where that is a
    module, else ``x``)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - node.level + 1] if node.level else []
    name = ".".join(base + ([node.module] if node.module else []))
    return [f"{name}.{a.name}" for a in node.names] + [name]


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the package modules it imports (executes), anywhere in its source."""
    mods = package_modules(root)
    graph: dict[str, set[str]] = {}
    for module, path in mods.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for target in _targets(module, path, node):
                parts = target.split(".")
                for i in range(1, len(parts) + 1):  # a.b.c runs a, a.b and a.b.c
                    name = ".".join(parts[:i])
                    if name in mods and name != module and not module.startswith(name + "."):
                        deps.add(name)
        graph[module] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_is_whole():
    graph = import_graph()
    assert {"kernelmap.strings", "kernelmap.adapters.kineto", "kernelmap.reports.checks",
            "kernelmap.frameworks.mxnet.build"} <= set(graph)
    assert "kernelmap.reports.analyses.base" in graph["kernelmap.reports.checks"]


def test_no_import_circles():
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_one(tmp_path):
    """The test above can fail: a deferred import inside a function closes a circle."""
    pkg = tmp_path / PACKAGE
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from .sub import c\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "c.py").write_text("from ..a import x\n")
    assert cycles(import_graph(tmp_path)) == [[f"{PACKAGE}.a", f"{PACKAGE}.b", f"{PACKAGE}.sub.c"]]
    (pkg / "sub" / "c.py").write_text("import numpy\n")
    assert cycles(import_graph(tmp_path)) == []


# --- private names stay in their module -------------------------------------------------------
def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_imports(root: Path = ROOT) -> list[str]:
    """``from x import _y`` (and ``x._y`` through an imported package module) across modules of the
    package, as ``module:line name``. A private *module* imported by a module of its own package
    (``from . import _native`` inside adapters/) is that package's own business and allowed."""
    mods = package_modules(root)
    found = []
    for module, path in mods.items():
        tree = ast.parse(path.read_text())
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        aliases = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = _targets(module, path, node)[-1]
                for a in node.names:
                    full = f"{base}.{a.name}"
                    if full in mods:  # a module of the package, bound to a name
                        aliases.add(a.asname or a.name)
                    if not _is_private(a.name) or not base.startswith(PACKAGE):
                        continue
                    own_submodule = base == package and (full in mods or _extension(root, full))
                    if not own_submodule:
                        found.append(f"{module}:{node.lineno} {a.name} from {base}")
            elif isinstance(node, ast.Import):
                aliases |= {a.asname for a in node.names if a.asname and a.name in mods}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and _is_private(node.attr)):
                found.append(f"{module}:{node.lineno} {node.value.id}.{node.attr}")
    return sorted(found)


def _extension(root: Path, dotted: str) -> bool:
    """Whether ``dotted`` names a C extension module's source of the package (adapters/_native.c)."""
    return (root / Path(*dotted.split("."))).with_suffix(".c").is_file()


def test_no_private_names_imported_across_modules():
    assert private_imports() == []


def test_the_private_name_check_finds_them(tmp_path):
    pkg = tmp_path / PACKAGE
    (pkg / "sub").mkdir(parents=True)
    for f in ("__init__.py", "sub/__init__.py", "sub/_helpers.py"):
        (pkg / f).write_text("")
    (pkg / "a.py").write_text("_x = 1\n")
    (pkg / "sub" / "b.py").write_text("from . import _helpers\n")  # its own package's private module: fine
    assert private_imports(tmp_path) == []
    (pkg / "b.py").write_text("from .a import _x\nfrom . import a as A\nA._x\n")
    (pkg / "c.py").write_text("from .sub import _helpers\n")  # another package's private module
    assert private_imports(tmp_path) == [f"{PACKAGE}.b:1 _x from {PACKAGE}.a", f"{PACKAGE}.b:3 A._x",
                                         f"{PACKAGE}.c:1 _helpers from {PACKAGE}.sub"]
