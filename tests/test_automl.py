"""AutoML embedding: parametric graphs against GraphBuilder, the plan DP
against brute force and the exact search, cost_fn's limits and gradients,
plan_many against planner.plan one configuration at a time."""

from __future__ import annotations

import dataclasses
import contextlib
import importlib.util
import io
import math
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from builders import synthetic_table

from costmodels import (
    CostSettings,
    cost_table,
    hardware_arrays,
    load_hardware,
)
from planner.automl import PlanConfig, cost_fn, plan_many
from planner.automl.batch import _batch_tables, _plan_batch
from planner.automl.parametric import ArchParams, parametric_graph, total_forward_flops
from planner.automl.templates import resnet_parametric, resnet_template
from planner.ir.builder import GraphBuilder
from planner.ir.graph import LayerArrays
from planner.models.zoo import get_model
from planner.planning import plan
from search import discrete_problem, plan_time, solve_brute, solve_dp
from search.elimination import (
    INFEASIBLE_S,
    best_plan,
    best_plans,
    dp_schedule,
    frontier_size,
    pad_schedule,
    soft_min_time,
)
from search.problem import plan_times

ROOT = Path(__file__).resolve().parents[1]
S = 5
TINY = {"depths": (1, 1, 1, 1), "widths": (8, 16, 32, 64), "resolution": 32, "num_classes": 10}


def tiny(widths=TINY["widths"], resolution=TINY["resolution"], name="tiny"):
    return resnet_template(TINY["depths"], widths, resolution=resolution, num_classes=10, name=name)


def assert_arrays_equal(ref: LayerArrays, got: LayerArrays, rtol=1e-6):
    for f in LayerArrays._fields:
        a = np.asarray(getattr(ref, f), np.float64)
        b = np.asarray(getattr(got, f), np.float64)
        np.testing.assert_allclose(b, a, rtol=rtol, atol=0, err_msg=f)


# -- parametric graphs ------------------------------------------------------------------------


def test_resnet_template_is_the_zoo_resnet50():
    assert resnet_template().fingerprint == get_model("resnet50").fingerprint


def test_parametric_arrays_equal_graph_builder_at_integer_widths_and_resolutions():
    pg = resnet_parametric(**TINY, channel_multiple=1)
    f = jax.jit(pg)
    cases = [((1, 1, 1, 1), 32), ((0.5, 1.5, 0.75, 2.0), 32), ((2.0, 0.5, 1.25, 0.25), 48), ((1, 1, 1, 1), 27)]
    for w, res in cases:
        widths = [round(b * x) for b, x in zip(TINY["widths"], w, strict=True)]
        ref = tiny(widths, res)
        got = f(ArchParams(jnp.asarray(w, jnp.float32), jnp.float32(res / 32), jnp.float32(64)))
        assert_arrays_equal(ref.arrays, got)


def test_parametric_resnet50_at_other_widths_and_resolution():
    pg = resnet_parametric()
    got = jax.jit(pg)(ArchParams(jnp.asarray([0.5, 1.5, 0.75, 1.25]), jnp.float32(160 / 224), jnp.float32(1)))
    assert_arrays_equal(resnet_template(widths=(32, 192, 192, 640), resolution=160).arrays, got)


def test_rounded_channels_are_multiples_and_match_the_builder():
    pg = resnet_parametric(**TINY, channel_multiple=8)
    got = jax.jit(lambda p: pg(p, rounded=True))(ArchParams(jnp.asarray([1.3, 0.9, 1.12, 0.2]), jnp.float32(1.0),
                                                            jnp.float32(1)))
    # 8*1.3=10.4 -> 8; 16*0.9=14.4 -> 16; 32*1.12=35.8 -> 32; 64*0.2=12.8 -> 16
    assert_arrays_equal(tiny((8, 16, 32, 16)).arrays, got)


