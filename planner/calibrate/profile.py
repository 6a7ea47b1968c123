"""Measure every layer's forward + backward time at the shard shapes the
strategy menu produces, and turn the measurements into a calibration
(:class:`costmodels.Calibration`, the file ``shardplan profile`` writes).

Each layer runs as a standalone jitted JAX op built from its row of the
layer graph (``lax.conv_general_dilated``, a dense matmul, training-mode
batch norm, ``lax.reduce_window`` pooling, ReLU, add, concat), on random
data of the shard's shape, NHWC (channels last, as Flax):

==========  ===============================================================
data        batch ``B / (d m)``, the whole layer
filter      batch ``B / d``, output channels ``/ m`` (channel-wise layers: channels ``/ m``)
channel     batch ``B / d``, input channels ``/ m``
spatial     batch ``B / d``, ``ceil(out rows / m)`` output rows and the input
            rows they read (the shard's own rows plus the halo; no padding
            along the split dim, the halo replaces it)
replicated  batch ``B / d``, the whole layer
==========  ===============================================================

for every mesh ``d x m`` of ``P`` devices, ``P`` the powers of two up to
``max_devices``, and every strategy the menu allows there
(:func:`costmodels.strategies.strategy_mask`). Forward and backward run in
one jitted call (``jax.vjp``: gradients of the parameters, and of the input
unless the layer reads only the model input); after ``warmup`` untimed
calls the median of ``repeats`` timed calls (``block_until_ready``) is kept.
Identical shard ops (the same shapes, within a layer or across layers) are
measured once.

:meth:`Profile.calibration` keys every measured shard by its operation
shape (version 3, :mod:`costmodels.calibration`): the layer's op and
unsharded dims, the strategy, and the shard's dims as
:func:`costmodels.shards.shard_shapes` gives them, with the device it ran
on. :meth:`Profile.layer_calibration` gives the older per-layer form
(version 1/2, keyed by *work* = samples per device / shard ways: per layer,
strategy and work the median over that strategy's distinct shapes with that
work, and per layer and work the median over all of them). Flatten and
unmodelled (``other``) layers are not measured; they keep the model.

The clock is a parameter (``timer``) so the bookkeeping can be tested with a
fake one; progress goes to an optional callback.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence

import jax
import numpy as np

from costmodels import (
    MAX_WORK_POINTS,
    STRATEGY_NAMES,
    Calibration,
    LayerDims,
    OpKey,
    ShapePoint,
    ShardDims,
    Strategy,
    graph_op_keys,
    shard_shapes,
    strategy_mask,
)
from planner.calibrate.shard_ops import ShardOp, fwd_bwd, make_arguments, shard_op
from planner.ir.graph import LayerGraph, LayerKind

__all__ = ["PROFILED_KINDS", "Profile", "ProfileEvent", "ShardOp", "ShardTiming", "menu_meshes", "profile_layers"]

PROFILED_KINDS = (
    LayerKind.CONV, LayerKind.DENSE, LayerKind.POOL, LayerKind.BATCH_NORM,
    LayerKind.ELEMENTWISE, LayerKind.ADD, LayerKind.CONCAT,
)
PROFILE_DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class ShardTiming:
    """One (layer, strategy, mesh) shard and its measured time."""

    layer: str
    strategy: str
    mesh: tuple[int, int]  # (d, m)
    work: float  # samples per device / shard ways (the calibration's x axis)
    shape: str  # ShardOp.description of what ran
    seconds: float  # median forward + backward wall time
    op: OpKey | None = None  # the layer's operation (calibration key)
    layer_dims: LayerDims | None = None  # the unsharded layer's dims
    shard: ShardDims | None = None  # the shard's dims, as costmodels.shards.shard_shapes gives them


@dataclasses.dataclass(frozen=True)
class ProfileEvent:
    """Progress, for a callback to render (library code never prints)."""

    done: int  # shard ops measured so far
    total: int  # distinct shard ops to measure
    layer: str  # the layer just measured ("" at the start)


@dataclasses.dataclass(frozen=True)
class Profile:
    """What :func:`profile_layers` measured."""

    model: str
    device: str  # what ran the ops (jax device kind), recorded as the calibration's device name
    dtype: str
    batch: int  # global batch
    max_devices: int
    repeats: int
    timings: tuple[ShardTiming, ...]
    hardware: str = ""  # the hardware preset the device is (recorded in the calibration; "" = not given)

    def calibration(self) -> Calibration:
        """Version 3: one point per distinct (operation, layer dims,
        strategy, shard) timed, with the device (``hardware``,
        ``device``)."""
        points = {}
        for t in self.timings:
            if t.op is None or t.layer_dims is None or t.shard is None:
                continue
            points.setdefault((t.op, t.layer_dims, t.strategy, t.shard), t.seconds)
        return Calibration(
            hardware=self.hardware, dtype=self.dtype, device_name=self.device,
            points=tuple(ShapePoint(op, dims, s, shard, sec) for (op, dims, s, shard), sec in points.items()),
        )

    def layer_calibration(self) -> Calibration:
        """Per layer and strategy, per work value: the median over the
        distinct shard shapes of that strategy with that work (the strategy's
        own points); and per layer, per work value, the median over every
        strategy's distinct shapes with that work (the work-only points, for
        strategies without their own and for version-1 readers). At most
        ``MAX_WORK_POINTS`` work values each; the largest ones are dropped beyond
        that."""
        per: dict[str, dict[float, dict[str, float]]] = {}
        own: dict[str, dict[str, dict[float, dict[str, float]]]] = {}
        for t in self.timings:
            per.setdefault(t.layer, {}).setdefault(t.work, {})[t.shape] = t.seconds
            own.setdefault(t.layer, {}).setdefault(t.strategy, {}).setdefault(t.work, {})[t.shape] = t.seconds

        def points(by_work: dict[float, dict[str, float]]) -> tuple[tuple[float, float], ...]:
            return tuple((w, float(statistics.median(by_work[w].values()))) for w in sorted(by_work)[:MAX_WORK_POINTS])

        layers = {name: points(by_work) for name, by_work in per.items()}
        strategies = {
            name: {s: points(by_strategy[s]) for s in STRATEGY_NAMES if s in by_strategy}
            for name, by_strategy in own.items()
        }
        return Calibration(hardware=self.hardware or self.device, dtype=self.dtype, layers=layers,
                           strategies=strategies)


def menu_meshes(max_devices: int) -> tuple[tuple[int, int], ...]:
    """Every ``(d, m)`` with ``d m = P``, ``P`` a power of two up to ``max_devices``."""
    if isinstance(max_devices, bool) or not isinstance(max_devices, int) or max_devices < 1:
        raise ValueError(f"max_devices must be a positive integer, got {max_devices!r}")
    out = []
    p = 1
    while p <= max_devices:
        m = 1
        while m <= p:
            out.append((p // m, m))
            m *= 2
        p *= 2
    return tuple(out)


# -- building one shard op from a layer row ---------------------------------------------


def _measure(op: ShardOp, warmup: int, repeats: int, timer: Callable[[], float]) -> float:
    params, xs, ct = make_arguments(op)
    for _ in range(warmup):
        jax.block_until_ready(fwd_bwd(op, params, xs, ct))
    samples = []
    for _ in range(repeats):
        start = timer()
        jax.block_until_ready(fwd_bwd(op, params, xs, ct))
        samples.append(timer() - start)
    return float(statistics.median(samples))


# -- the profile ---------------------------------------------------------------------------


def _positive_int(v, what: str, minimum: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < minimum:
        raise ValueError(f"{what} must be an integer >= {minimum}, got {v!r}")
    return int(v)


def profile_layers(
    graph: LayerGraph,
    batch: int,
    *,
    max_devices: int = 8,
    dtype: str = "float32",
    warmup: int = 2,
    repeats: int = 5,
    layers: Sequence[str] | None = None,
    timer: Callable[[], float] = time.perf_counter,
    callback: Callable[[ProfileEvent], None] | None = None,
    device: str | None = None,
    meshes: Sequence[tuple[int, int]] | None = None,
    hardware: str = "",
) -> Profile:
    """Time every layer of ``graph`` (or only ``layers``) forward + backward on
    the default JAX device at the shard shapes of global batch ``batch`` on
    every mesh of up to ``max_devices`` devices (module docstring), or only
    on ``meshes`` (``(d, m)`` pairs, e.g. one plan's mesh).
    ``device`` names what was measured in the calibration (default: the
    JAX device kind), ``hardware`` the hardware preset it is (a calibration
    is refused for other hardware). ``Profile.calibration()`` is the
    calibration."""
    batch = _positive_int(batch, "batch")
    warmup = _positive_int(warmup, "warmup", 0)
    repeats = _positive_int(repeats, "repeats")
    if dtype not in PROFILE_DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose from {', '.join(PROFILE_DTYPES)}")
    if meshes is None:
        meshes = menu_meshes(max_devices)
    else:
        meshes = tuple((int(d), int(m)) for d, m in meshes)
        if not meshes or any(d < 1 or m < 1 for d, m in meshes):
            raise ValueError(f"meshes must be (d, m) pairs of positive integers, got {meshes!r}")
    a = graph.arrays
    n = graph.num_layers
    kinds = np.asarray(a.kind)[:n].astype(int)
    wanted = set(range(n)) if layers is None else None
    if layers is not None:
        index = {name: i for i, name in enumerate(graph.names)}
        unknown = [x for x in layers if x not in index]
        if unknown:
            raise ValueError(f"model {graph.model_name!r} has no layer(s) {unknown[:3]}; see 'shardplan layers MODEL'")
        wanted = {index[x] for x in layers}
    todo = [i for i in sorted(wanted) if kinds[i] in PROFILED_KINDS]
    producers_of = {i: [] for i in range(n)}
    out_channels = np.asarray(a.out_channels).astype(int)
    for s, d in graph.edges:
        producers_of[d].append(s)
    keys = graph_op_keys(graph, dtype)
    # (layer, strategy, mesh, work, op, shard dims) for every feasible shard of the menu
    shards: list[tuple[int, Strategy, tuple[int, int], float, ShardOp, ShardDims]] = []
    for d, m in meshes:
        if batch % d:
            continue
        feasible = np.asarray(strategy_mask(a, float(batch), float(d), float(m)))
        dims = [np.asarray(x, np.float64) for x in shard_shapes(a, float(batch), float(d), float(m))]
        for i in todo:
            producers = producers_of[i]
            if kinds[i] == LayerKind.CONCAT:
                parts = tuple(int(out_channels[p]) for p in producers)
            else:
                parts = (int(a.in_channels[i]),) * max(len(producers), 2 if kinds[i] == LayerKind.ADD else 1)
            for s in Strategy:
                if not feasible[i, s]:
                    continue
                if s is Strategy.DATA:
                    shard_batch, split, work = batch // (d * m), 1, batch / (d * m)
                elif s is Strategy.REPLICATED:
                    shard_batch, split, work = batch // d, 1, batch / d
                else:
                    shard_batch, split, work = batch // d, m, batch / (d * m)
                strategy = Strategy.DATA if split == 1 else s  # m = 1: every strategy runs the whole layer
                op = shard_op(graph, i, strategy, shard_batch, split, parts, bool(producers), dtype)
                r, ro = int(a.spatial_rank[i]), int(a.out_spatial_rank[i])
                sd = ShardDims(float(dims[0][i, s]), float(dims[1][i, s]), float(dims[2][i, s]),
                               tuple(float(x) for x in dims[3][i, s, :r]), tuple(float(x) for x in dims[4][i, s, :ro]))
                shards.append((i, s, (d, m), work, op, sd))
    distinct = list(dict.fromkeys(op for *_, op, _ in shards))
    seconds: dict[ShardOp, float] = {}
    first_layer = {}
    for i, *_, op, _ in shards:
        first_layer.setdefault(op, graph.names[i])
    if callback is not None:
        callback(ProfileEvent(0, len(distinct), ""))
    for k, op in enumerate(distinct, start=1):
        seconds[op] = _measure(op, warmup, repeats, timer)
        if callback is not None:
            callback(ProfileEvent(k, len(distinct), first_layer[op]))
    timings = tuple(
        ShardTiming(layer=graph.names[i], strategy=STRATEGY_NAMES[s], mesh=mesh, work=work, shape=op.description,
                    seconds=seconds[op], op=keys[i][0] if keys[i] else None,
                    layer_dims=keys[i][1] if keys[i] else None, shard=sd)
        for i, s, mesh, work, op, sd in shards
    )
    return Profile(
        model=graph.model_name, device=device or jax.devices()[0].device_kind, dtype=dtype, batch=batch,
        max_devices=max_devices, repeats=repeats, timings=timings, hardware=hardware,
    )
