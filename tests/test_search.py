"""Search: exact solvers against brute force, the gradient + discrete search
against brute force (never infeasible when a plan fits, never better than
the optimum), refinement moves against full re-evaluation, the discrete
objective against the cost model (one-hot identity) and its plain-Python
reference, one compilation per bucket, determinism.

Random problems are synthetic cost tables (arbitrary costs, feasibility and
graphs) padded to one bucket; memory sizes are small integers so every
plan's memory is exact in float64 and limits sit half a byte away from any
plan's memory (no ties at the boundary)."""

import itertools

import jax.numpy as jnp
import numpy as np
import pytest
from builders import (
    E_PAD,
    L_PAD,
    chain_edges,
    dag_edges,
    limit_between,
    synthetic_table,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodels import (
    CostSettings,
    cost_table,
    expected_time,
    hardware_arrays,
    iteration_time,
    load_hardware,
    memory_per_device,
    one_hot,
)
from costmodels.reference import reference_iteration_time, reference_memory
from planner import GraphBuilder
from planner.models.zoo import get_model
from search import (
    GradientConfig,
    chain_order,
    discrete_problem,
    minimum_memory,
    plan_memory,
    plan_time,
    relaxed_search,
    solve,
    solve_brute,
    solve_dp,
    solve_milp,
)
from search.exact import memory_by_workspace_cap
from search.local import repair
from search.local.moves import pair_moves, single_moves
from search.problem import plan_memories

S = 5
FAST = GradientConfig(restarts=8, outer_steps=4, inner_steps=10)


problem_seeds = st.integers(0, 2**31 - 1)
layer_counts = st.integers(1, 6)


# -- the exact solvers agree with brute force ---------------------------------------------------


@pytest.mark.slow
@settings(max_examples=120, deadline=None)
@given(seed=problem_seeds, n=layer_counts, shuffle=st.booleans(), scale=st.sampled_from([1.0, 0.5]))
def test_dp_milp_and_brute_force_agree_on_chains(seed, n, shuffle, scale):
    """At ``scale`` 0.5 activations and workspaces are halved, so that the
    optimizer phase of memory is the larger in some plans and not in others
    (test_dp_exact_where_the_optimizer_phase_binds_the_optimum checks that it
    binds at the optimum of some instances)."""
    table = synthetic_table(seed, n, chain_edges(n, seed, shuffle), activation_scale=scale)
    p = discrete_problem(table)
    assert chain_order(p) is not None
    limit = limit_between(p, seed)
    brute = solve_brute(p, limit)
    dp = solve_dp(p, limit)
    milp = solve_milp(p, limit)
    assert dp.feasible == milp.feasible == brute.feasible
    assert brute.min_memory_bytes == pytest.approx(minimum_memory(p).memory_bytes, rel=1e-12)
    if brute.feasible:
        assert dp.exact
        assert dp.time_s == pytest.approx(brute.time_s, rel=1e-9)
        assert dp.lower_bound_s <= brute.time_s * (1 + 1e-9)
        assert milp.time_s == pytest.approx(brute.time_s, rel=1e-6)
        for r in (dp, milp):
            assert plan_memory(p, r.choice) <= limit
            assert plan_time(p, r.choice) == pytest.approx(r.time_s, rel=1e-12)
    else:
        assert dp.memory_bytes == brute.min_memory_bytes


@settings(max_examples=40, deadline=None)
@given(seed=problem_seeds, n=st.integers(2, 6))
def test_milp_and_brute_force_agree_on_dags(seed, n):
    table = synthetic_table(seed, n, dag_edges(n, seed))
    p = discrete_problem(table)
    limit = limit_between(p, seed)
    brute, milp = solve_brute(p, limit), solve_milp(p, limit)
    assert milp.feasible == brute.feasible
    if brute.feasible:
        assert milp.exact
        assert milp.time_s == pytest.approx(brute.time_s, rel=1e-6)
        assert milp.lower_bound_s <= brute.time_s * (1 + 1e-6)


@settings(max_examples=25, deadline=None)
@given(seed=problem_seeds, n=st.integers(2, 6), chain=st.booleans())
def test_overlap_term_exact_in_milp_and_bounded_in_dp(seed, n, chain):
    edges = chain_edges(n, seed, False) if chain else dag_edges(n, seed)
    p = discrete_problem(synthetic_table(seed, n, edges, overlap=0.7))
    limit = limit_between(p, seed)
    brute = solve_brute(p, limit)
    milp = solve_milp(p, limit)
    assert milp.feasible == brute.feasible
    if brute.feasible:
        assert milp.time_s == pytest.approx(brute.time_s, rel=1e-6)
        if chain:  # the DP optimises both additive bounds of max(f0, f1): a plan and a valid bound
            dp = solve_dp(p, limit)
            assert dp.lower_bound_s <= brute.time_s * (1 + 1e-9) <= dp.time_s * (1 + 2e-9)


def test_dp_closes_a_lagrangian_duality_gap():
    # Two independent layers, each fast-and-heavy (0 s, 6 B) or slow-and-light
    # (10 s, 0 B); the budget of 10 B fits one heavy layer. No multiplier makes
    # the Lagrangian pick exactly one (both heavy below 10/6 s/B, both light
    # above), so the exact completion must find 10 s by itself. No update
    # buffer: both memory phases hold the same 6 B per heavy layer.
    n = 2
    t = synthetic_table(0, n, [(0, 1)], p_feasible=1.0)
    feas = np.zeros((L_PAD, S), bool)
    feas[:, :2] = True
    lt = np.zeros((L_PAD, S), np.float32)
    lt[:n, 1] = 10.0
    state = np.zeros((L_PAD, S), np.float32)
    state[:n, 0] = 6.0
    t = t._replace(feasible=jnp.asarray(feas), compute_s=jnp.asarray(lt), backward_compute_s=jnp.zeros_like(lt),
                   state_bytes=jnp.asarray(state), update_bytes=jnp.zeros_like(lt),
                   activation_bytes=jnp.zeros_like(lt), workspace_bytes=jnp.zeros_like(lt),
                   reshard_s=jnp.zeros((E_PAD, S, S)))
    p = discrete_problem(t)
    dp = solve_dp(p, 10.0)
    assert dp.exact and dp.time_s == 10.0 and sorted(dp.choice.tolist()) == [0, 1]
    assert dp.labels > 0  # it took the label search, not the Lagrangian
    cut = solve_dp(p, 10.0, max_labels=0)  # the label search runs out: a plan, but no claim of optimality
    assert cut.feasible and not cut.exact and cut.lower_bound_s <= 10.0 <= cut.time_s


def _phases(p, choice):
    """(backward, optimizer) bytes of one plan."""
    rows = np.arange(p.num_layers)
    return (float(p.persistent_bytes[rows, choice].sum() + p.workspace_bytes[rows, choice].max()),
            float(p.optimizer_bytes[rows, choice].sum()))


def test_dp_exact_where_the_optimizer_phase_binds_the_optimum():
    """Seeds 0..40 of the halved-activation chains: the DP matches brute
    force on each, and in several the brute-force optimum's optimizer phase
    is the larger (so that phase, not the backward one, is what the limit
    cuts there)."""
    binding = 0
    for seed in range(41):
        n = 2 + seed % 5
        p = discrete_problem(synthetic_table(seed, n, chain_edges(n, seed, seed % 2 == 1), activation_scale=0.5))
        limit = limit_between(p, seed)
        brute, dp = solve_brute(p, limit), solve_dp(p, limit)
        assert dp.feasible == brute.feasible, seed
        if brute.feasible:
            assert dp.exact and dp.time_s == pytest.approx(brute.time_s, rel=1e-9), seed
            backward, optimizer = _phases(p, brute.choice)
            binding += optimizer > backward
    assert binding >= 10  # 18 of the 41 when written


def test_dp_skips_the_fastest_plan_when_its_optimizer_phase_breaks_the_limit():
    """Two layers in a chain, options 0 and 1 only, no resharding, workspace
    1 B everywhere (hand-computed):

    ======  ============  ============  =====  ======  ====  ==========  =========
    option  time layer 0  time layer 1  state  update  act.  persistent  optimizer
    ======  ============  ============  =====  ======  ====  ==========  =========
    0       1 s           1 s           30     20      5     15          30
    1       3 s           2 s           10     5       20    25          10
    ======  ============  ============  =====  ======  ====  ==========  =========

    Plans (time; backward phase = persistent sum + 1; optimizer phase):
    (0, 0): 2 s; 31; 60. (0, 1): 3 s; 41; 40. (1, 0): 4 s; 41; 40.
    (1, 1): 5 s; 51; 20. At 45 B the fastest, (0, 0), keeps the backward
    phase (31) but not the optimizer's (60), so the optimum is (0, 1) at 3 s.
    At 40.5 B no plan fits (the smallest memory is 41, of (0, 1) and (1, 0)),
    though the workspace cap's lower bound, max(1 + 15 + 15, 10 + 10) = 31,
    passes."""
    n = 2
    t = synthetic_table(0, n, [(0, 1)], p_feasible=1.0)
    feas = np.zeros((L_PAD, S), bool)
    feas[:, :2] = True

    def per_option(x0, x1):
        x = np.zeros((L_PAD, S), np.float32)
        x[:n, 0], x[:n, 1] = x0, x1
        return jnp.asarray(x)

    lt = np.zeros((L_PAD, S), np.float32)
    lt[:n, :2] = [[1.0, 3.0], [1.0, 2.0]]
    t = t._replace(feasible=jnp.asarray(feas), compute_s=jnp.asarray(lt), backward_compute_s=jnp.zeros_like(lt),
                   state_bytes=per_option(30, 10), update_bytes=per_option(20, 5),
                   activation_bytes=per_option(5, 20), workspace_bytes=per_option(1, 1),
                   reshard_s=jnp.zeros((E_PAD, S, S)))
    p = discrete_problem(t)
    assert p.persistent_bytes[:, :2].tolist() == [[15, 25]] * 2 and p.optimizer_bytes[:, :2].tolist() == [[30, 10]] * 2
    dp = solve_dp(p, 45.0)
    assert dp.feasible and dp.exact and dp.choice.tolist() == [0, 1] and dp.time_s == 3.0
    assert dp.memory_bytes == 41.0
    assert memory_by_workspace_cap(p)[1].tolist() == [31.0]
    dp = solve_dp(p, 40.5)
    assert not dp.feasible and dp.memory_bytes == 41.0


def test_dp_refuses_graphs_with_branches():
    p = discrete_problem(synthetic_table(1, 3, [(0, 1), (0, 2)]))
    assert chain_order(p) is None
    with pytest.raises(ValueError, match="chain"):
        solve_dp(p)


@settings(max_examples=40, deadline=None)
@given(seed=problem_seeds, n=layer_counts, scale=st.sampled_from([1.0, 0.5, 0.2]))
def test_minimum_memory_is_exact(seed, n, scale):
    """Against every plan: the smallest memory (either phase may bind at
    ``scale`` < 1) and, per workspace cap, a bound no plan within the cap
    beats."""
    p = discrete_problem(synthetic_table(seed, n, dag_edges(n, seed), activation_scale=scale))
    mm = minimum_memory(p)
    assert mm.memory_bytes == solve_brute(p).min_memory_bytes
    assert plan_memory(p, mm.choice) == mm.memory_bytes
    caps, bound = memory_by_workspace_cap(p)
    assert np.all(np.diff(caps) > 0) and bound.min() <= mm.memory_bytes
    plans = np.array(list(itertools.product(*[np.flatnonzero(p.feasible[i]) for i in range(n)])))
    largest = p.workspace_bytes[np.arange(n), plans].max(axis=1)
    backward = p.persistent_bytes[np.arange(n), plans].sum(axis=1)
    optimizer = p.optimizer_bytes[np.arange(n), plans].sum(axis=1)
    for cap, b in zip(caps, bound, strict=True):  # the memory with the workspace term at the cap
        assert b <= np.maximum(cap + backward, optimizer)[largest <= cap].min()
    assert np.array_equal(plan_memories(p, plans), np.maximum(backward + largest, optimizer))


def test_minimum_memory_when_the_phases_disagree():
    """Two layers, two options each (hand-computed). Option 0 keeps little for
    the backward pass but much at the optimizer step; option 1 the reverse:

    ======  ==========  =========  =========
    option  persistent  workspace  optimizer
    ======  ==========  =========  =========
    0       10          1          50
    1       40          1          20
    ======  ==========  =========  =========

    Plans (backward phase = persistent sum + 1, optimizer phase):
    (0, 0): max(21, 100) = 100; (0, 1) and (1, 0): max(51, 70) = 70;
    (1, 1): max(81, 40) = 81. The smallest is 70, which neither phase's
    per-layer minimum reaches (their bound: max(21, 40) = 40)."""
    p = discrete_problem(synthetic_table(0, 2, [(0, 1)]))
    two = lambda a, b: np.array([[a, b], [a, b]], dtype=float)  # noqa: E731
    p = p._replace(feasible=np.ones((2, 2), bool), persistent_bytes=two(10, 40), workspace_bytes=two(1, 1),
                   optimizer_bytes=two(50, 20), layer_time_s=two(1.0, 2.0),
                   grad_sync_s=np.zeros((2, 2)), backward_s=np.zeros((2, 2)), reshard_s=np.zeros((1, 2, 2)),
                   option_strategy=np.arange(2), option_lever=np.zeros(2, np.int64),
                   recompute_bytes=np.zeros((2, 2)), option_recomputes=np.zeros(2, bool),
                   option_joins=np.zeros(2, bool), checkpoint_credit=np.zeros((1, 2)))
    mm = minimum_memory(p)
    assert mm.memory_bytes == 70.0 and sorted(mm.choice.tolist()) == [0, 1]
    caps, bound = memory_by_workspace_cap(p)
    assert caps.tolist() == [1.0] and bound.tolist() == [40.0]
    assert solve_milp(p, 75.0).time_s == pytest.approx(3.0)
    assert not solve_milp(p, 69.5).feasible


# -- the gradient + discrete search ----------------------------------------------------------


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(seed=problem_seeds, n=layer_counts, chain=st.booleans(), gumbel=st.booleans())
def test_gradient_search_fits_whenever_a_plan_fits_and_never_beats_brute_force(seed, n, chain, gumbel):
    edges = chain_edges(n, seed, True) if chain else dag_edges(n, seed)
    table = synthetic_table(seed, n, edges)
    p = discrete_problem(table)
    limit = limit_between(p, seed)
    brute = solve_brute(p, limit)
    config = GradientConfig(restarts=8, outer_steps=4, inner_steps=10, gumbel=gumbel)
    sol = solve(table, limit, method="gradient", seed=seed % 7, config=config)
    assert sol.feasible == brute.feasible
    assert sol.min_memory_bytes == brute.min_memory_bytes
    if brute.feasible:
        assert sol.memory_bytes <= limit
        assert plan_memory(p, sol.choice) == sol.memory_bytes
        assert sol.time_s == pytest.approx(plan_time(p, sol.choice), rel=1e-12)
        assert sol.time_s >= brute.time_s * (1 - 1e-9)  # better than the optimum = a cost bug
    else:
        assert sol.memory_bytes == brute.min_memory_bytes


@settings(max_examples=30, deadline=None)
@given(seed=problem_seeds, n=st.integers(2, 6), overlap=st.sampled_from([0.0, 0.5]), scale=st.sampled_from([1.0, 0.5]))
def test_move_scores_equal_full_re_evaluation(seed, n, overlap, scale):
    """Every single and edge move's time and memory equal a full evaluation
    (at ``scale`` 0.5 the optimizer phase binds in some moved plans)."""
    p = discrete_problem(synthetic_table(seed, n, dag_edges(n, seed), overlap=overlap, p_feasible=1.0,
                                         activation_scale=scale))
    rng = np.random.default_rng(seed)
    c = rng.integers(0, S, n)
    single = single_moves(p, c)
    for lay, s in itertools.product(range(n), range(S)):
        x = c.copy()
        x[lay] = s
        assert single.time_s[lay, s] == pytest.approx(plan_time(p, x), rel=1e-12, abs=1e-15)
        assert single.memory_bytes[lay, s] == plan_memory(p, x)
    if p.num_edges:
        pair = pair_moves(p, c)
        for k in range(p.num_edges):
            for s, t in itertools.product(range(S), range(S)):
                x = c.copy()
                x[p.edge_src[k]], x[p.edge_dst[k]] = s, t
                assert pair.time_s[k, s, t] == pytest.approx(plan_time(p, x), rel=1e-12, abs=1e-15)
                assert pair.memory_bytes[k, s, t] == plan_memory(p, x)


@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_repair_reaches_the_limit_from_the_worst_plan(scale):
    p = discrete_problem(synthetic_table(3, 6, chain_edges(6, 3, False), p_feasible=1.0, activation_scale=scale))
    limit = minimum_memory(p).memory_bytes + 0.5
    for worst in (p.persistent_bytes, p.optimizer_bytes):  # the heaviest plan of each phase
        fixed, ok = repair(p, np.argmax(worst, axis=1), limit)
        assert ok and plan_memory(p, fixed) <= limit
        assert not repair(p, np.argmax(worst, axis=1), limit - 1.0)[1]


@settings(max_examples=40, deadline=None)
@given(seed=problem_seeds, n=layer_counts, scale=st.sampled_from([1.0, 0.5]))
def test_repair_fits_whenever_a_plan_fits(seed, n, scale):
    """From any plan, repair fits the limit exactly when the smallest memory does."""
    p = discrete_problem(synthetic_table(seed, n, dag_edges(n, seed), activation_scale=scale))
    rng = np.random.default_rng(seed)
    c = np.array([rng.choice(np.flatnonzero(f)) for f in p.feasible])
    limit = limit_between(p, seed)
    fixed, ok = repair(p, c, limit)
    assert ok == (minimum_memory(p).memory_bytes <= limit) == (plan_memory(p, fixed) <= limit)


def test_repair_walks_to_the_smallest_plan_where_moves_get_stuck():
    """Two unconnected layers whose option 0 has the largest workspace (100)
    and option 1 a small one (1) for 10 more persistent bytes: from (0, 0),
    memory 100, either single move costs 10 and saves nothing (the other
    layer's workspace stays), and there is no edge to move both. Only the
    walk to the smallest-memory plan (1, 1), memory 21, fits 50."""
    p = discrete_problem(synthetic_table(0, 2, []))
    two = lambda a, b: np.array([[a, b], [a, b]], dtype=float)  # noqa: E731
    p = p._replace(feasible=np.ones((2, 2), bool), persistent_bytes=two(0, 10), workspace_bytes=two(100, 1),
                   optimizer_bytes=two(5, 5), layer_time_s=two(1.0, 2.0),
                   grad_sync_s=np.zeros((2, 2)), backward_s=np.zeros((2, 2)), reshard_s=np.zeros((0, 2, 2)),
                   option_strategy=np.arange(2), option_lever=np.zeros(2, np.int64),
                   recompute_bytes=np.zeros((2, 2)), option_recomputes=np.zeros(2, bool),
                   option_joins=np.zeros(2, bool), checkpoint_credit=np.zeros((0, 2)))
    assert single_moves(p, np.zeros(2, np.int64)).memory_bytes.min() == 100.0
    fixed, ok = repair(p, np.zeros(2, np.int64), 50.0)
    assert ok and fixed.tolist() == [1, 1] and plan_memory(p, fixed) == 21.0


def test_the_walk_moves_the_shortest_prefix_that_fits_after_one_scoring(monkeypatch):
    """Three unconnected layers, each 40 persistent bytes on option 0 and 10
    on option 1, for 1, 2 and 3 s more: from (0, 0, 0), memory 120, the walk
    to (1, 1, 1) under a limit of 70 moves the two layers cheapest per byte
    saved (a and b: 60 bytes, one move leaves 90) and keeps c, after one
    scoring of the moves (the rest are exact evaluations of prefixes)."""
    import search.local._repair as repair_module

    p = discrete_problem(synthetic_table(0, 3, []))
    zeros = np.zeros((3, 2))
    p = p._replace(feasible=np.ones((3, 2), bool), persistent_bytes=np.array([[40.0, 10.0]] * 3),
                   workspace_bytes=zeros, optimizer_bytes=zeros,
                   layer_time_s=np.array([[1.0, 2.0], [1.0, 3.0], [1.0, 4.0]]), grad_sync_s=zeros, backward_s=zeros,
                   reshard_s=np.zeros((0, 2, 2)), option_strategy=np.arange(2), option_lever=np.zeros(2, np.int64),
                   recompute_bytes=zeros, option_recomputes=np.zeros(2, bool), option_joins=np.zeros(2, bool),
                   checkpoint_credit=np.zeros((0, 2)))
    assert plan_memory(p, np.zeros(3, np.int64)) == 120.0 and plan_memory(p, np.array([1, 0, 0])) == 90.0
    scorings = []
    monkeypatch.setattr(repair_module, "single_moves", lambda *a, **k: scorings.append(1) or single_moves(*a, **k))
    walked = repair_module._walk_towards(p, np.zeros(3, np.int64), np.ones(3, np.int64), 70.0)
    assert walked.tolist() == [1, 1, 0] and plan_memory(p, walked) == 60.0 and plan_time(p, walked) == 6.0
    assert len(scorings) == 1


def test_parallel_edges_are_merged_and_both_counted():
    t = synthetic_table(5, 3, [(0, 1), (0, 1), (1, 2)], p_feasible=1.0)
    p = discrete_problem(t)
    assert p.num_edges == 2
    c = np.array([1, 2, 3])
    assert plan_time(p, c) == pytest.approx(float(iteration_time(t, one_hot(np.r_[c, [0] * 5], S))), rel=1e-6)


def test_expected_time_by_hand():
    # Two layers, one edge (padded to L_PAD rows and E_PAD edges): the layer terms
    # weighted by their strategy probabilities plus the edge's resharding weighted
    # by the pair probabilities given, summed by hand; padded edges add nothing
    # whatever their pair probabilities; independent layers = iteration_time.
    import jax

    t = synthetic_table(3, 2, [(0, 1)], p_feasible=1.0)
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(S), L_PAD)
    pair = rng.dirichlet(np.ones(S * S), E_PAD).reshape(E_PAD, S, S)
    lt = np.asarray(t.compute_s, np.float64)[:2]  # grad sync, halo and output are zero in this table
    want = float(np.sum(probs[:2] * lt) + np.sum(pair[0] * np.asarray(t.reshard_s, np.float64)[0]))
    got = float(expected_time(t, jnp.asarray(probs, jnp.float32), jnp.asarray(pair, jnp.float32)))
    assert got == pytest.approx(want, rel=1e-5)
    outer = np.zeros_like(pair)
    outer[0] = np.outer(probs[0], probs[1])
    want_indep = float(np.sum(probs[:2] * lt) + np.sum(outer[0] * np.asarray(t.reshard_s, np.float64)[0]))
    assert float(iteration_time(t, jnp.asarray(probs, jnp.float32))) == pytest.approx(want_indep, rel=1e-5)
    # a cost that cannot be computed where the probability is zero: no NaN, nor in the gradient
    bad = t._replace(compute_s=t.compute_s.at[0, 2].set(jnp.nan))
    p0 = jnp.asarray(probs, jnp.float32).at[0].set(jnp.asarray([0.5, 0.5, 0.0, 0.0, 0.0]))
    value, grad = jax.value_and_grad(lambda c: expected_time(bad._replace(compute_s=c), p0, jnp.asarray(pair)))(
        bad.compute_s)
    assert np.isfinite(float(value)) and np.all(np.isfinite(np.asarray(grad)))
    assert float(grad[0, 0]) == pytest.approx(0.5) and float(grad[0, 2]) == 0.0


