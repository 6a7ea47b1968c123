"""Runs of recomputing layers on graphs with skip edges (residual networks):
the label search carries the skip edges' checkpoint credits
(search.exact.runs, search.exact.dp_runs), so the DP is exact where skip edges
reshard nothing, and search.exact.layer_chain's folding of their resharding
bounds the fastest plan from both sides. Oracle: brute force over every
plan of small random graphs."""

from __future__ import annotations

from types import SimpleNamespace

import jax.numpy as jnp
import numpy as np
import pytest
from builders import assert_dp_matches_brute_force, dag_table, every_plan, rich_table

from search import discrete_problem, smallest_memory, solve_brute, solve_dp
from search.exact import (
    dp_solves,
    layer_order_chain,
    milp as milp_module,
    minimum_memory,
    run_chain,
    solve_brute_limits,
)
from search.exact.dp_runs import _to_go, minimum_memory_runs
from search.exact.runs import HOP_BITS, open_skips, skip_state, skip_to_go
from search.options import with_strategies_of, without_joins
from search.problem import has_runs, plan_memory, plan_time, run_terms

# a downsampling block (1 -> 2 -> 3 -> 5 beside 1 -> 4 -> 5: no edge joins 3 and 4) and a longer skip over it
@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
def test_dp_over_runs_with_skip_edges_matches_brute_force(seed):
    """Skip edges that reshard nothing: solve_dp takes the graph (solve's DP
    paths do not: dp_solves), and its smallest memory and its fastest plan
    at limits from below the smallest memory to above the fastest plan's
    are brute force's, proven."""
    p = discrete_problem(dag_table(seed, skip_reshard=False))
    rc = run_chain(p)
    assert has_runs(p) and not dp_solves(p) and rc is not None and rc.skip_src.size >= 2
    full = solve_brute(p)
    assert minimum_memory_runs(p).memory_bytes == pytest.approx(full.min_memory_bytes, rel=1e-12)
    assert_dp_matches_brute_force(p, full, 5)


@pytest.mark.slow
def test_skip_credits_change_the_answer():
    """The test above can fail: without the skip edges' credits, the
    smallest memory or the fastest plan at its limits moves on several of
    its graphs."""
    moved = 0
    for seed in range(6):
        p = discrete_problem(dag_table(seed, skip_reshard=False))
        skip = p.edge_dst != p.edge_src + 1
        none = p._replace(checkpoint_credit=np.where(skip[:, None], 0.0, p.checkpoint_credit))
        full = solve_brute(p)
        limits = np.linspace(full.min_memory_bytes * 0.99, full.memory_bytes * 1.02, 5)
        for a, b in zip(solve_brute_limits(p, limits), solve_brute_limits(none, limits), strict=True):
            moved += (a.feasible != b.feasible) or (a.feasible and a.time_s != pytest.approx(b.time_s, rel=1e-9))
    assert moved >= 5


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
def test_dp_over_runs_with_skip_edges_that_reshard_matches_brute_force(seed):
    """Skip edges that reshard (hops): solve_dp takes the graph itself (its
    labels carry each open hop's source class and pay its resharding at the
    destination), and its fastest plan at limits from below the smallest
    memory to above the fastest plan's is brute force's, proven; at some
    limits only the label search closes the gap the folded bounds leave."""
    p = discrete_problem(dag_table(seed, skip_reshard=True))
    rc = run_chain(p)
    assert has_runs(p) and not dp_solves(p) and rc is not None and rc.hop_src.size >= 2
    assert np.any(rc.hop_extra > 0)  # the source's class matters
    full = solve_brute(p)
    assert_dp_matches_brute_force(p, full, 7)
    labelled = [solve_dp(p, limit).labels for limit in np.linspace(full.min_memory_bytes, full.memory_bytes, 5)]
    assert max(labelled) > 0


