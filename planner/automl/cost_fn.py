"""``cost_fn``: the cost of the best plan as a differentiable function of
architecture parameters (the package docstring, :mod:`planner.automl`, says how)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from costmodels import (
    NUM_STRATEGIES,
    CostSettings,
    Hardware,
    cost_table,
    expected_time,
    hardware_arrays,
    iteration_time,
    load_hardware,
    memory_per_device,
    one_hot,
    strategy_mask,
)
from planner.automl.parametric import ArchParams, ParametricGraph
from planner.plan_inputs import device_count, memory_limit_bytes, mesh_shapes
from search import INFEASIBLE_S, DPSchedule, best_plans, dp_schedule, soft_min_lanes

__all__ = ["CostEstimate", "CostFunction", "cost_fn"]


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
    valid: Any  # [] bool: the architecture can be planned (see CostFunction); where false every number is NaN


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
        """The estimate at ``params``. Called with concrete values, an
        architecture that cannot be planned (a width or the resolution not
        positive, a batch under 1 or one that no mesh's data axis divides, a
        non-finite value) raises ``ValueError``; traced (under ``jit``,
        ``vmap``, ``grad``), where values are unknown until run time, it
        gives ``valid = False`` and NaN for every time, memory, weight and
        gradient instead (never a finite number, never a zero gradient)."""
        problem = _invalid_params(params, self.meshes)
        if problem:
            raise ValueError(f"cost_fn: {problem}")
        return self.fn(params)


def _invalid_params(params: ArchParams, meshes) -> str | None:
    """Why concrete ``params`` cannot be planned on ``meshes`` (``None``: they
    can, or they are traced and only the run-time ``valid`` flag can tell)."""
    leaves = (params.widths, params.resolution, params.batch)
    if any(isinstance(x, jax.core.Tracer) for x in leaves):
        return None
    widths = np.asarray(params.widths, np.float64).ravel()
    resolution, batch = np.asarray(params.resolution, np.float64), np.asarray(params.batch, np.float64)
    if resolution.shape != () or batch.shape != ():  # a batch of architectures: leave it to valid
        return None
    if not (np.all(np.isfinite(widths)) and np.isfinite(resolution) and np.isfinite(batch)):
        return f"widths, resolution and batch must be finite, got {widths.tolist()}, {float(resolution)}, {float(batch)}"
    if np.any(widths <= 0):
        return f"width multipliers must be positive, got {widths.tolist()}"
    if resolution <= 0:
        return f"the resolution multiplier must be positive, got {float(resolution)}"
    b = float(np.round(batch))
    if b < 1:
        return f"the batch must be at least 1 sample, got {float(batch)}"
    if not any(b >= d and b % d == 0 for d, _ in meshes):
        data = sorted({int(d) for d, _ in meshes})
        return (f"no mesh can split batch {b:.0f} into whole samples per device (data axes {data}); "
                f"use a multiple of {min(data)}")
    return None


def _softmin_weights(x, tau):
    m = jax.lax.stop_gradient(jnp.min(x))
    z = jnp.exp(-(x - m) / tau)
    return z / jnp.sum(z), m - tau * jnp.log(jnp.sum(z))


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

    # The relaxation pads no GEMM tile: tile quantization is a step function of the widths, with no
    # useful gradient and a jump where a shard's channels pass a multiple of the tile (7% on GPT-2's
    # relaxed time between widths 1.00 and 1.01). Exact at multiples of the tile; the exact plan's time
    # (the rounded architecture, below) pads as the hardware does.
    smooth = hwa._replace(channel_tile=jnp.zeros_like(hwa.channel_tile),
                          reduction_tile=jnp.zeros_like(hwa.reduction_tile))

    def per_mesh(dm):  # the tables of one mesh shape
        d, m = dm[0], dm[1]
        ok = (batch_r >= d) & (jnp.mod(batch_r, d) == 0)
        t = cost_table(arrays, smooth, batch, d, m, settings)
        t = t._replace(feasible=strategy_mask(arrays_r, batch_r, d, m) & ok)
        fastest = jnp.where(t.feasible, t.layer_time_s, jnp.inf).min(axis=-1)
        scale = jax.lax.stop_gradient(jnp.sum(jnp.where(t.layer_mask > 0, fastest, 0.0)))
        scale = jnp.where(jnp.isfinite(scale) & (scale > 0), scale, 1.0)  # (a mesh that cannot run: any)
        tr = cost_table(arrays_r, hwa, batch_r, d, m, settings)  # exact: the rounded architecture
        return t, tr._replace(feasible=tr.feasible & ok), ok, temperature * scale / n_real  # per-decision tau

    t, tr, ok, tau = jax.vmap(per_mesh)(meshes)  # leaves [M, ...]: the meshes are the DP's lanes

    def soft(c, r):  # sum over meshes of the soft minimum; lanes are independent
        lt = jnp.where(t.feasible, t._replace(compute_s=c).layer_time_s, INFEASIBLE_S)
        return jnp.sum(soft_min_lanes(jnp.moveaxis(lt, 0, -1), jnp.moveaxis(r, 0, -1), sched, tau))

    # d F / d cost = the Gibbs probabilities: per layer [M, L, S] and per edge [M, E, S, S]
    marginals, pair = jax.grad(soft, argnums=(0, 1))(t.compute_s, t.reshard_s)
    f = jax.vmap(expected_time)(t, marginals, pair)  # under the Gibbs distribution over plans
    mem = jax.vmap(memory_per_device)(t, marginals)
    # exact: hard minimum and its plan on every mesh
    lt_r = jnp.where(tr.feasible, tr.layer_time_s, INFEASIBLE_S)
    _, choice = best_plans(jnp.moveaxis(lt_r, 0, -1), jnp.moveaxis(tr.reshard_s, 0, -1), sched)
    choice = choice.T  # [M, L]
    oh = one_hot(choice, NUM_STRATEGIES)
    et, em = jax.vmap(iteration_time)(tr, oh), jax.vmap(memory_per_device)(tr, oh)
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
    # An architecture that cannot be planned (CostFunction.__call__) gives NaN values and NaN
    # gradients, never 0: a term that is 0 (value and gradient) where valid, NaN where not, and
    # depends on every parameter (a select alone would pass a zero gradient).
    valid = (jnp.all(params.widths > 0) & (params.resolution > 0) & (batch_r >= 1) & jnp.any(ok)
             & jnp.all(jnp.isfinite(params.widths)) & jnp.isfinite(params.resolution) & jnp.isfinite(batch))
    nan = jnp.where(valid, 0.0, jnp.nan) * (jnp.sum(params.widths) + params.resolution + batch)
    return CostEstimate(time_s + nan, memory + nan, objective + nan, w + nan, et[pick] + nan, em[pick] + nan,
                        jnp.where(valid, pick, -1).astype(jnp.int32), fits[pick] & valid, certified & valid,
                        jnp.where(valid, choice[pick], -1), valid)


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
        raise ValueError(  # noqa: TRY004 (user errors are ValueErrors)
            "build_graph must be a ParametricGraph (planner.parametric_graph, planner.resnet_parametric or "
            "planner.transformer_parametric)")
    devices = device_count(devices)
    if not temperature > 0:
        raise ValueError(f"temperature must be positive, got {temperature!r}")
    if not memory_penalty >= 0:
        raise ValueError(f"memory_penalty must be non-negative, got {memory_penalty!r}")
    hw = load_hardware(hardware)
    limit = memory_limit_bytes(memory_limit, hw)
    meshes = tuple(mesh_shapes(int(devices), int(devices), hw.devices_per_node, allow_cross_node_model_axis))
    sched = dp_schedule(build_graph.template)
    settings = CostSettings(dtype=dtype, optimizer=optimizer)
    hwa = hardware_arrays(hw, dtype)
    fn = functools.partial(
        _estimate, graph=build_graph, hwa=hwa, sched=jax.tree.map(jnp.asarray, sched),
        meshes=jnp.asarray(meshes, jnp.float32), limit=jnp.float32(limit), temperature=jnp.float32(temperature),
        penalty=jnp.float32(memory_penalty), settings=settings)
    return CostFunction(build_graph, hw.name, int(devices), meshes, limit, float(temperature), float(memory_penalty), fn)