# -- the discrete objective is the cost model's ----------------------------------------------------


def test_discrete_objective_is_the_cost_model_at_one_hot():
    g = get_model("alexnet")
    hw = load_hardware("dgx-a100")
    rng = np.random.default_rng(0)
    for d, m in ((16, 4), (8, 8)):
        t = cost_table(g.arrays, hardware_arrays(hw), 1024.0, float(d), float(m), CostSettings())
        p = discrete_problem(t)
        feas = np.asarray(t.feasible)[: g.num_layers]
        for _ in range(5):
            c = np.array([rng.choice(np.flatnonzero(f)) for f in feas])
            probs = one_hot(np.r_[c, np.zeros(t.feasible.shape[0] - g.num_layers, int)], S)
            assert plan_time(p, c) == pytest.approx(float(iteration_time(t, probs)), rel=1e-5)
            assert plan_memory(p, c) == pytest.approx(float(memory_per_device(t, probs)), rel=1e-5)
            # and against the independent plain-Python evaluator
            assert plan_time(p, c) == pytest.approx(reference_iteration_time(g, c, hw, 1024.0, d, m), rel=1e-4)
            assert plan_memory(p, c) == pytest.approx(reference_memory(g, c, 1024.0, d, m), rel=1e-4)


# -- compilation, determinism, real models ---------------------------------------------------------


