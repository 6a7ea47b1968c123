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
