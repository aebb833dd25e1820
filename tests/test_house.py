"""The house: the package's import graph has no circles (module-level and deferred imports alike).

The graph is built from the source with ``ast``: every ``import``/``from ... import`` anywhere in a
module of the ``kernelmap`` package (frameworks/ and reports/ are its subpackages), resolved to the
package's own modules; importing ``a.b.c`` imports ``a`` and ``a.b`` too (their ``__init__``).
"""

from __future__ import annotations

import ast
import builtins
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "kernelmap"


# pyproject.toml's [tool.setuptools.package-dir]: the design card keeps these at the checkout's top level
PACKAGE_DIRS = {PACKAGE: PACKAGE, f"{PACKAGE}.frameworks": "frameworks", f"{PACKAGE}.reports": "reports"}


def package_modules(root: Path = ROOT) -> dict[str, Path]:
    """Module name -> file, for every .py of the package (frameworks/ and reports/ as the package's
    subpackages, as pyproject.toml maps them)."""
    mods = {}
    for package, folder in PACKAGE_DIRS.items():
        for dirpath, dirs, files in os.walk(root / folder):
            dirs[:] = [d for d in dirs if d != "__pycache__" and not (Path(dirpath) / d).is_symlink()]
            for f in files:
                if f.endswith(".py"):
                    parts = package.split(".") + list((Path(dirpath) / f).relative_to(root / folder).with_suffix("").parts)
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
    (``from . import _native`` inside kernelmap/) is that package's own business and allowed."""
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
    """Whether ``dotted`` names a C extension module's source of the package (kernelmap/_native.c)."""
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


# --- framework knowledge lives in frameworks/<name>/ and the registry ---------------------------
def _framework_words() -> dict[str, str]:
    """Lower-cased word -> what it is: each registered framework's name, label and module names."""
    from kernelmap import frameworks

    words = {}
    for d in frameworks.REGISTRY.values():
        for w in (d.name, d.label, *d.import_names):
            words[w.lower()] = f"framework {d.name}"
    return words


def _mode_words() -> dict[str, str]:
    from kernelmap import frameworks

    words = {m: f"mode of {d.name}" for d in frameworks.REGISTRY.values() for m in d.modes}
    return {**words, "hybridize": "mode of mxnet"}


# The adapters' formats, where a framework's name is the format's own (not a rule of the framework's: those
# live in frameworks/<name>/, read through the registry). Each entry must still occur (a stale one fails).
FORMAT_WORDS = {
    "kernelmap.adapters.inductor": {"torch"},  # Inductor's own span names ("Torch-Compiled Region")
    "kernelmap.adapters": {"mxnet", "jax"},  # the formats named in its error: "MXNet profiler", "XLA (jax.profiler)"
    "kernelmap.adapters.mxnet_profiler": {"mxnet"},  # the format's own category "MXNET_C_API"; "an MXNet profiler trace"
    "kernelmap.adapters.xla_trace": {"jit"},  # "jit(relu)": an XLA op name
}


BUILTIN_NAMES = frozenset(dir(builtins))


def framework_names_outside(root: Path = ROOT) -> dict[str, set[str]]:
    """Module (outside kernelmap.frameworks) -> the framework and mode words its code names: in
    identifiers and in string constants other than docstrings (a user message, a dict key, a
    default). Inside the adapters a registered trace source (``kineto``, ``mxnet_profiler``: the
    registry's vocabulary, the format an adapter reads) is not a name; elsewhere it is spelled by the
    registry (``trace_source``), not by hand. Comments and docstrings are prose, not code."""
    import re

    from kernelmap import frameworks

    sources = {d.trace_source for d in frameworks.REGISTRY.values()}
    words = {**_framework_words(), **_mode_words(), **{s: "trace source" for s in sources}}
    pattern = re.compile(r"(?<![a-z])(" + "|".join(sorted(map(re.escape, words), key=len, reverse=True))
                         + r")(?![a-z])", re.IGNORECASE)
    found: dict[str, set[str]] = {}
    for module, path in package_modules(root).items():
        if module.startswith(f"{PACKAGE}.frameworks"):
            continue
        tree = ast.parse(path.read_text())
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                texts = [node.value]
            elif isinstance(node, ast.Name):
                texts = [node.id]
            elif isinstance(node, ast.Attribute):
                texts = [node.attr]
            elif isinstance(node, ast.FunctionDef | ast.ClassDef):
                texts = [node.name]
            elif isinstance(node, ast.arg | ast.keyword):
                texts = [node.arg or ""]
            elif isinstance(node, ast.alias):
                texts = [node.name, node.asname or ""]
            elif isinstance(node, ast.ImportFrom):
                texts = [node.module or ""]
            else:
                continue
            for text in texts:
                # a mode word that Python itself defines (compile) is a name of its own as an identifier
                # (re.compile, builtins.compile); as a string it still names the mode
                if not (isinstance(node, ast.Constant)) and text in BUILTIN_NAMES:
                    continue
                if module.startswith(f"{PACKAGE}.adapters"):
                    for source in sources:  # the format it reads
                        text = re.sub(rf"(?<![a-z]){re.escape(source)}(?![a-z])", " ", text, flags=re.IGNORECASE)
                for m in pattern.finditer(text):
                    found.setdefault(module, set()).add(m.group(1).lower())
    return found


