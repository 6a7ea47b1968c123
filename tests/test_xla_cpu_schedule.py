"""XLA:CPU's schedule (costmodels/xla_cpu_schedule.py) against hand-computed
peaks, its buffers on real cpu tables (costmodels/xla_cpu.py) against the
export's rules, and planner/schedule_fit.py's re-planning against a stub
solver."""

import jax.numpy as jnp
import numpy as np
import pytest
from builders import synthetic_table

from costmodels import XlaCpuBuffers, lever_menu, memory_per_device, one_hot, scheduled_memory_per_device
from costmodels.strategies import NUM_STRATEGIES as S
from planner.schedule_fit import SCHEDULE_RETRIES, fit_schedule
from search import Solution, discrete_problem, minimum_memory


def _table(out1: float = 4.0, swapped: float = 20.0, d_gt_1: bool = True, late: float = 0.0):
    """Three layers in order, every strategy alike: conv0 (the first weighted
    layer: no copy), a max pool, conv2 (copied; reversed kernel ``swapped``;
    ``late``: a gradient copy it keeps after its backward step, as a ZeRO
    dense layer's). Bytes per device, small integers."""
    rows = lambda *v: jnp.asarray(np.repeat(np.asarray(v, np.float64)[:, None], S, axis=1), jnp.float32)  # noqa: E731
    G = (10.0, 0.0, 30.0)  # gradients; the update is as large
    # state = weights + gradients + two adam slots + update: 5 G
    state = rows(*(5 * g for g in G))
    table = builders_table(
        state_bytes=state, update_bytes=rows(*G),
        activation_bytes=rows(40.0, 20.0, 12.0),  # the pool's: its input 16 and index matrix 4
        workspace_bytes=rows(5.0, 7.0 + 8.0, 9.0),  # the pool's with its iotas (8)
    )
    x = XlaCpuBuffers(
        gradient_bytes=rows(*G), held_gradient_bytes=rows(*G), kernel_copy_bytes=rows(0.0, 0.0, 30.0),
        scattered_gradient_bytes=rows(0.0, 0.0, 0.0), late_copy_bytes=rows(0.0, 0.0, late),
        reversed_kernel_bytes=rows(0.0, 0.0, swapped),
        pool_input_bytes=rows(0.0, 16.0, 0.0), pool_iota_bytes=rows(0.0, 8.0, 0.0),
        pool_output_bytes=rows(0.0, out1, 0.0),
        max_pool=jnp.asarray([0.0, 1.0, 0.0]), convolution=jnp.asarray([1.0, 0.0, 1.0]),
        reduces_gradients=jnp.asarray(1.0 if d_gt_1 else 0.0))
    return table._replace(xla_cpu=x)


def builders_table(levers: int = 1, **fields):
    t = synthetic_table(0, 3, [(0, 1), (1, 2)], layers=3, edge_rows=2, levers=levers)
    return t._replace(**fields)


def _lever_table(menu: str, **by_lever):
    """``_table()`` on the lever menu ``menu`` (``costmodels.lever_menu``):
    every field of the plain table, repeated per option, but those given in
    ``by_lever`` (field -> one tuple of 3 per-layer values per lever of the
    menu, in its order), the same for every strategy."""
    plain = _table()
    K = len(lever_menu(menu))
    t = builders_table(levers=K)
    fields = {}
    for name in ("state_bytes", "update_bytes", "activation_bytes", "workspace_bytes", "recompute_bytes",
                 "checkpoint_bytes"):
        per_lever = by_lever.get(name, [np.asarray(getattr(plain, name))[:, 0]] * K)
        block = np.stack([np.asarray(v, np.float64) for v in per_lever], axis=-1)  # [3, K]
        fields[name] = jnp.asarray(np.tile(block, (1, S)), jnp.float32)  # option s K + k
    buffers = {}
    for name in ("gradient_bytes", "held_gradient_bytes", "kernel_copy_bytes", "scattered_gradient_bytes",
                 "late_copy_bytes"):
        plain_rows = np.asarray(getattr(plain.xla_cpu, name if name != "held_gradient_bytes" else "gradient_bytes"))
        per_lever = by_lever.get(name, [plain_rows[:, 0]] * K)
        block = np.stack([np.asarray(v, np.float64) for v in per_lever], axis=-1)
        buffers[name] = jnp.asarray(np.tile(block, (1, S)), jnp.float32)
    return t._replace(**fields, xla_cpu=plain.xla_cpu._replace(**buffers))


