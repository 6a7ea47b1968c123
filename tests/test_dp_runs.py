"""The DP over runs of recomputing layers (search.exact.dp_runs, search.exact.dp) and
its Pareto filter (search.exact.pareto), against brute force: every plan of small
chains whose 15 options per layer have random times, resharding, state,
activations, workspaces, recomputed bytes and checkpoints."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from builders import HAND_CHAIN, assert_dp_matches_brute_force, every_plan, rich_table

from search import discrete_problem, smallest_memory, solve, solve_brute, solve_dp
from search.exact import dp_solves, minimum_memory_milp, pareto, run_chain, solve_milp, viterbi
from search.exact.dp_runs import lighter_runs, minimum_memory_runs
from search.exact.pareto import nondominated_rows
from search.problem import has_runs, plan_memory, plan_time


@pytest.mark.parametrize("seed", range(8))
def test_dp_over_runs_matches_brute_force(seed):
    """solve_dp on chains whose plans hold runs: at limits from below the
    smallest memory to above the fastest plan's, the same feasibility and
    time as brute force, proven (exact), within the limit; and the smallest
    memory (minimum_memory_runs, smallest_memory) is brute force's."""
    p = discrete_problem(rich_table(seed, 4 + seed % 2))
    assert has_runs(p) and dp_solves(p)
    full = solve_brute(p)
    assert minimum_memory_runs(p).memory_bytes == pytest.approx(full.min_memory_bytes, rel=1e-12)
    mm = smallest_memory(p)
    assert mm.exact and plan_memory(p, mm.choice) == pytest.approx(full.min_memory_bytes, rel=1e-12)
    assert_dp_matches_brute_force(p, full, 6)


def test_solve_uses_the_dp_over_runs_where_runs_are_needed():
    """auto on a chain whose fastest plan without recomputing does not fit:
    the DP over runs, proven optimal, brute force's time and smallest
    memory."""
    t = rich_table(3, 5)
    p = discrete_problem(t)
    full = solve_brute(p)
    limit = full.min_memory_bytes * 1.01
    assert full.memory_bytes > limit  # the fastest plan does not fit
    for method in ("auto", "dp"):
        sol = solve(t, memory_limit=limit, method=method)
        assert sol.method == "dp" and sol.optimality_gap == 0.0
        assert sol.time_s == pytest.approx(solve_brute(p, limit).time_s, rel=1e-9)
        assert sol.min_memory_bytes == pytest.approx(full.min_memory_bytes, rel=1e-12)


def test_the_dp_stopped_in_time_still_gives_a_plan_and_a_bound(monkeypatch):
    """With no time for the completion over runs, solve_dp returns a plan
    that fits (not claimed optimal) and a lower bound below brute force's
    time; auto (its time limit set to zero) then lets the gradient search
    join in, keeps the better plan and the DP's bound."""
    import search.solver as solver_module

    t = rich_table(5, 5)
    p = discrete_problem(t)
    full = solve_brute(p)
    stuck = []
    for limit in np.linspace(full.min_memory_bytes, full.memory_bytes, 8)[1:-1]:
        r = solve_dp(p, limit, time_limit_s=0.0)
        brute = solve_brute(p, limit)
        assert r.feasible and plan_memory(p, r.choice) <= limit
        assert r.lower_bound_s <= brute.time_s * (1 + 1e-9) <= r.time_s * (1 + 2e-9)
        if not r.exact:
            stuck.append((limit, r))
    assert stuck  # some limit needs the completion
    monkeypatch.setattr(solver_module, "AUTO_MILP_TIME_LIMIT_S", 0.0)
    limit, r = stuck[0]
    sol = solve(t, memory_limit=limit, method="auto")
    assert [h.stage for h in sol.history][-1] == "dp" and sol.history[-1].time_s == r.time_s
    assert sol.feasible and sol.time_s <= r.time_s and sol.lower_bound_s == r.lower_bound_s


