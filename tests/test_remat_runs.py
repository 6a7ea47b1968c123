"""Runs of consecutive recomputing layers (costmodels.recomputed_runs,
search.problem.run_terms): the memory of plans whose recomputing layers
form runs, against bytes worked out by hand from what a run keeps (what
enters it) and what its backward pass holds (its recomputed activations up
to the layer), on small tables built by hand."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from builders import HAND_CHAIN, hand_table, random_run_table

from costmodels import memory_per_device
from costmodels.evaluate import one_hot
from planner import GraphBuilder
from search import discrete_problem, plan_memory, solve, solve_brute, solve_dp
from search.options import compact_options, recomputing_saves_no_time, without_joins, without_recomputing
from search.problem import has_runs

# HAND_CHAIN (tests/builders.py): activations 100, 200, 300 bytes, inputs 50, 100, 200, workspaces 10, 20, 30
# plan (0 keep, 1 remat, 2 remat+join) -> bytes, by hand:
CHAIN_BY_HAND = {
    # nothing recomputed: 100 + 200 + 300 kept, the largest workspace 30
    (0, 0, 0): 600 + 30,
    # one run of all three: it keeps layer 0's input (50); at layer 2's backward step it holds
    # the recomputed 100 + 200 + 300 and layer 2's own transient 30
    (1, 2, 2): 50 + 600 + 30,
    # layer 0 kept (100); the run 1-2 keeps layer 1's input (100) and holds 200 + 300 + 30
    (0, 1, 2): 100 + 100 + 500 + 30,
    # joining after a layer that keeps its activations, or as the first layer, is plain remat
    (0, 2, 2): 100 + 100 + 500 + 30,
    (2, 2, 2): 50 + 600 + 30,
    # three runs of one layer: their inputs kept (50, 100, 200); layer 2's step holds 300 + 30
    (1, 1, 1): 50 + 100 + 200 + 330,
    # two runs of one layer beside layer 1's 200
    (1, 0, 1): 50 + 200 + 200 + 330,
    # the run 0-1 keeps 50 beside layer 2's 300; layer 1's step holds 100 + 200 + 20
    (1, 2, 0): 50 + 300 + 320,
    (0, 1, 0): 100 + 100 + 300 + 220,
}


@pytest.mark.parametrize("plan", sorted(CHAIN_BY_HAND))
def test_run_memory_by_hand_on_a_chain(plan):
    p = discrete_problem(HAND_CHAIN)
    assert plan_memory(p, np.array(plan)) == CHAIN_BY_HAND[plan]
    assert float(memory_per_device(HAND_CHAIN, one_hot(jnp.asarray(plan), 15))) == CHAIN_BY_HAND[plan]


def test_a_run_reaches_only_as_far_as_its_layers_recompute():
    """A skip edge 0 -> 2 (layer 2 adds two inputs of 100 bytes each, half its
    200-byte input each) needs no checkpoint only when layers 0, 1 and 2 all
    recompute."""
    t = hand_table([(0, 1), (1, 2), (0, 2)], [1.0, 0.5, 0.5])
    p = discrete_problem(t)
    by_hand = {
        (1, 2, 2): 50 + 600 + 30,  # one run: both of layer 2's inputs come from inside it
        # run 1-2 keeps layer 1's input (100) and, of layer 2's, the half from layer 0 (100)
        (0, 1, 2): 100 + 100 + 100 + 500 + 30,
    }
    for plan, want in by_hand.items():
        assert plan_memory(p, np.array(plan)) == want
        assert float(memory_per_device(t, one_hot(jnp.asarray(plan), 15))) == want


def test_relaxed_run_memory_between_plans():
    """At probabilities between plans, the run's terms are expectations over
    independently drawn layers: layer 1 recomputes with probability 1/2, the
    others always. Layer 0 starts a run, layer 1 joins it half the time
    (else keeps its activations), layer 2 joins. Kept: 50 + (200 + 100) / 2
    + 200. Freed: edge 0-1 half of layer 1's kept input (100 / 2), edge 1-2
    half the time (200 / 2). Peak at layer 2: its workspace 330 plus the
    run's activations before it, R[1] = 200 / 2 + 100 / 2 (layer 1's, then
    layer 0's if layer 1 joins)."""
    probs = jnp.zeros((3, 15)).at[0, 1].set(1.0).at[1, 0].set(0.5).at[1, 2].set(0.5).at[2, 2].set(1.0)
    kept = 50 + (0.5 * 200 + 0.5 * 100) + 200  # activations in expectation
    freed = 0.5 * 100 + 0.5 * 200
    assert float(memory_per_device(HAND_CHAIN, probs)) == pytest.approx(kept - freed + 330 + 150, rel=1e-6)


