"""AutoML embedding: the cost of the best plan as a differentiable function
of architecture parameters (:func:`cost_fn`), and many configurations
planned in one compiled call (:func:`plan_many`).

Both rest on an exact dynamic programme over plans (:mod:`planner._plan_dp`,
variable elimination along the layer order; exact on any DAG whose
frontier has at most four layers: chains, ResNets) instead of the host-side
search of :func:`planner.plan`:

* ``cost_fn``: per mesh shape, the soft minimum over *all plans* of the
  iteration time, ``F = -tau log sum_plans exp(-time / tau)`` (tends to the
  optimum as ``tau -> 0``), and the memory of the Gibbs distribution over
  plans (:func:`costmodels.memory_per_device` at its per-layer marginals,
  ``dF / d layer_time``); then a soft minimum over mesh shapes of
  ``F (1 + penalty relu(memory / limit - 1))``. Beside it, the exact
  discrete optimum of the rounded architecture (hard minimum, plan by
  backtracking), not differentiated.
* ``plan_many``: the hard DP for every (configuration, mesh shape) in one
  jitted, vmapped call. When the fastest plan of the chosen mesh fits the
  memory limit and no mesh whose fastest plan does not fit is faster, that
  plan is the constrained optimum (a constrained minimum is never below the
  unconstrained one), certified in-graph; other configurations fall back to
  :func:`planner.plan`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from costmodels import (
    STRATEGY_NAMES,
    CostSettings,
    Hardware,
    cost_table,
    hardware_arrays,
    iteration_time,
    load_hardware,
    memory_per_device,
    one_hot,
)
from costmodels.strategies import NUM_STRATEGIES, strategy_mask
from planner._plan_dp import (
    DPSchedule,
    best_plan,
    dp_schedule,
    pad_schedule,
    soft_min_time,
)
from planner.evaluate import resolve_batch
from planner.graph import LayerGraph, bucket_size
from planner.parametric import ArchParams, ParametricGraph
from planner.planning import InfeasibleMemoryError, mesh_shapes, parse_memory_limit

__all__ = ["CostEstimate", "CostFunction", "PlanBatch", "PlanConfig", "cost_fn", "plan_many"]


def _hardware(hardware: str | Path | Hardware) -> Hardware:
    return hardware if isinstance(hardware, Hardware) else load_hardware(hardware)


# ---------------------------------------------------------------------------------------------
# cost_fn
# ---------------------------------------------------------------------------------------------


class CostEstimate(NamedTuple):
    """What a :class:`CostFunction` returns (``M`` mesh shapes, ``L`` layers)."""

    time_s: Any  # [] smoothed iteration time of the best plan (differentiable)
    memory_bytes_per_device: Any  # [] smoothed memory per device of that plan (differentiable)
    objective_s: Any  # [] soft-min over meshes of time * (1 + penalty * relu(memory / limit - 1))
    mesh_weights: Any  # [M] soft-min weight of each mesh shape
    exact_time_s: Any  # [] the rounded architecture's fastest plan on the exact mesh (not differentiated)
    exact_memory_bytes_per_device: Any  # [] its memory
    exact_mesh: Any  # [] int32 index into CostFunction.meshes
    exact_fits: Any  # [] bool: that plan fits the memory limit
    exact_certified: Any  # [] bool: it is the constrained optimum (see plan_many)
    exact_choice: Any  # [L] int32 strategy per layer of that plan


@dataclasses.dataclass(frozen=True, eq=False)
class CostFunction:
    """``f(ArchParams) -> CostEstimate``; jitted, differentiable, vmappable."""

    graph: ParametricGraph
    hardware: str
    devices: int
    meshes: tuple[tuple[int, int], ...]  # (d, m) of each mesh shape, in CostEstimate.mesh_weights order
    memory_limit_bytes: float
    temperature: float
    memory_penalty: float
    fn: Callable[[ArchParams], CostEstimate] = dataclasses.field(repr=False)

    def __call__(self, params: ArchParams) -> CostEstimate:
        return self.fn(params)


def _softmin_weights(x, tau):
    m = jax.lax.stop_gradient(jnp.min(x))
    z = jnp.exp(-(x - m) / tau)
    return z / jnp.sum(z), m - tau * jnp.log(jnp.sum(z))


def _expected_time(table, marginals, pair):
    """Expected iteration time under the Gibbs distribution over plans (layer
    marginals ``[L, S]``, edge pair marginals ``[E, S, S]``); overlap term as
    :func:`costmodels.iteration_time` at the layer marginals."""
    mask = table.layer_mask[:, None]
    layer = jnp.sum(marginals * jnp.where(table.feasible, table.layer_time_s, 0.0) * mask)
    grad = jnp.sum(marginals * table.grad_sync_s * mask)
    bwd = jnp.sum(marginals * table.backward_compute_s * mask)
    return layer + jnp.sum(pair * table.reshard_s) - table.gradient_overlap * jnp.minimum(grad, bwd)


@functools.partial(jax.jit, static_argnames=("graph", "settings"))
def _estimate(params: ArchParams, graph: ParametricGraph, hwa, sched: DPSchedule, meshes, limit, temperature,
              penalty, settings: CostSettings) -> CostEstimate:
    """One compilation per graph, settings and shapes: the hardware, the mesh
    list, the limit, the temperature and the penalty are traced."""
    arrays = graph(params)
    arrays_r = jax.lax.stop_gradient(graph(params, rounded=True))
    batch = jnp.asarray(params.batch, jnp.float32)
    batch_r = jnp.round(jax.lax.stop_gradient(batch))
    n_real = jnp.maximum(jnp.sum(arrays.mask), 1.0)

    def per_mesh(dm):
        d, m = dm[0], dm[1]
        ok = (batch_r >= d) & (jnp.mod(batch_r, d) == 0)
        t = cost_table(arrays, hwa, batch, d, m, settings)
        t = t._replace(feasible=strategy_mask(arrays_r, batch_r, d, m) & ok)
        fastest = jnp.where(t.feasible, t.layer_time_s, jnp.inf).min(axis=-1)
        scale = jax.lax.stop_gradient(jnp.sum(jnp.where(t.layer_mask > 0, fastest, 0.0)))
        scale = jnp.where(jnp.isfinite(scale) & (scale > 0), scale, 1.0)  # (a mesh that cannot run: any)
        tau = temperature * scale / n_real  # per-decision temperature
        soft = lambda c, r: soft_min_time(t._replace(compute_s=c, reshard_s=r), sched, tau)
        # d F / d cost = the Gibbs probabilities: per layer [L, S] and per edge [E, S, S]
        marginals, pair = jax.grad(soft, argnums=(0, 1))(t.compute_s, t.reshard_s)
        f_soft = _expected_time(t, marginals, pair)
        mem = memory_per_device(t, marginals)
        # exact: the rounded architecture, hard minimum and its plan
        tr = cost_table(arrays_r, hwa, batch_r, d, m, settings)
        tr = tr._replace(feasible=tr.feasible & ok)
        _, choice = best_plan(tr, sched)
        oh = one_hot(choice, NUM_STRATEGIES)
        return f_soft, mem, ok, iteration_time(tr, oh), memory_per_device(tr, oh), choice

    f, mem, ok, et, em, choice = jax.vmap(per_mesh)(meshes)
    big = jnp.float32(3e38)
    J = jnp.where(ok, f * (1.0 + penalty * jax.nn.relu(mem / limit - 1.0)), big)
    tau_m = temperature * jax.lax.stop_gradient(jnp.min(J))
    w, objective = _softmin_weights(J, tau_m)
    time_s = jnp.sum(jnp.where(ok, w * f, 0.0))
    memory = jnp.sum(jnp.where(ok, w * mem, 0.0))
    fits = ok & (em <= limit)
    pick = jnp.where(jnp.any(fits), jnp.argmin(jnp.where(fits, et, jnp.inf)), jnp.argmin(jnp.where(ok, et, jnp.inf)))
    idx = jnp.arange(et.shape[0])
    others_slower = jnp.all(~ok | fits | (et > et[pick]) | ((et == et[pick]) & (idx > pick)))
    certified = jnp.any(fits) & others_slower & (hwa.gradient_overlap == 0)
    return CostEstimate(time_s, memory, objective, w, et[pick], em[pick], pick.astype(jnp.int32), fits[pick],
                        certified, choice[pick])


def cost_fn(
    build_graph: ParametricGraph,
    hardware: str | Path | Hardware,
    devices: int,
    memory_limit: float | str | None = None,
    *,
    temperature: float = 0.01,
    memory_penalty: float = 10.0,
    dtype: str = "float32",
    optimizer: str = "adam",
    allow_cross_node_model_axis: bool = False,
) -> CostFunction:
    """A jit-compatible, differentiable function from :class:`ArchParams`
    (width multipliers, resolution multiplier, global batch) to the
    iteration time and memory per device under the best plan on ``devices``
    devices of ``hardware`` (every mesh shape with the model axis in one
    node), smoothed over the strategy menu and the mesh shapes at a relative
    ``temperature`` (per layer decision: ``temperature`` x the mean fastest
    layer time; between meshes: ``temperature`` x the best mesh's value), with
    the exact discrete optimum of the rounded architecture beside it."""
    if not isinstance(build_graph, ParametricGraph):
        raise ValueError("build_graph must be a ParametricGraph (planner.parametric_graph or planner.resnet_parametric)")
    if not (isinstance(devices, (int, np.integer)) and devices >= 1):
        raise ValueError(f"devices must be a positive integer, got {devices!r}")
    if not temperature > 0:
        raise ValueError(f"temperature must be positive, got {temperature!r}")
    if not memory_penalty >= 0:
        raise ValueError(f"memory_penalty must be non-negative, got {memory_penalty!r}")
    hw = _hardware(hardware)
    limit = hw.device.memory_bytes if memory_limit is None else parse_memory_limit(memory_limit)
    meshes = tuple(mesh_shapes(int(devices), int(devices), hw.devices_per_node, allow_cross_node_model_axis))
    sched = dp_schedule(build_graph.template)
    settings = CostSettings(dtype=dtype, optimizer=optimizer)
    hwa = hardware_arrays(hw, dtype)
    fn = functools.partial(
        _estimate, graph=build_graph, hwa=hwa, sched=jax.tree.map(jnp.asarray, sched),
        meshes=jnp.asarray(meshes, jnp.float32), limit=jnp.float32(limit), temperature=jnp.float32(temperature),
        penalty=jnp.float32(memory_penalty), settings=settings)
    return CostFunction(build_graph, hw.name, int(devices), meshes, limit, float(temperature), float(memory_penalty), fn)


# ---------------------------------------------------------------------------------------------
# plan_many
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PlanConfig:
    """One configuration to plan: the arguments of :func:`planner.plan`."""

    model: str | LayerGraph
    devices: int
    hardware: str | Path | Hardware = "abci-v100"
    memory_limit: float | int | str | None = None
    batch: int | None = None
    batch_per_device: int | None = None


@dataclasses.dataclass(frozen=True)
class PlanBatch:
    """The best plan of every configuration (``N`` rows, ``L`` the largest bucket)."""

    models: tuple[str, ...]
    layer_names: tuple[tuple[str, ...], ...]
    mesh: np.ndarray  # [N, 2] (d, m) of the chosen mesh
    batch: np.ndarray  # [N] global batch
    iteration_s: np.ndarray  # [N] predicted seconds per iteration (nan where nothing fits)
    memory_bytes_per_device: np.ndarray  # [N]
    memory_limit_bytes: np.ndarray  # [N]
    feasible: np.ndarray  # [N] bool: a plan fits the memory limit
    certified: np.ndarray  # [N] bool: the in-graph DP proved the plan optimal
    fallback: np.ndarray  # [N] bool: planned by planner.plan instead
    choice: np.ndarray  # [N, L] int strategy index per layer, -1 past the model's layers
    seconds: float  # wall time of the whole call

    def strategies(self, i: int) -> dict[str, str]:
        """Layer name -> strategy name of configuration ``i``."""
        return {n: STRATEGY_NAMES[int(s)] for n, s in zip(self.layer_names[i], self.choice[i], strict=False)}


@functools.partial(jax.jit, static_argnames=("settings", "chunk"))
def _plan_batch(arrays, hwa, sched, batch, meshes, settings: CostSettings, chunk: int):
    """Hard DP on every (configuration, mesh): ``[N, M]`` DP value, exact time
    and memory of the plan, and the plan ``[N, M, L]``."""

    def one(args):
        a, h, s, b, mesh = args

        def per_mesh(dm):
            t = cost_table(a, h, b, dm[0], dm[1], settings)
            value, choice = best_plan(t, s)
            oh = one_hot(choice, NUM_STRATEGIES)
            return value, iteration_time(t, oh), memory_per_device(t, oh), choice

        return jax.vmap(per_mesh)(mesh)

    return jax.lax.map(one, (arrays, hwa, sched, batch, meshes), batch_size=chunk)


def _stack(xs: Sequence[Any]) -> Any:
    return jax.tree.map(lambda *v: np.stack([np.asarray(x) for x in v]), *xs)


def plan_many(
    configs: Sequence[PlanConfig],
    *,
    dtype: str = "float32",
    optimizer: str = "adam",
    allow_cross_node_model_axis: bool = False,
    fallback: bool = True,
    method: str = "auto",
    seed: int = 0,
    chunk: int = 32,
) -> PlanBatch:
    """Plan every configuration: models padded to one bucket, hardware and
    device counts stacked, the cost tables and the exact DP of every mesh
    shape of every configuration in one compiled call (one compilation per
    bucket, padded batch size and setting). Configurations the DP cannot
    certify (a binding memory limit, a gradient-overlap term, a graph too
    wide for the DP) are planned by :func:`planner.plan` when ``fallback``
    (``method`` and ``seed`` go to it), else reported uncertified."""
    import time as _time

    from planner.planning import plan
    from planner.zoo import get_model

    start = _time.perf_counter()
    configs = list(configs)
    if not configs:
        raise ValueError("plan_many needs at least one configuration")
    settings = CostSettings(dtype=dtype, optimizer=optimizer)
    graphs, hws, batches, limits, meshes = [], [], [], [], []
    loaded: dict[Any, Hardware] = {}
    for c in configs:
        if not isinstance(c, PlanConfig):
            raise ValueError(f"configs must be PlanConfig objects, got {type(c).__name__}")
        g = get_model(c.model) if isinstance(c.model, str) else c.model
        if not isinstance(g, LayerGraph):
            raise ValueError(f"model must be a built-in model name or a LayerGraph, got {type(c.model).__name__}")
        key = id(c.hardware) if isinstance(c.hardware, Hardware) else str(c.hardware)
        hw = loaded[key] = loaded[key] if key in loaded else _hardware(c.hardware)
        B = resolve_batch(c.devices, c.batch, c.batch_per_device)
        graphs.append(g)
        hws.append(hw)
        batches.append(B)
        limits.append(hw.device.memory_bytes if c.memory_limit is None else parse_memory_limit(c.memory_limit))
        meshes.append(mesh_shapes(int(c.devices), B, hw.devices_per_node, allow_cross_node_model_axis))
    N = len(configs)
    L = max(bucket_size(g.num_layers) for g in graphs)
    E = max(bucket_size(g.num_edges) for g in graphs)
    M = max(len(m) for m in meshes)
    scheds = []
    for g in graphs:
        try:
            scheds.append(dp_schedule(g))
        except ValueError:  # too wide for the DP: planner.plan plans it
            scheds.append(None)
    dp_ok = np.array([s is not None for s in scheds])
    K = max([len(s.slots) for s in scheds if s is not None] + [1])
    inputs = max([s.in_edge.shape[1] for s in scheds if s is not None] + [1])
    # events padded to a multiple of 32 (not a power of two: the scan's length is its cost)
    steps = -(-max([s.layer.shape[0] for s in scheds if s is not None] + [1]) // 32) * 32
    empty = DPSchedule(*(np.zeros((steps,) + np.shape(x)[1:], np.asarray(x).dtype) for x in (
        np.zeros(1, np.int32), np.zeros(1, bool), np.zeros(1, np.int32), np.zeros((1, inputs), np.int32),
        np.zeros((1, inputs), np.int32), np.zeros((1, inputs), np.float32), np.zeros(1, np.int32),
        np.zeros(1, bool))), np.arange(K, dtype=np.int32))
    scheds = [pad_schedule(s, K, inputs, steps) if s is not None else empty for s in scheds]
    Np = bucket_size(N)  # padded: batches of similar size share a compilation
    rows = list(range(N)) + [0] * (Np - N)
    arrays = _stack([graphs[i].padded(L, E).arrays for i in rows])
    hw_rows: dict[int, Any] = {}
    for i in rows:
        if id(hws[i]) not in hw_rows:
            hw_rows[id(hws[i])] = jax.tree.map(np.asarray, hardware_arrays(hws[i], dtype))
    hwa = _stack([hw_rows[id(hws[i])] for i in rows])
    sched = _stack([scheds[i] for i in rows])
    mesh_arr = np.array([[meshes[i][min(j, len(meshes[i]) - 1)] for j in range(M)] for i in rows], np.float32)
    value, time_s, mem, choice = jax.tree.map(
        np.asarray, _plan_batch(arrays, hwa, sched, np.asarray([batches[i] for i in rows], np.float32), mesh_arr,
                                settings, min(chunk, Np)))

    out_mesh = np.zeros((N, 2), int)
    out_t, out_m = np.full(N, np.nan), np.full(N, np.nan)
    feasible, certified, used_fallback = np.zeros(N, bool), np.zeros(N, bool), np.zeros(N, bool)
    out_choice = np.full((N, L), -1, int)
    for i in range(N):
        k = len(meshes[i])
        t, m, v = time_s[i, :k].astype(np.float64), mem[i, :k].astype(np.float64), value[i, :k].astype(np.float64)
        fits = m <= limits[i]
        ok = bool(dp_ok[i]) and hws[i].gradient_overlap == 0 and bool(np.allclose(v, t, rtol=1e-5))
        if ok and fits.any():
            b = int(np.argmin(np.where(fits, t, np.inf)))
            idx = np.arange(k)
            ok = bool(np.all(fits | (t > t[b]) | ((t == t[b]) & (idx > b))))
        else:
            ok = False
        n = graphs[i].num_layers
        if ok:
            out_mesh[i], out_t[i], out_m[i] = meshes[i][b], t[b], m[b]
            feasible[i] = certified[i] = True
            out_choice[i, :n] = choice[i, b, :n]
        elif fallback:
            used_fallback[i] = True
            try:
                p = plan(graphs[i], devices=int(configs[i].devices), hardware=hws[i], memory_limit=limits[i],
                         batch=batches[i], method=method, seed=seed, dtype=dtype, optimizer=optimizer,
                         allow_cross_node_model_axis=allow_cross_node_model_axis)
            except InfeasibleMemoryError:
                continue
            out_mesh[i], out_t[i], out_m[i], feasible[i] = p.mesh, p.iteration_s, p.memory_bytes_per_device, True
            out_choice[i, :n] = [STRATEGY_NAMES.index(r.strategy) for r in p.layers]
    return PlanBatch(
        models=tuple(g.model_name for g in graphs), layer_names=tuple(g.names for g in graphs), mesh=out_mesh,
        batch=np.asarray(batches), iteration_s=out_t, memory_bytes_per_device=out_m,
        memory_limit_bytes=np.asarray(limits), feasible=feasible, certified=certified, fallback=used_fallback,
        choice=out_choice, seconds=_time.perf_counter() - start,
    )