def test_framework_names_live_in_frameworks_and_the_registry():
    found = framework_names_outside()
    allowed = FORMAT_WORDS
    unexpected = {m: sorted(w - allowed.get(m, set())) for m, w in found.items() if w - allowed.get(m, set())}
    assert unexpected == {}, "name frameworks only in frameworks/<name>/ and the registry"
    stale = {m: sorted(w - found.get(m, set())) for m, w in allowed.items() if w - found.get(m, set())}
    assert stale == {}, "fixed: remove these from FORMAT_WORDS"


def test_each_vocabulary_speaks_the_schema():
    """A framework's op names (frameworks/<name>/ops.py) map to the schema's canonical ops and directions;
    the adapters reach them through the registry only (no adapter imports a framework's folder)."""
    from kernelmap import frameworks, schema

    vocabularies = {n: d.vocabulary for n, d in frameworks.REGISTRY.items() if d.vocabulary is not None}
    assert vocabularies, "no framework has a vocabulary"
    for name, v in vocabularies.items():
        assert {c for c, _ in v.ops.values()} <= set(schema.CANONICAL_OPS), name
        assert {d for _, d in v.ops.values()} <= set(schema.DIRECTIONS), name
        assert set(v.weight_args) | set(v.gemm_ops) <= set(v.ops), name
    graph = import_graph()
    reach = {m: sorted(t for t in deps if t.startswith(f"{PACKAGE}.frameworks.") and t.count(".") >= 3
                       and t.split(".")[2] in frameworks.REGISTRY)
             for m, deps in graph.items() if m.startswith(f"{PACKAGE}.adapters")}
    assert {m: r for m, r in reach.items() if r} == {}, "adapters read framework rules through the registry"


def test_the_framework_name_check_finds_them(tmp_path):
    pkg = tmp_path / PACKAGE
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "adapters").mkdir()
    (pkg / "adapters" / "__init__.py").write_text('x = "kineto"\ny = "mxnet_profiler"\n')  # formats read
    (pkg / "ok.py").write_text('"""PyTorch in a docstring is prose."""\n# mxnet in a comment\nx = 1\n')
    (pkg / "bad.py").write_text('def label(df, framework="pytorch"):\n    return f"{df} on JAX"\n'
                                'def build_mxnet():\n    pass\nMODE = "hybridized"\nS = ["kineto"]\n')
    assert framework_names_outside(tmp_path) == {f"{PACKAGE}.bad": {"pytorch", "jax", "mxnet", "hybridized",
                                                                     "kineto"}}


# --- sizes: no file over 800 lines, no function over 100 -----------------------------------------
MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 100
SOURCE_FOLDERS = ("kernelmap", "frameworks", "reports")
BIG_FILES = {"kernelmap/_native.c"}  # the C scanner: one pass per format, each with its Python twin
# Functions allowed over the limit while being split ({"module.function": why}); each entry must still be
# over the limit (a stale one fails). Empty since issue 36's splits (2026-11-27).
LONG_FUNCTIONS_PENDING: dict[str, str] = {}


def source_files(root: Path = ROOT) -> list[Path]:
    """Every text file of kernelmap/, frameworks/ and reports/ (no caches, no built libraries)."""
    out = []
    for folder in SOURCE_FOLDERS:
        for dirpath, dirs, files in os.walk(root / folder):
            dirs[:] = [d for d in dirs if d != "__pycache__" and not d.endswith(".egg-info")]
            out += [Path(dirpath) / f for f in files if not f.endswith((".so", ".pyc", ".pyd"))]
    return sorted(out)


def long_files(root: Path = ROOT) -> dict[str, int]:
    """Relative path -> lines, for the files over MAX_FILE_LINES (BIG_FILES aside)."""
    found = {}
    for path in source_files(root):
        rel = path.relative_to(root).as_posix()
        n = len(path.read_bytes().splitlines())
        if n > MAX_FILE_LINES and rel not in BIG_FILES:
            found[rel] = n
    return found


def long_functions(root: Path = ROOT) -> dict[str, int]:
    """``module.function`` (``module.Class.method``, nested ones dotted too) -> lines, for every
    function of the package over MAX_FUNCTION_LINES (its decorators and docstring included)."""
    found = {}

    def visit(node, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}.{child.name}"
                if not isinstance(child, ast.ClassDef):
                    first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                    if child.end_lineno - first + 1 > MAX_FUNCTION_LINES:
                        found[name] = child.end_lineno - first + 1
                visit(child, name)
            else:
                visit(child, prefix)

    for module, path in package_modules(root).items():
        visit(ast.parse(path.read_text()), module)
    return found