@pytest.mark.parametrize("seed", range(5))
def test_relaxed_and_discrete_run_memory_agree_on_random_plans(seed):
    """The jitted relaxed memory at one-hot probabilities (an associative
    scan) and the host's (prefix sums) on random bytes, a chain with skip
    edges, and random plans."""
    rng = np.random.default_rng(seed)
    n = 7
    act, inputs, work = (rng.integers(1, 100, n).astype(float) for _ in range(3))
    edges = [(i, i + 1) for i in range(n - 1)] + [(0, 3), (2, 6)]
    shares = [1.0 if v not in (3, 6) else 0.5 for _, v in edges]
    t = hand_table(edges, shares, act, inputs, work)
    p = discrete_problem(t)
    for plan in rng.integers(0, 3, (20, n)):
        assert float(memory_per_device(t, one_hot(jnp.asarray(plan), 15))) == pytest.approx(plan_memory(p, plan),
                                                                                              rel=1e-6)


def test_brute_force_finds_that_runs_lower_the_smallest_memory():
    """Six layers that each keep their 100-byte input (recomputing one alone
    frees nothing), 10 bytes of workspace: 610 bytes without runs. Covered
    by runs, ``c`` checkpoints and a longest run of ``k`` layers hold
    ``100 c + 100 k + 10``, ``c k >= 6``: 510 at best (two runs of three,
    three of two), the smallest memory by brute force."""
    t = hand_table([(i, i + 1) for i in range(5)], [1.0] * 5, [100.0] * 6, [100.0] * 6, [10.0] * 6)
    p = discrete_problem(t)
    assert plan_memory(p, np.zeros(6, int)) == 610
    assert plan_memory(p, np.array([1, 2, 2, 2, 2, 2])) == 100 + 600 + 10
    assert plan_memory(p, np.array([1, 1, 1, 1, 1, 1])) == 600 + 100 + 10  # runs of one free nothing
    assert plan_memory(p, np.array([0, 1, 2, 2, 2, 2])) == 100 + 100 + 500 + 10
    assert plan_memory(p, np.array([1, 2, 2, 1, 2, 2])) == 100 + 100 + 300 + 10
    r = solve_brute(p, memory_limit=520)
    assert r.feasible and plan_memory(p, r.choice) == 510
    assert not solve_brute(p, memory_limit=509).feasible


@pytest.mark.parametrize("limit", [580.0, 650.0, 1e9])
def test_solve_plans_runs_with_every_exact_method(limit):
    """search.solve: ``milp``, ``dp`` and ``auto`` plan a table with runs as
    fast as brute force's plan: ``auto`` and ``dp`` with the DP on the table
    without recomputing where its fastest plan fits (630 bytes, all kept: no
    smallest memory then), else with the DP over runs. The smallest memory is
    (1, 2, 1)'s: the run 0-1 keeps 50 bytes, layer 2 its input, 200, and its
    step holds 300 + 30: 580; below it no plan fits."""
    assert has_runs(discrete_problem(HAND_CHAIN))
    brute = solve_brute(discrete_problem(HAND_CHAIN), limit)
    for method in ("auto", "dp", "milp"):
        sol = solve(HAND_CHAIN, memory_limit=limit, method=method)
        assert sol.feasible and sol.memory_bytes <= limit
        assert sol.time_s == pytest.approx(brute.time_s, rel=1e-6)
        assert sol.method == ("milp" if method == "milp" else "dp")
        if method != "milp" and limit >= 630:
            assert sol.min_memory_bytes is None
        else:
            assert sol.min_memory_bytes == 580 == solve_brute(discrete_problem(HAND_CHAIN)).min_memory_bytes
    for method in ("auto", "dp", "milp"):
        assert not solve(HAND_CHAIN, memory_limit=579.0, method=method).feasible
    r = solve_dp(discrete_problem(HAND_CHAIN), limit)
    assert r.feasible and r.exact and r.time_s == pytest.approx(brute.time_s, rel=1e-6)