def test_parametric_graph_on_a_chain_with_flatten_and_groups_by_function():
    b = GraphBuilder("chain", (3, 20, 20))
    x = b.conv("c1", b.input, 6, 3, padding="VALID")
    x = b.relu("r1", x)
    x = b.avg_pool("p1", x, 2)
    x = b.conv("c2", x, 10, 3, stride=2, padding=((1, 0), (1, 0)))
    x = b.flatten("flat", x)
    b.dense("fc", x, 7)
    t = b.build()
    pg = parametric_graph(t, lambda name: {"c1": 0, "c2": 1}.get(name))
    got = jax.jit(pg)(ArchParams(jnp.asarray([2.0, 0.5]), jnp.float32(1.5), jnp.float32(1)))
    b2 = GraphBuilder("chain", (3, 30, 30))
    x = b2.conv("c1", b2.input, 12, 3, padding="VALID")
    x = b2.relu("r1", x)
    x = b2.avg_pool("p1", x, 2)
    x = b2.conv("c2", x, 5, 3, stride=2, padding=((1, 0), (1, 0)))
    x = b2.flatten("flat", x)
    b2.dense("fc", x, 7)
    assert_arrays_equal(b2.build().arrays, got)


def test_parametric_graph_rejects_bad_groups():
    with pytest.raises(ValueError, match="no conv or dense layer matches"):
        parametric_graph(tiny(), {"nothing/": 0})
    with pytest.raises(ValueError, match="without gaps"):
        parametric_graph(tiny(), {"layer1/": 0, "layer3/": 2})
    pg = resnet_parametric(**TINY)
    with pytest.raises(ValueError, match="4 width groups"):
        pg(ArchParams(jnp.ones(3), jnp.float32(1), jnp.float32(1)))


# -- the plan DP -------------------------------------------------------------------------------


def graph_like(n: int, edges):
    e = np.asarray(edges, float).reshape(-1, 2)
    return SimpleNamespace(num_layers=n, model_name="random", edges=tuple((int(u), int(v)) for u, v in e))


def random_edges(n: int, seed: int):
    """A chain plus random skip edges of length 2 or 3 (frontier <= 4)."""
    rng = np.random.default_rng(seed)
    edges = [(i, i + 1) for i in range(n - 1)]
    edges += [(i, i + k) for k in (2, 3) for i in range(n - k) if rng.random() < 0.3]
    return edges


@pytest.mark.parametrize("seed", range(5))
def test_hard_dp_is_the_brute_force_optimum(seed):
    n = 8 if seed else 1  # seed 0: one layer, no edge (no carried axis)
    edges = random_edges(n, seed)
    t = synthetic_table(seed, n, edges, layers=16, edge_rows=32)
    g = graph_like(n, edges)
    if frontier_size(g) > 4:
        pytest.skip("frontier too wide")
    value, choice = jax.jit(best_plan)(t, dp_schedule(g))
    p = discrete_problem(t)
    brute = solve_brute(p)
    np.testing.assert_allclose(float(value), brute.time_s, rtol=1e-6)
    np.testing.assert_allclose(plan_time(p, np.asarray(choice)[:n]), brute.time_s, rtol=1e-6)


def test_lanes_with_a_padded_schedule_are_each_the_brute_force_optimum():
    # three tables of one structure as lanes, the schedule widened by an axis, an
    # input column and 5 events (dummies, padding events): each lane is its own optimum
    n = 7
    edges = random_edges(n, 11)
    g = graph_like(n, edges)
    sched = dp_schedule(g)
    k, inputs, steps = len(sched.slots), sched.in_edge.shape[1], sched.layer.shape[0]
    tables = [synthetic_table(seed, n, edges, layers=16, edge_rows=32) for seed in (20, 21, 22)]
    lt = jnp.stack([jnp.where(t.feasible, t.layer_time_s, INFEASIBLE_S) for t in tables], axis=-1)
    reshard = jnp.stack([t.reshard_s for t in tables], axis=-1)
    value, choice = jax.jit(best_plans)(lt, reshard, pad_schedule(sched, k + 1, inputs + 1, steps + 5))
    for b, t in enumerate(tables):
        p = discrete_problem(t)
        brute = solve_brute(p)
        np.testing.assert_allclose(float(value[b]), brute.time_s, rtol=1e-6)
        np.testing.assert_allclose(plan_time(p, np.asarray(choice)[:n, b]), brute.time_s, rtol=1e-6)