def _chain_graph(n_convs: int, width: int, name: str):
    b = GraphBuilder(name, (8, 16, 16))
    x = b.input
    for i in range(n_convs):
        x = b.conv(f"conv{i}", x, width, 3, padding="SAME")
        x = b.relu(f"relu{i}", x)
    x = b.flatten("flatten", x)
    b.dense("fc", x, 10)
    return b.build()


@pytest.mark.slow
def test_gradient_search_compiles_once_per_bucket():
    hw = hardware_arrays(load_hardware("dgx-a100"))
    a, b, c = _chain_graph(5, 16, "a"), _chain_graph(6, 32, "b"), _chain_graph(9, 16, "c")
    assert a.arrays.mask.shape == b.arrays.mask.shape == (16,) and c.arrays.mask.shape == (32,)
    tables = [cost_table(g.arrays, hw, 64.0, 4.0, 2.0, CostSettings()) for g in (a, b, c)]
    solve(tables[0], method="gradient", config=FAST)
    size = relaxed_search._cache_size()
    solve(tables[1], method="gradient", config=FAST)  # another model, same bucket: no compilation
    assert relaxed_search._cache_size() == size
    solve(tables[2], method="gradient", config=FAST)  # next bucket: one more
    assert relaxed_search._cache_size() == size + 1