@pytest.mark.parametrize("seed", range(6))
def test_auto_skips_runs_only_where_the_fastest_plan_without_them_fits(seed):
    """auto on random run problems (a chain with a skip edge: the MILP
    without runs; and the chain alone: the DP) at limits from the smallest
    memory up: always brute force's time; the MILP over runs only where
    brute force's fastest plan without recomputing does not fit. Where a
    joining option costs less time than keeping, no shortcut is taken."""
    t = random_run_table(seed, 5)
    for table in (t, t._replace(edge_mask=t.edge_mask.at[-1].set(0.0))):
        p = discrete_problem(table)
        free = solve_brute(without_recomputing(p))  # the fastest plan without recomputing, and its memory
        assert recomputing_saves_no_time(p)
        full = solve_brute(p)
        for limit in np.linspace(full.min_memory_bytes, full.memory_bytes * 1.1, 6):
            sol = solve(table, memory_limit=limit, method="auto")
            assert sol.feasible and sol.time_s == pytest.approx(solve_brute(p, limit).time_s, rel=1e-6)
            assert (sol.min_memory_bytes is None) == (plan_memory(p, free.choice) <= limit)
    faster = t._replace(compute_s=t.compute_s.at[:, 2].set(t.compute_s[:, 0] * 0.5))
    assert not recomputing_saves_no_time(discrete_problem(faster))
    assert solve(faster, memory_limit=1e9, method="auto").min_memory_bytes is not None


@pytest.mark.parametrize("seed", range(6))
def test_gradient_search_on_runs_fits_and_never_beats_brute_force(seed):
    """The gradient search (relaxed memory with runs, then repair and local
    moves scored by the plans' exact memories) on random run problems: it
    fits wherever a plan fits, never beats brute force, and at the smallest
    memory, which only plans with runs reach here, finds a plan."""
    t = random_run_table(seed, 5)
    p = discrete_problem(t)
    full = solve_brute(p)
    for limit in (full.min_memory_bytes, 0.5 * (full.min_memory_bytes + full.memory_bytes), full.memory_bytes):
        brute = solve_brute(p, limit)
        sol = solve(t, memory_limit=limit, method="gradient", seed=seed)
        assert sol.feasible and sol.memory_bytes <= limit
        assert plan_memory(p, np.array(sol.choice)) == pytest.approx(sol.memory_bytes, rel=1e-9)
        assert sol.time_s >= brute.time_s * (1 - 1e-6)


def test_recomputing_is_never_merged_with_keeping():
    """An option equal to another in every per-layer cost but whether it
    recomputes stays: in a run it costs differently."""
    t = HAND_CHAIN._replace(
        activation_bytes=HAND_CHAIN.activation_bytes.at[:, 1].set(HAND_CHAIN.activation_bytes[:, 0]),
        workspace_bytes=HAND_CHAIN.workspace_bytes.at[:, 1].set(HAND_CHAIN.workspace_bytes[:, 0]),
        recompute_bytes=jnp.zeros((3, 15)), checkpoint_bytes=HAND_CHAIN.checkpoint_bytes)
    c = compact_options(discrete_problem(t))
    assert list(c.option_ids) == [0, 1, 2]


def test_each_input_edge_carries_its_part_of_the_input():
    """edge_input_share: a concatenation of 4 and 12 channels takes a quarter
    of its input from the first; an add, half from each; a one-input layer,
    all of it."""
    from costmodels import CostSettings, cost_table, hardware_arrays, load_hardware

    b = GraphBuilder("cat", (3, 8, 8))
    a = b.conv("a", b.input, 4, 3)
    c = b.conv("c", b.input, 12, 3)
    cat = b.concat("cat", [a, c])
    d = b.conv("d", cat, 16, 1)
    b.add("sum", [cat, d])
    g = b.build()
    t = cost_table(g.arrays, hardware_arrays(load_hardware("dgx-a100")), 8.0, 1.0, 1.0, CostSettings())
    share = {(g.names[int(s)], g.names[int(d)]): float(v)
             for s, d, v, k in zip(t.edge_src, t.edge_dst, t.edge_input_share, t.edge_mask, strict=True) if k > 0}
    assert share == {("a", "cat"): 0.25, ("c", "cat"): 0.75, ("cat", "d"): 1.0, ("cat", "sum"): 0.5,
                     ("d", "sum"): 0.5}