def test_too_many_hops_open_at_once_are_no_run_chain():
    """At most 64 // HOP_BITS - 1 skip edges that reshard may be open over
    one layer (a label's code holds their classes): one more and run_chain
    declines, so solve_dp says what it takes."""
    most = 64 // HOP_BITS - 1
    n = most + 3
    for count, declined in ((most, False), (most + 1, True)):
        edges = [(i, i + 1) for i in range(n - 1)] + [(i, n - 1) for i in range(count)]
        p = discrete_problem(rich_table(0, n, edges=edges))
        assert has_runs(p) and (run_chain(p) is None) == declined
    with pytest.raises(NotImplementedError, match="layer order"):
        solve_dp(p, 1e9)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_folded_resharding_bounds_the_fastest_plan(seed):
    """Skip edges that reshard: on layer_order_chain's lower and upper
    problems (no skip edge reshards there) every plan keeps its memory, and
    their fastest plans bound brute force's time from below and above at
    every limit."""
    p = discrete_problem(dag_table(seed, skip_reshard=True))
    assert has_runs(p) and run_chain(layer_order_chain(p, "lower")).hop_src.size == 0
    lo, hi = layer_order_chain(p, "lower"), layer_order_chain(p, "upper")
    rng = np.random.default_rng(seed)
    for _ in range(20):
        c = np.array([rng.choice(np.flatnonzero(f)) for f in p.feasible])
        assert plan_memory(lo, c) == plan_memory(p, c) == plan_memory(hi, c)
        assert plan_time(lo, c) <= plan_time(p, c) <= plan_time(hi, c)
    full = solve_brute(p)
    limits = np.linspace(full.min_memory_bytes, full.memory_bytes * 1.02, 4)
    for limit, brute in zip(limits, solve_brute_limits(p, limits), strict=True):
        a, b = solve_dp(lo, limit), solve_dp(hi, limit)
        assert a.feasible and b.feasible and a.exact and b.exact
        assert a.time_s <= brute.time_s * (1 + 1e-9) <= plan_time(p, a.choice) * (1 + 2e-9)
        assert brute.time_s <= plan_time(p, b.choice) * (1 + 1e-9) <= b.time_s * (1 + 2e-9)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_smallest_memory_of_a_graph_whose_skip_edges_reshard(seed, monkeypatch):
    """smallest_memory takes a graph whose skip edges reshard by the label
    search over layer_order_chain's problem (same plans, same memory):
    brute force's smallest memory, proven, without the MILP; where the
    label search runs out of labels or time, the MILP's, also brute force's
    here."""
    p = discrete_problem(dag_table(seed, skip_reshard=True))
    full = solve_brute(p)
    calls = []
    real_milp = milp_module.minimum_memory_milp
    monkeypatch.setattr(milp_module, "minimum_memory_milp", lambda *a, **k: calls.append(1) or real_milp(*a, **k))
    mm = smallest_memory(p)
    assert mm.exact and not calls
    assert mm.memory_bytes == plan_memory(p, mm.choice) == pytest.approx(full.min_memory_bytes, rel=1e-12)
    with pytest.raises(RuntimeError, match="deadline"):
        minimum_memory_runs(layer_order_chain(p, "lower"), deadline=0.0)

    def out_of_labels(*args, **kwargs):
        raise RuntimeError("out of labels")

    monkeypatch.setattr(milp_module, "minimum_memory_runs", out_of_labels)
    mm = smallest_memory(p)
    assert calls and mm.exact
    assert plan_memory(p, mm.choice) == pytest.approx(full.min_memory_bytes, rel=1e-9)


@pytest.mark.parametrize("seed", range(3))
def test_smallest_memory_past_its_deadline_offers_the_runs_of_the_strategies_without_them(seed, monkeypatch):
    """Where the label search stops and the MILP finds nothing in its time,
    smallest_memory returns, unproven, the smallest plan with the strategies
    of the smallest plan without runs: brute force's smallest over those
    strategies, no larger than that plan."""
    p = discrete_problem(dag_table(seed, skip_reshard=True))
    free = minimum_memory(without_joins(p)).choice
    least = solve_brute(with_strategies_of(p, free)).min_memory_bytes  # brute force over those strategies' plans
    real_runs = milp_module.minimum_memory_runs

    def stopped(q, rc=None, **kw):  # the search over every option stops at its deadline
        if "deadline" in kw:
            raise RuntimeError("the smallest memory with runs ran past its deadline")
        return real_runs(q, rc, **kw)

    monkeypatch.setattr(milp_module, "minimum_memory_runs", stopped)
    monkeypatch.setattr(milp_module, "milp", lambda *a, **k: SimpleNamespace(status=1, x=None, message="time limit"))
    mm = smallest_memory(p, 1.0)
    assert not mm.exact
    assert mm.memory_bytes == plan_memory(p, mm.choice) == pytest.approx(least, rel=1e-12)
    assert mm.memory_bytes <= plan_memory(p, free)