def test_runs_need_a_chain_in_layer_order():
    """Runs follow the layers' order: a chain 1 -> 0 -> 2 is no chain the DP
    over runs takes (NotImplementedError; solve's 'dp' says so, 'auto' takes
    the MILP), and its smallest memory is the MILP's (brute force's)."""
    t = rich_table(1, 3, edges=[(1, 0), (0, 2)])
    p = discrete_problem(t)
    assert has_runs(p) and run_chain(p) is None and not dp_solves(p)
    with pytest.raises(NotImplementedError, match="layer order"):
        solve_dp(p, 1e9)
    with pytest.raises(ValueError, match="layer order"):
        solve(t, memory_limit=1e9, method="dp")
    full = solve_brute(p)
    assert smallest_memory(p).memory_bytes == pytest.approx(full.min_memory_bytes, rel=1e-9)
    limit = full.min_memory_bytes * 1.05
    sol = solve(t, memory_limit=limit, method="auto")
    assert sol.method == "milp" and sol.time_s == pytest.approx(solve_brute(p, limit).time_s, rel=1e-6)


def test_lighter_runs_is_the_smallest_plan_no_slower_per_layer():
    """On HAND_CHAIN (tests/builders.py: every layer's options
    cost 1 ms, so any lever of the same strategy is allowed), from the plan
    keeping everything (630 bytes) lighter_runs finds the smallest memory,
    580 (by hand in tests/test_remat_runs.py); and it never leaves a plan's strategies."""
    p = discrete_problem(HAND_CHAIN)
    fixed = lighter_runs(p, np.zeros(3, np.int64))
    assert plan_memory(p, fixed) == 580
    q = discrete_problem(rich_table(2, 5))
    for c in np.random.default_rng(0).integers(0, 15, (20, 5)):
        c = np.where(q.feasible[np.arange(5), c], c, 0)
        light = lighter_runs(q, c)
        assert np.array_equal(q.option_strategy[light], q.option_strategy[c])
        assert np.all(q.layer_time_s[np.arange(5), light] <= q.layer_time_s[np.arange(5), c])
        assert plan_memory(q, light) <= plan_memory(q, c) and plan_time(q, light) <= plan_time(q, c) * (1 + 1e-12)


def _dominated_by_brute_force(x: np.ndarray) -> np.ndarray:
    """[m] whether some other label is no larger in every column and smaller
    in one, or equal and earlier."""
    le = np.all(x[:, None, :] <= x[None, :, :], axis=-1)  # [i, j]: i no larger than j
    eq = np.all(x[:, None, :] == x[None, :, :], axis=-1)
    earlier = np.tri(len(x), k=-1, dtype=bool).T
    return np.any(le & (~eq | earlier), axis=0)


@pytest.mark.parametrize("rounds", [0, 2, 10_000])
@pytest.mark.parametrize("m", [50, 1500])
def test_pareto_filter_keeps_exactly_the_nondominated_of_each_group(m, rounds, monkeypatch):
    """nondominated_rows against all-pairs dominance over five columns
    within each group, with ties and few distinct values in the last two,
    through the vectorised rounds alone, the sweep alone and both."""
    monkeypatch.setattr(pareto, "_HEAD_ROUNDS", rounds)
    rng = np.random.default_rng(m)
    x = np.stack([rng.integers(0, 30, m), rng.integers(0, 30, m), rng.integers(0, 4, m),
                  rng.integers(0, 3, m), rng.integers(0, 3, m)], axis=1).astype(float)
    group = rng.integers(0, 3, m)
    kept = nondominated_rows(x, group)
    assert np.all(np.diff(kept) > 0)
    for g in range(3):
        rows = np.flatnonzero(group == g)
        want = rows[~_dominated_by_brute_force(x[rows])]  # of equal rows, the first: as the filter keeps
        assert np.array_equal(kept[group[kept] == g], want)
    assert np.array_equal(nondominated_rows(x), np.flatnonzero(~_dominated_by_brute_force(x)))


def test_viterbi_with_weighted_pairs_is_viterbi_with_the_pairs_added():
    rng = np.random.default_rng(0)
    K, n, S = 3, 6, 4
    unary, pair, C = rng.random((K, n, S)), rng.random((n, S, S)), rng.random((n, S, S))
    w = np.array([0.0, 0.5, 2.0])
    v1, p1 = viterbi(unary, pair, (C, w))
    v2, p2 = viterbi(unary, pair[None] + w[:, None, None, None] * C[None])
    assert np.allclose(v1, v2) and np.array_equal(p1, p2)