def test_soft_min_and_its_gradient_are_the_gibbs_sum_over_all_plans():
    # enumerate all 5^6 plans: F = -tau log sum exp(-time / tau), dF/dcompute = marginals
    n = 6
    edges = random_edges(n, 3)
    t = synthetic_table(3, n, edges, layers=16, edge_rows=32)
    p = discrete_problem(t)
    plans = np.stack(np.meshgrid(*[np.arange(S)] * n, indexing="ij"), axis=-1).reshape(-1, n)
    times = plan_times(p, plans)  # inf where a layer is infeasible
    tau = 2e-3  # comparable to the spread of plan times: many plans carry weight
    z = -(times - times.min()) / tau
    w = np.exp(z)
    ref = times.min() - tau * np.log(w.sum())
    marg = np.stack([np.bincount(plans[:, i], weights=w, minlength=S) for i in range(n)]) / w.sum()  # [n, S]
    sched = dp_schedule(graph_like(n, edges))
    f = lambda c: soft_min_time(t._replace(compute_s=c), sched, tau)
    value, grad = jax.jit(jax.value_and_grad(f))(t.compute_s)
    np.testing.assert_allclose(float(value), ref, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(grad)[:n], marg, atol=2e-4)
    assert 0.05 < marg.max(axis=1).min() < 0.95  # the test is not the hard minimum in disguise


def test_soft_min_tends_to_the_dp_optimum_on_a_chain():
    hw = load_hardware("abci-v100")
    g = get_model("vgg16-cifar10")
    t = cost_table(g.arrays, hardware_arrays(hw), 256.0, 2.0, 4.0, CostSettings())
    exact = solve_dp(discrete_problem(t), 1e30).time_s
    sched = dp_schedule(g)
    assert len(sched.slots) == 2  # a chain needs two slots
    f = jax.jit(soft_min_time)
    n = g.num_layers
    gaps = []
    for tau in (1e-3, 1e-4, 1e-5, 1e-6):
        v = float(f(t, sched, tau))
        # opt - tau n log S <= F <= opt (at most S^n plans, one of them optimal)
        assert exact - tau * n * math.log(S) - 1e-6 * exact <= v <= exact * (1 + 1e-6)
        gaps.append(exact - v)
    assert gaps == sorted(gaps, reverse=True) and gaps[-1] <= 1e-3 * exact  # gap ~ tau log(#optimal plans)


def test_dp_refuses_too_wide_graphs():
    b = GraphBuilder("wide", (4, 8, 8))
    branches = [b.conv(f"c{i}", b.input, 4, 1) for i in range(6)]
    b.concat("cat", branches)
    with pytest.raises(ValueError, match="slots"):
        dp_schedule(b.build())


# -- cost_fn -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_cost():
    pg = resnet_parametric(**TINY, channel_multiple=8)
    return pg, cost_fn(pg, "dgx-a100", 8, temperature=0.05)


def params(w=(1.0, 1.0, 1.0, 1.0), res=1.0, batch=256.0):
    return ArchParams(jnp.asarray(w, jnp.float32), jnp.float32(res), jnp.float32(batch))


@pytest.fixture(scope="module")
def tiny_jacobian(tiny_cost):
    """The jitted Jacobian of (time, memory) in the stage widths, the batch traced:
    one compile serves every test and batch."""
    _, cf = tiny_cost

    def f(w, batch=256.0):
        c = cf(params(w, batch=batch))
        return c.time_s, c.memory_bytes_per_device

    return jax.jit(jax.jacrev(f))


@pytest.mark.slow
def test_cost_fn_exact_value_is_the_exact_plan_and_tends_to_it(tiny_cost):
    pg, cf = tiny_cost
    out = cf(params())
    ref = plan_many([PlanConfig(tiny(), 8, "dgx-a100", batch=256)], fallback=False)
    assert ref.certified[0]
    np.testing.assert_allclose(float(out.exact_time_s), ref.iteration_s[0], rtol=1e-6)
    assert cf.meshes[int(out.exact_mesh)] == tuple(ref.mesh[0]) and bool(out.exact_certified)
    # cold, the relaxation tends to the exact optimum of the same hardware without GEMM tile padding
    # (cost_fn's relaxation pads no tile: a step function of the widths), here at whole channel counts
    hw = load_hardware("dgx-a100")
    untiled = dataclasses.replace(hw, device=dataclasses.replace(
        hw.device, kernel=dataclasses.replace(hw.device.kernel, channel_tile=1.0, reduction_tile=1.0)))
    ref_untiled = plan_many([PlanConfig(tiny(), 8, untiled, batch=256)], fallback=False)
    cold = cost_fn(pg, "dgx-a100", 8, temperature=1e-4)(params())
    np.testing.assert_allclose(float(cold.time_s), ref_untiled.iteration_s[0], rtol=2e-3)
    np.testing.assert_allclose(float(cold.memory_bytes_per_device), float(out.exact_memory_bytes_per_device),
                               rtol=2e-2)
    np.testing.assert_allclose(float(jnp.sum(out.mesh_weights)), 1.0, rtol=1e-5)


