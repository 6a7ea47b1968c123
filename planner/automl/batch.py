"""``plan_many``: many configurations (models padded to one row count,
hardware, device counts) planned by a few compiled calls: the exact DP of
:mod:`search.elimination` for every (configuration, mesh shape) pair, the pairs
of one graph structure as the lanes of one DP, ``chunk`` configurations per
call. When the fastest plan of the chosen mesh fits the memory limit and no
mesh whose fastest plan does not fit is faster, that plan is the constrained
optimum (a constrained minimum is never below the unconstrained one),
certified; other configurations fall back to :func:`planner.plan`.
Re-exported by :mod:`planner.automl`."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from costmodels import (
    NUM_STRATEGIES,
    STRATEGY_NAMES,
    CostSettings,
    CostTable,
    Hardware,
    cost_table,
    hardware_arrays,
    iteration_time,
    load_hardware,
    memory_per_device,
    one_hot,
)
from planner.plan_inputs import resolve_batch
from planner.ir.graph import VECTOR_FIELDS, LayerArrays, LayerGraph, bucket_size
from planner.planning import InfeasibleMemoryError, mesh_shapes, parse_memory_limit
from search import INFEASIBLE_S, DPSchedule, best_plans, dp_schedule, pad_schedule

__all__ = ["PlanBatch", "PlanConfig", "ROW_MULTIPLE", "plan_many"]


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
    """The best plan of every configuration (``N`` rows, ``L`` the largest layer
    count rounded up to a multiple of ``ROW_MULTIPLE``)."""

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


@functools.partial(jax.jit, static_argnames=("settings",))
def _batch_tables(arrays, hwa, batch, meshes, settings: CostSettings) -> CostTable:
    """The cost tables of ``P`` configurations on each of their ``M`` mesh
    shapes, leaves ``[P * M, ...]`` (pair ``p * M + j``: configuration ``p``, mesh ``j``)."""
    P, M = meshes.shape[:2]

    def tables(a, h, b, mesh):
        return jax.vmap(lambda dm: cost_table(a, h, b, dm[0], dm[1], settings))(mesh)

    t = jax.vmap(tables)(arrays, hwa, batch, meshes)  # leaves [P, M, ...]
    return jax.tree.map(lambda x: x.reshape((P * M,) + x.shape[2:]), t)


@jax.jit
def _plan_batch(t: CostTable, sched: DPSchedule, limit, valid):
    """Hard DP on the ``P x M`` cost tables of :func:`_batch_tables` (leaves
    ``[P * M, ...]``), which share one DP schedule (one graph structure): one
    DP whose lanes are the tables (:func:`best_plans`, lanes last so that each
    step is a few vectorised passes over ``S**K x P M`` floats). Per
    configuration, the mesh ``best [P]`` whose plan is the fastest of those
    that fit ``limit [P]`` bytes (among the ``valid [P, M]`` meshes), and the
    exact time of that plan (:func:`costmodels.iteration_time` at its
    one-hot). Returns the DP value ``[P, M]``, the memory of each mesh's plan
    ``[P, M]`` (:func:`memory_per_device`), ``best``, its time ``[P]`` and its
    plan ``[P, L]``.

    A separate compilation from :func:`_batch_tables`: fused into one, XLA:CPU
    computes the tables in the DP's transposed layout, about 3x slower
    (measured with ``benchmarks/automl_throughput.py``'s configurations)."""
    P, M = valid.shape
    layer_time = jnp.where(t.feasible, t.layer_time_s, INFEASIBLE_S)  # [PM, L, S]
    value, choice = best_plans(jnp.moveaxis(layer_time, 0, -1), jnp.moveaxis(t.reshard_s, 0, -1), sched)
    oh = one_hot(choice.T, NUM_STRATEGIES)  # [PM, L, S]
    mem = jax.vmap(memory_per_device)(t, oh).reshape(P, M)
    value = value.reshape(P, M)
    fits = valid & (mem <= limit[:, None])
    best = jnp.argmin(jnp.where(fits, value, jnp.inf), axis=1)  # [P]
    lane = jnp.arange(P) * M + best
    time_s = jax.vmap(iteration_time)(jax.tree.map(lambda x: x[lane], t), oh[lane])
    return value, mem, best, time_s, choice[:, lane].T


def _stack(xs: Sequence[Any]) -> Any:
    return jax.tree.map(lambda *v: np.stack([np.asarray(x) for x in v]), *xs)


def _fill_value(field: str) -> float:
    """What :meth:`LayerGraph.padded` puts in a padding row of ``field``."""
    return 1.0 if field in VECTOR_FIELDS or field in ("in_channels", "out_channels", "groups") else 0.0


def _stack_graphs(graphs: Sequence[LayerGraph], layers: np.ndarray, edges: np.ndarray, rows: int, edge_rows: int
                  ) -> LayerArrays:
    """``[N, rows, ...]`` / ``[N, edge_rows]`` float32 arrays of every graph
    (``layers`` / ``edges`` real rows each), padded as
    :meth:`LayerGraph.padded` pads: one ``np.stack`` per field when the
    graphs' arrays have equal lengths (one bucket)."""
    N = len(graphs)
    pad = {False: np.arange(rows)[None, :] >= layers[:, None], True: np.arange(edge_rows)[None, :] >= edges[:, None]}
    out = {}
    for f in LayerArrays._fields:
        is_edge = f.startswith("edge_")
        total = edge_rows if is_edge else rows
        vs = [np.asarray(getattr(g.arrays, f)) for g in graphs]
        have = vs[0].shape[0]
        if any(v.shape[0] != have for v in vs):  # several buckets: each to the first's length
            vs = [np.concatenate([v[:have], np.zeros((max(0, have - v.shape[0]),) + v.shape[1:])]) for v in vs]
        x = np.zeros((N, max(have, total)) + vs[0].shape[1:], np.float32)
        np.stack(vs, out=x[:, :have])
        x = x[:, :total]
        mask = pad[is_edge]
        np.copyto(x, np.float32(_fill_value(f)), where=mask if x.ndim == 2 else mask[:, :, None])
        out[f] = x
    return LayerArrays(**out)


def _structure_key(g: LayerGraph, edges: int) -> tuple:
    """Graphs with equal keys have the same DP schedule (layer count and edges)."""
    a = g.arrays
    return g.num_layers, np.asarray(a.edge_src)[:edges].tobytes(), np.asarray(a.edge_dst)[:edges].tobytes()


ROW_MULTIPLE = 32  # plan_many pads layers, edges and DP events to a multiple of this


def _round_up(n: int) -> int:
    return max(1, -(-int(n) // ROW_MULTIPLE)) * ROW_MULTIPLE


def plan_many(
    configs: Sequence[PlanConfig],
    *,
    dtype: str = "float32",
    optimizer: str = "adam",
    allow_cross_node_model_axis: bool = False,
    fallback: bool = True,
    method: str = "auto",
    seed: int = 0,
    chunk: int = 64,
) -> PlanBatch:
    """Plan every configuration: models padded to the same row counts
    (multiples of ``ROW_MULTIPLE``), hardware and device counts stacked, the
    cost tables and the exact DP of every mesh shape of every configuration,
    ``P = min(chunk, N rounded up to a power of two)`` configurations of one
    graph structure per compiled call (one compilation of each of the two
    stages per padded size, ``P`` and setting; calls are dispatched
    asynchronously while the host stacks the next chunk). Configurations the
    DP cannot certify (a binding memory limit, a gradient-overlap term, a
    graph too wide for the DP) are planned by :func:`planner.plan` when
    ``fallback`` (``method`` and ``seed`` go to it), else reported
    uncertified. Every row is the fastest plan found, as
    ``plan(..., simplicity_tolerance=0)`` gives it (``plan``'s default
    returns the simplest plan within 1% of the fastest instead)."""
    import time as _time

    from planner.planning import plan

    start = _time.perf_counter()
    configs = list(configs)
    if not configs:
        raise ValueError("plan_many needs at least one configuration")
    if not (isinstance(chunk, (int, np.integer)) and not isinstance(chunk, bool) and chunk >= 1):
        raise ValueError(f"chunk must be a positive integer, got {chunk!r}")
    settings = CostSettings(dtype=dtype, optimizer=optimizer)
    graphs, hws, hw_of, batches, limits, meshes = _resolved(configs, allow_cross_node_model_axis)
    N = len(configs)
    n_layers = np.array([g.num_layers for g in graphs])
    n_edges = np.array([g.num_edges for g in graphs])
    # layers, edges and DP events padded to multiples of ROW_MULTIPLE, not to power-of-two
    # buckets: the tables and the DP's scan cost in proportion to them
    L = _round_up(n_layers.max())
    E = _round_up(n_edges.max())
    M = max(len(m) for m in meshes)

    group, padded = _schedules(graphs, n_edges)

    P = min(bucket_size(N), int(chunk))  # configurations per compiled call
    hw_table = _stack([jax.tree.map(np.asarray, hardware_arrays(h, dtype)) for h in hws])  # [H, ...]
    hw_idx = np.asarray(hw_of)
    batch_arr = np.asarray(batches, np.float32)
    mesh_arr = np.array([[m[min(j, len(m) - 1)] for j in range(M)] for m in meshes], np.float32)  # [N, M, 2]
    valid = np.arange(M)[None, :] < np.array([len(m) for m in meshes])[:, None]  # [N, M] real mesh shapes
    lim = np.asarray(limits, np.float64)
    lim32 = lim.astype(np.float32)
    pending = []
    for gi, s in enumerate(padded):
        if s is None:
            continue
        members = np.flatnonzero(group == gi)
        for j in range(0, len(members), P):
            rows = members[j:j + P]
            take = np.concatenate([rows, np.full(P - len(rows), rows[0])])
            # stacked chunk by chunk: the host stacks the next chunk while the device computes this one
            arrays = _stack_graphs([graphs[i] for i in take], n_layers[take], n_edges[take], L, E)
            tables = _batch_tables(arrays, jax.tree.map(lambda x, t=hw_idx[take]: x[t], hw_table),
                                   batch_arr[take], mesh_arr[take], settings)
            pending.append((rows, _plan_batch(tables, s, lim32[take], valid[take])))  # dispatched, not awaited
    value, mem = np.full((N, M), np.nan), np.full((N, M), np.nan)
    best, time_b, choice = np.zeros(N, int), np.full(N, np.nan), np.zeros((N, L), int)
    for rows, out in pending:
        n = len(rows)
        v, m, b_, t_, ch = (np.asarray(x)[:n] for x in out)
        value[rows], mem[rows], best[rows], time_b[rows], choice[rows] = v, m, b_, t_, ch

    # certification, all configurations at once: the fastest fitting mesh (by the DP's value, the
    # optimum of each mesh) is no slower than any mesh whose fastest plan does not fit
    fits = valid & (mem <= lim[:, None])
    rows_n = np.arange(N)
    b = np.argmin(np.where(fits, value, np.inf), axis=1)  # [N] as the device chose, in float64 limits
    vb = value[rows_n, b][:, None]
    idx = np.arange(M)[None, :]
    overlap = np.array([hws[h].gradient_overlap for h in hw_of])
    ok = (group >= 0) & (overlap == 0) & fits.any(axis=1) & (b == best)
    ok &= np.isclose(value[rows_n, b], time_b, rtol=1e-5)  # the DP's value is its plan's exact time
    ok &= np.all(~valid | fits | (value > vb) | ((value == vb) & (idx > b[:, None])), axis=1)

    out_mesh = np.where(ok[:, None], mesh_arr[rows_n, b].astype(int), 0)
    out_t = np.where(ok, time_b, np.nan)
    out_m = np.where(ok, mem[rows_n, b], np.nan)
    feasible, certified, used_fallback = ok.copy(), ok.copy(), np.zeros(N, bool)
    out_choice = np.where(ok[:, None] & (np.arange(L)[None, :] < n_layers[:, None]), choice, -1)
    for i in np.flatnonzero(~ok) if fallback else ():
        used_fallback[i] = True
        try:
            p = plan(graphs[i], devices=int(configs[i].devices), hardware=hws[hw_of[i]], memory_limit=limits[i],
                     batch=batches[i], method=method, seed=seed, dtype=dtype, optimizer=optimizer,
                     allow_cross_node_model_axis=allow_cross_node_model_axis, simplicity_tolerance=0.0)
        except InfeasibleMemoryError:
            continue
        out_mesh[i], out_t[i], out_m[i], feasible[i] = p.mesh, p.iteration_s, p.memory_bytes_per_device, True
        out_choice[i, :n_layers[i]] = [STRATEGY_NAMES.index(r.strategy) for r in p.layers]
    return PlanBatch(
        models=tuple(g.model_name for g in graphs), layer_names=tuple(g.names for g in graphs), mesh=out_mesh,
        batch=np.asarray(batches), iteration_s=out_t, memory_bytes_per_device=out_m,
        memory_limit_bytes=lim, feasible=feasible, certified=certified, fallback=used_fallback,
        choice=out_choice, seconds=_time.perf_counter() - start,
    )


def _resolved(configs: Sequence[PlanConfig], allow_cross_node_model_axis: bool) -> tuple:
    """Each configuration's graph, the distinct hardware (loaded once) and its
    index, the global batch, the memory limit in bytes and the mesh shapes:
    ``(graphs, hws, hw_of, batches, limits, meshes)``."""
    from planner.models.zoo import get_model

    graphs, hw_of, batches, limits, meshes = [], [], [], [], []
    loaded: dict[Any, int] = {}  # hardware key -> index into hws
    hws: list[Hardware] = []
    shapes: dict[tuple, list[tuple[int, int]]] = {}
    for c in configs:
        if not isinstance(c, PlanConfig):
            raise ValueError(f"configs must be PlanConfig objects, got {type(c).__name__}")  # noqa: TRY004
        g = get_model(c.model) if isinstance(c.model, str) else c.model
        if not isinstance(g, LayerGraph):
            raise ValueError(  # noqa: TRY004
                f"model must be a built-in model name or a LayerGraph, got {type(c.model).__name__}")
        key = id(c.hardware) if isinstance(c.hardware, Hardware) else str(c.hardware)
        if key not in loaded:
            loaded[key] = len(hws)
            hws.append(load_hardware(c.hardware))
        hw = hws[loaded[key]]
        B = resolve_batch(c.devices, c.batch, c.batch_per_device)
        graphs.append(g)
        hw_of.append(loaded[key])
        batches.append(B)
        limits.append(hw.device.memory_bytes if c.memory_limit is None else parse_memory_limit(c.memory_limit))
        mkey = (c.devices, B, hw.devices_per_node)
        if mkey not in shapes:
            shapes[mkey] = mesh_shapes(int(c.devices), B, hw.devices_per_node, allow_cross_node_model_axis)
        meshes.append(shapes[mkey])
    return graphs, hws, hw_of, batches, limits, meshes


def _schedules(graphs: list[LayerGraph], n_edges: np.ndarray) -> tuple[np.ndarray, list]:
    """One DP schedule per graph structure (configurations of one template
    share it), padded to common sizes: each configuration's schedule index
    ``[N]`` (-1: too wide for the DP, :func:`planner.plan` plans it) and the
    padded schedules (None for those)."""
    group = np.full(len(graphs), -1)  # [N] index into scheds, -1: too wide for the DP (planner.plan plans it)
    keys: dict[Any, int] = {}
    scheds: list[DPSchedule | None] = []
    for i, g in enumerate(graphs):
        k = _structure_key(g, int(n_edges[i]))
        if k not in keys:
            keys[k] = len(scheds)
            try:
                scheds.append(dp_schedule(g))
            except ValueError:
                scheds.append(None)
        group[i] = keys[k] if scheds[keys[k]] is not None else -1
    real = [s for s in scheds if s is not None]
    K = max([len(s.slots) for s in real] + [1])
    inputs = max([s.in_edge.shape[1] for s in real] + [1])
    steps = _round_up(max([s.layer.shape[0] for s in real] + [1]))
    padded = [pad_schedule(s, K, inputs, steps) if s is not None else None for s in scheds]
    return group, padded
