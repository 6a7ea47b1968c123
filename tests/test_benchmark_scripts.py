"""The benchmark scripts in benchmarks/ run end to end and print what their
docs quote (the figures themselves are recorded in docs/benchmarks.md)."""

import itertools
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_xla_agreement_quick_prints_rows_and_summary(tmp_path):
    """benchmarks/xla_agreement.py (the memory-promise grid) on its smallest case, and
    benchmarks/memory_models.py on its output:
    one plan, compiled once, a row with the limit and ``fits``, and the
    summary counts; ``--json`` holds the same row."""
    import json

    out = tmp_path / "rows.json"
    # compiled with XLA:CPU's depth-first memory scheduler, which the header then names
    flags = os.environ.get("XLA_FLAGS", "") + " --xla_cpu_enable_concurrency_optimized_scheduler=false"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XLA_FLAGS": flags}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "xla_agreement.py"), "--quick", "--models", "vgg16-cifar10",
         "--batches", "64", "--meshes", "2x4", "--limits", "none", "--json", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = proc.stdout
    assert text.startswith("jax ") and " x cpu (memory scheduler); plans: " in text.splitlines()[0]
    assert "limits vgg16-cifar10 batch 64 mesh 2x4: smallest feasible" in text
    row = [line for line in text.splitlines() if line.startswith("vgg16-cifar10 ")]
    assert len(row) == 1 and " 2x4 " in row[0] and " none " in row[0]
    assert "summary: 1 cases, 1 compiled programs, 0 failed to compile" in text
    for line in ("fits the limit: ", "total memory within 10%: ", "every collective within 5%: ",
                 "parameters + optimizer state exact: "):
        assert any(s.startswith(line) and s.endswith(" of 1") for s in text.splitlines()), line
    assert json.loads(out.read_text())["cpu_scheduler"] == "memory"
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 1 and rows[0]["mesh"] == [2, 4] and rows[0]["limit"] == "none"
    assert rows[0]["fits"] is True and rows[0]["state_exact"] is True  # 80 GB: any VGG plan fits
    assert rows[0]["compiled_total_bytes"] > 0 and rows[0]["report"]["mesh"] == [2, 4]

    # benchmarks/memory_models.py on that grid: one case, every model scored; "today" is
    # the cost model's own memory, so its error is the grid row's compiled / predicted - 1.
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "memory_models.py"), str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = {line.split()[0]: line.split() for line in proc.stdout.splitlines()[2:]}
    assert set(lines) == {"today", "sum", "phases+expansion", "phases", "liveness", "phases+pools", "forward+pools",
                          "forward+copies", "fused", "fused+pools", "xla-cpu-rules"}
    # a lever-free plan's memory on cpu is XLA:CPU's schedule (costmodels/xla_cpu.py), as the
    # script sums it again from the cost table, the plan and the grid row's inputs
    pct = lambda s: float(s.rstrip("%"))  # noqa: E731
    assert abs(pct(lines["xla-cpu-rules"][4]) - pct(lines["today"][4])) <= 0.1
    err = rows[0]["compiled_total_bytes"] / rows[0]["predicted_total_bytes"] - 1
    assert lines["today"][4] == lines["today"][5] == f"{err:+.1%}"
    assert lines["today"][1] == str(int(abs(err) <= 0.10)) and lines["today"][3] == "1"


def test_search_quality_refuses_remat_runs_without_a_remat_menu():
    """benchmarks/search_quality.py --remat-runs offers recomputing in runs,
    which needs the remat lever on the menu: without --levers remat|all it
    stops with argparse's usage error (exit 2) before any search."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "search_quality.py"), "--remat-runs", "--levers", "zero",
         "--skip-timings", "--models", "cosmoflow-256"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 2, proc.stdout[-2000:]
    assert "--remat-runs needs --levers remat or all" in proc.stderr


def test_search_quality_refuses_unknown_limits():
    """benchmarks/search_quality.py --limits takes a subset of the instance
    kinds; a name that is none of them stops it with argparse's usage error
    (exit 2), naming the kinds, before any search."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "search_quality.py"), "--limits", "tight,tigth",
         "--skip-timings", "--models", "cosmoflow-256"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 2, proc.stdout[-2000:]
    assert "unknown limit(s) in 'tight,tigth'; choose from loose, tight, infeasible, levers-only" in proc.stderr


def test_search_quality_layer_order_bounds_hold_on_the_graph():
    """benchmarks/search_quality.py's reference where the MILP proves
    nothing (forced: a result that is not exact, with the slowest plan that
    fits and no bound) on a chain with skip edges that reshard, whose plans
    hold runs: the DP over the graph in layer order proves brute force's
    fastest time, and the plan it reports fits."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    sys.path.insert(0, str(ROOT / "tests"))
    from search_quality import with_layer_order_bounds
    from builders import rich_table

    from search import discrete_problem, solve_brute
    from search.exact import MILPResult
    from search.problem import has_runs, plan_memories, plan_memory, plan_time, plan_times

    n = 5
    edges = [(i, i + 1) for i in range(n - 1)] + [(0, 2), (1, 4)]
    checked = 0
    for seed in range(4):
        p = discrete_problem(rich_table(seed, n, edges))
        assert has_runs(p)
        full = solve_brute(p)
        for limit in (full.min_memory_bytes * 1.05, full.memory_bytes):
            brute = solve_brute(p, limit)
            # a plan that fits, as slow as possible: over every plan
            plans = np.array(list(itertools.product(*[np.flatnonzero(f) for f in p.feasible])))
            fit = plans[plan_memories(p, plans) <= limit]
            slow = fit[np.argmax(plan_times(p, fit))]
            given = MILPResult(slow, plan_time(p, slow), plan_memory(p, slow), True, 0.0, False, "forced", 0.0)
            (ref,), _ = with_layer_order_bounds([p], [given], limit, 30.0, [None])
            assert ref.feasible and ref.exact and ref.time_s == pytest.approx(brute.time_s, rel=1e-9)
            assert brute.time_s * (1 - 1e-9) <= ref.lower_bound_s <= brute.time_s * (1 + 1e-9)
            checked += ref.time_s < given.time_s  # the DP's plan, not the one given
    assert checked


@pytest.mark.slow
def test_memory_grid_quick_splits_halves_and_scores_families(tmp_path):
    """benchmarks/memory_grid.py --quick on one model: a row per limit, each in
    the half SHA-256 of its case id puts it in (even first byte: development),
    the summary per half and family, and the ordering line."""
    import hashlib
    import json

    out = tmp_path / "grid.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "memory_grid.py"), "--quick", "--models", "vgg16-cifar10",
         "--json", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads(out.read_text())
    assert [x["case"] for x in r["rows"]] == ["vgg16-cifar10/32/2x4/none", "vgg16-cifar10/32/2x4/tight"]
    for x in r["rows"]:
        even = hashlib.sha256(x["case"].encode()).digest()[0] % 2 == 0
        assert x["half"] == ("development" if even else "held-out") and x["family"] == "cnn"
        assert x["compiled_total_bytes"] > 0 and x["fits"] == (x["compiled_total_bytes"] <= x["limit_bytes"])
    s = r["summary"]
    assert s["development"]["all"]["cases"] + s["held-out"]["all"]["cases"] == 2
    assert s["development"]["transformer"]["cases"] == s["held-out"]["transformer"]["cases"] == 0
    assert "memory ordered right: " in proc.stdout and proc.stdout.count("\ndevelopment ") == 3