@pytest.mark.parametrize("seed", range(6))
def test_milp_agrees_with_brute_force_on_runs(seed):
    """The MILP's run rows (search.exact.milp_memory._run_rows) against every plan: the
    smallest memory, and the fastest plan under limits from the smallest to
    the largest memory."""
    from search import solve_milp
    from search.exact import minimum_memory_milp

    p = discrete_problem(random_run_table(seed, 5))
    assert has_runs(p)
    full = solve_brute(p)
    assert minimum_memory_milp(p).memory_bytes == pytest.approx(full.min_memory_bytes, rel=1e-9)
    for limit in np.linspace(full.min_memory_bytes, full.memory_bytes, 5):
        brute, milp = solve_brute(p, limit), solve_milp(p, limit)
        assert milp.feasible and milp.exact
        assert milp.time_s == pytest.approx(brute.time_s, rel=1e-6) and milp.memory_bytes <= limit
    assert not solve_milp(p, full.min_memory_bytes * (1 - 1e-6)).feasible


def test_remat_runs_offers_runs_on_cnn_layers_and_costs_them_by_hand():
    """CostSettings(remat_runs=True) on the tiny CNN (tests/builders.py: per
    sample conv1 keeps its input, 128 elements; relu its output, 256; conv2
    its input, 256; the max pool its input, 256; fc its input, 64), batch 4
    on one device, float32 (16 bytes per element across the batch).
    Recomputing is offered on every layer (the flatten, which saves nothing,
    too: a run may cross it), joining where the producer can recompute. The run conv1-relu-conv2 keeps conv1's
    input only (relu's and conv2's inputs are inside it): the activations
    fall from 128 + 256 + 256 to 128 elements, 8192 bytes. Its backward pass
    holds at conv2's step conv2's input and output gradients (256 + 256)
    and the run's 128 + 256 + 256 recomputed: 18432 bytes, against the
    largest transient kept, 8192 (relu's or conv2's gradients): +10240.
    Net +2048 bytes; the state does not change and the backward phase binds."""
    from builders import tiny_oracle_graph

    from costmodels import CostSettings, cost_table, hardware_arrays, load_hardware

    g = tiny_oracle_graph()
    hw = hardware_arrays(load_hardware("dgx-a100"))
    t = cost_table(g.arrays, hw, 4.0, 1.0, 1.0, CostSettings(levers="remat", remat_runs=True))
    off = cost_table(g.arrays, hw, 4.0, 1.0, 1.0, CostSettings(levers="remat"))
    n = g.num_layers
    names = list(g.names)
    feasible = np.asarray(t.feasible)[:n]
    data, remat, join = 0, 1, 2  # data's options under the "remat" menu
    assert {nm for i, nm in enumerate(names) if feasible[i, remat]} == set(names)
    assert {nm for i, nm in enumerate(names) if feasible[i, join]} == set(names) - {"conv1"}
    assert not np.asarray(off.feasible)[:n, [remat, join]].any()  # without remat_runs: none (each keeps no more)
    keep = np.full(n, data)
    plan = keep.copy()
    plan[[names.index("conv1"), names.index("relu"), names.index("conv2")]] = [remat, join, join]
    pad = np.zeros(t.feasible.shape[0] - n, int)
    mem = lambda c: float(memory_per_device(t, one_hot(jnp.asarray(np.r_[c, pad]), 15)))  # noqa: E731
    assert mem(plan) - mem(keep) == -8192 + 10240
    p = discrete_problem(t)
    assert plan_memory(p, plan) - plan_memory(p, keep) == -8192 + 10240


@pytest.mark.parametrize("seed", range(3))
def test_relaxed_run_terms_are_the_expectations_over_every_plan(seed):
    """Layers drawn independently from the probabilities: the relaxed run
    terms (costmodels.recomputed_runs: a scan, and prefix sums over the
    layers each edge skips) are the expectations of the discrete ones
    (search.problem.run_terms) over all 3^6 plans, weighted by their
    probabilities; with skip edges over up to four layers and two layers
    that never join (probability exactly 0)."""
    import itertools

    from costmodels.evaluate import recomputed_runs
    from search.problem import run_terms

    rng = np.random.default_rng(seed)
    n = 6
    act, inputs, work = (rng.integers(1, 100, n).astype(float) for _ in range(3))
    edges = [(i, i + 1) for i in range(n - 1)] + [(0, 3), (1, 5), (0, 5)]
    t = hand_table(edges, rng.uniform(0.2, 1.0, len(edges)), act, inputs, work)
    probs = rng.dirichlet(np.ones(3), n)
    probs[[2, 4], 2] = 0.0  # layers 2 and 4 never join
    probs /= probs.sum(axis=1, keepdims=True)
    plans = np.array(list(itertools.product(range(3), repeat=n)))  # [729, n]
    weight = np.prod(probs[np.arange(n), plans], axis=1)
    credit, transient = run_terms(discrete_problem(t), plans)
    full = jnp.zeros((n, 15)).at[:, :3].set(jnp.asarray(probs, jnp.float32))
    got_credit, got_transient = recomputed_runs(t, full)
    assert float(got_credit) == pytest.approx(weight @ credit, rel=1e-5)
    np.testing.assert_allclose(np.asarray(got_transient), weight @ transient, rtol=1e-5, atol=1e-4)