@pytest.mark.parametrize("seed", range(4))
def test_bucketed_viterbi_is_a_relaxation_exact_where_buckets_are(seed):
    """bucket_viterbi at caps on the largest transient, against every plan.
    Recomputed bytes in multiples of 16 and caps of 128 and 256 bytes in 16
    buckets (8 and 16 bytes: no sum is rounded; workspaces above 16 bytes, so
    the last bucket never allows a join): its value is the fastest plan whose
    transients keep within the cap, and its path such a plan. In 2 buckets
    it never exceeds that (a relaxation)."""
    from search.exact.runs import all_bucket_moves, bucket_viterbi

    t = rich_table(seed, 4)
    t = t._replace(recompute_bytes=16.0 * jnp.ceil(t.recompute_bytes / 16.0), workspace_bytes=t.workspace_bytes + 17.0)
    p = discrete_problem(t)
    rc = run_chain(p)
    plans, times, _, peak = every_plan(p)
    caps = np.array([128.0, 256.0])
    assert np.all([(peak <= c).any() and (peak > c).any() for c in caps])
    unary = np.stack([np.where(p.workspace_bytes <= c, p.layer_time_s, np.inf) for c in caps])
    fastest = np.array([times[peak <= c].min() for c in caps])
    val, path = bucket_viterbi(unary, rc.pair, all_bucket_moves(rc, caps, 16))
    assert np.allclose(val, fastest, rtol=1e-12)
    assert np.allclose([plan_time(p, x) for x in path], val, rtol=1e-12)
    assert np.all(peak[[np.flatnonzero((plans == x).all(axis=1))[0] for x in path]] <= caps)
    coarse, _ = bucket_viterbi(unary, rc.pair, all_bucket_moves(rc, caps, 2))
    assert np.all(coarse <= fastest * (1 + 1e-12))


@pytest.mark.parametrize("seed", range(4))
def test_the_dp_intervals_cover_every_plan_that_fits(seed):
    """run_intervals: every plan within the limit has its largest transient
    in some interval [floor, cap] the DP searches, whose lower bound on
    memory it does not beat."""
    from search.exact.dp_runs import run_intervals

    p = discrete_problem(rich_table(seed, 4))
    plans, _, memory, peak = every_plan(p)
    for limit in np.quantile(memory, [0.01, 0.3, 0.8]):
        caps, floors, bound = run_intervals(p, run_chain(p), float(limit))
        fits = memory <= limit
        inside = (peak[fits, None] >= floors[None, :]) & (peak[fits, None] <= caps[None, :])
        assert inside.any(axis=1).all()
        # and the interval's lower bound is no more than the plan's memory
        assert np.all(np.any(inside & (bound[None, :] <= memory[fits, None] * (1 + 1e-12)), axis=1))


RICH = dict(state_most=1000, workspace_most=300, update_share=0.9)  # either phase may be the larger


# 16-layer chains where either phase may be the larger; 20-layer chains (seeds where comparing a run's sum
# or the kept bytes wrongly changes the smallest memory) where the workspaces vary as much as the state
MILP_CASES = [(100 + s, 16, RICH) for s in range(4)] + [(s, 20, dict(state_most=300, workspace_most=300))
                                                        for s in (103, 105, 117)]


@pytest.mark.slow
@pytest.mark.parametrize("seed, n, kw", MILP_CASES)
def test_label_searches_match_the_milp(seed, n, kw):
    """The label searches give the MILP's answers (another exact solver)
    on chains larger than brute force takes: the smallest memory, and the
    fastest plan at three limits. Their dominance compares the optimizer
    phase, a run's sum and the peak only where these can still change how
    a plan ends, and must drop no label an optimum needs."""
    p = discrete_problem(rich_table(seed, n, **kw))
    ref = minimum_memory_milp(p)
    assert ref.exact
    assert minimum_memory_runs(p).memory_bytes == pytest.approx(ref.memory_bytes, rel=1e-12)
    for limit in ref.memory_bytes * np.array([1.001, 1.05, 1.2]):
        dp, milp = solve_dp(p, limit), solve_milp(p, limit, smallest=ref)
        assert dp.feasible and dp.exact and milp.exact
        assert dp.time_s == pytest.approx(milp.time_s, rel=1e-6)


def test_rich_chains_need_the_optimizer_phase():
    """The RICH chains above are not vacuous: on each, the plan with the
    smallest backward phase (the optimizer phase left out) needs more
    memory than the smallest memory."""
    for seed in range(100, 104):
        p = discrete_problem(rich_table(seed, 16, **RICH))
        backward_only = minimum_memory_milp(p._replace(optimizer_bytes=np.where(p.feasible, 0.0, np.inf)))
        assert plan_memory(p, backward_only.choice) > minimum_memory_milp(p).memory_bytes


