"""A calibration as arrays for the cost table, and the jitted lookup of a
shard's measured time (:mod:`costmodels.calibration` describes the rules)."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from costmodels.calibration._file import MAX_WORK_POINTS, Calibration
from costmodels.calibration._keys import (
    LayerDims,
    OpKey,
    Points,
    ShardDims,
    graph_op_keys,
)
from costmodels.layers import LayerTable
from costmodels.shards import ShardShapes
from costmodels.strategies import STRATEGY_NAMES

__all__ = ["CalibrationArrays", "ShapeCalibrationArrays", "calibrate_compute", "calibrated_seconds",
           "calibration_arrays", "shape_calibrated_seconds"]


# -- arrays for the cost table ---------------------------------------------------------------------


class CalibrationArrays(NamedTuple):
    """A version 1/2 calibration aligned with a graph's rows."""

    log_work: jnp.ndarray  # [L, K] log of the work-only points' work (sample-equivalents), ascending, padded by repeating the last
    log_seconds: jnp.ndarray  # [L, K] log of their measured seconds
    count: jnp.ndarray  # [L] work-only points per layer (0 = none)
    strategy_log_work: jnp.ndarray  # [L, S, K] log work of each strategy's own points, padded likewise
    strategy_log_seconds: jnp.ndarray  # [L, S, K] log seconds of each strategy's own points
    strategy_count: jnp.ndarray  # [L, S] each strategy's own points (0 = use the work-only points)

    @property
    def measured(self):  # [L, S] bool: the strategy has points (its own or the layer's); else the roofline
        return (self.count[:, None] > 0) | (self.strategy_count > 0)


class ShapeCalibrationArrays(NamedTuple):
    """A version 3 calibration aligned with a graph's rows: ``N`` points
    (padded to a power of two with group -1) of the operations the graph has."""

    row_group: jnp.ndarray  # [L] operation group of each row (-1: no points)
    point_group: jnp.ndarray  # [N] operation group of each point (-1: padding)
    point_strategy: jnp.ndarray  # [N] strategy index the point was measured under
    point_row: jnp.ndarray  # [N] int32, a graph row of the point's operation (for the model at the point)
    point_batch: jnp.ndarray  # [N] samples of the point's shard
    point_in_channels: jnp.ndarray  # [N]
    point_out_channels: jnp.ndarray  # [N]
    point_in_spatial: jnp.ndarray  # [N, 3] input spatial dims incl. halo, 1 where absent
    point_out_spatial: jnp.ndarray  # [N, 3] output spatial dims, 1 where absent
    point_seconds: jnp.ndarray  # [N] measured forward + backward seconds

    @property
    def point_shapes(self) -> ShardShapes:  # the points as [N, 1] shards
        return ShardShapes(
            batch=self.point_batch[:, None], in_channels=self.point_in_channels[:, None],
            out_channels=self.point_out_channels[:, None], in_spatial=self.point_in_spatial[:, None, :],
            out_spatial=self.point_out_spatial[:, None, :],
        )

    def point_arrays(self, arrays):
        """``arrays`` (the graph's layer arrays) with one row per point: the
        row of a layer of the point's operation (edges unchanged)."""
        rows = self.point_row
        per_layer = {f: jnp.asarray(getattr(arrays, f))[rows] for f in arrays._fields if not f.startswith("edge_")}
        return arrays._replace(**per_layer)


def _fill(lw: np.ndarray, ls: np.ndarray, pts: Points) -> int:
    w = np.log([x for x, _ in pts])
    s = np.log([y for _, y in pts])
    k = len(pts)
    lw[:k], ls[:k] = w, s
    lw[k:], ls[k:] = w[-1], s[-1]
    return k