@pytest.mark.slow
def test_cost_fn_gradients_match_finite_differences(tiny_cost, tiny_jacobian):
    _, cf = tiny_cost
    w0 = jnp.asarray([1.1, 0.9, 1.05, 0.95], jnp.float32)
    v = jnp.asarray([0.3, -0.2, 0.5, 0.1], jnp.float32)

    def f(w, batch=256.0):
        c = cf(params(w, batch=batch))
        return c.time_s, c.memory_bytes_per_device

    jac = tiny_jacobian  # the batch traced: one compile for both batches
    (gt, gm) = jac(w0, 256.0)
    # batch 260: the 8x1 mesh cannot split it (whole samples per device): weight 0, finite gradients
    assert float(cf(params(w0, batch=260.0)).mesh_weights[0]) == 0.0
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jac(w0, 260.0))
    h = 2e-3
    (tp, mp), (tm, mm) = f(w0 + h * v), f(w0 - h * v)
    np.testing.assert_allclose(float(jnp.dot(gt, v)), (float(tp) - float(tm)) / (2 * h), rtol=3e-2)
    np.testing.assert_allclose(float(jnp.dot(gm, v)), (float(mp) - float(mm)) / (2 * h), rtol=3e-2)
    assert float(jnp.dot(gt, v)) > 0  # wider stages, slower iterations


def test_cost_fn_rejects_bad_arguments():
    pg = resnet_parametric(**TINY)
    with pytest.raises(ValueError, match="ParametricGraph"):
        cost_fn(tiny(), "dgx-a100", 8)
    with pytest.raises(ValueError, match="temperature"):
        cost_fn(pg, "dgx-a100", 8, temperature=0.0)
    with pytest.raises(ValueError, match="devices"):
        cost_fn(pg, "dgx-a100", 0)


@pytest.mark.parametrize("w, res, batch, phrase", [
    ((1.0, -0.5, 1.0, 1.0), 1.0, 256.0, "width multipliers must be positive"),
    ((1.0, 0.0, 1.0, 1.0), 1.0, 256.0, "width multipliers must be positive"),
    ((1.0, 1.0, 1.0, 1.0), -1.0, 256.0, "resolution multiplier must be positive"),
    ((1.0, 1.0, 1.0, 1.0), 1.0, 0.2, "at least 1 sample"),
    ((1.0, float("nan"), 1.0, 1.0), 1.0, 256.0, "finite"),
])
def test_cost_fn_refuses_architectures_it_cannot_plan(tiny_cost, w, res, batch, phrase):
    _, cf = tiny_cost
    with pytest.raises(ValueError, match=phrase):
        cf(params(w, res, batch))


def test_cost_fn_refuses_a_batch_no_mesh_can_split():
    # 16 devices in nodes of 8: the data axis is 2, 4, 8 or 16, so batch 7 splits on no mesh
    pg = resnet_parametric(**TINY, channel_multiple=8)
    cf = cost_fn(pg, "dgx-a100", 16)
    assert sorted(d for d, _ in cf.meshes) == [2, 4, 8, 16]
    with pytest.raises(ValueError, match=r"no mesh can split batch 7 .*data axes \[2, 4, 8, 16\].*multiple of 2"):
        cf(params(batch=7.0))


@pytest.mark.slow
def test_cost_fn_traced_bad_architecture_is_nan_not_zero(tiny_cost, tiny_jacobian):
    """Under jit or grad the values are unknown until run time: every number
    of an unplannable architecture is NaN (its gradient too), never 0."""
    _, cf = tiny_cost
    f = jax.jit(lambda p: cf(p))
    good, bad = f(params()), f(params((1.0, -0.5, 1.0, 1.0)))
    assert bool(good.valid) and np.isfinite(float(good.time_s)) and float(good.time_s) > 0
    assert not bool(bad.valid) and not bool(bad.exact_fits) and int(bad.exact_mesh) == -1
    for x in (bad.time_s, bad.memory_bytes_per_device, bad.objective_s, bad.exact_time_s):
        assert np.isnan(float(x))
    g, _ = tiny_jacobian(jnp.ones(4, jnp.float32), 0.2)  # the time's gradient, under jit
    assert bool(jnp.all(jnp.isnan(g)))
    g_ok, _ = tiny_jacobian(jnp.ones(4, jnp.float32), 256.0)
    assert bool(jnp.all(jnp.isfinite(g_ok))) and float(jnp.sum(jnp.abs(g_ok))) > 0