def test_auto_keeps_the_dp_plan_that_fits_over_a_faster_one_that_does_not(monkeypatch):
    """auto, the DP stopped in time (its plan fits, not proven) and the
    gradient search given a smallest plan that does not fit (an unproven
    smallest memory, forced: the smallest without runs): where the gradient
    search's plan breaks the limit, auto returns the DP's plan, which fits,
    although the other is faster."""
    import search.solver as solver_module
    from search.exact import minimum_memory
    from search.options import without_joins

    t = rich_table(5, 5)
    p = discrete_problem(t)
    full = solve_brute(p)
    monkeypatch.setattr(solver_module, "AUTO_MILP_TIME_LIMIT_S", 0.0)
    monkeypatch.setattr(solver_module, "smallest_memory",
                        lambda q, time_limit_s=None: minimum_memory(without_joins(q))._replace(exact=False))
    checked = 0
    for limit in np.linspace(full.min_memory_bytes, full.memory_bytes, 8)[1:-1]:
        r = solve_dp(p, limit, time_limit_s=0.0)
        grad = solve(t, memory_limit=limit, method="gradient")
        if r.exact or grad.feasible:
            continue
        sol = solve(t, memory_limit=limit, method="auto")
        assert sol.feasible and sol.method == "dp" and sol.time_s == r.time_s and grad.time_s < r.time_s
        checked += 1
    assert checked


@pytest.mark.parametrize("seed", range(6))
def test_an_unproven_smallest_memory_above_the_limit_proves_nothing(seed, monkeypatch):
    """solve_dp given a smallest memory that is not proven and does not fit
    (forced: the smallest plan without runs, above the limit), at limits
    just above brute force's smallest memory, with no multiplier's plan
    kept (forced: no Lagrangian ascent, so only the fastest plans are
    tried, which break the limit): the DP's labels still find brute
    force's fastest plan (no claim of infeasibility); and with its labels
    cut to one, where it finds none, it returns no plan that fits with a
    finite lower bound (not proven infeasible)."""
    import search.exact._dp_bounds as bounds_module
    from search.exact import minimum_memory
    from search.options import without_joins

    monkeypatch.setattr(bounds_module, "_ASCENT_STAGES", 0)
    p = discrete_problem(rich_table(seed, 5))
    wrong = minimum_memory(without_joins(p))._replace(exact=False)
    lo = solve_brute(p).min_memory_bytes
    limits = [x for x in lo * np.array([1.0, 1.02, 1.05]) if x < wrong.memory_bytes]
    assert limits
    for limit in limits:
        brute = solve_brute(p, limit)
        r = solve_dp(p, limit, smallest=wrong)
        assert r.feasible and r.exact and r.time_s == pytest.approx(brute.time_s, rel=1e-9), (seed, limit)
        cut = solve_dp(p, limit, smallest=wrong, max_labels=1)
        assert not cut.feasible and np.isfinite(cut.lower_bound_s) and cut.lower_bound_s <= brute.time_s * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(3))
def test_the_dp_from_an_incumbent_is_still_brute_forces_answer(seed):
    """solve_dp given a plan to beat (brute force's fastest plan within the
    limit, or a slower plan that fits, or one that does not fit): brute
    force's time, proven, at limits that need runs; from the optimum itself
    the label search needs no more labels than without it. A plan that is
    not one of the problem's is refused."""
    p = discrete_problem(rich_table(seed, 5))
    full = solve_brute(p)
    rng = np.random.default_rng(seed)
    for limit in np.linspace(full.min_memory_bytes * 1.001, full.memory_bytes, 4)[:3]:
        brute = solve_brute(p, limit)
        plain = solve_dp(p, limit)
        fits = [c for c in (np.array([rng.choice(np.flatnonzero(f)) for f in p.feasible]) for _ in range(200))
                if plan_memory(p, c) <= limit]
        over = next(c for c in (np.array([rng.choice(np.flatnonzero(f)) for f in p.feasible]) for _ in range(200))
                    if plan_memory(p, c) > limit)
        for start in [np.asarray(brute.choice), over] + fits[:1]:
            dp = solve_dp(p, limit, incumbent=start)
            assert dp.feasible and dp.exact and dp.time_s == pytest.approx(brute.time_s, rel=1e-9)
            assert plan_memory(p, dp.choice) <= limit
        assert solve_dp(p, limit, incumbent=np.asarray(brute.choice)).labels <= plain.labels
    bad = np.asarray(full.choice).copy()
    bad[0] = p.num_options
    with pytest.raises(ValueError, match="incumbent"):
        solve_dp(p, full.memory_bytes, incumbent=bad)