def test_layer_order_chain_rejects_what_it_cannot_fold():
    p = discrete_problem(dag_table(0, skip_reshard=True))
    with pytest.raises(ValueError, match="lower"):
        layer_order_chain(p, "middle")
    back = p._replace(edge_src=p.edge_dst, edge_dst=p.edge_src)
    with pytest.raises(ValueError, match="earlier layer"):
        layer_order_chain(back, "lower")


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_skip_to_go_is_the_least_kept_bytes_with_its_first_option(seed):
    """skip_to_go at position 0, plus the first layer's bytes: for each
    first option, the least backward-phase kept bytes (activations and state
    less the checkpoints runs free, skip edges' included) over every plan
    starting with it, brute force's; every credit taken as earned (the
    bound without the skip edges' states) is below it for some option."""
    for reshard in (False, True):
        p = discrete_problem(dag_table(seed, skip_reshard=reshard))
        rc = run_chain(p)
        inside = np.isfinite(rc.time)
        A = np.where(inside, rc.persistent, np.inf)
        go = skip_to_go(rc, inside, A, -rc.credit)
        plans, _, _, _ = every_plan(p)
        credit, _ = run_terms(p, plans)
        kept = p.persistent_bytes[np.arange(p.num_layers), plans].sum(axis=1) - credit
        starts = np.flatnonzero(inside[0])
        state = skip_state(rc, open_skips(rc)[0], rc.skip_opens[0, starts])
        least = np.array([kept[plans[:, 0] == s].min() for s in starts])
        assert A[0, starts] + go[0][starts, state] == pytest.approx(least, rel=1e-12)
        earned = A[0] + _to_go(rc, inside, A, -rc.credit)[0]  # the same least with every skip credit earned
        assert np.any(earned[starts] < least * (1 - 1e-9))


@pytest.mark.slow
def test_dp_over_runs_without_the_skip_states_is_still_exact(monkeypatch):
    """Past MOST_OPEN_STATES open skip edges skip_to_go declines (None), and
    past MOST_BUCKET_OPEN_STATES skip_moves does for the Lagrangian's
    Viterbi and the bound to go by time: the DP then takes every skip credit
    as earned there, weaker bounds that hold: brute force's answers still."""
    import search.exact._dp_bounds as bounds_module
    import search.exact.dp_runs as dp_runs_module
    from search.exact.runs import MOST_BUCKET_OPEN_STATES, skip_moves

    p = discrete_problem(dag_table(0, skip_reshard=True))
    rc = run_chain(p)
    inside = np.isfinite(rc.time)
    assert skip_to_go(rc, inside, rc.persistent, -rc.credit, most_open=1) is None
    assert skip_moves(rc, MOST_BUCKET_OPEN_STATES) is not None  # (the DP takes them here; not below)
    monkeypatch.setattr(dp_runs_module, "skip_to_go", lambda *a, **k: None)
    for module in (bounds_module, dp_runs_module):
        monkeypatch.setattr(module, "skip_moves", lambda *a, **k: None)
    assert_dp_matches_brute_force(p, solve_brute(p), 5)


def _exact_bucket_table(seed: int, reshard: bool):
    """dag_table with recomputed bytes in multiples of 16 and workspaces above
    16 bytes, so that 16 buckets of caps of 128 and 256 bytes round no run's
    sum (as in test_dp_runs' bucketed Viterbi test)."""
    t = dag_table(seed, skip_reshard=reshard)
    return t._replace(recompute_bytes=16.0 * jnp.ceil(t.recompute_bytes / 16.0),
                      workspace_bytes=t.workspace_bytes + 17.0)