def calibration_arrays(calibration: Calibration, graph: LayerTable, *, by_layer: bool = False):
    """Align a calibration with a graph's (bucketed) rows.

    Versions 1/2: by layer name, a :class:`CalibrationArrays`; names the
    graph does not have are an error (a calibration for another model).
    Version 3: by operation shape, a :class:`ShapeCalibrationArrays`; points
    of operations the graph does not have are ignored. ``by_layer``: a
    version 3 calibration as per-layer work points
    (:meth:`Calibration.by_layer`, for the oracle's ``[L, 1]`` use)."""
    if calibration.points:
        if by_layer:
            return calibration_arrays(calibration.by_layer(graph), graph)
        return _shape_arrays(calibration, graph)
    unknown = sorted((set(calibration.layers) | set(calibration.strategies)) - set(graph.names))
    if unknown:
        raise ValueError(
            f"calibration names {len(unknown)} layer(s) that model {graph.model_name!r} does not have, "
            f"e.g. {unknown[:3]}; was it measured on another model?"
        )
    rows = int(np.shape(graph.arrays.mask)[0])
    S = len(STRATEGY_NAMES)
    lw, ls, cnt = np.zeros((rows, MAX_WORK_POINTS)), np.zeros((rows, MAX_WORK_POINTS)), np.zeros(rows)
    slw, sls, scnt = np.zeros((rows, S, MAX_WORK_POINTS)), np.zeros((rows, S, MAX_WORK_POINTS)), np.zeros((rows, S))
    index = {n: i for i, n in enumerate(graph.names)}
    for name, pts in calibration.layers.items():
        i = index[name]
        cnt[i] = _fill(lw[i], ls[i], pts)
    for name, own in calibration.strategies.items():
        i = index[name]
        for s, pts in own.items():
            j = STRATEGY_NAMES.index(s)
            scnt[i, j] = _fill(slw[i, j], sls[i, j], pts)
    return CalibrationArrays(*(jnp.asarray(x, jnp.float32) for x in (lw, ls, cnt, slw, sls, scnt)))


def _pad3(v: tuple[float, ...]) -> list[float]:
    return [*v, *([1.0] * (3 - len(v)))]


def _shape_arrays(calibration: Calibration, graph: LayerTable) -> ShapeCalibrationArrays:
    rows = int(np.shape(graph.arrays.mask)[0])
    group_of: dict[tuple[OpKey, LayerDims], int] = {}
    first_row: list[int] = []
    row_group = -np.ones(rows)
    for i, key in enumerate(graph_op_keys(graph, calibration.dtype)):
        if key is None:
            continue
        if key not in group_of:
            group_of[key] = len(first_row)
            first_row.append(i)
        row_group[i] = group_of[key]
    # Repeated measurements of one shard under one strategy: their median.
    merged: dict[tuple[int, str, ShardDims], list[float]] = {}
    for p in calibration.points:
        g = group_of.get((p.op, p.layer))
        if g is not None:
            merged.setdefault((g, p.strategy, p.shard), []).append(p.seconds)
    n = max(8, 1 << max(0, len(merged) - 1).bit_length())  # padded to a power of two: fewer compilations
    group, strat, prow = -np.ones(n), np.zeros(n), np.zeros(n, np.int32)
    b, c, f, sec = np.ones(n), np.ones(n), np.ones(n), np.ones(n)
    sin, sout = np.ones((n, 3)), np.ones((n, 3))
    for k, ((g, s, sh), secs) in enumerate(merged.items()):
        group[k], strat[k], prow[k] = g, STRATEGY_NAMES.index(s), first_row[g]
        b[k], c[k], f[k], sec[k] = sh.batch, sh.in_channels, sh.out_channels, statistics.median(secs)
        sin[k], sout[k] = _pad3(sh.in_spatial), _pad3(sh.out_spatial)
    if merged:  # padding repeats the first point's shard (group -1: never used), so the model sees real shapes
        k = len(merged)
        prow[k:], b[k:], c[k:], f[k:], sec[k:], sin[k:], sout[k:] = prow[0], b[0], c[0], f[0], sec[0], sin[0], sout[0]
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    return ShapeCalibrationArrays(
        row_group=f32(row_group), point_group=f32(group), point_strategy=f32(strat),
        point_row=jnp.asarray(prow, jnp.int32), point_batch=f32(b), point_in_channels=f32(c),
        point_out_channels=f32(f), point_in_spatial=f32(sin), point_out_spatial=f32(sout), point_seconds=f32(sec),
    )