def test_a_byte_grid_makes_the_label_search_a_relaxation():
    """search_runs with kept bytes rounded down to a grid (byte_grid), in
    every interval the DP searches at two limits, against every plan: it
    finishes, its path is no slower than the fastest plan whose largest
    transient lies in the interval and that fits (brute force), nor than
    the exact search's; and somewhere its path breaks the limit (a
    relaxation, not the exact search). By memory it is refused."""
    from search.exact.dp_runs import run_intervals, search_runs

    broke = 0
    for seed in range(4):
        p = discrete_problem(rich_table(seed, 5))
        rc = run_chain(p)
        _, times, memory, peak = every_plan(p)
        for limit in np.quantile(memory, [0.05, 0.3]):
            caps, floors, _ = run_intervals(p, rc, float(limit))
            for cap, floor in zip(caps, floors, strict=True):
                fits = (peak > floor) & (peak <= cap) & (memory <= limit)
                exact, _, done, _ = search_runs(rc, float(cap), float(floor), float(limit), np.inf)
                assert done and (exact is not None or not fits.any())
                for grid in (limit / 64, limit / 8):
                    path, _, done, _ = search_runs(rc, float(cap), float(floor), float(limit), np.inf, byte_grid=grid)
                    assert done and (path is not None or exact is None)
                    if path is None:
                        continue
                    if fits.any():
                        assert plan_time(p, path) <= times[fits].min() * (1 + 1e-9)
                    if exact is not None:
                        assert plan_time(p, path) <= plan_time(p, exact) * (1 + 1e-9)
                    broke += plan_memory(p, path) > limit
    assert broke
    with pytest.raises(ValueError, match="byte_grid"):
        search_runs(rc, float(cap), float(floor), float(limit), np.inf, minimize="memory", byte_grid=1.0)


def test_search_runs_refuses_bounds_to_go_built_for_other_arguments():
    """search_runs(..., pruning=) takes run_pruning's tables of its own
    interval and multipliers only: built for another cap, multiplier or
    objective, it raises ValueError instead of pruning with them; built for
    its own, it finds brute force's fastest plan of the interval."""
    from search.exact.dp_runs import run_intervals, run_pruning, search_runs

    p = discrete_problem(rich_table(3, 5))
    rc = run_chain(p)
    _, times, memory, peak = every_plan(p)
    limit = float(np.quantile(memory, 0.3))
    caps, floors, _ = run_intervals(p, rc, limit)
    held = [k for k in range(caps.size) if ((peak > floors[k]) & (peak <= caps[k]) & (memory <= limit)).any()]
    assert held and caps.size > 1  # an interval that holds plans that fit, and another
    k = held[0]
    cap, floor, elsewhere = float(caps[k]), float(floors[k]), float(caps[k - 1])
    own = run_pruning(rc, cap, limit, lam=1e-3)
    fits = (peak > floor) & (peak <= cap) & (memory <= limit)
    path, _, done, _ = search_runs(rc, cap, floor, limit, np.inf, lam=1e-3, pruning=own)
    assert done and plan_time(p, path) == pytest.approx(times[fits].min(), rel=1e-9)
    for other in (run_pruning(rc, elsewhere, limit, lam=1e-3), run_pruning(rc, cap, limit),
                  run_pruning(rc, cap, limit, minimize="memory", lam=1e-3)):
        with pytest.raises(ValueError, match="pruning was built for another interval"):
            search_runs(rc, cap, floor, limit, np.inf, lam=1e-3, pruning=other)
    with pytest.raises(ValueError, match="minimize must be"):
        run_pruning(rc, cap, limit, minimize="speed")


@pytest.mark.parametrize("seed", range(3))
def test_the_dp_stays_exact_on_coarse_byte_grids(seed, monkeypatch):
    """solve_dp with its relaxations on grids of a half and a twentieth of the
    limit (plans that break the limit, bounds from their times): still
    brute force's time, proven, and its plan within the limit."""
    import search.exact._dp_labels as labels_module

    monkeypatch.setattr(labels_module, "BYTE_GRIDS", (0.5, 0.05))
    p = discrete_problem(rich_table(seed + 10, 5))
    assert_dp_matches_brute_force(p, solve_brute(p), 6)