def test_same_seed_same_solution_and_history():
    t = synthetic_table(11, 6, dag_edges(6, 11))
    p = discrete_problem(t)
    limit = limit_between(p, 11)
    first = solve(t, limit, method="gradient", seed=3, config=FAST)
    second = solve(t, limit, method="gradient", seed=3, config=FAST)
    assert first.choice == second.choice and first.time_s == second.time_s
    assert [h.time_s for h in first.history] == [h.time_s for h in second.history]


def test_auto_uses_dp_on_chains_and_certifies_small_dags():
    chain = synthetic_table(2, 5, chain_edges(5, 2, False))
    assert solve(chain, method="auto").method == "dp"
    dag = synthetic_table(2, 5, dag_edges(5, 2))
    limit = limit_between(discrete_problem(dag), 2)
    sol = solve(dag, limit, method="auto", config=FAST)
    # the MILP proves the optimum at once: no gradient search (its stages are not in the history)
    assert sol.method == "milp" and sol.optimality_gap is not None and sol.optimality_gap < 1e-6
    assert [h.stage for h in sol.history] == ["milp"]
    assert sol.time_s == pytest.approx(solve_brute(discrete_problem(dag), limit).time_s, rel=1e-6)


def test_auto_adds_the_gradient_search_where_the_milp_proves_nothing_in_time(monkeypatch):
    import search.solver as solve_module

    dag = synthetic_table(3, 6, dag_edges(6, 3))
    limit = limit_between(discrete_problem(dag), 3)
    exact = solve(dag, limit, method="milp")

    def unproven(p, lim, *, time_limit_s=None, smallest=None):  # a MILP stopped by its time limit, no incumbent
        assert time_limit_s == solve_module.AUTO_MILP_TIME_LIMIT_S
        return exact_milp(p, lim, smallest=smallest)._replace(exact=False, feasible=False, time_s=float("inf"))

    exact_milp = solve_module.solve_milp
    monkeypatch.setattr(solve_module, "solve_milp", unproven)
    sol = solve(dag, limit, method="auto", config=FAST, time_budget_s=None)  # (the budget's shares: below)
    stages = [h.stage for h in sol.history]
    assert sol.method == "gradient" and "relaxed" in stages and stages[-1] == "milp"
    assert sol.feasible and sol.time_s == pytest.approx(exact.time_s, rel=1e-6)  # the gradient search finds it
    assert sol.lower_bound_s == pytest.approx(exact.lower_bound_s)  # and the MILP's bound stays


