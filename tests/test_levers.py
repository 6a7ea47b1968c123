"""Memory levers (costmodels/levers.py): ZeRO stages and rematerialisation on
the menu, checked against hand-computed bytes and collective times, the
plain-Python reference, and the solvers on the larger menu."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from builders import chain_edges, dag_edges, limit_between, synthetic_table
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodels import CostSettings, cost_table, hardware_arrays, iteration_time, load_hardware, memory_per_device
from costmodels.evaluate import one_hot
from costmodels.levers import (
    Lever,
    lever_menu,
    levers_per_strategy,
    menu_of,
    option_index,
    option_name,
    option_strategy,
    parse_option,
)
from costmodels.reference import reference_iteration_time, reference_memory
from costmodels.strategies import Strategy
from planner import GraphBuilder
from planner.models.zoo import get_model
from search import (
    discrete_problem,
    plan_memory,
    plan_time,
    solve,
    solve_brute,
    solve_dp,
    solve_milp,
)

S = len(Strategy)
MB = 1e6
BUCKET = 25 * 2**20  # CostSettings' gradient bucket


def _table(graph, hw, batch, d, m, levers="all", **kw):
    return cost_table(graph.arrays, hardware_arrays(hw), float(batch), float(d), float(m),
                      CostSettings(levers=levers, **kw))


def _dense_graph(f_in: int, f_out: int, name: str = "one-dense"):
    b = GraphBuilder(name, (f_in,))
    b.dense("big", b.input, f_out, bias=False)
    return b.build()


# -- the menu -------------------------------------------------------------------------------


def test_menu_sizes_codes_and_names():
    assert [len(lever_menu(x)) for x in ("none", "zero", "remat", "all")] == [1, 4, 3, 12]
    for choice in ("none", "zero", "remat", "all"):
        menu = lever_menu(choice)
        assert menu[0] == Lever(0, False)  # option s K is always the plain strategy
        assert menu_of(S * len(menu)) == menu
        for s, lever in itertools.product(range(S), menu):
            o = option_index(s, lever, menu)
            assert option_strategy(S * len(menu))[o] == s
    menu = lever_menu("all")
    assert option_name(option_index(Strategy.DATA, Lever(3, True), menu), menu) == "data+zero3+remat"
    assert option_name(option_index(Strategy.FILTER, Lever(0, False), menu), menu) == "filter"
    assert option_name(option_index(Strategy.CHANNEL, Lever(2, False), menu), menu) == "channel+zero2"
    assert option_name(option_index(Strategy.DATA, Lever(1, True, True), menu), menu) == "data+zero1+remat+join"
    assert parse_option("data+zero1+remat+join") == (Strategy.DATA, Lever(1, True, True))
    with pytest.raises(ValueError, match="join after remat"):
        parse_option("data+join")
    with pytest.raises(ValueError, match="unknown levers"):
        lever_menu("zero4")
    with pytest.raises(ValueError, match="unknown levers"):
        CostSettings(levers="fsdp")
    with pytest.raises(ValueError, match="options is not"):
        levers_per_strategy(S * 5)
    with pytest.raises(ValueError, match="not in this menu"):
        option_index(0, Lever(1, False), lever_menu("remat"))


# -- ZeRO by hand -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_zero_bytes_and_collectives_by_hand(dtype):
    # One dense layer 256 -> 4096 (1,048,576 weights, no bias) on a 4 x 2 mesh of one
    # DGX A100 node (NVSwitch: 3 us, 300 GB/s), Adam. Per parameter: weights w and
    # gradients g (4 B each in fp32, 2 B in bf16), and what ZeRO stage 1 shards: fp32
    # master weights (bf16 only, 4 B), two Adam slots (8 B) and the update (4 B).
    g = _dense_graph(256, 4096)
    hw = load_hardware("dgx-a100")
    batch, d, m = 512, 4, 2
    t = _table(g, hw, batch, d, m, dtype=dtype)
    menu = lever_menu("all")
    w = gr = 4.0 if dtype == "float32" else 2.0
    opt = 12.0 if dtype == "float32" else 16.0
    params = 256.0 * 4096.0
    alpha, bw = 3e-6, 300e9
    for s, local, D in ((Strategy.DATA, params, 8), (Strategy.FILTER, params / 2, 4), (Strategy.CHANNEL, params / 2, 4),
                        (Strategy.REPLICATED, params, 4)):
        plain = option_index(s, Lever(0, False), menu)
        rs = (D - 1) * (alpha + BUCKET / D / bw)  # ring reduce-scatter of one bucket over the weights' replicas
        ag = (D - 1) * (alpha + BUCKET / D / bw)  # ring all-gather of one bucket
        expected_state = {  # stage 1 also: its update gathered to the whole weights, at the optimizer step
            0: (w + gr + opt) * local,
            1: (w + gr + opt / D + w) * local,
            2: (w + (gr + opt) / D) * local,
            3: (w + gr + opt) / D * local,
        }
        expected_extra = {0: 0.0, 1: 0.0, 2: gr * local, 3: (gr + w) * local}
        for z in range(4):
            o = option_index(s, Lever(z, False), menu)
            assert bool(t.feasible[0, o])
            assert float(t.state_bytes[0, o]) == pytest.approx(expected_state[z], rel=1e-6)
            # the optimizer step's part: the update (4 B, sharded from stage 1) and stage 1's gathered one
            update = 4.0 * local / (D if z else 1) + (w * local if z == 1 else 0.0)
            assert float(t.update_bytes[0, o]) == pytest.approx(update, rel=1e-6)
            assert float(t.workspace_bytes[0, o] - t.workspace_bytes[0, plain]) == pytest.approx(
                expected_extra[z], rel=1e-6)
            assert float(t.activation_bytes[0, o]) == float(t.activation_bytes[0, plain])
            assert float(t.compute_s[0, o]) == float(t.compute_s[0, plain])
            if z == 1:  # the gradients stay whole: all-reduced as without ZeRO
                assert float(t.grad_sync_s[0, o]) == float(t.grad_sync_s[0, plain])
            if z:
                if z >= 2:
                    assert float(t.grad_sync_s[0, o]) == pytest.approx(rs * gr * local / BUCKET, rel=1e-5)
                assert float(t.weight_gather_s[0, o]) == pytest.approx((2 if z == 3 else 1) * ag * w * local / BUCKET,
                                                                      rel=1e-5)
            else:
                assert float(t.weight_gather_s[0, o]) == 0.0


def test_zero_crossing_nodes_is_hierarchical():
    # data on 4 x 4 of DGX A100 nodes (8 GPUs each): 16 ranks, 8 per node. Reduce-scatter
    # inside the node (NVSwitch), then the node's eighth across the 2 nodes (InfiniBand,
    # 10 us, 25 GB/s); all-gather in reverse: the hierarchical all-reduce's two halves.
    g = _dense_graph(256, 4096)
    t = _table(g, load_hardware("dgx-a100"), 512, 4, 4)
    o = option_index(Strategy.DATA, Lever(2, False), lever_menu("all"))
    inside = 7 * (3e-6 + BUCKET / 8 / 300e9)
    across = 1 * (1e-5 + BUCKET / 8 / 2 / 25e9)
    flat = 15 * (1e-5 + BUCKET / 16 / 25e9)
    per_bucket = min(flat, inside + across)
    grad_bytes = 4.0 * 256 * 4096
    assert float(t.grad_sync_s[0, o]) == pytest.approx(per_bucket * grad_bytes / BUCKET, rel=1e-5)
    assert float(t.weight_gather_s[0, o]) == pytest.approx(per_bucket * grad_bytes / BUCKET, rel=1e-5)


def test_zero_masks():
    hw = load_hardware("dgx-a100")
    menu = lever_menu("zero")
    g = get_model("vgg16-cifar10")
    names = list(g.names)
    t = np.asarray(_table(g, hw, 64, 4, 2, levers="zero").feasible)
    conv, relu, head = names.index("features/0"), names.index("relu"), names.index("classifier/0")
    z1 = lambda s: option_index(s, Lever(1, False), menu)  # noqa: E731
    assert t[conv, z1(Strategy.DATA)] and t[conv, z1(Strategy.FILTER)]  # 64 channels, groups of 8 and 4
    assert not t[relu, z1(Strategy.DATA)]  # no parameters
    assert not t[head, z1(Strategy.DATA)]  # 10 outputs: 8 does not divide them
    t2 = np.asarray(_table(g, hw, 64, 2, 1, levers="zero").feasible)
    assert t2[head, z1(Strategy.DATA)]  # ... 2 does
    t11 = np.asarray(_table(g, hw, 64, 1, 1, levers="zero").feasible)
    assert not t11[conv, 1:4].any()  # one device: nothing to shard over
    # a tiny tied decoder: token embedding, one attention, the output layer reading the table
    b = GraphBuilder("tied", (1, 16))
    x = b.embed("embed", b.input, 64, 32)
    x = b.attention("attention", b.dense("qkv", x, 96), heads=4)
    b.dense("head", b.dense("out", x, 32), 64, tied=True)
    tg = b.build()
    tt = np.asarray(_table(tg, hw, 64, 4, 2, levers="zero").feasible)
    rows = {n: i for i, n in enumerate(tg.names)}
    for name in ("embed", "attention", "head"):  # the table a tied output reads; attention; the tied output
        assert not tt[rows[name], [z1(s) for s in range(S)]].any(), name
    assert tt[rows["qkv"], z1(Strategy.DATA)] and tt[rows["out"], z1(Strategy.DATA)]


# -- rematerialisation by hand --------------------------------------------------------------------


def test_remat_by_hand():
    # Self-attention of 4 heads over 64 tokens of 32 channels: it saves q, k, v and the
    # 4 x 64 x 64 probabilities (3 x 32 x 64 + 4 x 64 x 64 elements per sample), more
    # than its input (3 x 32 x 64). Recomputed: it keeps its input, computes its
    # forward twice, and holds what it saved as a transient of its backward step.
    b = GraphBuilder("attn", (96, 64))
    b.attention("att", b.input, heads=4)
    g = b.build()
    hw = load_hardware("dgx-a100")
    batch, d, m = 64, 4, 2
    t = _table(g, hw, batch, d, m, levers="remat")
    menu = lever_menu("remat")
    for s, split in ((Strategy.DATA, m), (Strategy.FILTER, m), (Strategy.REPLICATED, 1)):
        plain, remat = option_index(s, Lever(0, False), menu), option_index(s, Lever(0, True), menu)
        assert bool(t.feasible[0, remat])
        gb = batch / d
        saved = (3 * 32 * 64 + 4 * 64 * 64) * gb * 4 / split
        kept = 3 * 32 * 64 * gb * 4 / split
        assert float(t.activation_bytes[0, plain]) == pytest.approx(saved, rel=1e-6)
        assert float(t.activation_bytes[0, remat]) == pytest.approx(kept, rel=1e-6)
        assert float(t.workspace_bytes[0, remat] - t.workspace_bytes[0, plain]) == pytest.approx(saved, rel=1e-6)
        fwd = float(t.compute_s[0, plain] - t.backward_compute_s[0, plain])
        assert float(t.compute_s[0, remat]) == pytest.approx(float(t.compute_s[0, plain]) + fwd, rel=1e-6)
        assert float(t.backward_compute_s[0, remat]) == pytest.approx(
            float(t.backward_compute_s[0, plain]) + fwd, rel=1e-6)
        # the backward step's transient: the input and output gradients and dP, dS (heads x tokens^2 each)
        grads = (3 * 32 * 64 + 32 * 64) * gb * 4 / split
        probs = 4 * 64 * 64 * gb * 4 / split
        assert float(t.workspace_bytes[0, plain]) == pytest.approx(grads + 2 * probs, rel=1e-6)
        # on XLA:CPU the probabilities are also kept transposed (held at the backward step if recomputed)
        tc = _table(g, hw, batch, d, m, levers="remat", platform="cpu")
        assert float(tc.activation_bytes[0, plain]) == pytest.approx(saved + probs, rel=1e-6)
        assert float(tc.activation_bytes[0, remat]) == pytest.approx(kept, rel=1e-6)
        assert float(tc.workspace_bytes[0, remat]) == pytest.approx(grads + 3 * probs + saved, rel=1e-6)
    # a layer that saves only its input gains nothing by recomputing: not offered
    c = GraphBuilder("conv", (8, 16, 16))
    c.conv("conv", c.input, 8, 3)
    tc = _table(c.build(), hw, 64, 4, 2, levers="remat")
    recomputing = [o for o in range(S * len(menu)) if menu[o % len(menu)].remat]
    assert not np.asarray(tc.feasible)[0, recomputing].any()
    # nor does joining the run before a layer: the attention's producer, the model input, cannot recompute
    joining = [o for o in range(S * len(menu)) if menu[o % len(menu)].joins]
    assert not np.asarray(t.feasible)[0, joining].any()


# -- the one-hot identity and the plain-Python reference under levers -----------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name,hw_name,batch,mesh,dtype", [
    ("resnet50", "dgx-a100", 512, (16, 4), "float32"),  # convs, batch norms, residual adds
    ("vit-tiny", "dgx-a100", 64, (4, 2), "float32"),  # attention (remat), layer norms
])
def test_lever_plans_agree_with_the_reference(name, hw_name, batch, mesh, dtype):
    g = get_model(name)
    hw = load_hardware(hw_name)
    d, m = mesh
    st_ = CostSettings(levers="all", dtype=dtype)
    t = cost_table(g.arrays, hardware_arrays(hw), float(batch), float(d), float(m), st_)
    # every strategy's plain option is the lever-free table's, bit for bit
    plain = cost_table(g.arrays, hardware_arrays(hw), float(batch), float(d), float(m), CostSettings(dtype=dtype))
    assert t.reshard_s.shape == plain.reshard_s.shape  # resharding stays by strategy
    for field in ("feasible", "compute_s", "backward_compute_s", "grad_sync_s", "weight_gather_s", "halo_s",
                  "output_s", "state_bytes", "activation_bytes", "workspace_bytes"):
        np.testing.assert_array_equal(np.asarray(getattr(t, field))[:, ::len(lever_menu("all"))], np.asarray(getattr(plain, field)),
                                      err_msg=field)
    p = discrete_problem(t)
    feas = np.asarray(t.feasible)[: g.num_layers]
    rng = np.random.default_rng(0)
    for _ in range(3):
        c = np.array([rng.choice(np.flatnonzero(f)) for f in feas])
        assert any(o % len(lever_menu("all")) for o in c)  # the random plans use levers
        probs = one_hot(np.r_[c, np.zeros(t.feasible.shape[0] - g.num_layers, int)], t.feasible.shape[1])
        assert plan_time(p, c) == pytest.approx(float(iteration_time(t, probs)), rel=1e-5)
        assert plan_memory(p, c) == pytest.approx(float(memory_per_device(t, probs)), rel=1e-5)
        if dtype == "float32":  # (the reference's compute is float32's; its bytes are any dtype's)
            assert plan_time(p, c) == pytest.approx(reference_iteration_time(g, c, hw, float(batch), d, m, st_),
                                                    rel=1e-4)
        assert plan_memory(p, c) == pytest.approx(reference_memory(g, c, float(batch), d, m, st_), rel=1e-4)


# -- the solvers on the larger menu -----------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 4), levers=st.sampled_from([3, 4]), chain=st.booleans(),
       overlap=st.sampled_from([0.0, 0.6]))
def test_exact_solvers_agree_with_brute_force_on_lever_menus(seed, n, levers, chain, overlap):
    edges = chain_edges(n, seed, True) if chain else dag_edges(n, seed)
    p = discrete_problem(synthetic_table(seed, n, edges, levers=levers, p_feasible=0.5, overlap=overlap))
    assert p.num_options == S * levers and p.strategy_reshard_s.shape[1:] == (S, S)
    limit = limit_between(p, seed)
    brute = solve_brute(p, limit)
    milp = solve_milp(p, limit)
    assert milp.feasible == brute.feasible
    if brute.feasible:
        assert milp.time_s == pytest.approx(brute.time_s, rel=1e-6)
        assert plan_memory(p, milp.choice) <= limit
        if chain and not overlap:
            dp = solve_dp(p, limit)
            assert dp.exact and dp.time_s == pytest.approx(brute.time_s, rel=1e-9)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 4), chain=st.booleans())
def test_gradient_search_on_lever_menus_fits_and_never_beats_brute_force(seed, n, chain):
    from search import GradientConfig

    edges = chain_edges(n, seed, True) if chain else dag_edges(n, seed)
    table = synthetic_table(seed, n, edges, levers=4, p_feasible=0.5)
    p = discrete_problem(table)
    limit = limit_between(p, seed)
    brute = solve_brute(p, limit)
    sol = solve(table, limit, method="gradient", config=GradientConfig(restarts=4, outer_steps=3, inner_steps=8))
    assert sol.feasible == brute.feasible
    if brute.feasible:
        assert sol.memory_bytes <= limit
        assert sol.time_s >= brute.time_s * (1 - 1e-9)
        assert sol.time_s == pytest.approx(plan_time(p, sol.choice), rel=1e-12)


def test_elimination_refuses_lever_tables():
    from search.elimination import best_plan, soft_min_time

    t = synthetic_table(0, 3, [(0, 1), (1, 2)], levers=3)
    for fn in (lambda: best_plan(t, None), lambda: soft_min_time(t, None, 1e-3)):
        with pytest.raises(ValueError, match="levers='none'"):
            fn()  # (refused before the schedule is read)


# -- the search weighs ZeRO against model parallelism ------------------------------------------------


@pytest.mark.parametrize("batch,winner", [(8192, "zero"), (512, "filter")])
def test_search_chooses_zero_or_model_parallelism_by_hand(batch, winner):
    # One dense layer 256 -> 4096 on 4 x 2 GPUs of one DGX A100 node (NVSwitch: 3 us,
    # 300 GB/s), fp32 Adam: 1,048,576 weights, 20 B each. A memory limit between
    # the candidates' memory (hand-computed below) and data parallelism's rules out
    # plain data parallelism. Its two ways out:
    #   data + ZeRO-2: the same compute; the gradients reduce-scattered and the weights
    #     all-gathered over the 8 replicas: 2 x 7 (a + B/8 b) per 25 MiB bucket;
    #   filter: half the weights, all-reduced over the 4 replicas (ring, 6 (a + B/4 b)
    #     per bucket; the tree, 4a + 2 B b, is slower), plus an all-gather of the output
    #     features over the model axis for the loss: (a + Y/2 b), Y = batch/4 x 4096 x 4 B.
    # ZeRO saves 1.0 B b of gradient traffic for Y/2 b of activations: it wins when
    # batch > 8 x 256 = 2048, filter below.
    f_in, f_out, d, m = 256, 4096, 4, 2
    g = _dense_graph(f_in, f_out)
    hw = load_hardware("dgx-a100")
    t = _table(g, hw, batch, d, m)
    menu = lever_menu("all")
    data, zero2 = option_index(Strategy.DATA, Lever(0, False), menu), option_index(Strategy.DATA, Lever(2, False), menu)
    filt = option_index(Strategy.FILTER, Lever(0, False), menu)
    a, b = 3e-6, 1 / 300e9
    weights = f_in * f_out
    buckets = 4.0 * weights / BUCKET
    zero_s = float(t.compute_s[0, zero2]) + 2 * 7 * (a + BUCKET / 8 * b) * buckets
    y = batch / d * f_out * 4.0
    filter_s = float(t.compute_s[0, filt]) + 6 * (a + BUCKET / 4 * b) * buckets / 2 + (a + y / 2 * b)
    p = discrete_problem(t)
    assert plan_time(p, [zero2]) == pytest.approx(zero_s, rel=1e-5)
    assert plan_time(p, [filt]) == pytest.approx(filter_s, rel=1e-5)
    # memory by hand, the larger of two phases. Backward: the state but the optimizer's
    # update (4 B per weight), the saved input (filter's input is replicated in the
    # group) and the larger of the backward step's input and output gradients and the
    # loss step's two fp32 logits-sized buffers in the loss's layout (filter's output
    # gathered over the model axis) (ZeRO-2: and the whole gradient). Optimizer step:
    # the state with the update (20 B per weight; ZeRO-2 shards 16 of them, the update
    # among them, over the 8 replicas).
    step_data = max(4 * batch / 8 * (f_in + f_out), 2 * 4 * batch / 8 * f_out)
    step_filter = max(4 * batch / 4 * (f_in + f_out / 2), 2 * 4 * batch / 4 * f_out)
    mem_data = max(16.0 * weights + 4 * batch / 8 * f_in + step_data, 20.0 * weights)
    mem_zero2 = max((4 + 12 / 8) * weights + 4 * batch / 8 * f_in + step_data + 4.0 * weights,
                    (4 + 16 / 8) * weights)
    mem_filter = max(8.0 * weights + 4 * batch / 4 * f_in + step_filter, 10.0 * weights)
    for o, want in ((data, mem_data), (zero2, mem_zero2), (filt, mem_filter)):
        assert plan_memory(p, [o]) == pytest.approx(want, rel=1e-6)
    # a limit below data parallelism's memory that the winner fits (at batch 8192 filter's
    # loss step, its logits gathered over the model axis, needs more than data parallelism)
    mem_winner = mem_zero2 if winner == "zero" else mem_filter
    assert mem_winner < mem_data
    limit = (mem_winner + mem_data) / 2
    assert (zero_s < filter_s) == (winner == "zero")
    for method in ("auto", "milp", "gradient"):
        sol = solve(t, limit, method=method)
        o = sol.choice[0]
        assert sol.feasible and sol.memory_bytes <= limit
        s, lever = o // len(menu), menu[o % len(menu)]
        if winner == "zero":
            assert s == Strategy.DATA and lever.zero_stage >= 1, option_name(o, menu)
        else:
            assert s == Strategy.FILTER, option_name(o, menu)
        assert sol.time_s == pytest.approx(solve_brute(p, limit).time_s, rel=1e-6)


def test_levers_that_buy_nothing_are_dropped():
    # On 4 x 1 GPUs the gradient all-reduce over 4 ranks is a ring (6 (a + B/4 b) per
    # bucket against the tree's 4a + 2 B b), and ZeRO-2's reduce-scatter and all-gather
    # are its two halves: data + ZeRO-2 ties plain data parallelism in time and needs
    # less memory. Without a limit that binds, every method returns the plain plan.
    g = _dense_graph(256, 4096)
    t = _table(g, load_hardware("dgx-a100"), 512, 4, 1)
    menu = lever_menu("all")
    p = discrete_problem(t)
    data, zero2 = option_index(Strategy.DATA, Lever(0, False), menu), option_index(Strategy.DATA, Lever(2, False), menu)
    assert plan_time(p, [zero2]) == pytest.approx(plan_time(p, [data]), rel=1e-6)
    assert plan_memory(p, [zero2]) < plan_memory(p, [data])
    for method in ("auto", "milp", "gradient"):
        sol = solve(t, None, method=method)
        assert sol.choice[0] % len(menu) == 0, option_name(sol.choice[0], menu)  # (data or, on m = 1, replicated)
    # where the limit binds, the lever stays
    sol = solve(t, (plan_memory(p, [zero2]) + plan_memory(p, [data])) / 2, method="auto")
    assert sol.choice[0] % len(menu) != 0 and sol.choice[0] // len(menu) == Strategy.DATA


def test_compact_options_keeps_one_of_each_equivalent_option():
    from search import compact_options, plain_options

    g = get_model("vgg16-cifar10")  # no layer recomputes (each saves its input): half the menu goes
    hw = load_hardware("dgx-a100")
    for mesh in ((4, 2), (8, 1)):
        p = discrete_problem(_table(g, hw, 64, *mesh))
        c, ids, rep = compact_options(p)
        assert set(ids) <= set(np.flatnonzero(p.feasible.any(axis=0)))
        assert not any(lever_menu("all")[k].remat for k in p.option_lever[ids])
        assert c.reshard_s.shape[1:] == (ids.size, ids.size)
        assert plain_options(c)[Strategy.DATA] >= 0 and ids[plain_options(c)[Strategy.DATA]] == 0
        column = {o: k for k, o in enumerate(ids)}
        rng = np.random.default_rng(1)
        for _ in range(3):  # any plan costs what the plan of the options standing for its options costs
            x = np.array([rng.choice(np.flatnonzero(f)) for f in p.feasible])
            y = rep[np.arange(p.num_layers), x]
            assert (y >= 0).all() and all(c.feasible[i, column[o]] for i, o in enumerate(y))
            assert plan_time(p, y) == plan_time(p, x) and plan_memory(p, y) == plan_memory(p, x)
            assert plan_time(c, [column[o] for o in y]) == plan_time(p, y)
        if mesh == (8, 1):  # no model axis: filter, channel and replicated are data parallelism
            for s in (Strategy.FILTER, Strategy.CHANNEL, Strategy.REPLICATED):
                assert plain_options(c)[s] < 0 or not c.feasible[:, plain_options(c)[s]].any()



def test_duplicate_options_are_the_pairs_equal_in_every_cost():
    """drop_duplicate_options against its definition checked pair by pair: an
    option stands for another at a layer where both run and they are equal in
    every per-layer cost, every reshard row of an edge leaving the layer, and
    every reshard column and checkpoint credit of an edge entering it."""
    duplicates = 0
    for mesh in ((4, 2), (8, 1)):  # on (8, 1) filter, channel and replicated are data parallelism
        duplicates += _duplicates_checked_pair_by_pair(discrete_problem(_table(get_model("vit-tiny"),
                                                                               load_hardware("dgx-a100"), 64, *mesh)))
    assert duplicates > 0  # the check saw duplicates to find


def _duplicates_checked_pair_by_pair(p) -> int:
    from search.options import drop_duplicate_options

    _, rep = drop_duplicate_options(p)
    per_layer = (p.layer_time_s, p.persistent_bytes, p.workspace_bytes, p.optimizer_bytes, p.grad_sync_s,
                 p.backward_s, p.recompute_bytes)
    src, dst = p.src_incidence.tocsr(), p.dst_incidence.tocsr()
    flags = p.option_recomputes + 2.0 * p.option_joins

    def equal(i, a, b):
        if any(x[i, a] != x[i, b] for x in per_layer) or flags[a] != flags[b]:
            return False
        leaving = all((p.reshard_s[e, a] == p.reshard_s[e, b]).all() for e in src[i].indices)
        entering = all((p.reshard_s[e, :, a] == p.reshard_s[e, :, b]).all()
                       and p.checkpoint_credit[e, a] == p.checkpoint_credit[e, b] for e in dst[i].indices)
        return leaving and entering

    duplicates = 0
    for i in range(p.num_layers):
        for b in range(p.num_options):
            if not p.feasible[i, b]:
                assert rep[i, b] == -1
                continue
            first = next(a for a in range(p.num_options) if p.feasible[i, a] and equal(i, a, b))
            assert rep[i, b] == first
            duplicates += first != b
    return duplicates


# -- the planner ----------------------------------------------------------------------------


def test_plan_with_levers_fits_where_no_lever_free_plan_does():
    """VGG16-CIFAR-10, 8 DGX A100s, batch 64, 55 MB: lever-free, no plan fits
    (the smallest needs about 56.7 MB); with ZeRO one does. The plan records its menu and each
    layer's stage; its collectives are ZeRO's, by hand: a stage-2 or 3 layer
    reduce-scatters its gradient (one shard of its float32 weights per device)
    over its data-parallel group, and gathers its weights once (stage 2) or
    twice (stage 3)."""
    import planner
    from planner.planning import InfeasibleMemoryError

    with pytest.raises(InfeasibleMemoryError) as err:
        planner.plan("vgg16-cifar10", devices=8, hardware="dgx-a100", batch=64, memory_limit="55MB", levers="none")
    assert err.value.required_bytes > 55e6
    p = planner.plan("vgg16-cifar10", devices=8, hardware="dgx-a100", batch=64, memory_limit="55MB", levers="zero")
    assert p.levers == "zero" and p.memory_bytes_per_device <= 55e6 and p.zero_stages
    g = get_model("vgg16-cifar10")
    a = g.unpadded()
    i_of = {n: i for i, n in enumerate(g.names)}
    d, m = p.mesh
    for name, z in p.zero_stages.items():
        s, i = p.strategies[name], i_of[name]
        params = float(a.params[i])
        kernel = float(np.prod(a.kernel[i])) * float(a.in_channels[i]) * float(a.out_channels[i])
        # filter splits kernel and bias, channel the kernel only (ParaDL §4.7: its bias is added once)
        local = {"filter": params / m, "channel": kernel / m + (params - kernel)}.get(s, params)
        axes = ("data", "model") if s == "data" and m > 1 else ("data",)
        ranks = d * m if s == "data" else d
        mine = [c for c in p.collectives if c.where in (name, f"{name} (weights)")]
        got = sorted((c.kind, c.axes, c.phase, c.bytes_per_device) for c in mine)
        grad = [("all-reduce", axes, "gradient", 4 * local)] if z == 1 else \
            [("reduce-scatter", axes, "gradient", 4 * local / ranks)]
        gathers = [("all-gather", axes, ph, 4 * local) for ph in (("backward", "forward") if z == 3 else ("update",))]
        want = sorted(grad + gathers)
        assert [g[:3] for g in got] == [w[:3] for w in want], name
        assert [g[3] for g in got] == pytest.approx([w[3] for w in want], rel=1e-6), name


@pytest.mark.slow
def test_zero_stages_2_and_3_fit_their_prediction_on_xla_cpu(devices):
    """VGG16-CIFAR-10 at batch 16 on 4x2, every layer data under ZeRO stage
    2, then 3: XLA's compiled total (the oracle) is within 10% of the
    prediction (measured 1.045 and 1.034), and within what the cpu
    margin covers. The export ties each layer's weights (and stage 3's
    gathers) to the layer's input in the forward pass and to its cotangent
    in the backward pass, and its weight gradients to its input gradient
    (planner.runtime.calls.zero_call). Without the ties XLA:CPU's schedule
    computes every kernel copy and gather at the step's start: 1.75 and
    2.84; without the last, XLA copies each donated kernel read by an input
    gradient at the step's start: 1.11 and 1.09."""
    import planner
    from planner.plan_inputs import MEMORY_MARGIN
    from planner.runtime.validation import fixed_plan

    model, x = planner.flax_model("vgg16-cifar10", batch=16)
    g = planner.extract(model, x)
    t = _table(g, load_hardware("dgx-a100"), 16, 4, 2, levers="zero", optimizer="adam")
    for stage in (2, 3):
        ok = np.asarray(t.feasible)[:g.num_layers, option_index(Strategy.DATA, Lever(stage, False), lever_menu("zero"))]
        options = {n: f"data+zero{stage}" if f else "data" for n, f in zip(g.names, ok, strict=True)}
        plan = fixed_plan(model, x, (4, 2), strategies=options, batch=16, optimizer="adam")
        assert set(plan.zero_stages.values()) == {stage} and len(plan.zero_stages) == 13  # the layers the mask lets shard
        row = {r.part: r for r in planner.validate(model, plan).memory}["total"]
        assert row.compiled_bytes <= row.predicted_bytes / (1 - MEMORY_MARGIN["cpu"]), (stage, row)
        assert abs(row.compiled_bytes / row.predicted_bytes - 1) <= 0.10, (stage, row)


