"""search.local.run_moves: the memories of moved plans, computed in the window of
layers a move can change, against the whole plans' memories
(search.problem.plan_memories, which sums every layer)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from builders import hand_table, random_run_table, rich_table

from search import discrete_problem
from search.local.moves import pair_memory_floors, pair_moves, single_moves
from search.local.run_moves import moved_run_memories
from search.problem import has_runs, plan_memories


def skip_problem(seed: int, n: int = 14):
    """A chain with random skip edges (several into one layer, as at a
    ResNet's adds), random bytes and times; options 0 (keep), 1 (remat), 2
    (remat+join)."""
    rng = np.random.default_rng(seed)
    act, inputs, work = (rng.integers(1, 100, n).astype(float) for _ in range(3))
    skips = {(int(u), int(v)) for u, v in rng.integers(0, n, (n // 2, 2)) if v > u + 1}
    edges = [(i, i + 1) for i in range(n - 1)] + sorted(skips)
    shares = rng.uniform(0.2, 1.0, len(edges))
    t = hand_table(edges, shares, act, inputs, work)
    return discrete_problem(t._replace(compute_s=jnp.asarray(rng.uniform(1.0, 2.0, (n, 15)), jnp.float32)))


def runny_plan(p, rng):
    """A plan with many runs: each layer keeps, recomputes or joins."""
    return rng.choice(3, p.num_layers, p=[0.2, 0.3, 0.5])


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("m", [1, 2])
def test_window_memories_are_the_whole_plans_memories(seed, m):
    rng = np.random.default_rng(seed)
    p = skip_problem(seed)
    assert has_runs(p) and p.num_edges > p.num_layers - 1
    for _ in range(4):
        c = runny_plan(p, rng)
        N = 400
        layers = np.stack([rng.choice(p.num_layers, m, replace=False) for _ in range(N)])
        options = rng.integers(0, 3, (N, m))
        plans = np.broadcast_to(c, (N, p.num_layers)).copy()
        plans[np.arange(N)[:, None], layers] = options
        np.testing.assert_allclose(moved_run_memories(p, c, layers, options), plan_memories(p, plans), rtol=1e-12)


def test_moves_score_each_moved_plan_by_its_whole_memory():
    """single_moves and pair_moves (which use the windows where plans hold
    runs) give, for every move, the memory of the plan it makes."""
    rng = np.random.default_rng(7)
    p = skip_problem(7, n=10)
    c = runny_plan(p, rng)
    single = single_moves(p, c).memory_bytes
    pair = pair_moves(p, c).memory_bytes
    for lay in range(p.num_layers):
        for o in range(3):
            x = c.copy()
            x[lay] = o
            assert single[lay, o] == pytest.approx(plan_memories(p, x[None])[0], rel=1e-12)
    for k, (u, v) in enumerate(zip(p.edge_src, p.edge_dst, strict=True)):
        for s in range(3):
            for t in range(3):
                x = c.copy()
                x[u], x[v] = s, t
                assert pair[k, s, t] == pytest.approx(plan_memories(p, x[None])[0], rel=1e-12)
    assert np.isinf(single[:, 3:]).all()  # options the layers cannot run


@pytest.mark.parametrize("runs", [True, False])
def test_pair_moves_score_memory_only_below_the_time_asked(runs):
    """pair_moves(faster_than=t) leaves the time of every move and the
    memory of each move faster than t as they are without it, and the
    others' memory inf (the local search asks only for improving moves)."""
    from search.options import without_joins

    rng = np.random.default_rng(3)
    p = skip_problem(3, n=10)
    p = p if runs else without_joins(p)
    assert has_runs(p) == runs
    c = runny_plan(p, rng) if runs else rng.integers(0, 2, p.num_layers)
    full = pair_moves(p, c)
    t = float(np.median(full.time_s[np.isfinite(full.time_s)]))
    part = pair_moves(p, c, faster_than=t)
    below = full.time_s < t
    assert below.any() and (~below & np.isfinite(full.memory_bytes)).any()
    np.testing.assert_array_equal(part.time_s, full.time_s)
    np.testing.assert_array_equal(part.memory_bytes[below], full.memory_bytes[below])
    assert np.isinf(part.memory_bytes[~below]).all()


@pytest.mark.parametrize("seed", range(6))
def test_pair_memory_floors_bound_every_pair_move(seed):
    """pair_memory_floors never exceeds the memory of the plan a pair move
    makes (plan_memories, every layer summed), on chains with skip edges
    whose plans hold runs, and equals it where plans hold none."""
    from search.options import without_joins

    rng = np.random.default_rng(seed)
    p = skip_problem(seed)
    for q in (p, without_joins(p)):
        c = runny_plan(q, rng) if has_runs(q) else rng.integers(0, 2, q.num_layers)
        floors = pair_memory_floors(q, c)
        exact = pair_moves(q, c).memory_bytes
        fin = np.isfinite(exact)
        np.testing.assert_array_equal(np.isfinite(floors), fin)
        if has_runs(q):
            assert np.all(floors[fin] <= exact[fin] * (1 + 1e-12))
            assert np.any(floors[fin] < exact[fin])  # a bound, not the memories
        else:
            np.testing.assert_allclose(floors[fin], exact[fin], rtol=1e-12)


@pytest.mark.parametrize("weaker", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_cheapest_pair_is_the_full_scorings_and_scores_fewer_moves(seed, weaker, monkeypatch):
    """repair's pair step (_cheapest_pair, scored in chunks by a lower
    bound) picks the move the full scoring of every pair move picks (least
    added time per byte saved, the first among equals), at the fastest
    plan (a local optimum without a limit: no move speeds it up) and at
    random plans of chains with skip edges and runs, with
    pair_memory_floors' bound and with a weaker one (random bytes taken
    off: the chunks' order scrambled, so that many are scored); at the
    fastest plan, with the bound itself, it scores fewer moves than
    there are."""
    import search.local._repair as repair_module
    from search.local import local_search
    from search.local.moves import current_state, with_overlap

    n = 12
    edges = [(i, i + 1) for i in range(n - 1)] + [(0, 3), (4, 7), (6, 9)]
    p = discrete_problem(rich_table(seed, n, edges))
    assert has_runs(p)
    scored = []

    def counting(*args, only=None, **kw):
        if only is not None:
            scored.append(int(only.sum()))
        return pair_moves(*args, only=only, **kw)

    monkeypatch.setattr(repair_module, "pair_moves", counting)
    rng = np.random.default_rng(seed)
    if weaker:
        def weakened(q, c, cur):  # still a lower bound: bytes taken off
            return pair_memory_floors(q, c, cur) - rng.uniform(0, 300, (q.num_edges,) + (q.num_options,) * 2)

        monkeypatch.setattr(repair_module, "pair_memory_floors", weakened)
    # a fast plan no single or pair move speeds up (the local search's optimum without a limit)
    fastest = local_search(p, np.argmin(np.where(p.feasible, p.layer_time_s, np.inf), axis=1), np.inf)
    plans = [fastest] + [np.array([rng.choice(np.flatnonzero(f)) for f in p.feasible]) for _ in range(3)]
    fewer = False
    for k, c in enumerate(plans):
        cur = current_state(p, c)
        t_now, m_now = with_overlap(p, cur.base_s, cur.grad_s, cur.bwd_s), cur.memory_bytes
        full = pair_moves(p, c)
        saved = m_now - full.memory_bytes
        ok = (saved > 0) & np.isfinite(full.time_s)
        want = None
        if ok.any():
            score = np.where(ok, (full.time_s - t_now) / np.where(ok, saved, 1.0), np.inf)
            want = tuple(int(x) for x in np.unravel_index(int(np.argmin(score)), score.shape))
        scored.clear()
        assert repair_module._cheapest_pair(p, c, cur, t_now, m_now, chunk=1) == want, (seed, k)
        if k == 0:
            fewer = sum(scored) < int(np.isfinite(full.time_s).sum())
    assert fewer or weaker


def test_cheapest_pair_without_runs_is_the_full_scorings():
    """Without runs (every memory a sum) the pair step scores every move at
    once: the same move as the full scoring of pair_moves."""
    import search.local._repair as repair_module
    from search.local.moves import current_state, with_overlap
    from search.options import without_joins

    n = 10
    edges = [(i, i + 1) for i in range(n - 1)] + [(0, 3), (4, 7)]
    for seed in range(4):
        p = without_joins(discrete_problem(rich_table(seed, n, edges)))
        assert not has_runs(p)
        rng = np.random.default_rng(seed)
        c = np.array([rng.choice(np.flatnonzero(f)) for f in p.feasible])
        cur = current_state(p, c)
        t_now, m_now = with_overlap(p, cur.base_s, cur.grad_s, cur.bwd_s), cur.memory_bytes
        full = pair_moves(p, c)
        saved = m_now - full.memory_bytes
        ok = (saved > 0) & np.isfinite(full.time_s)
        assert ok.any()
        score = np.where(ok, (full.time_s - t_now) / np.where(ok, saved, 1.0), np.inf)
        want = tuple(int(x) for x in np.unravel_index(int(np.argmin(score)), score.shape))
        assert repair_module._cheapest_pair(p, c, cur, t_now, m_now) == want


def test_repair_makes_pair_moves_with_runs_only_where_allowed(monkeypatch):
    """Where plans hold runs, repair makes no move of an edge's two layers
    by default (each costs a window of layers) and walks to the smallest
    plan instead, still fitting; with ``max_pair_moves`` it makes at most
    that many. Checked where, unlimited, it makes two or more (found among
    random plans and limits; the search must find one)."""
    import search.local._repair as repair_module
    from search import plan_memory, solve_brute

    calls = []
    cheapest = repair_module._cheapest_pair
    monkeypatch.setattr(repair_module, "_cheapest_pair", lambda *a, **k: calls.append(1) or cheapest(*a, **k))
    checked = 0
    for seed in range(24, 40):
        p = discrete_problem(random_run_table(seed, 6))
        assert has_runs(p)
        smallest = solve_brute(p).min_memory_bytes
        rng = np.random.default_rng(seed)
        for _ in range(20):
            c = np.array([rng.choice(np.flatnonzero(f)) for f in p.feasible])
            limit = smallest + rng.uniform(0, 1) * max(plan_memory(p, c) - smallest, 0.0)
            calls.clear()
            repair_module.repair(p, c, limit, max_pair_moves=100)
            if len(calls) < 2:
                continue
            checked += 1
            for allowed, most in ((None, 0), (1, 1)):
                calls.clear()
                fixed, ok = repair_module.repair(p, c, limit, max_pair_moves=allowed)
                assert len(calls) <= most and ok and plan_memory(p, fixed) <= limit, (seed, allowed)
    assert checked