def test_auto_under_a_time_budget_gives_its_stages_their_shares_and_stops_the_local_search(monkeypatch):
    """Under ``time_budget_s`` the auto MILP's limit is at most its share of
    the budget (and at least MIN_STAGE_S), the refinement gets a deadline
    within the budget (or MIN_STAGE_S past it), and a local search whose
    deadline has passed returns the plan it was given."""
    import time

    import search.solver as solve_module
    from search.local.refinement import local_search

    dag = synthetic_table(3, 6, dag_edges(6, 3))
    limit = limit_between(discrete_problem(dag), 3)
    exact_milp, real_refine = solve_module.solve_milp, solve_module.refine
    seen = {}

    def unproven(p, lim, *, time_limit_s=None, smallest=None):
        seen["milp_s"] = time_limit_s
        return exact_milp(p, lim, smallest=smallest)._replace(exact=False, feasible=False, time_s=float("inf"))

    def refine(*args, deadline_s=None, **kwargs):
        seen["deadline_s"] = deadline_s
        return real_refine(*args, deadline_s=deadline_s, **kwargs)

    monkeypatch.setattr(solve_module, "solve_milp", unproven)
    monkeypatch.setattr(solve_module, "refine", refine)
    budget = 4.0
    start = time.perf_counter()
    sol = solve(dag, limit, method="auto", config=FAST, time_budget_s=budget)
    assert sol.feasible
    assert solve_module.MIN_STAGE_S <= seen["milp_s"] <= max(solve_module.MIN_STAGE_S,
                                                              solve_module.EXACT_SHARE * budget)
    end = time.perf_counter()  # (the solver's own clock starts after `start`, before `end`)
    assert start < seen["deadline_s"] <= max(end + budget, end + solve_module.MIN_STAGE_S)
    assert seen["deadline_s"] - start <= budget + (end - start)
    with pytest.raises(ValueError, match="time_budget_s"):
        solve(dag, limit, method="auto", time_budget_s=0)
    p = discrete_problem(dag)
    fits = solve(dag, limit, method="milp").choice
    assert list(local_search(p, fits, limit, deadline_s=time.perf_counter() - 1.0)) == list(fits)