def _peak(table, strategy: int = 0) -> float:
    return float(scheduled_memory_per_device(table, one_hot(np.full(3, strategy), S)))


def test_schedule_peaks_by_hand():
    # args (weights, slots) = 3 G = 30 + 0 + 90 = 120.
    # forward = C + S + at the pool: made 40 + 20, iotas from it on 8, other pools' Z 0, 2 x out 4
    #         = 30 + 20 + 76 = 126; backward = C + A + Z + max W = 30 + 72 + 16 + 9 = 127;
    # reduce: before each layer C + A + Z = 0, 40, 76; twice the gradients from it on 80, 60, 60:
    #         cuts 80, 100, 136; the optimizer step 2 G = 80.
    assert _peak(_table()) == 120 + 136
    assert _peak(_table(d_gt_1=False)) == 120 + 127  # one data group: no all-reduce
    assert _peak(_table(out1=20.0)) == 120 + 30 + 20 + 40 + 20 + 8 + 40  # the forward peak at the pool: 158
    # the same for every strategy here, and relaxed: a mix of equal rows is the same
    assert _peak(_table(), strategy=3) == 256
    assert float(scheduled_memory_per_device(_table(), jnp.full((3, S), 1.0 / S))) == pytest.approx(256, rel=1e-6)


def test_a_transient_outside_a_convolution_stands_with_the_activations_up_to_its_layer():
    # The pool's workspace 68 (W = 60 without its iotas 8). At each layer's step: copies and
    # activations up to it 40, 76, 118 and W 5, 60, 9: 45, 136, 127. The backward pass's start holds
    # every activation with the convolutions' largest transient: C 30 + A 72 + Z 16 + max(5, 9) = 127.
    # Forward 126, no all-reduce (one data group), the optimizer step 80: the pool's step, 136.
    t = _table(d_gt_1=False)
    t = t._replace(workspace_bytes=t.workspace_bytes.at[1].set(68.0))
    assert _peak(t) == 120 + 136
    # the same transient on a convolution stands with every activation: 30 + 72 + 16 + 60
    conv = t._replace(xla_cpu=t.xla_cpu._replace(convolution=jnp.ones(3)))
    assert _peak(conv) == 120 + 178


def test_a_copy_kept_after_its_layers_backward_step_joins_the_later_steps_and_the_reduction():
    # conv2's copy P = 50 from after its step (it runs first in the backward pass). At each
    # layer's step: copies and activations up to it 40, 76, 118, P of the layers after it 50, 50, 0,
    # W 5, 7, 9: 95, 133, 127; the pass's start 127: backward 133. The reduction's cuts gain P from
    # conv2 on: 80 + 50, 100 + 50, 136 + 50.
    assert _peak(_table(late=50.0)) == 120 + 186
    assert _peak(_table(late=50.0, d_gt_1=False)) == 120 + 133  # at the pool's step, above the pass's start
    assert _peak(_table(late=50.0, d_gt_1=False)) > _peak(_table(d_gt_1=False))


def test_a_zero2_plans_gradients_are_made_whole_and_reduced_to_their_shards():
    """ZeRO stage 2 on every layer (group of 4) where the backward pass
    makes whole gradients (a strategy that all-reduces them, or a recomputed
    run): the state holds a quarter of each gradient; the backward pass makes
    them whole and reduces them to the quarters, which the optimizer step
    reads."""
    G = np.asarray([10.0, 0.0, 30.0])
    # per lever (stages 0-3): state = weights + held gradients + 2 slots + update
    state = [5 * G, 5 * G, G + G / 4 + 2 * G / 4 + G / 4, G / 4 + G / 4 + 2 * G / 4 + G / 4]
    update = [G, G / 4, G / 4, G / 4]
    held = [G, G, G / 4, G / 4]
    t = _lever_table("zero", state_bytes=state, update_bytes=update, held_gradient_bytes=held)
    zero2 = one_hot(np.full(3, 2), S * 4)  # strategy 0 at stage 2
    # args = state - update - held = weights + slots = 1.5 G = 15 + 0 + 45 = 60. The reduction holds
    # the whole gradients and their shards: before each layer C + A + Z = 0, 40, 76, then G + H from it
    # on 50, 37.5, 37.5: cuts 50, 77.5, 113.5; the optimizer step H + U = 10 + 10; forward 126
    # (as without levers): the backward pass's start binds, 127
    assert float(scheduled_memory_per_device(t, zero2)) == 60 + 127
    assert float(scheduled_memory_per_device(t, one_hot(np.zeros(3, int), S * 4))) == 120 + 136  # stage 0
    # the solvers' memory credits the sharded gradients to the backward pass: it is lower
    assert float(memory_per_device(t, zero2)) < 60 + 136