# -- lookup ---------------------------------------------------------------------------------------


def _interp_one(lw, ls, n, x):
    """Piecewise-linear in log-log with end-segment extrapolation; one point set."""
    k = jnp.maximum(n, 1.0).astype(jnp.int32)
    idx = jnp.clip(jnp.searchsorted(lw[:MAX_WORK_POINTS], x), 1, jnp.maximum(k - 1, 1))
    x0, x1 = lw[idx - 1], lw[idx]
    y0, y1 = ls[idx - 1], ls[idx]
    slope = jnp.where(x1 > x0, (y1 - y0) / jnp.where(x1 > x0, x1 - x0, 1.0), 1.0)
    single = ls[0] + (x - lw[0])  # one point: time proportional to work
    return jnp.where(n >= 2, y0 + slope * (x - x0), single)


def calibrated_seconds(cal: CalibrationArrays, work):
    """Version 1/2: interpolated seconds ``[L, S]`` for work ``[L, S]`` (sample-equivalents).

    With one column per strategy (``S`` = the number of strategies) a
    strategy's own points take precedence over the layer's work-only points;
    with any other number of columns (e.g. ``[L, 1]``, the oracle's) only
    the work-only points are used. Entries neither covers are meaningless
    (finite); mask them with :attr:`CalibrationArrays.measured`."""
    x = jnp.log(jnp.maximum(work, 1e-30))
    base = jax.vmap(jax.vmap(_interp_one, in_axes=(None, None, None, 0)))(
        cal.log_work, cal.log_seconds, cal.count, x)
    if x.shape[-1] != cal.strategy_count.shape[-1]:
        return jnp.exp(base)
    own = jax.vmap(jax.vmap(_interp_one))(cal.strategy_log_work, cal.strategy_log_seconds, cal.strategy_count, x)
    return jnp.exp(jnp.where(cal.strategy_count > 0, own, base))


def _close(a, b):
    return jnp.abs(a - b) <= 1e-4 * jnp.maximum(jnp.abs(b), 1.0)