def test_relaxed_run_memory_has_the_gradients_of_finite_differences():
    """The gradient search differentiates the relaxed memory: with runs
    (an associative scan, a product per edge) its gradient at an interior
    point matches central differences, and is finite at one-hot points."""
    import jax

    t = random_run_table(3, 5)
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(5, 3)), jnp.float32)

    def memory(z):  # softmax over the three runnable options, the others at zero
        probs = jnp.zeros((5, 15)).at[:, :3].set(jax.nn.softmax(z, axis=-1))
        return memory_per_device(t, probs)

    grad = np.asarray(jax.grad(memory)(logits))
    h = 1e-2
    for i, j in [(0, 0), (1, 2), (2, 1), (3, 2), (4, 0)]:
        up, down = logits.at[i, j].add(h), logits.at[i, j].add(-h)
        fd = (float(memory(up)) - float(memory(down))) / (2 * h)
        assert grad[i, j] == pytest.approx(fd, rel=2e-2, abs=1e-2)
    onehot = one_hot(jnp.asarray([1, 2, 2, 0, 1]), 15)
    assert np.isfinite(np.asarray(jax.grad(lambda q: memory_per_device(t, q))(onehot))).all()


def test_an_unproven_smallest_memory_neither_claims_nor_refuses(monkeypatch):
    """Within a time limit the MILP over runs may not prove the smallest
    memory (MinimumMemory.exact False: here forced, as its plan the smallest
    without runs). solve then reports no smallest memory, does not call the
    table infeasible on that bound, and still finds brute force's plan under a
    limit only runs reach."""
    import search.solver as solver_module
    from search.exact import minimum_memory

    t = random_run_table(1, 5)
    p = discrete_problem(t)
    full = solve_brute(p)
    free = minimum_memory(without_joins(p))
    assert full.min_memory_bytes < free.memory_bytes  # runs reach below every plan without them
    limit = 0.5 * (full.min_memory_bytes + free.memory_bytes)
    monkeypatch.setattr(solver_module, "smallest_memory",
                        lambda q, time_limit_s=None: minimum_memory(without_joins(q))._replace(exact=False))
    for method in ("auto", "milp"):
        sol = solve(t, memory_limit=limit, method=method)
        assert sol.feasible and sol.min_memory_bytes is None, method
        assert sol.time_s == pytest.approx(solve_brute(p, limit).time_s, rel=1e-6), method
    # the gradient search walks towards the smallest plan it was given, which here does not fit: it may
    # fail, but it says the table is not proven infeasible either
    assert solve(t, memory_limit=limit, method="gradient").min_memory_bytes is None