def test_a_tied_zero2_layer_makes_its_shard_and_no_kernel_copy():
    """As above, but each device reduce-scatters its own gradient at the
    layer's backward step and the export's ties leave no kernel copy: the
    whole gradient is a transient of that step (``scattered_gradient_bytes``),
    the shard what the reduction keeps (``gradient_bytes``), and no copy
    (``kernel_copy_bytes`` 0) at stages 2 and 3."""
    G = np.asarray([10.0, 0.0, 30.0])
    copy = np.asarray([0.0, 0.0, 30.0])
    t = _lever_table("zero", state_bytes=[5 * G, 5 * G, 2 * G, 1.25 * G], update_bytes=[G, G / 4, G / 4, G / 4],
                     held_gradient_bytes=[G, G, G / 4, G / 4], gradient_bytes=[G, G, G / 4, G / 4],
                     kernel_copy_bytes=[copy, copy, 0 * copy, 0 * copy],
                     scattered_gradient_bytes=[0 * G, 0 * G, G, G])
    # args 1.5 G = 60. forward = C 0 + S 20 + at the pool (made 40 + 20, iotas 8, 2 x out 8) = 96;
    # backward = C 0 + A 72 + Z 16 + max (W + R) = max(5 + 10, 7, 9 + 30) = 39: 127; reduce: before each
    # layer 0, 40, 76, then G/4 + G/4 from it on 20, 15, 15: cuts 20, 55, 91; the optimizer step 10 + 10
    assert float(scheduled_memory_per_device(t, one_hot(np.full(3, 2), S * 4))) == 60 + 127
    # without the transient the backward pass's start would be 97, and the peak 157
    no_transient = t._replace(xla_cpu=t.xla_cpu._replace(scattered_gradient_bytes=0 * t.xla_cpu.gradient_bytes))
    assert float(scheduled_memory_per_device(no_transient, one_hot(np.full(3, 2), S * 4))) == 60 + 97


def test_a_recomputed_run_keeps_its_input_and_comes_back_at_its_backward_step():
    """The pool (layer 1) recomputes and conv2 joins its run (menu ``remat``:
    keep, remat, remat+join): the run keeps the pool's input (10) and, conv2's
    input being inside the run, not conv2's (4); conv2's backward step holds
    the pool's recomputed activations (20) beside its own."""
    keep = (40.0, 20.0, 12.0)
    t = _lever_table(
        "remat",
        activation_bytes=[keep, (40.0, 10.0, 4.0), (40.0, 10.0, 4.0)],  # a recomputing layer keeps its input
        workspace_bytes=[(5.0, 15.0, 9.0), (5.0, 35.0, 21.0), (5.0, 35.0, 21.0)],  # ... and recomputes at its step
        recompute_bytes=[(0.0,) * 3, keep, keep], checkpoint_bytes=[(0.0,) * 3, (40.0, 10.0, 4.0), (40.0, 10.0, 4.0)],
    )
    plan = one_hot(np.asarray([0, 1, 2]), S * 3)  # keep, remat, remat+join
    # A = 40 + 10 + 4 less the joined input 4 = 50; W = 5, 35 - 8 iotas, 21 + the run's 20 = 41:
    # backward = C 30 + 50 + Z 16 + 41 = 137; forward = 30 + 20 + (40 + 10) + 8 + 0 + 2 x 4 = 116;
    # reduce: before each layer C + A + Z = 0, 40, 66, cuts 80, 100, 126; args 3 G = 120
    assert float(scheduled_memory_per_device(t, plan)) == 120 + 137


