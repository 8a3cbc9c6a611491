"""The package's structure holds: no import circles, and dependencies point one way
(the layers of docs/architecture.md).  Imports are read from the source with ast --
every import, at module level or inside a function, as a reader would follow it;
only imports under ``if TYPE_CHECKING:`` (annotations) are left out.  A name taken
from the package's face (``from subzero import Operator``) depends on the module
that defines it; ``import subzero`` is a client's use of the public API (the
optimizer's, the operators'), not an arrow into the package.  Every exception and
warning class of the package is defined in subzero/errors.py."""

import ast
from pathlib import Path

import pytest
from conftest import ROOT

#: the import name of each top-level folder
PACKAGES = {"subzero": "subzero", "operators": "subzero.operators",
            "optimizer": "subzero.optimizer", "workflows": "subzero.workflows"}

#: what each layer may import (besides itself, errors and tuning), lowest first
LAYERS = {
    "subzero.model": {"subzero.model"},
    "subzero.capture": {"subzero.model"},
    "subzero.coords": {"subzero.model"},
    "subzero.storage": {"subzero.model", "subzero.capture"},
    "subzero.query": {"subzero.model", "subzero.capture", "subzero.storage", "subzero.coords"},
    "subzero.engines": {"subzero.model", "subzero.capture", "subzero.storage"},
    "subzero.runs": {"subzero.model", "subzero.capture", "subzero.storage", "subzero.engines"},
}
#: modules every layer may import (docs/architecture.md's "leaves"): they import none of
#: the layers (the process's allocator, ``subzero.heap``, only ``subzero.tuning``; a
#: forked child, ``subzero.forked``, only the allocator; scratch folders, none)
LEAVES = ("subzero.errors", "subzero.tuning", "subzero.version", "subzero.heap", "subzero.forked",
          "subzero.scratch")
#: what no layer of the core may import: the outer layers
OUTER = ("subzero.api", "subzero.store", "subzero.run", "subzero.cli", "subzero.export",
         "subzero.explore", "subzero.optimizer", "subzero.operators", "subzero.workflows",
         "subzero.plot")


def _modules() -> dict[str, Path]:
    mods = {}
    for folder, name in PACKAGES.items():
        for p in sorted((ROOT / folder).rglob("*.py")):
            rel = p.relative_to(ROOT / folder).with_suffix("")
            parts = [name, *rel.parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = p
    return mods


def _type_checking_only(tree: ast.Module) -> set[int]:
    """Line numbers of imports under ``if TYPE_CHECKING:``."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:
                for n in ast.walk(sub):
                    if isinstance(n, (ast.Import, ast.ImportFrom)):
                        lines.add(n.lineno)
    return lines


def _face(mods: dict[str, Path]) -> dict[str, str]:
    """The package face's names (``from subzero import Operator``) and the modules that
    define them: importing a name from the face depends on its module, not on all the
    face gathers."""
    names = {}
    for node in ast.parse(mods["subzero"].read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                names[a.asname or a.name] = node.module
    return names


def _imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    face = _face(mods)
    graph: dict[str, set[str]] = {}
    for mod, path in mods.items():
        tree = ast.parse(path.read_text())
        skip = _type_checking_only(tree)
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        out = set()
        for node in ast.walk(tree):
            if getattr(node, "lineno", None) in skip:
                continue
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    root = f"{base}.{node.module}" if node.module else base
                else:
                    root = node.module or ""
                names = []
                for a in node.names:
                    full = f"{root}.{a.name}"
                    if full in mods:
                        names.append(full)          # a module of the package
                    elif root == "subzero" and a.name in face:
                        names.append(face[a.name])  # a name the face re-exports
                    else:
                        names.append(root)
            else:
                continue
            for n in names:
                # the module itself, or the package a name comes from
                while n and n not in mods:
                    n = n.rpartition(".")[0]
                if n and n != mod and n != "subzero":
                    out.add(n)
        graph[mod] = out
    return graph


@pytest.fixture(scope="module")
def graph():
    return _imports(_modules())


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _package_of(mod: str) -> str:
    """A module's package: a subpackage of subzero, else the module itself."""
    parts = mod.split(".")
    return ".".join(parts[:2])


def test_no_import_circles(graph):
    assert _cycles(graph) == []


def test_a_package_face_imports_no_package_of_its_own_that_imports_it_back(graph):
    """Sanity of the reader itself: it sees the arrows it should."""
    assert "subzero.engines.spark.engine" in graph["subzero.engines.choice"]
    assert "subzero.query.trace" in graph["subzero.query.tracelog"]


@pytest.mark.parametrize("layer", list(LAYERS))
def test_dependencies_point_one_way(graph, layer):
    allowed = LAYERS[layer] | {layer, *LEAVES}
    bad = sorted((m, d) for m, deps in graph.items() if _package_of(m) == layer
                 for d in deps if _package_of(d) not in allowed)
    assert bad == [], f"{layer} imports outside its layer: {bad}"


def test_the_leaves_import_no_layer(graph):
    assert graph["subzero.heap"] == {"subzero.tuning"}      # the reader sees them
    assert graph["subzero.forked"] == {"subzero.heap"}
    assert graph["subzero.scratch"] == set()
    bad = sorted((m, d) for m in LEAVES for d in graph[m] if d not in LEAVES)
    assert bad == [], f"a leaf imports a layer: {bad}"


def test_the_core_never_reaches_the_outer_layers(graph):
    core = ("subzero.model", "subzero.capture", "subzero.coords", "subzero.storage", "subzero.query",
            "subzero.engines", "subzero.runs", *LEAVES)
    def within(name: str, places: tuple[str, ...]) -> bool:
        return any(name == p or name.startswith(p + ".") for p in places)
    bad = sorted((m, d) for m, deps in graph.items() if within(m, core)
                 for d in deps if within(d, OUTER))
    assert bad == []


def test_every_exception_class_is_defined_in_errors(graph):
    mods = _modules()
    found = []
    for mod, path in mods.items():
        if mod == "subzero.errors":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {ast.unparse(b) for b in node.bases}
                if any(b.endswith(("Error", "Exception", "Warning")) or b in
                       {"Deadline", "TaskFailed", "InternalSignal", "ValueError", "RuntimeError"}
                       for b in bases):
                    found.append(f"{mod}.{node.name}")
    assert found == []


def test_every_error_is_a_subzero_error():
    import inspect

    from subzero import errors
    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass)
               if issubclass(c, BaseException) and c.__module__ == "subzero.errors"]
    assert len(classes) > 15
    for c in classes:
        assert issubclass(c, (errors.SubZeroError, errors.SubZeroWarning)), c