@pytest.mark.parametrize("seed", range(4))
def test_skip_added_is_what_the_skip_edges_credits_leave_unearned(seed):
    """For plans drawn at random: their kept bytes (run_terms' credits, skip
    edges' included) are rc.persistent's (every skip credit taken off) less the
    chain's pair credits plus skip_added's."""
    from search.exact.runs import skip_added, skip_moves

    p = discrete_problem(dag_table(seed, skip_reshard=False))
    rc = run_chain(p)
    rng = np.random.default_rng(seed)  # 20,000 plans drawn (every plan: seconds per seed)
    plans = np.stack([rng.choice(np.flatnonzero(p.feasible[i]), 20_000) for i in range(p.num_layers)], axis=1)
    credit, _ = run_terms(p, plans)
    rows = np.arange(p.num_layers)
    kept = p.persistent_bytes[rows, plans].sum(axis=1) - credit
    chain = rc.persistent[rows, plans].sum(axis=1) - rc.credit[rows[1:], plans[:, :-1], plans[:, 1:]].sum(axis=1)
    added = skip_added(skip_moves(rc), plans)
    assert np.any(added > 0) and np.any(added == 0)
    assert chain + added == pytest.approx(kept, rel=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_bucketed_viterbi_with_skip_states_is_the_least_priced_plan(seed):
    """bucket_viterbi with skip_moves' states, where buckets round nothing:
    at each cap and kept-byte price lam, its value is brute force's least
    time + lam * kept bytes over the plans whose transients keep within the
    cap (exact in the skip edges' credits), and its path such a plan;
    bucket_to_go's value to go from each first option is the least over
    the plans starting with it. Without the skip states (every skip credit
    taken as earned) the value is below it for some price: the states
    matter here."""
    from search.exact.runs import all_bucket_moves, bucket_start, bucket_to_go, bucket_viterbi, skip_moves

    p = discrete_problem(_exact_bucket_table(seed, reshard=False))
    rc = run_chain(p)
    skips = skip_moves(rc)
    plans, times, _, peak = every_plan(p)
    credit, _ = run_terms(p, plans)
    rows = np.arange(p.num_layers)
    kept = p.persistent_bytes[rows, plans].sum(axis=1) - credit
    caps = np.array([128.0, 256.0])
    assert np.all([(peak <= c).any() and (peak > c).any() for c in caps])
    moves = all_bucket_moves(rc, caps, 16)
    T, A = rc.time, np.where(np.isfinite(rc.time), rc.persistent, 0.0)  # (inf where infeasible; rc.time: p's here)
    below = []
    for lam in (0.0, 1e-3 * times.mean() / kept.mean(), times.mean() / kept.mean()):
        w = np.full(caps.size, lam)
        unary = np.stack([np.where(p.workspace_bytes <= c, T + lam * A, np.inf) for c in caps])
        val, path = bucket_viterbi(unary, rc.pair, moves, (-rc.credit, w), skips)
        priced = times + lam * kept
        least = np.array([priced[peak <= c].min() for c in caps])
        assert val == pytest.approx(least, rel=1e-12)
        at = [np.flatnonzero((plans == x).all(axis=1))[0] for x in path]
        assert priced[at] == pytest.approx(least, rel=1e-12) and np.all(peak[at] <= caps)
        for k, c in enumerate(caps):
            inside = np.isfinite(rc.time) & (rc.workspace <= c)
            h = bucket_to_go(rc, inside, np.where(inside, T + lam * A, np.inf), rc.pair - lam * rc.credit, c, 16,
                             skips, lam)
            b0 = bucket_start(rc, c, 16)
            for s in np.flatnonzero(inside[0]):
                mine = (plans[:, 0] == s) & (peak <= c)
                want = priced[mine].min() if mine.any() else np.inf
                assert unary[k, 0, s] + h[0, s, b0[s], skips.start[s]] == pytest.approx(want, rel=1e-12)
        earned, _ = bucket_viterbi(unary, rc.pair, moves, (-rc.credit, w))
        assert np.all(earned <= least * (1 + 1e-12))
        below.append(np.any(earned < least * (1 - 1e-9)))
    assert not below[0] and any(below[1:])  # (at lam 0 bytes cost nothing)