def test_evaluate_takes_levers_and_says_why_one_cannot_run():
    from planner.evaluation import evaluate

    g = get_model("vgg16-cifar10")
    hw = load_hardware("dgx-a100")
    plan = {n: "data" for n in g.names}
    plain = evaluate(g, hw, 8, mesh=(8, 1), plan=plan, batch=64)
    zero = evaluate(g, hw, 8, mesh=(8, 1), plan=plan | {"features/12": "data+zero2"}, batch=64)
    row = {r.name: r for r in zero.layers}["features/12"]
    assert (row.zero_stage, row.remat, row.option) == (2, False, "data+zero2")
    assert zero.memory_bytes_per_device < plain.memory_bytes_per_device
    # the same plan on the larger menus costs the same (float32 rounding apart)
    for levers in ("zero", "all"):
        again = evaluate(g, hw, 8, mesh=(8, 1), plan=plan | {"features/12": "data+zero2"}, batch=64, levers=levers)
        assert again.iteration_s == pytest.approx(zero.iteration_s, rel=1e-6)
    with pytest.raises(ValueError, match="levers need the menu 'zero', which levers='remat' does not hold"):
        evaluate(g, hw, 8, mesh=(8, 1), plan=plan | {"features/12": "data+zero2"}, batch=64, levers="remat")
    with pytest.raises(ValueError, match="cannot run strategy data\\+zero1 here: ZeRO needs a layer with parameters"):
        evaluate(g, hw, 8, mesh=(8, 1), plan=plan | {"relu": "data+zero1"}, batch=64)
    with pytest.raises(ValueError, match="unknown or repeated lever 'zero4'"):
        evaluate(g, hw, 8, mesh=(8, 1), plan=plan | {"relu": "data+zero4"}, batch=64)
    # a run of recomputed layers: the conv recomputes, the ReLU after it joins (a CNN offers runs,
    # planner.evaluation.remat_runs_offered); the first layer has no producer whose run it could join
    run = evaluate(g, hw, 8, mesh=(8, 1), plan=plan | {"features/12": "data+remat", "relu_12": "data+remat+join"},
                   batch=64)
    rows = {r.name: r for r in run.layers}
    assert (rows["features/12"].option, rows["relu_12"].option) == ("data+remat", "data+remat+join")
    assert rows["relu_12"].joins and not rows["features/12"].joins
    with pytest.raises(ValueError, match="cannot run strategy data\\+remat\\+join here: .*needs a producer"):
        evaluate(g, hw, 8, mesh=(8, 1), plan=plan | {"features/0": "data+remat+join"}, batch=64)