def test_a_cpu_tables_zero_buffers_follow_the_export():
    """A real ``cpu`` table (the tiny CNN on 4x2, every lever): a ZeRO-2/3
    option's state holds its whole gradients over its replica group (8
    devices under ``data``, the 4 of the data axis under ``filter`` and
    ``channel``), the other options hold them whole; outside a recomputed
    run the backward pass makes a ZeRO-2/3 conv's or dense layer's shard
    under ``data`` and ``filter`` (each device reduce-scatters its own) and
    the whole gradient under ``channel`` (an all-reduce); the whole gradient
    is then a transient of the layer's step, and such a convolution has no
    kernel copy, such a dense layer copies its whole gradient at the step
    and keeps a copy after it; in a recomputed run all are as without ZeRO
    (planner.runtime.calls.zero_call, planner.runtime.runs). A dense kernel
    has no copy at the step's start."""
    from builders import TINY_CNN_BATCH, tiny_cnn

    from costmodels import CostSettings, cost_table, hardware_arrays, load_hardware, option_index
    from costmodels.layers import LayerKind
    from costmodels.levers import Lever
    from costmodels.strategies import Strategy
    from planner import extract

    model, x = tiny_cnn()
    graph = extract(model, x)
    hw = load_hardware("dgx-a100")
    t = cost_table(graph.arrays, hardware_arrays(hw, "float32"), float(TINY_CNN_BATCH), 4.0, 2.0,
                   CostSettings(levers="all", platform="cpu"))
    menu = lever_menu("all")
    kind, params = np.asarray(graph.arrays.kind), np.asarray(graph.arrays.params)
    weighted = np.isin(kind, [LayerKind.CONV, LayerKind.DENSE]) & (params > 0)
    conv = (kind == LayerKind.CONV) & (params > 0)
    dense = (kind == LayerKind.DENSE) & (params > 0)
    assert conv.sum() >= 2 and dense.sum() >= 1
    xb = t.xla_cpu
    G, held, C, R, P = (np.asarray(v) for v in (xb.gradient_bytes, xb.held_gradient_bytes, xb.kernel_copy_bytes,
                                                xb.scattered_gradient_bytes, xb.late_copy_bytes))
    assert not C[dense].any()
    for s, group in ((Strategy.DATA, 8.0), (Strategy.FILTER, 4.0), (Strategy.CHANNEL, 4.0)):
        whole, copy = G[:, option_index(s, Lever(0, False), menu)], C[:, option_index(s, Lever(0, False), menu)]
        assert whole[weighted].min() > 0 and copy.sum() > 0
        for stage in range(4):
            for remat in (False, True):
                o = option_index(s, Lever(stage, remat), menu)
                np.testing.assert_allclose(held[:, o], whole / (group if stage >= 2 else 1.0), rtol=1e-6)
                local = stage >= 2 and not remat and s != Strategy.CHANNEL
                np.testing.assert_allclose(G[:, o], np.where(weighted & local, held[:, o], whole), rtol=1e-6)
                np.testing.assert_allclose(C[:, o], np.where(conv & local, 0.0, copy), rtol=1e-6)
                np.testing.assert_allclose(R[:, o], np.where(conv & local, whole, 0.0)
                                           + np.where(dense & local, 2.0 * whole, 0.0), rtol=1e-6)
                np.testing.assert_allclose(P[:, o], np.where(dense & local, whole, 0.0), rtol=1e-6)