def test_total_forward_flops_is_the_graph_total():
    t = tiny()
    pg = resnet_parametric(**TINY)
    flops = jax.jit(lambda p: total_forward_flops(pg(p)))(params())
    np.testing.assert_allclose(float(flops), t.total("flops_fwd"), rtol=1e-6)


# -- plan_many -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_plan_many_equals_plan_one_by_one_and_compiles_once():
    # small models: plan() is exact on them (the DP on the chain, the MILP on the
    # 54-layer DAG), so the times must agree exactly; one has a binding limit.
    # plus a graph too wide for the DP (planned by plan())
    wide = GraphBuilder("wide", (4, 8, 8))
    x = wide.conv("stem", wide.input, 4, 1)
    for i in range(28):  # 36 layers: the bucket of the others, so plan() compiles nothing new
        x = wide.relu(f"r{i}", x)
    wide.concat("cat", [wide.conv(f"c{i}", x, 4, 1) for i in range(6)])
    configs = [
        PlanConfig(tiny(), 8, "dgx-a100"),
        PlanConfig("vgg16-cifar10", 16, "abci-v100"),
        PlanConfig(tiny((16, 16, 32, 32), name="tiny-b"), 16, "abci-v100", batch=64),
        PlanConfig("vgg16-cifar10", 8, "abci-v100", memory_limit="100MB", batch=64),
        PlanConfig(wide.build(), 8, "dgx-a100"),
    ]
    cache = lambda: (_batch_tables._cache_size(), _plan_batch._cache_size())
    before = cache()
    out = plan_many(configs)  # two graph structures, one compilation of each stage
    after = cache()
    assert all(a - b <= 1 for a, b in zip(after, before, strict=True))  # (0 if an earlier test compiled these)
    assert out.certified.tolist() == [True, True, True, False, False]
    assert out.fallback.tolist() == [False, False, False, True, True]
    for i, c in enumerate(configs):
        p = plan(c.model, devices=c.devices, hardware=c.hardware, memory_limit=c.memory_limit, batch=c.batch,
                 simplicity_tolerance=0.0)  # plan_many gives the fastest plan, not the simplest within 1%
        np.testing.assert_allclose(out.iteration_s[i], p.iteration_s, rtol=1e-6)
        assert tuple(out.mesh[i]) == p.mesh
        assert out.memory_bytes_per_device[i] <= out.memory_limit_bytes[i]
    # other models of the same buckets and the same padded batch: no new compilation
    again = plan_many([PlanConfig(tiny((8, 8, 8, 8), name=f"t{i}"), 8, "dgx-a100") for i in range(3)])
    assert cache() == after and again.certified.all()


@pytest.mark.slow
def test_plan_many_reports_uncertified_rows_without_fallback():
    out = plan_many([PlanConfig("vgg16-cifar10", 8, "abci-v100", memory_limit="100MB", batch=64)], fallback=False)
    assert not out.certified[0] and not out.feasible[0] and np.isnan(out.iteration_s[0])
    with pytest.raises(ValueError, match="at least one"):
        plan_many([])
    with pytest.raises(ValueError, match="chunk must be a positive integer"):
        plan_many([PlanConfig("vgg16-cifar10", 8)], chunk=0)


# -- examples ------------------------------------------------------------------------------------


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_width_search_example_runs():
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = _load(ROOT / "examples" / "automl_width_search.py").main(["--steps", "1", "--tiny"])
    text = buf.getvalue()
    assert rc == 0 and "chosen width multipliers" in text and "plan: mesh" in text


def test_optuna_example_skips_cleanly_without_optuna():
    if importlib.util.find_spec("optuna") is not None:
        pytest.skip("optuna is installed")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = _load(ROOT / "examples" / "automl_optuna.py").main(["--trials", "2", "--tiny"])
    assert rc == 0 and "optuna is not installed" in buf.getvalue()