def test_solve_reports_infeasible_with_the_smallest_memory_plan():
    t = synthetic_table(4, 4, chain_edges(4, 4, False))
    p = discrete_problem(t)
    mm = minimum_memory(p)
    for method in ("auto", "gradient", "dp", "milp"):
        sol = solve(t, mm.memory_bytes - 0.5, method=method, config=FAST)
        assert not sol.feasible and sol.memory_bytes == mm.memory_bytes == sol.min_memory_bytes


def test_solve_rejects_bad_arguments():
    t = synthetic_table(4, 3, [(0, 1), (0, 2)])
    with pytest.raises(ValueError, match="unknown method"):
        solve(t, method="annealing")
    with pytest.raises(ValueError, match="chain"):
        solve(t, method="dp")
    with pytest.raises(ValueError, match="positive"):
        solve(t, -1.0)
    with pytest.raises(ValueError, match="restarts"):
        GradientConfig(restarts=0)


def test_gradient_matches_exact_optimum_on_a_residual_network():
    """A small ResNet-style DAG on 2 nodes: the gradient search (with
    refinement) against the MILP, with and without a binding limit."""
    b = GraphBuilder("tiny-res", (16, 16, 16))
    x = b.conv("stem", b.input, 32, 3, padding="SAME")
    for i in range(3):
        y = b.conv(f"b{i}/conv1", x, 32, 3, padding="SAME")
        y = b.batch_norm(f"b{i}/bn", y)
        y = b.relu(f"b{i}/relu", y)
        y = b.conv(f"b{i}/conv2", y, 32, 3, padding="SAME")
        x = b.relu(f"b{i}/out", b.add(f"b{i}/add", [x, y]))
    x = b.flatten("flatten", b.global_avg_pool("pool", x))
    g = b.build()
    t = cost_table(g.arrays, hardware_arrays(load_hardware("dgx-a100")), 256.0, 4.0, 4.0, CostSettings())
    p = discrete_problem(t)
    assert chain_order(p) is None
    for limit in (None, minimum_memory(p).memory_bytes * 1.05):
        exact = solve(t, limit, method="milp")
        grad = solve(t, limit, method="gradient", config=FAST)
        assert exact.optimality_gap is not None and exact.optimality_gap < 1e-6
        assert grad.feasible and grad.time_s >= exact.time_s * (1 - 1e-6)
        assert grad.time_s <= exact.time_s * 1.02


