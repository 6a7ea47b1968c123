"""The direction of dependency (docs/design.md): ``costmodels`` <- ``search``
<- ``planner``. Read from the source (every import statement, the ones inside
functions included), not from what happens to be loaded."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def imports_of(path: Path, own: str) -> set[str]:
    """The top-level package of every module ``path`` imports (a relative import: ``own``)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            out.add(own if node.level else (node.module or "").split(".")[0])
    return out


def test_imports_of_reads_every_kind_of_import(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import search.solve, numpy as np\nfrom planner import x\nfrom . import y\n"
                     "def f():\n    import flax\n", encoding="utf-8")
    assert imports_of(probe, "costmodels") == {"search", "numpy", "planner", "costmodels", "flax"}


@pytest.mark.parametrize("package, forbidden", [
    ("costmodels", {"planner", "search", "flax", "optax"}),
    ("search", {"planner", "flax"}),  # (its gradient search runs on optax)
])
def test_packages_import_only_downward(package, forbidden):
    offenders = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        bad = imports_of(path, package) & forbidden
        if bad:
            offenders[str(path.relative_to(ROOT))] = sorted(bad)
    assert not offenders, f"{package} must not import {sorted(forbidden)}: {offenders}"


def _modules() -> dict[str, Path]:
    out = {}
    for package in ("costmodels", "search", "planner"):
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def module_imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ``modules`` that ``path`` imports (``from pkg import sub``
    counts as importing ``pkg.sub`` where ``sub`` is a module)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            subs = {f"{node.module}.{a.name}" for a in node.names} & set(modules)
            out |= subs if len(subs) == len(node.names) else ({node.module} & set(modules)) | subs
    return out


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        cycles.append(sorted(component))
    return cycles


def test_import_cycles_by_hand():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set(), "c": {"b"}}) == []
    assert sorted(import_cycles({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c", "a"}})) == [["a", "b"], ["c", "d"]]


def test_no_file_imports_back_from_a_file_that_imports_it():
    modules = _modules()
    graph = {m: module_imports(p, modules) - {m} for m, p in modules.items()}
    assert "planner.ir.graph" in graph["planner.ir.builder"]  # the reader sees imports at all
    assert not import_cycles(graph), f"import cycles: {import_cycles(graph)}"


@pytest.mark.parametrize("code", [
    "import planner",
    "from planner.cli import main\nmain(['--help'])",
])
def test_import_and_help_load_neither_jax_nor_flax(code):
    """``import planner`` and ``shardplan --help`` answer at once: the public
    names and the subcommands load on first use (what a fresh process has
    imported afterwards, as Python records it)."""
    import subprocess
    import sys

    probe = code + "\nimport sys\nprint(sorted(m for m in ('jax', 'flax', 'scipy', 'costmodels', 'search') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1]).stdout
    assert out.strip().splitlines()[-1] == "[]"