def test_a_replicated_output_its_reader_slices_is_kept_whole():
    """On 4x2 a layer whose output is replicated over the model axis and read
    by a layer that keeps its input keeps its whole output (the batch over
    the data axis' 4 devices), as its activation on ``cpu``; on 8x1, with
    no model axis, nothing is added. Oracle: the ``cpu`` table less the
    ``gpu`` one (XLA:CPU's own buffers), against the layer's output
    elements times the samples per data group, 4 bytes each."""
    from builders import TINY_CNN_BATCH, tiny_cnn

    from costmodels import CostSettings, cost_table, hardware_arrays, load_hardware
    from costmodels.layers import LayerKind
    from costmodels.strategies import Strategy
    from planner import extract

    model, x = tiny_cnn()
    g = extract(model, x)
    a = g.arrays
    hw = hardware_arrays(load_hardware("dgx-a100"), "float32")
    n = g.num_layers
    kind, saved = np.asarray(a.kind)[:n], np.asarray(a.saved_elements)[:n]
    src, dst = np.asarray(a.edge_src).astype(int), np.asarray(a.edge_dst).astype(int)
    real = np.asarray(a.edge_mask) > 0
    read_by_saver = np.zeros(n, bool)
    for u, v in zip(src[real], dst[real], strict=True):
        read_by_saver[u] |= saved[v] > 0
    pools = kind == LayerKind.POOL  # their index matrices differ too
    assert read_by_saver[~pools].sum() >= 3 and (~read_by_saver[~pools]).sum() >= 1
    for d, m in ((4.0, 2.0), (8.0, 1.0)):
        extra = {}
        for platform in ("cpu", "gpu"):
            t = cost_table(a, hw, float(TINY_CNN_BATCH), d, m, CostSettings(platform=platform))
            extra[platform] = np.asarray(t.activation_bytes)[:n]
        added = (extra["cpu"] - extra["gpu"])[~pools]
        whole = 4.0 * np.asarray(a.out_elements)[:n] * TINY_CNN_BATCH / d
        expected = np.where(read_by_saver & (m > 1), whole, 0.0)[~pools]
        np.testing.assert_allclose(added[:, Strategy.REPLICATED], expected, rtol=1e-6)
        for s in (Strategy.DATA, Strategy.FILTER, Strategy.SPATIAL):  # outputs split over the model axis
            np.testing.assert_allclose(added[:, s], 0.0, atol=1e-3)


def test_a_channel_dense_layers_gathered_output_gradient_is_held_three_times():
    """On 2x4 a ``channel`` dense layer's backward step holds its output
    gradient, gathered over the model axis, in two more layouts on ``cpu``
    (the operand layouts of the products for its input and weight
    gradients); no other dense strategy, and nothing on 8x1. Oracle: the
    ``cpu`` table's workspace less the ``gpu`` one, against twice the
    layer's output elements times the samples per data group, 4 bytes each."""
    from builders import TINY_CNN_BATCH, tiny_cnn

    from costmodels import CostSettings, cost_table, hardware_arrays, load_hardware
    from costmodels.layers import LayerKind
    from costmodels.strategies import Strategy
    from planner import extract

    model, x = tiny_cnn()
    g = extract(model, x)
    a = g.arrays
    hw = hardware_arrays(load_hardware("dgx-a100"), "float32")
    n = g.num_layers
    dense = np.asarray(a.kind)[:n] == LayerKind.DENSE
    assert dense.sum() >= 2
    for d, m in ((2.0, 4.0), (8.0, 1.0)):
        extra = {}
        for platform in ("cpu", "gpu"):
            t = cost_table(a, hw, float(TINY_CNN_BATCH), d, m, CostSettings(platform=platform))
            extra[platform] = np.asarray(t.workspace_bytes)[:n][dense]
        added = extra["cpu"] - extra["gpu"]
        twice = 2 * 4.0 * np.asarray(a.out_elements)[:n][dense] * TINY_CNN_BATCH / d
        np.testing.assert_allclose(added[:, Strategy.CHANNEL], twice if m > 1 else 0.0, rtol=1e-6)
        for s in (Strategy.DATA, Strategy.FILTER, Strategy.REPLICATED):
            np.testing.assert_allclose(added[:, s], 0.0, atol=1e-3)


def _sol(choice, memory, limit, feasible=True, time_s=1.0):
    return Solution(choice=tuple(choice), time_s=time_s, memory_bytes=memory, memory_limit_bytes=limit,
                    feasible=feasible, min_memory_bytes=0.0, method="stub", seed=0, lower_bound_s=None,
                    optimality_gap=None, seconds=0.0)