def test_no_file_over_800_lines():
    assert long_files() == {}, f"split these files (at most {MAX_FILE_LINES} lines)"


def test_no_function_over_100_lines():
    found = long_functions()
    assert sorted(set(found) - set(LONG_FUNCTIONS_PENDING)) == [], \
        f"split these into named stages (at most {MAX_FUNCTION_LINES} lines): {found}"
    stale = sorted(set(LONG_FUNCTIONS_PENDING) - set(found))
    assert stale == [], "split: remove these from LONG_FUNCTIONS_PENDING"


def test_the_size_checks_find_them(tmp_path):
    pkg = tmp_path / PACKAGE
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES - 1))  # with its def: 100 lines
    method = body.replace("    ", "        ")
    (pkg / "a.py").write_text(f"def short():\n{body}\n\nclass C:\n    def long(self):\n{method}        pass\n")
    assert long_functions(tmp_path) == {f"{PACKAGE}.a.C.long": MAX_FUNCTION_LINES + 1}
    assert long_files(tmp_path) == {}
    (pkg / "b.j2").write_text("x\n" * (MAX_FILE_LINES + 1))
    assert long_files(tmp_path) == {f"{PACKAGE}/b.j2": MAX_FILE_LINES + 1}


# --- no module loaded by file path (to dodge the import order) -----------------------------------
# Loads of files that are not modules of the package, each with its reason.
FILE_LOADS_ALLOWED = {
    "kernelmap.frameworks.pytorch.custom_op.build": "the op library it has just built in its cache "
                                                    "(~/.cache/kernelmap), not a module of the package",
}


def file_path_loads(root: Path = ROOT) -> dict[str, list[int]]:
    """Module -> the lines where it calls ``importlib``'s ``spec_from_file_location``."""
    found: dict[str, list[int]] = {}
    for module, path in package_modules(root).items():
        for node in ast.walk(ast.parse(path.read_text())):
            name = (node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name)
                    else node.names[0].name if isinstance(node, ast.ImportFrom) and len(node.names) == 1 else None)
            if name == "spec_from_file_location":
                found.setdefault(module, []).append(node.lineno)
    return found


def test_no_module_is_loaded_by_file_path():
    found = file_path_loads()
    assert sorted(set(found) - set(FILE_LOADS_ALLOWED)) == [], f"import it by name, downward: {found}"
    assert sorted(set(FILE_LOADS_ALLOWED) - set(found)) == [], "gone: remove it from FILE_LOADS_ALLOWED"


def test_the_file_load_check_finds_one(tmp_path):
    pkg = tmp_path / PACKAGE
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("import importlib.util\nspec = importlib.util.spec_from_file_location('x', 'x.so')\n")
    (pkg / "b.py").write_text("from importlib.util import spec_from_file_location\n")
    assert file_path_loads(tmp_path) == {f"{PACKAGE}.a": [2], f"{PACKAGE}.b": [1]}


# --- reports/analysis.py re-exports only what is used -------------------------------------------
ANALYSIS = f"{PACKAGE}.reports.analysis"


def unused_re_exports(root: Path = ROOT) -> list[str]:
    """The names ``reports/analysis.py`` imports that no other file (of the package, tests/ or
    benches/) takes from it: ``from ...analysis import NAME`` or ``A.NAME`` where ``A`` is it."""
    mods = package_modules(root)
    exported = {a.asname or a.name for node in ast.parse(mods[ANALYSIS].read_text()).body
                if isinstance(node, ast.ImportFrom) and node.module != "__future__" for a in node.names}
    others = [(m, p) for m, p in mods.items() if m != ANALYSIS]
    others += [(None, p) for folder in ("tests", "benches") for p in sorted((root / folder).glob("**/*.py"))]
    used = set()
    for module, path in others:
        tree = ast.parse(path.read_text())
        aliases = set()
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = _targets(module, path, node)[-1] if module else node.module or ""
            if base == ANALYSIS:
                used |= {a.name for a in node.names}
            aliases |= {a.asname or a.name for a in node.names if f"{base}.{a.name}" == ANALYSIS}
        used |= {n.attr for n in ast.walk(tree)
                 if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in aliases}
    return sorted(exported - used)


def test_reports_analysis_re_exports_only_what_is_used():
    assert unused_re_exports() == [], "drop these re-exports from reports/analysis.py"