def test_the_gradient_method_searches_longer_for_a_smallest_plan_that_fits(monkeypatch):
    """Where the smallest memory found within the short limit neither fits
    nor is proven (forced here: the smallest plan without runs, above a
    limit only runs reach), the gradient method searches for it again with
    SMALLEST_RETRY_TIME_LIMIT_S (or the caller's shorter limit), and with
    the real smallest plan as its repair target it fits, where without the
    retry it has no plan that fits to walk to; no retry where the caller's
    limit is no longer than the first."""
    import search.solver as solver_module
    from search.exact import minimum_memory, smallest_memory

    t = random_run_table(1, 5)
    p = discrete_problem(t)
    full = solve_brute(p)
    free = minimum_memory(without_joins(p))
    limit = 0.5 * (full.min_memory_bytes + free.memory_bytes)
    asked = []

    def smallest(q, time_limit_s=None):
        asked.append(time_limit_s)
        if time_limit_s is not None and time_limit_s <= solver_module.AUTO_MILP_TIME_LIMIT_S:
            return minimum_memory(without_joins(q))._replace(exact=False)
        return smallest_memory(q, time_limit_s)

    monkeypatch.setattr(solver_module, "smallest_memory", smallest)
    sol = solve(t, memory_limit=limit, method="gradient")
    assert asked == [solver_module.AUTO_MILP_TIME_LIMIT_S, solver_module.SMALLEST_RETRY_TIME_LIMIT_S]
    assert sol.feasible and sol.min_memory_bytes == pytest.approx(full.min_memory_bytes, rel=1e-6)
    assert sol.time_s >= solve_brute(p, limit).time_s * (1 - 1e-6)
    asked.clear()
    sol = solve(t, memory_limit=limit, method="gradient", milp_time_limit_s=30.0)
    assert asked == [solver_module.AUTO_MILP_TIME_LIMIT_S, 30.0] and sol.feasible
    asked.clear()
    assert not solve(t, memory_limit=limit, method="gradient", milp_time_limit_s=2.0).feasible
    assert asked == [2.0]


def test_the_smallest_memory_milp_stops_at_its_time_limit():
    """minimum_memory_milp within a time limit too short to prove anything:
    a plan no larger than the smallest without runs, marked not exact; with
    no limit, brute force's smallest memory, exact."""
    from search.exact import minimum_memory, minimum_memory_milp

    p = discrete_problem(random_run_table(2, 5))
    quick = minimum_memory_milp(p, time_limit_s=1e-6)
    assert not quick.exact
    assert quick.memory_bytes == plan_memory(p, quick.choice) <= minimum_memory(without_joins(p)).memory_bytes
    done = minimum_memory_milp(p)
    assert done.exact and done.memory_bytes == pytest.approx(solve_brute(p).min_memory_bytes, rel=1e-9)


def test_the_infeasible_error_says_what_the_search_found(monkeypatch):
    """planner.plan's infeasible error takes each mesh's smallest plan from
    the search (a Solution that does not fit is one) instead of searching
    again: where the search's smallest memory is not proven (forced here),
    the error says so, and its limit is that plan's; with the real search,
    proven, it says any plan needs it."""
    import re

    from builders import tiny_oracle_graph

    import planner
    import search.solver as solver_module
    from search.exact import smallest_memory

    kw = dict(devices=1, hardware="dgx-a100", batch=4, memory_limit="1kB", levers="remat")
    with pytest.raises(ValueError) as info:
        planner.plan(tiny_oracle_graph(), **kw)
    assert "the smallest memory limit any plan needs is" in str(info.value)
    proven = float(re.search(r"\(([\d,]+) bytes", str(info.value)).group(1).replace(",", ""))
    found = []

    def unproven(q, time_limit_s=None):
        mm = smallest_memory(q, time_limit_s)
        found.append(mm.memory_bytes)
        return mm._replace(exact=False)

    monkeypatch.setattr(solver_module, "smallest_memory", unproven)
    with pytest.raises(ValueError) as info:
        planner.plan(tiny_oracle_graph(), **kw)
    message = str(info.value)
    assert "the smallest memory limit the search found a plan for is" in message and "not proven" in message
    assert float(re.search(r"\(([\d,]+) bytes", message).group(1).replace(",", "")) == proven and found


def test_the_infeasible_error_counts_what_runs_free():
    """planner.plan's infeasible error on the tiny CNN with runs offered
    (levers="remat", a model without attention): its smallest plan recomputes
    runs, and the error's parts (kept for the backward pass, less the
    checkpoints inside runs; the largest transient with the run's recomputed
    activations) add up to the plan's memory, as search.plan_memory counts it."""
    import re

    from builders import tiny_oracle_graph

    import planner

    with pytest.raises(ValueError) as info:
        planner.plan(tiny_oracle_graph(), devices=1, hardware="dgx-a100", batch=4, memory_limit="1kB", levers="remat")
    message = str(info.value)
    assert "of checkpoints inside runs of recomputed layers" in message
    plan_kb, kept_kb, work_kb = (float(v) for v in re.search(
        r"([\d.]+) kB for the plan.* ([\d.]+) kB are weights.* and ([\d.]+) kB the largest transient", message).groups())
    assert kept_kb + work_kb == pytest.approx(plan_kb, abs=0.02)