@settings(max_examples=30, deadline=None)
@given(seed=problem_seeds, n=st.integers(2, 6), overlap=st.sampled_from([0.0, 0.5]), scale=st.sampled_from([1.0, 0.5]))
def test_segment_candidates_are_scored_exactly(seed, n, overlap, scale):
    """Every re-planned chain segment's time and memory equal a full
    evaluation of the plan it makes (at ``scale`` 0.5 the optimizer phase
    binds in some), and segment moves only improve."""
    from search.local.segments import apply_segment, chain_segments, segment_candidates, segment_moves

    p = discrete_problem(synthetic_table(seed, n, chain_edges(n, seed, True) if seed % 2 else dag_edges(n, seed),
                                         overlap=overlap, activation_scale=scale))
    rng = np.random.default_rng(seed)
    c = np.array([rng.choice(np.flatnonzero(f)) for f in p.feasible])
    seg = chain_segments(p)
    assert sorted(seg.nodes[seg.nodes >= 0].tolist()) == list(range(n))
    cand = segment_candidates(p, c, seg)
    for i in range(len(cand.segment)):
        x = apply_segment(c, seg, cand, i)
        assert cand.time_s[i] == pytest.approx(plan_time(p, x), rel=1e-12, abs=1e-15)
        assert cand.memory_bytes[i] == plan_memory(p, x)
    limit = plan_memory(p, c) * rng.uniform(0.9, 1.2)
    x = segment_moves(p, c, seg, limit, tol=0.0)
    if x is not None:
        assert plan_memory(p, x) <= limit and plan_time(p, x) < plan_time(p, c)