def shape_calibrated_seconds(cal: ShapeCalibrationArrays, shapes: ShardShapes, model_s, point_model_s):
    """Version 3 lookup (module docstring): ``(measured [L, S] bool, seconds
    [L, S])`` for the shards ``shapes`` (``[L, S]``, may be traced), given
    the model's time of every shard ``model_s`` ``[L, S]`` and of every point
    ``point_model_s`` ``[N]`` (the same model at the points' shards).
    ``measured`` is false where the layer's operation has no points; there
    ``seconds`` is ``model_s``. Pure, jittable, differentiable in ``model_s``."""
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    S = model_s.shape[-1]
    g, pg = cal.row_group, cal.point_group
    same = (g[:, None] == pg[None, :]) & (g[:, None] >= 0)  # [L, N] the layer's operation
    same3 = same[:, None, :]  # [L, 1, N]
    exact = (same3
             & _close(shapes.batch[..., None], cal.point_batch)
             & _close(shapes.in_channels[..., None], cal.point_in_channels)
             & _close(shapes.out_channels[..., None], cal.point_out_channels)
             & jnp.all(_close(shapes.in_spatial[:, :, None, :], cal.point_in_spatial), axis=-1)
             & jnp.all(_close(shapes.out_spatial[:, :, None, :], cal.point_out_spatial), axis=-1))  # [L, S, N]
    t = cal.point_seconds  # [N]
    n_exact = jnp.sum(f32(exact), axis=-1)
    exact_s = jnp.sum(jnp.where(exact, t, 0.0), axis=-1) / jnp.maximum(n_exact, 1.0)

    def safe(den):  # a denominator that is 1 where it is 0 (finite gradients where unused)
        return jnp.where(den > 0, den, 1.0)

    strat = jnp.arange(S, dtype=jnp.float32)[None, :, None]
    own = same3 & (cal.point_strategy[None, None, :] == strat)  # [L, S, N]
    n_own = jnp.sum(f32(own), axis=-1, keepdims=True)
    use = jnp.where(n_own >= 2, own, same3)  # the strategy's own trend, else the operation's
    u = f32(use)
    n = jnp.sum(u, axis=-1)  # [L, S]
    x = point_model_s  # [N]
    # Weighted least squares in relative error: weights 1 / t^2 (centered sums for float32).
    w = u / jnp.square(t)
    sw = safe(jnp.sum(w, axis=-1, keepdims=True))
    xm = jnp.sum(w * x, axis=-1, keepdims=True) / sw
    ym = jnp.sum(w * t, axis=-1, keepdims=True) / sw
    sxx = jnp.sum(w * jnp.square(x - xm), axis=-1)
    sxy = jnp.sum(w * (x - xm) * (t - ym), axis=-1)
    xm, ym = xm[..., 0], ym[..., 0]
    spread = sxx > 1e-6 * jnp.sum(w * jnp.square(x), axis=-1)  # x values not all equal
    beta_free = sxy / jnp.where(spread, sxx, 1.0)
    alpha_free = ym - beta_free * xm
    # alpha, beta >= 0: the free optimum, else the better of the two edges (the problem is convex).
    beta_0 = jnp.maximum(jnp.sum(w * x * t, axis=-1), 0.0) / safe(jnp.sum(w * x * x, axis=-1))
    alpha_0 = ym

    def sse(alpha, beta):
        return jnp.sum(w * jnp.square(alpha[..., None] + beta[..., None] * x - t), axis=-1)

    zero = jnp.zeros_like(ym)
    edge_alpha0 = sse(zero, beta_0) <= sse(alpha_0, zero)
    ok = (alpha_free >= 0) & (beta_free >= 0)
    alpha = jnp.where(ok, alpha_free, jnp.where(edge_alpha0, 0.0, alpha_0))
    beta = jnp.where(ok, beta_free, jnp.where(edge_alpha0, beta_0, 0.0))
    fit = alpha + beta * model_s
    # One point (or all at one x): the ratio measured / model there.
    ratio = jnp.sum(u * t, axis=-1) / safe(jnp.sum(u * x, axis=-1))
    trend = jnp.where((n >= 2) & spread, fit, model_s * ratio)
    measured = n > 0
    seconds = jnp.where(n_exact > 0, exact_s, jnp.where(measured, trend, model_s))
    return measured, seconds


ModelFn = Callable[[Any, ShardShapes], Any]  # (layer arrays [L], shards [L, S]) -> [L, S] seconds


def calibrate_compute(cal, arrays, work, shapes: ShardShapes, model_s, model: ModelFn):
    """``(measured [L, S] bool, seconds [L, S])`` of a calibration for the
    cost table. Version 1/2 arrays (:class:`CalibrationArrays`) interpolate
    at ``work`` ``[L, S]`` (sample-equivalents). Version 3 arrays
    (:class:`ShapeCalibrationArrays`) look up ``shapes``
    (:func:`shape_calibrated_seconds`) with the model's time ``model_s``
    ``[L, S]`` of the graph's shards as the regressor, and ``model(arrays,
    shapes)`` (the same compute model, e.g.
    ``costmodels.compute.shard_compute_s(hw, ...).total_s``) gives it at the
    points' shards."""
    if isinstance(cal, CalibrationArrays):
        return cal.measured, calibrated_seconds(cal, work)
    point_model_s = model(cal.point_arrays(arrays), cal.point_shapes)[:, 0]
    return shape_calibrated_seconds(cal, shapes, model_s, point_model_s)