@pytest.mark.parametrize("seed", range(3))
def test_the_dp_below_an_upper_bound_finds_the_faster_plan_or_proves_none(seed):
    """solve_dp(upper_s=) at limits that need runs and on the same chain
    without runs: just above brute force's time, brute force's plan, proven;
    at that time or below it, no plan (the smallest-memory one, feasible
    False) and a lower bound at least upper_s, also where the smallest plan
    and the Lagrangian's fit (they are slower); a bound that is no time is
    refused."""
    from search.options import without_joins

    p = discrete_problem(rich_table(seed + 20, 5))
    full = solve_brute(p)
    for q in (p, without_joins(p)):
        for limit in np.linspace(full.min_memory_bytes * 1.001, full.memory_bytes, 4)[:3]:
            brute = solve_brute(q, limit)
            if not brute.feasible:
                continue
            above = solve_dp(q, limit, upper_s=brute.time_s * (1 + 1e-6))
            assert above.feasible and above.exact and above.time_s == pytest.approx(brute.time_s, rel=1e-9)
            for upper in (brute.time_s, brute.time_s * 0.99):
                none = solve_dp(q, limit, upper_s=upper)
                assert not none.feasible and none.lower_bound_s >= upper * (1 - 1e-9)
    with pytest.raises(ValueError, match="upper_s"):
        solve_dp(p, full.memory_bytes, upper_s=0.0)
    with pytest.raises(ValueError, match="upper_s"):
        solve_dp(p, full.memory_bytes, upper_s=float("nan"))


@pytest.mark.parametrize("seed", range(3))
def test_a_dp_cut_short_keeps_a_valid_bound_that_rises_with_its_labels(seed):
    """solve_dp over runs with its labels cut at budgets from one up, at
    limits that need runs: every bound at most brute force's time, every
    plan within the limit and no faster than it; the bound never falls as
    the budget grows (the completion's searches are the same, each budget
    going further), and it is brute force's time, proven, once the budget
    is large enough."""
    p = discrete_problem(rich_table(seed + 30, 5))
    full = solve_brute(p)
    checked = 0
    for limit in np.linspace(full.min_memory_bytes * 1.001, full.memory_bytes, 4)[:3]:
        brute = solve_brute(p, limit)
        if not brute.feasible:
            continue
        whole = solve_dp(p, limit)
        assert whole.exact and whole.time_s == pytest.approx(brute.time_s, rel=1e-9)
        if whole.labels < 4:  # the Lagrangian closed it: no completion to cut
            continue
        bounds = []
        for budget in np.unique(np.geomspace(1, whole.labels, 12).astype(int)):
            r = solve_dp(p, limit, max_labels=int(budget))
            assert r.lower_bound_s <= brute.time_s * (1 + 1e-9), (seed, limit, budget)
            if r.feasible:
                assert r.time_s >= brute.time_s * (1 - 1e-9) and plan_memory(p, r.choice) <= limit
            bounds.append(r.lower_bound_s)
        assert bounds == sorted(bounds)
        assert bounds[-1] == pytest.approx(brute.time_s, rel=1e-9)
        checked += 1
    assert checked


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3))
def test_searches_cut_by_their_own_budget_halve_their_step_and_the_dp_stays_exact(seed, monkeypatch):
    """With every search above the first step held to one label (each is
    cut), the completion goes on with smaller steps, and at the first step
    with the labels left: the DP still proves brute force's time at limits
    that need runs, and its searches were cut on the way."""
    import search.exact._dp_labels as labels_module

    monkeypatch.setattr(labels_module, "_SEARCH_LABELS", 1)
    monkeypatch.setattr(labels_module, "_SEARCH_GROWTH", 0)
    calls = []

    def counted(*args, **kw):
        out = real(*args, **kw)
        calls.append((kw["max_labels"], out[2]))
        return out

    real = labels_module.search_runs
    monkeypatch.setattr(labels_module, "search_runs", counted)
    p = discrete_problem(rich_table(seed + 30, 5))
    full = solve_brute(p)
    for limit in np.linspace(full.min_memory_bytes * 1.001, full.memory_bytes, 4)[:3]:
        brute = solve_brute(p, limit)
        if not brute.feasible:
            continue
        r = solve_dp(p, limit)
        assert r.exact and r.time_s == pytest.approx(brute.time_s, rel=1e-9), (seed, limit)
        assert plan_memory(p, r.choice) <= limit
    assert any(not done for _, done in calls)  # some searches were cut, and the completion went on
