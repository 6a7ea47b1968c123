"""docs/benchmarks.md is generated from the recorded runs in
benchmarks/results/*.json by benchmarks/render_docs.py, so the page cannot
drift from the numbers; and every benchmark script writes such a file
(``--json PATH``, through benchmarks/_results.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
RESULTS = BENCHMARKS / "results"
DOC = ROOT / "docs" / "benchmarks.md"
# the benchmark scripts: every script in benchmarks/ but the private helpers and the page's renderer
SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_") and p.name != "render_docs.py")


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_doc_is_what_render_docs_writes_from_the_results():
    render_docs = _load("render_docs")
    assert DOC.read_text(encoding="utf-8") == render_docs.render(RESULTS), (
        "docs/benchmarks.md differs from what benchmarks/results/ renders: run python benchmarks/render_docs.py")


def test_doc_is_short():
    lines = DOC.read_text(encoding="utf-8").splitlines()
    assert len(lines) < 300, f"docs/benchmarks.md has {len(lines)} lines; one short table per claim, no history"


def test_every_results_file_has_a_section():
    """A results file no section reads (as its own or among its ``also``) would be a number nobody sees."""
    sections = {name for s in _load("render_docs").SECTIONS for name in (s.result, *s.also)}
    orphans = sorted(p.stem for p in RESULTS.glob("*.json") if p.stem not in sections)
    assert not orphans, f"benchmarks/results/ files without a section in render_docs.SECTIONS: {orphans}"


def test_each_results_file_records_its_run():
    for path in sorted(RESULTS.glob("*.json")):
        r = json.loads(path.read_text())
        missing = {"script", "command", "mode", "date", "jax", "machine", "summary", "rows"} - set(r)
        assert not missing, f"{path.name} lacks {sorted(missing)}"
        settings, _, rest = r["command"].partition("python ")
        assert rest.startswith(r["script"]) and all("=" in w for w in settings.split()), (path.name, r["command"])
        assert (ROOT / r["script"]).is_file() and r["machine"]["cpu_count"] >= 1, path.name


def test_a_section_without_results_says_how_to_produce_them(tmp_path):
    """Rendered from an empty folder, every section is listed under "Not
    recorded here" with its command; the GPU's says it needs one."""
    render_docs = _load("render_docs")
    text = render_docs.render(tmp_path)
    assert "## Not recorded here" in text
    for s in render_docs.SECTIONS:
        said = f"- {s.title}: `{s.command}`" + (" (needs a GPU)." if s.needs_gpu else ".")
        assert said in text.splitlines(), s.title
        assert s.command.split("python ", 1)[1].split()[0] in {f"benchmarks/{n}" for n in SCRIPTS}, s.command
    assert sum(s.needs_gpu for s in render_docs.SECTIONS) == 1  # gpu_steps.py alone needs an accelerator


def test_write_results_records_the_run_atomically(tmp_path):
    """benchmarks/_results.py: numpy values and tuples as JSON numbers and
    lists, a non-finite float as null, the command as the script was started;
    no temporary file left beside the result."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from _results import write_results
    finally:
        sys.path.remove(str(BENCHMARKS))
    out = tmp_path / "sub" / "x.json"
    write_results(out, "benchmarks/demo.py", "quick", {"ratio": np.float32(1.5), "worst": float("inf")},
                  [{"mesh": (2, 4), "bytes": np.arange(3)}], ["--quick", "--models", "a b"], extra=np.int64(7))
    r = json.loads(out.read_text())
    assert r["command"] == "python benchmarks/demo.py --quick --models 'a b'"
    assert r["mode"] == "quick" and r["summary"] == {"ratio": 1.5, "worst": None}
    assert r["rows"] == [{"mesh": [2, 4], "bytes": [0, 1, 2]}] and r["extra"] == 7
    assert r["machine"]["cpu_count"] == os.cpu_count() and len(r["date"]) == 10
    assert [p.name for p in out.parent.iterdir()] == ["x.json"]
    assert write_results(None, "benchmarks/demo.py", "quick", {}, []) is None
    write_results(out, "benchmarks/demo.py", "full", {}, [], [], env={"XLA_FLAGS": "--a=1 --b"})
    assert json.loads(out.read_text())["command"] == "XLA_FLAGS='--a=1 --b' python benchmarks/demo.py"


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS)
def test_script_takes_json(script):
    """Each script's --help offers --json PATH, defaulting to its own
    results file (seconds each: most import JAX before parsing)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, str(BENCHMARKS / script), "--help"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = " ".join(proc.stdout.split())
    assert "--json PATH" in text and f"benchmarks/results/{Path(script).stem}.json" in text, text[-600:]
