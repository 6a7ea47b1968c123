"""search.run_moves: the memories of moved plans, computed in the window of
layers a move can change, against the whole plans' memories
(search.problem.plan_memories, which sums every layer)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from search import discrete_problem
from search.moves import pair_moves, single_moves
from search.problem import has_runs, plan_memories
from search.run_moves import moved_run_memories
from test_remat_runs import hand_table


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
    from search.problem import without_joins

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
