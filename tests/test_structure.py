"""The code base's shape, guarded: layers a newcomer sees in the folders, and no cycles.

The layers (docs/architecture.md, "Layers"), lowest first; a module imports only modules
of its own layer or lower ones, at any depth of the file (a late import counts too):

0. foundation: ``dbml.errors``, ``dbml.scheduler`` (which imports nothing else of dbml),
   ``dbml.zoo`` (the architectures), ``dbml.sql`` (the catalog's SQL files);
1. the core, ``dbml.core``: the job, its data path, the catalog, inference. What it needs
   from above comes through a seam (``dbml.core.placement``: where a job runs), which a
   backend fills by name;
2. backends, each on its own: ``dbml.cluster`` (Ray) and ``dbml.search`` (hyper-parameter
   search); neither imports the other;
3. surfaces: the SQL functions (``dbml.udfs``), the shell, BigQuery ML, the Python API
   (``dbml``, ``dbml.api``, ``dbml.tuning``), notebooks and plots, export, explanations,
   the command line and the bench.

There are no line caps (issue 30): a long module with one concern is fine; a short one
that reaches across layers is not.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# the source folders and the package each is imported as (pyproject's package-dir)
PACKAGES = {"dbml": "dbml", "benchmarks": "dbml.bench"}

FOUNDATION, CORE, BACKEND, SURFACE = range(4)
# the longest matching prefix decides a module's layer
LAYERS = {
    "dbml.errors": FOUNDATION, "dbml.scheduler": FOUNDATION, "dbml.zoo": FOUNDATION, "dbml.sql": FOUNDATION,
    "dbml.core": CORE,
    "dbml.cluster": BACKEND, "dbml.search": BACKEND,
    "dbml": SURFACE,   # everything else: dbml's __init__, api, tuning, udfs, shell, bigquery, notebook, ...
}
BACKENDS = ("dbml.cluster", "dbml.search")


def _modules() -> dict[str, Path]:
    out = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join((package, *parts))] = path
    return out


MODULES = _modules()


def layer(name: str) -> int:
    best = max((p for p in LAYERS if name == p or name.startswith(p + ".")), key=len)
    return LAYERS[best]


def _imports(name: str, path: Path) -> set[str]:
    """Project modules ``name`` imports, at any depth of the file (late imports count)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # ``from pkg import mod`` depends on the module, not on the package's __init__
            subs = [f"{base}.{a.name}" for a in node.names]
            targets = [t for t in subs if t in MODULES] or [base]
        else:
            continue
        found.update(t for t in targets if t in MODULES and t != name)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _package_init_edges(name: str) -> set[str]:
    """Importing ``a.b.c`` runs ``a.b``'s ``__init__``: not an edge we count as a cycle."""
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def test_no_import_cycles():
    graph = {n: {t for t in ts if t not in _package_init_edges(n)} for n, ts in GRAPH.items()}
    cycles, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_no_module_imports_a_higher_layer():
    up = [f"{n} (layer {layer(n)}) imports {t} (layer {layer(t)})" for n, ts in sorted(GRAPH.items())
          for t in sorted(ts) if layer(t) > layer(n)]
    assert not up, "imports from a lower layer to a higher one:\n" + "\n".join(up)


def test_backends_do_not_import_each_other():
    def backend(name):
        return next((b for b in BACKENDS if name == b or name.startswith(b + ".")), None)
    across = [f"{n} imports {t}" for n, ts in sorted(GRAPH.items()) for t in sorted(ts)
              if backend(n) and backend(t) and backend(n) != backend(t)]
    assert not across, "\n".join(across)


def test_every_module_has_a_layer_and_the_folders_are_the_layers():
    # a module of the core, a backend or the foundation lives in that layer's folder
    misplaced = [n for n in MODULES if n.count(".") == 1 and layer(n) in (CORE, BACKEND)
                 and not (ROOT / "dbml" / n.split(".")[1]).is_dir()]
    assert not misplaced, misplaced
    assert layer("dbml.core.training") == CORE and layer("dbml.shell.session") == SURFACE


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith("dbml.scheduler")))
def test_scheduler_never_imports_the_runtime(name):
    runtime = {t for t in GRAPH[name] if not t.startswith("dbml.scheduler") and t != "dbml"}
    assert not runtime, f"{name} imports the dbml runtime: {sorted(runtime)}"