def test_the_re_export_check_finds_one(tmp_path):
    rep = tmp_path / PACKAGE / "reports"
    (rep / "analyses").mkdir(parents=True)
    for f in ("__init__.py", "reports/__init__.py", "reports/analyses/__init__.py"):
        (tmp_path / PACKAGE / f).write_text("")
    (rep / "analyses" / "ops.py").write_text("def a(): pass\ndef b(): pass\ndef c(): pass\n")
    (rep / "analysis.py").write_text("from .analyses.ops import a, b, c  # noqa: F401\n")
    (rep / "html.py").write_text("from . import analysis as A\nfrom .analysis import b\nA.a()\n")
    assert unused_re_exports(tmp_path) == ["c"]


# --- docs/ARCHITECTURE.md: one screen, naming only what exists, its layering true -----------------
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"


def architecture_paths(text: str) -> list[str]:
    """The paths the architecture's picture names: ``a/b.py``, ``name.py``, ``a/`` and ``<name>/x.py``
    (``<name>``, ``<topic>``: any)."""
    block = text.split("```", 2)[1]
    found = re.findall(r"(?<![\w./<>*-])((?:[\w<>-]+/)*(?:[\w<>-]+\.(?:py|md|j2|c)|[\w<>-]+/))(?![\w*])", block)
    return sorted({p for p in found if not p.split("/")[0].isupper()})  # RUN_DIR/...: a run's, not ours


def missing_paths(paths: list[str], root: Path = ROOT) -> list[str]:
    """Those of ``paths`` that exist nowhere: as given from the checkout, or under one of its source
    folders (the picture's indented names are their folder's); ``<...>`` and ``*`` match any name."""
    bases = [root, *(root / f for f in SOURCE_FOLDERS), root / "kernelmap" / "adapters", root / "docs"]
    out = []
    for p in paths:
        pattern = re.sub(r"<[^>]+>", "*", p).rstrip("/")
        if not any(list(base.glob(pattern)) for base in bases):
            out.append(p)
    return out


def test_architecture_is_one_screen_naming_only_what_exists():
    text = ARCHITECTURE.read_text()
    assert len(text.splitlines()) <= 60
    paths = architecture_paths(text)
    assert {"kernelmap/run/", "kernelmap/history/", "kernelmap/native.py", "<name>/ops.py"} <= set(paths)
    assert missing_paths(paths) == []


def test_the_architecture_check_finds_a_missing_path(tmp_path):
    (tmp_path / "kernelmap").mkdir()
    (tmp_path / "kernelmap" / "a.py").write_text("")
    text = "# A\n```\nkernelmap/a.py   x\n  b.py           y\nkernelmap/gone/  z\n```\n"
    assert architecture_paths(text) == ["b.py", "kernelmap/a.py", "kernelmap/gone/"]
    assert missing_paths(architecture_paths(text), tmp_path) == ["b.py", "kernelmap/gone/"]


def _imports_of(module: str) -> set[str]:
    """Every dotted name a package module imports (its own package's resolved), anywhere in it."""
    path = package_modules()[module]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import | ast.ImportFrom):
            out |= set(_targets(module, path, node))
    return out


def test_the_layers_hold_as_the_architecture_says():
    from kernelmap import frameworks

    mods = package_modules()
    graph = import_graph()
    # the C helpers' loader is a leaf: strings and the adapters import it downward
    assert graph[f"{PACKAGE}.native"] == set()
    # the framework-free layer imports no framework, and nothing of the runner, the adapters or the reports
    framework_modules = {m for d in frameworks.REGISTRY.values() for m in d.import_names}
    free = [f"{PACKAGE}.frameworks.{m}" for m in ("registry", "spec", "data", "case")]
    free += [f"{PACKAGE}.frameworks.{n}.{m}" for n in frameworks.REGISTRY for m in ("descriptor", "ops")
             if f"{PACKAGE}.frameworks.{n}.{m}" in mods]
    for module in free:
        names = _imports_of(module)
        assert not {n.split(".")[0] for n in names} & framework_modules, module
        assert not [n for n in names if n.startswith((f"{PACKAGE}.run", f"{PACKAGE}.adapters", f"{PACKAGE}.reports"))], module
    # every framework with a vocabulary keeps it in its own folder's ops.py
    for name, d in frameworks.REGISTRY.items():
        assert (d.vocabulary is not None) == (f"{PACKAGE}.frameworks.{name}.ops" in mods), name
    # adapters never print; analyses draw nothing
    for module, path in mods.items():
        tree = ast.parse(path.read_text())
        if module.startswith(f"{PACKAGE}.adapters"):
            assert not [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call)
                        and isinstance(n.func, ast.Name) and n.func.id == "print"], module
        if module.startswith(f"{PACKAGE}.reports.analyses"):
            drawn = {n for n in _imports_of(module) if n.split(".")[0] in ("matplotlib", "jinja2")
                     or n.startswith((f"{PACKAGE}.reports.figures", f"{PACKAGE}.reports.html"))}
            assert drawn == set(), module
