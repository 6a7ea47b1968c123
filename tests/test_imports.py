"""The direction of dependency (docs/design.md): ``costmodels`` <- ``search``
<- ``planner``; and tests share helpers through tests/builders.py and
fixtures, never by importing another test module. Read from the source
(every import statement, the ones inside functions included), not from what
happens to be loaded."""

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


def imported_test_modules(path: Path) -> list[str]:
    """The ``test_*`` modules that ``path`` imports, in any import statement."""
    return sorted(m for m in imports_of(path, "") if m.startswith("test_"))


def test_imported_test_modules_by_hand(tmp_path):
    probe = tmp_path / "test_probe.py"
    probe.write_text("import numpy\nfrom builders import rich_table\nfrom test_dp_runs import x\n"
                     "def f():\n    import test_validate as t\n", encoding="utf-8")
    assert imported_test_modules(probe) == ["test_dp_runs", "test_validate"]
    probe.write_text("from builders import rich_table\nimport testing\n", encoding="utf-8")
    assert imported_test_modules(probe) == []


def test_no_test_module_imports_another():
    """Shared helpers live in tests/builders.py (or fixtures in tests/conftest.py)."""
    files = sorted((ROOT / "tests").glob("*.py"))
    assert len(files) > 50  # the reader sees the test modules at all
    offenders = {p.name: imported_test_modules(p) for p in files if imported_test_modules(p)}
    assert not offenders, f"test modules importing other test modules (move the helpers to tests/builders.py): " \
        f"{offenders}"


# -- the faces: planner imports costmodels and search, search imports costmodels, only through __init__ --


def inner_imports(path: Path, packages: set[str]) -> list[str]:
    """The imports in ``path`` that reach past a package of ``packages`` into a
    module inside it: ``from pkg.mod import x``, ``import pkg.mod`` and ``from
    pkg import mod`` (``mod`` a module or subpackage of ``pkg``), each as
    ``line: module``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [f"{node.lineno}: {a.name}" for a in node.names
                    if a.name.split(".")[0] in packages and "." in a.name]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            top = node.module.split(".")[0]
            if top not in packages:
                continue
            if node.module != top:
                out.append(f"{node.lineno}: {node.module}")
            else:
                out += [f"{node.lineno}: {top}.{a.name}" for a in node.names
                        if (ROOT / top / a.name).is_dir() or (ROOT / top / f"{a.name}.py").is_file()]
    return out


def test_inner_imports_by_hand(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from costmodels import Strategy, cost_table\nimport search\nfrom search import solve\n"
                     "from costmodels.table import cost_table\nimport search.solver\nfrom search import exact\n"
                     "from planner.ir import graph\n"
                     "def f():\n    from costmodels.oracle import oracle_table\n", encoding="utf-8")
    assert inner_imports(probe, {"costmodels", "search"}) == [
        "4: costmodels.table", "5: search.solver", "6: search.exact", "9: costmodels.oracle"]
    assert inner_imports(probe, {"planner"}) == ["7: planner.ir"]


@pytest.mark.parametrize("package, faces", [
    ("planner", {"costmodels", "search"}),
    ("search", {"costmodels"}),
])
def test_packages_import_the_ones_below_through_their_faces(package, faces):
    offenders = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        bad = inner_imports(path, faces)
        if bad:
            offenders[str(path.relative_to(ROOT))] = bad
    assert not offenders, f"{package} must import {sorted(faces)} only from their __init__ (__all__): {offenders}"


FACES = ("costmodels", "search", "costmodels.calibration", "costmodels.oracle", "costmodels.pipeline",
         "search.exact", "search.local", "search.gradient", "search.pipeline")


def _lazy_face(package: str) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """A lazy face's ``__all__``, its ``_LAZY`` map and the module each name's
    ``TYPE_CHECKING`` import reads it from, read from the source."""
    tree = ast.parse((ROOT / package.replace(".", "/") / "__init__.py").read_text(encoding="utf-8"))
    names, lazy, typed = [], {}, {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id == "__all__":
                names = ast.literal_eval(node.value)
            elif node.targets[0].id == "_LAZY":
                lazy = ast.literal_eval(node.value)
        elif isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            typed = {a.asname or a.name: imp.module for imp in node.body for a in imp.names}
    if not lazy:  # a face that builds its map from those imports (costmodels): the one it built
        import importlib

        lazy = dict(importlib.import_module(package)._LAZY)
    return names, lazy, typed


@pytest.mark.parametrize("package", ["costmodels", "search", "planner.runtime"])
def test_lazy_faces_name_every_public_name_once(package):
    import importlib

    names, lazy, typed = _lazy_face(package)
    assert len(names) == len(set(names))
    assert set(names) == set(lazy), f"__all__ and _LAZY differ: {sorted(set(names) ^ set(lazy))}"
    assert typed == lazy, f"TYPE_CHECKING imports and _LAZY differ: {sorted(set(typed.items()) ^ set(lazy.items()))}"
    face = importlib.import_module(package)
    for name, module in lazy.items():
        assert getattr(face, name) is getattr(importlib.import_module(module), name), name
    assert set(names) <= set(dir(face))


@pytest.mark.parametrize("face", FACES)
def test_what_packages_import_from_a_face_is_in_its_all(face):
    import importlib

    public = set(importlib.import_module(face).__all__)
    missing = {}
    for package in ("costmodels", "search", "planner"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and node.module == face and not node.level:
                    names = {a.name for a in node.names} - public
                    names = {n for n in names if not (ROOT / face.replace(".", "/") / f"{n}.py").is_file()}
                    if names:
                        missing.setdefault(str(path.relative_to(ROOT)), set()).update(names)
    assert not missing, f"imported from {face} but not in its __all__: {missing}"


def test_importing_the_faces_loads_nothing_else():
    """``import costmodels, search`` loads neither their modules nor JAX,
    NumPy or SciPy (the names load on first use); a name loads its module."""
    import subprocess
    import sys

    probe = ("import sys\nimport costmodels, search\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] in "
             "('costmodels', 'search', 'jax', 'numpy', 'scipy', 'optax')))\n"
             "search.plan_time\nprint('search.problem' in sys.modules, 'search.solver' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         cwd=ROOT).stdout.strip().splitlines()
    assert out == ["['costmodels', 'search']", "True False"]


@pytest.mark.parametrize("face", FACES)
def test_no_face_hides_a_module_of_its_own(face):
    """A public name that is also a module of the package would stand where
    ``import package.module`` looks for the module."""
    import importlib

    folder = ROOT / face.replace(".", "/")
    modules = {p.stem for p in folder.glob("*.py")} | {p.name for p in folder.iterdir() if (p / "__init__.py").is_file()}
    assert not set(importlib.import_module(face).__all__) & modules