def test_fit_schedule_searches_again_below_the_excess():
    t = _table()  # every plan's schedule peaks at 256 here (strategies alike)
    asked = []

    def solve(table, budget):
        asked.append(budget)
        return _sol([0, 0, 0], 200.0, budget)

    ok = fit_schedule([t], [_sol([0, 0, 0], 200.0, 300.0)], 300.0, solve)[0]
    assert (ok.feasible, ok.memory_bytes, asked) == (True, 256.0, [])  # fits: reported at its schedule's peak
    events = []
    out = fit_schedule([t], [_sol([0, 0, 0], 200.0, 250.0)], 250.0, solve, events.append)[0]
    # 6 bytes over: searched again 6 below the lower of the plan's solvers' memory and its budget
    assert asked == [194.0, 188.0, 182.0, 176.0][:SCHEDULE_RETRIES]
    assert [(e.stage, e.table) for e in events] == [("schedule", 0)] * SCHEDULE_RETRIES
    assert "256 B, 6 B over the budget; searching again within 194 B" in events[0].message
    # then the table's least-memory plan is tried: its schedule too needs 256
    assert (out.feasible, out.memory_bytes, out.memory_limit_bytes) == (False, 256.0, 250.0)
    # ... and is what the mesh reports, as every plan that does not fit: the least-memory plan and its memory
    smallest = minimum_memory(discrete_problem(t))
    assert out.choice == tuple(smallest.choice) and out.min_memory_bytes == smallest.memory_bytes < 256.0
    # a mesh the search found nothing on stays so, unsearched
    none = fit_schedule([t], [_sol([0, 0, 0], 400.0, 250.0, feasible=False)], 250.0, solve)[0]
    assert not none.feasible and len(asked) == SCHEDULE_RETRIES


def test_fit_schedule_leaves_other_tables_alone():
    t = _table()._replace(xla_cpu=None)  # a gpu table: the solvers' memory is the plan's
    sol = _sol([0, 0, 0], 200.0, 250.0)
    assert fit_schedule([t], [sol], 250.0, lambda *_: pytest.fail("searched again"))[0] == sol


def test_fit_schedules_smallest_plan_is_searched_longer_where_the_first_search_settles_nothing(monkeypatch):
    """Where the table's least-memory plan is taken and the first search
    (within AUTO_MILP_TIME_LIMIT_S) finds no plan within the budget and
    proves none, it searches again with SMALLEST_RETRY_TIME_LIMIT_S, as
    search.solve does; the longer search's plan is the one reported. The
    first search is a stub (a plan above the budget, unproven); the longer
    one is the real smallest memory (minimum_memory, the oracle)."""
    import planner.schedule_fit as fit_module
    import search.solver as solver_module

    t = _table()  # every plan's schedule peaks at 256 here
    smallest = minimum_memory(discrete_problem(t))
    asked = []

    def first(p, time_limit_s=None):
        asked.append(time_limit_s)
        return smallest._replace(memory_bytes=1e9, exact=False)

    def longer(p, time_limit_s=None):
        asked.append(time_limit_s)
        return minimum_memory(p)

    monkeypatch.setattr(fit_module, "smallest_memory", first)
    monkeypatch.setattr(solver_module, "smallest_memory", longer)
    out = fit_schedule([t], [_sol([0, 0, 0], 200.0, 250.0)], 250.0, lambda table, budget: _sol([0, 0, 0], 200.0,
                                                                                                 budget))[0]
    assert asked == [solver_module.AUTO_MILP_TIME_LIMIT_S, solver_module.SMALLEST_RETRY_TIME_LIMIT_S]
    assert out.min_memory_bytes == smallest.memory_bytes and out.memory_bytes == 256.0 and not out.feasible
    # a first search whose plan fits the budget (or is proven) is not searched again
    asked.clear()
    monkeypatch.setattr(fit_module, "smallest_memory", lambda p, time_limit_s=None: asked.append(time_limit_s)
                        or smallest._replace(exact=False))
    fit_schedule([t], [_sol([0, 0, 0], 200.0, 250.0)], 250.0, lambda table, budget: _sol([0, 0, 0], 200.0, budget))
    assert asked == [solver_module.AUTO_MILP_TIME_LIMIT_S]