def test_local_search_trades_one_payer_for_two_gainers():
    """Three unconnected layers, two options each, hand-computed. Layer 0
    takes 1 ms and keeps 100 B (option 0) or takes 1.5 ms and keeps nothing
    (option 1); layers 1 and 2 take 1 ms and keep 60 B (option 0) or take
    1.3 ms and keep nothing (option 1). Limit 120 B of kept bytes (+1 B of
    workspace). From (0, 1, 1) (3.6 ms, 100 B) no single move helps (a
    gainer needs 160 B), nor one payer for one gainer (+0.5 - 0.3 ms), but
    layer 0's 100 B freed pays for both gainers: (1, 0, 0), 3.5 ms, 120 B,
    which brute force confirms is the optimum."""
    from search.local import local_search
    from search.local.moves import current_state, with_overlap
    from search.local.refinement import _swap

    n = 3
    base = synthetic_table(0, n, [])
    O = base.feasible.shape[1]
    rows = base.feasible.shape[0]

    def col(values, fill=0.0):  # [rows, O]: options 0 and 1 per layer, the rest 0
        x = np.full((rows, O), fill)
        x[:n, :2] = values
        return jnp.asarray(x, jnp.float32)

    feas = np.zeros((rows, O), bool)
    feas[:, :2] = True
    t = base._replace(
        feasible=jnp.asarray(feas),
        compute_s=col([[1e-3, 1.5e-3], [1e-3, 1.3e-3], [1e-3, 1.3e-3]]),
        backward_compute_s=col(0.0), grad_sync_s=col(0.0), weight_gather_s=col(0.0),
        state_bytes=col(0.0), update_bytes=col(0.0),
        activation_bytes=col([[100.0, 0.0], [60.0, 0.0], [60.0, 0.0]]),
        workspace_bytes=col(1.0, fill=1.0),
    )
    p = discrete_problem(t)
    limit = 121.0
    start = np.array([0, 1, 1])
    assert plan_time(p, start) == pytest.approx(3.6e-3) and plan_memory(p, start) == 101.0
    cur = current_state(p, start)
    single = single_moves(p, start, cur)
    t_now = with_overlap(p, cur.base_s, cur.grad_s, cur.bwd_s)
    assert not ((single.memory_bytes <= limit) & (single.time_s < t_now * (1 - 1e-9))).any()
    assert _swap(p, start, single, t_now, cur.memory_bytes, limit, 1e-12) is None
    best = local_search(p, start, limit)
    assert best.tolist() == [1, 0, 0]
    assert plan_time(p, best) == pytest.approx(3.5e-3) and plan_memory(p, best) == 121.0
    brute = solve_brute(p, limit)
    assert plan_time(p, best) == pytest.approx(brute.time_s, rel=1e-12)
