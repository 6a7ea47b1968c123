"""The Lagrangian candidates of the refinement (search.exact.lagrangian) and the
run sums rounded up that they are searched with, against brute force."""

from __future__ import annotations

import numpy as np
import pytest
from builders import every_plan, rich_table

from search import discrete_problem, solve_brute
from search.exact import lagrangian_plans, run_chain, smallest_memory
from search.exact.runs import all_bucket_moves, bucket_viterbi
from search.local import refine
from search.problem import has_runs, plan_memory, plan_time


def test_run_sums_rounded_up_restrict_where_rounded_down_relax():
    """bucket_viterbi at a cap of 200 bytes in 4 buckets of 50, every
    workspace above 50 bytes (so the last bucket allows no join), recomputed
    bytes not multiples of 50: rounded up, its value is no less than the
    fastest plan whose transients keep within the cap (brute force) and its
    path is such a plan; rounded down, no more. Over the seeds the two
    differ (the rounding matters)."""
    differ = 0
    for seed in range(6):
        t = rich_table(seed, 5, workspace_most=40)
        t = t._replace(workspace_bytes=t.workspace_bytes + 65.0)
        p = discrete_problem(t)
        rc = run_chain(p)
        plans, times, _, peak = every_plan(p)
        cap = 200.0
        assert (peak <= cap).any() and (peak > cap).any()
        fastest = times[peak <= cap].min()
        unary = np.where(p.workspace_bytes <= cap, p.layer_time_s, np.inf)[None]
        up, path = bucket_viterbi(unary, rc.pair, all_bucket_moves(rc, np.array([cap]), 4, up=True))
        down, _ = bucket_viterbi(unary, rc.pair, all_bucket_moves(rc, np.array([cap]), 4))
        assert up[0] >= fastest * (1 - 1e-12) and down[0] <= fastest * (1 + 1e-12)
        assert peak[np.flatnonzero((plans == path[0]).all(axis=1))[0]] <= cap
        assert plan_time(p, path[0]) == pytest.approx(up[0], rel=1e-12)
        differ += up[0] > down[0] * (1 + 1e-9)
    assert differ


@pytest.mark.parametrize("seed", range(6))
def test_lagrangian_plans_bracket_the_limit(seed):
    """At limits between the smallest memory and the fastest plan's (brute
    force), the Lagrangian plans are runnable, one of them fits and one is
    over the limit (the two ends of a multiplier's bracket); under no
    limit, or where no plan can hold a run, there are none."""
    p = discrete_problem(rich_table(seed, 6))
    assert has_runs(p)
    full = solve_brute(p)  # (no limit: the fastest plan, and the smallest memory)
    lo, hi = full.min_memory_bytes, full.memory_bytes
    assert hi > lo
    for limit in np.linspace(lo, hi, 5)[1:-1]:
        plans = lagrangian_plans(p, limit)
        assert plans.shape[1] == p.num_layers and plans.shape[0] >= 2
        assert p.feasible[np.arange(p.num_layers), plans].all()
        mem = np.array([plan_memory(p, x) for x in plans])
        assert (mem <= limit).any() and (mem > limit).any()
    assert lagrangian_plans(p, np.inf).shape == (0, p.num_layers)
    no_runs = p._replace(option_joins=np.zeros_like(p.option_joins))
    assert lagrangian_plans(no_runs, (lo + hi) / 2).shape == (0, p.num_layers)


def test_refine_searches_from_its_starts_besides_its_best_candidates(monkeypatch):
    """refine with one candidate place: the local search also starts from
    a start (brute force's fastest plan within the limit, which fits, so
    repair keeps it) besides the candidate (the smallest-memory plan), and
    the result is that plan's time; without starts, it starts from the
    candidate alone."""
    import search.local.refinement as refine_module

    searched = []
    free = refine_module.free_levers
    monkeypatch.setattr(refine_module, "free_levers", lambda p, c, *a: searched.append(np.array(c)) or free(p, c, *a))
    for seed in range(3):
        p = discrete_problem(rich_table(seed, 6))
        full = solve_brute(p)
        limit = (full.min_memory_bytes + full.memory_bytes) / 2
        best = solve_brute(p, limit)
        mm = smallest_memory(p)
        searched.clear()
        with_start = refine(p, mm.choice[None], limit, max_candidates=1, starts=np.asarray(best.choice)[None])
        assert with_start.feasible and with_start.time_s == pytest.approx(best.time_s, rel=1e-12)
        assert len(searched) == 2 and any((x == np.asarray(best.choice)).all() for x in searched)
        searched.clear()
        refine(p, mm.choice[None], limit, max_candidates=1)
        assert len(searched) == 1 and (searched[0] == mm.choice).all()


def test_the_gradient_method_refines_from_the_lagrangian_plans(monkeypatch):
    """search.solve's gradient method hands the Lagrangian plans of each
    table with runs to the refinement as starts, and its plan is no slower
    than the refinement from them alone gives."""
    import search.solver as solver_module
    from search import compact_options, solve

    given = []
    real = solver_module.lagrangian_plans
    monkeypatch.setattr(solver_module, "lagrangian_plans", lambda p, lim, **kw: given.append(real(p, lim, **kw)) or given[-1])
    t = rich_table(1, 6)
    p = compact_options(discrete_problem(t)).problem
    full = solve_brute(p)
    limit = (full.min_memory_bytes + full.memory_bytes) / 2
    s = solve(t, limit, "gradient")
    assert len(given) == 1 and given[0].shape[0] >= 2
    alone = refine(p, given[0][:1], limit, starts=given[0])
    assert s.feasible and s.time_s <= alone.time_s * (1 + 1e-12)