def test_free_levers_takes_zero2_where_it_ties_plain_data_parallelism():
    """free_levers, the reverse of drop_idle_levers: on 4 x 1 A100s (a ring
    all-reduce, whose two halves are ZeRO-2's reduce-scatter and all-gather)
    plain data parallelism moves to data + ZeRO-2, equal in time and
    smaller; ZeRO-1 and ZeRO-3 add collectives, so it stops there; a plan
    already there stays."""
    from search.local import free_levers

    g = _dense_graph(256, 4096)
    p = discrete_problem(_table(g, load_hardware("dgx-a100"), 512, 4, 1))
    menu = lever_menu("all")
    data, zero2 = option_index(Strategy.DATA, Lever(0, False), menu), option_index(Strategy.DATA, Lever(2, False), menu)
    for z in (1, 3):
        assert plan_time(p, [option_index(Strategy.DATA, Lever(z, False), menu)]) > plan_time(p, [data]) * (1 + 1e-6)
    assert free_levers(p, [data]).tolist() == [zero2]
    assert free_levers(p, [zero2]).tolist() == [zero2]


@pytest.mark.parametrize("seed", range(6))
def test_free_levers_changes_only_zero_stages_and_never_costs_time_or_memory(seed):
    """On random lever tables (ZeRO stages 0-3 per strategy) and random
    plans: free_levers changes only ZeRO stages, its plan is no slower (to
    its tolerance) and needs less memory where it changed anything, and
    from its plan no single change of a ZeRO stage is no slower and
    smaller (brute force over every layer and stage)."""
    from search.local import free_levers

    n = 6
    rng = np.random.default_rng(seed)
    changed = 0
    for k in range(4):
        p = discrete_problem(synthetic_table(seed * 10 + k, n, chain_edges(n, seed, True), levers=4, p_feasible=0.7))
        c = np.array([rng.choice(np.flatnonzero(f)) for f in p.feasible])
        f = free_levers(p, c, rel_tol=0.0)
        assert np.array_equal(p.option_strategy[f], p.option_strategy[c])
        assert plan_time(p, f) <= plan_time(p, c) * (1 + 1e-12)
        if not np.array_equal(f, c):
            changed += 1
            assert plan_memory(p, f) < plan_memory(p, c)
        t, m = plan_time(p, f), plan_memory(p, f)
        for lay in range(n):
            for o in np.flatnonzero(p.feasible[lay] & (p.option_strategy == p.option_strategy[f[lay]])):
                x = f.copy()
                x[lay] = o
                assert not (plan_time(p, x) <= t and plan_memory(p, x) < m), (lay, o)
    assert changed


def test_auto_levers_search_without_levers_first_and_with_all_only_when_nothing_fits():
    """levers="auto" (the default): where a lever-free plan fits it is that
    plan; where none fits, the plan with every lever, and the callback says
    so. VGG16-CIFAR-10 on 8 DGX A100s at batch 64: 1 GB fits without levers,
    55 MB does not (test above). (The plan with every lever is not compared
    with another search's: the time budget may stop one and not the other.)"""
    import planner
    from search import SearchEvent

    kw = dict(devices=8, hardware="dgx-a100", batch=64)
    loose = planner.plan("vgg16-cifar10", memory_limit="1GB", **kw)
    assert loose.levers == "none"
    assert loose.to_dict() | {"seconds": 0} == planner.plan("vgg16-cifar10", memory_limit="1GB", levers="none",
                                                           **kw).to_dict() | {"seconds": 0}
    events: list[SearchEvent] = []
    tight = planner.plan("vgg16-cifar10", memory_limit="55MB", callback=events.append, **kw)
    assert tight.levers == "all" and tight.zero_stages and tight.memory_bytes_per_device <= 55e6
    assert any(e.stage == "levers" for e in events)
