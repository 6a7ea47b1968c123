"""Wall time of the exact stage-cut search (``search.solve_stage_cuts``) on
long chains, and how many cut sets' DPs it ran.

    python benchmarks/stage_cuts.py [--repeats 3] [--json PATH]

Cases: ``L`` layers in ``S`` stages for ``m`` micro-batches, 1F1B and
GPipe, either a chain of identical blocks between a lighter first and last
layer (an embedding and a head, larger state) or random layers (times
log-uniform over a factor of 400, boundaries over a factor of 1000,
seeded), each without a memory limit and at 5% over the smallest limit any
cut set fits. Prints, per case, the best of ``--repeats`` wall times, the
DPs run (bisection and sweep) and the distinct candidate stage times;
writes them as ``rows`` (through ``benchmarks/_results.py``, default
``benchmarks/results/stage_cuts.json``), the slowest and the most DPs in
``summary``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from _results import add_json_option, write_results  # noqa: E402
from search import StageCutProblem, StageCutsInfeasibleError, solve_stage_cuts  # noqa: E402
from search.exact import stage_cuts as module  # noqa: E402

SHAPES = [(128, 64, 128), (128, 64, 8), (128, 64, 2), (128, 64, 1), (128, 8, 64), (96, 24, 96)]


def blocks(L: int, S: int, m: int, schedule: str) -> StageCutProblem:
    """Identical blocks between a lighter first and last layer holding more state."""
    time_s, state, act = np.full(L, 1.0), np.full(L, 4e8), np.full(L, 1e8)
    time_s[[0, -1]], state[[0, -1]] = (0.3, 0.7), (2e9, 2e9)
    return StageCutProblem(time_s, state, act, np.full(L - 1, 0.02), S, m, schedule)


def random_layers(L: int, S: int, m: int, schedule: str, seed: int) -> StageCutProblem:
    rng = np.random.default_rng(seed)
    return StageCutProblem(np.exp(rng.uniform(-3, 3, L)), rng.uniform(0, 1e9, L), rng.uniform(0, 3e8, L),
                           np.exp(rng.uniform(-5, 2, L - 1)), S, m, schedule)


def smallest_limit(p: StageCutProblem) -> float:
    try:
        solve_stage_cuts(p._replace(memory_limit_bytes=-1.0))
    except StageCutsInfeasibleError as e:
        return e.min_memory_bytes
    raise AssertionError("a negative limit fitted")


def measure(p: StageCutProblem, repeats: int) -> dict:
    """Best wall time of ``repeats`` solves, DPs run, distinct candidates."""
    calls, least_sum = [0], module._least_sum

    def counted(*args):
        calls[0] += 1
        return least_sum(*args)

    module._least_sum = counted
    try:
        seconds = []
        for _ in range(repeats):
            calls[0], start = 0, time.perf_counter()
            r = solve_stage_cuts(p)
            seconds.append(time.perf_counter() - start)
    finally:
        module._least_sum = least_sum
    seg = module._segments(module._checked(p))
    return {"seconds": min(seconds), "dps": calls[0], "step_time_s": r.step_time_s,
            "candidates": int(np.unique(seg.time_s[np.isfinite(seg.time_s)]).size)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    add_json_option(parser, __file__)
    args = parser.parse_args(argv)
    rows = []
    print(f"{'chain':7} {'L':>4} {'S':>3} {'m':>4} {'schedule':8} {'limit':6} {'seconds':>8} {'DPs':>5} "
          f"{'candidates':>10}")
    for (L, S, m), schedule, chain in ((s, sch, c) for s in SHAPES for sch in ("1f1b", "gpipe")
                                       for c in ("blocks", "random")):
        p = blocks(L, S, m, schedule) if chain == "blocks" else random_layers(L, S, m, schedule, seed=L + S + m)
        for limit in ("none", "tight"):
            q = p if limit == "none" else p._replace(memory_limit_bytes=1.05 * smallest_limit(p))
            row = {"chain": chain, "layers": L, "stages": S, "microbatches": m, "schedule": schedule,
                   "limit": limit, **measure(q, args.repeats)}
            rows.append(row)
            print(f"{chain:7} {L:4} {S:3} {m:4} {schedule:8} {limit:6} {row['seconds']:8.3f} {row['dps']:5} "
                  f"{row['candidates']:10}")
    slowest_s, most_dps = max(r["seconds"] for r in rows), max(r["dps"] for r in rows)
    print(f"slowest: {slowest_s:.3f} s; most DPs: {most_dps}")
    write_results(args.json, __file__, "default" if args.repeats == 3 else "custom",
                  {"repeats": args.repeats, "cases": len(rows), "slowest_s": slowest_s, "most_dps": most_dps},
                  rows, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
