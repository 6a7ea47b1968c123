"""Choosing the H200 kernel model's constants from the per-layer rows, and
scoring the choice on rows left out (benchmarks/fidelity.py, docs/fidelity.md).

Every row is predicted by the library's own compute model
(:func:`costmodels.compute.shard_compute_s`) on its shard graph (fidelity.py's
``shard_graph``), plus one jitted call's dispatch; all rows are evaluated at
once (one jitted, vmapped function), so a fit is cheap and many are affordable.

Two kinds of constants:

* fitted: the attained fraction of peak per math mode (tf32, bfloat16) and the
  saturation half-point, by Adam on the mean squared log error of the
  training rows (the bfloat16 fraction as its ratio to tf32's, which stays 1,
  the same fraction of each mode's peak, where no bfloat16 row trains it);
* chosen from a grid: the dispatch of one jitted call and the fixed cost of
  one convolution library call (the grid also takes channel tiles and
  compute/memory exponents; it holds the ones chosen before, 64 and 2, as
  trying others multiplies the fits). Within one kind of layer the dispatch
  and the convolution call are one constant (every row of a kind runs the
  same calls), so no fit separates them: each grid point is fitted on all
  rows but one kind and scored on the kind left out, and the point with the
  least left-out error is kept, scored on the kinds whose training set holds
  every dtype (here: dense left out, predicted from the convolutions; the
  convolutions left out are trained by one float32 dense layer alone, which
  fixes no bfloat16 efficiency, and are reported only).

Fixed from their sources, not fitted: the launch cost per kernel (the preset's
``launch_s``), the tiles of the reduction dim, and the convolution layouts.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

TILES = (64.0,)  # chosen among 16-128 by leave-one-layer-out error (docs/fidelity.md)
EXPONENTS = (2.0,)  # chosen among 1, 1.5, 2, 3, 4 and max (docs/fidelity.md)
DISPATCH_S = (2e-5, 4e-5, 6e-5, 8e-5, 1.2e-4, 1.9e-4)
CONV_CALL_S = (0.0, 1e-5, 2e-5, 3e-5, 4e-5, 6e-5)
STEPS = 250


class RowSet:
    """Every row as stacked arrays: the shard graph's layer arrays, its batch,
    its dtype's element size and math mode, and the measured seconds."""

    def __init__(self, rows: Sequence[dict], shard_graph, hardware: str = "h200"):
        from costmodels import hardware_arrays, load_hardware
        from costmodels.compute import DTYPE_BYTES

        self.rows = list(rows)
        self.hw = load_hardware(hardware)
        graphs = [shard_graph(r) for r in rows]
        names = [list(g.names) for g in graphs]
        if any(n != ["layer", "relu"] for n in names):
            raise ValueError("every shard graph must be exactly layer -> relu")
        # the two real layers of each graph (the rest is bucket padding), stacked over rows
        self.arrays = jax.tree.map(lambda *xs: jnp.asarray(np.stack(xs)[:, :2], jnp.float32),
                                   *[g.arrays for g in graphs])
        self.batch = jnp.asarray([float(r["shard"]["b"]) for r in rows], jnp.float32)
        self.delta = jnp.asarray([DTYPE_BYTES[r["dtype"]] for r in rows], jnp.float32)
        self.bf16 = jnp.asarray([r["dtype"] != "float32" for r in rows], jnp.float32)
        self.log_measured = jnp.asarray(np.log([r["fwd_bwd_s"] for r in rows]), jnp.float32)
        per_dtype = {dt: hardware_arrays(self.hw, dt) for dt in ("float32", "bfloat16")}
        self.hwa = jax.tree.map(lambda *xs: jnp.stack(xs), *[per_dtype[r["dtype"]] for r in rows])
        self.kind = np.array([r["kind"] for r in rows])
        self.layer_name = np.array([r["layer"] for r in rows])
        self.dtype = np.array([r["dtype"] for r in rows])


def _predict(params, hyper, data):
    """Log predicted seconds of every row at ``params`` (fitted, logs) and
    ``hyper`` (tile, exponent, dispatch, conv call)."""
    from costmodels.compute import shard_compute_s
    from costmodels.shards import shard_shapes

    arrays, batch, delta, bf16, hwa = data
    tile, exponent, dispatch, conv_call = hyper
    eff = jnp.exp(params["log_eff_tf32"] + bf16 * params["log_bf16_ratio"])  # [rows]

    def one(a, b, dl, e, h):
        h = h._replace(efficiency=h.efficiency.at[0].set(e).at[1].set(e), channel_tile=tile,
                       compute_memory_exponent=exponent, conv_call_s=conv_call,
                       saturation_output_elements=jnp.exp(params["log_saturation"]))
        sh = jax.tree.map(lambda x: x[:, :1], shard_shapes(a, b, 1.0, 1.0))  # the data strategy on one device
        return jnp.log(jnp.sum(shard_compute_s(h, a, sh, dl).total_s) + dispatch)

    return jax.vmap(one)(arrays, batch, delta, eff, hwa)


@jax.jit
def _fit(start, hypers, data, log_measured, weight):
    """Adam on the weighted mean squared log error, one fit per grid point
    (vmapped over ``hypers``); returns the fitted params per point."""
    opt = optax.adam(0.08)

    def fit_one(hyper):
        def loss(p):
            r = _predict(p, hyper, data) - log_measured
            return jnp.sum(weight * r * r) / jnp.maximum(jnp.sum(weight), 1.0)

        def step(carry, _):
            p, s = carry
            g = jax.grad(loss)(p)
            u, s = opt.update(g, s, p)
            return (optax.apply_updates(p, u), s), None

        (p, _), _ = jax.lax.scan(step, (start, opt.init(start)), None, length=STEPS)
        return p

    return jax.vmap(fit_one)(hypers)


_predict_many = jax.jit(jax.vmap(_predict, in_axes=(0, 0, None)))


class Choice:
    """Every grid point fitted on one training set: its params and its log
    predictions of every row."""

    def __init__(self, rs: RowSet, train: np.ndarray, grid: np.ndarray):
        k = rs.hw.device.kernel
        eff = rs.hw.device.efficiency_of("conv", "tf32")
        start = {"log_eff_tf32": jnp.log(jnp.float32(eff)), "log_bf16_ratio": jnp.float32(0.0),
                 "log_saturation": jnp.log(jnp.float32(max(k.saturation_output_elements, 1e3)))}
        data = (rs.arrays, rs.batch, rs.delta, rs.bf16, rs.hwa)
        hypers = tuple(jnp.asarray(grid[:, c], jnp.float32) for c in range(4))
        self.params = _fit(start, hypers, data, rs.log_measured, jnp.asarray(train, jnp.float32))
        self.log_pred = np.asarray(_predict_many(self.params, hypers, data))  # [grid, rows]


def grid() -> np.ndarray:
    """[points, 4] tile, exponent, dispatch seconds, conv call seconds."""
    return np.asarray(list(itertools.product(TILES, EXPONENTS, DISPATCH_S, CONV_CALL_S)), np.float64)


def _relative(log_pred, rs: RowSet) -> np.ndarray:
    return np.abs(np.exp(log_pred - np.asarray(rs.log_measured)) - 1.0)


def choose(rs: RowSet) -> dict:
    """Fit every grid point leaving out each layer kind and each layer, and on
    all rows; choose the grid point by the left-out error over both kinds
    (module docstring). Returns per row the relative error in-sample,
    leaving its kind out and leaving its layer out, at the chosen point, and
    the chosen constants."""
    g = grid()
    n = len(rs.rows)
    measured = np.asarray(rs.log_measured)

    def left_out(key: np.ndarray, points: np.ndarray) -> np.ndarray:  # [points, rows] log predictions
        pred = np.zeros((len(points), n))
        for value in sorted(set(key)):
            out = key == value
            pred[:, out] = Choice(rs, ~out, points).log_pred[:, out]
        return pred

    by_kind = left_out(rs.kind, g)
    # the point whose left-out-kind predictions have the least mean squared log error, over the
    # kinds whose training set (every other kind) holds every dtype: a training set without a
    # dtype leaves its efficiency at the prior and scores the prior, not the choice
    scored = np.array([set(rs.dtype[rs.kind != k]) == set(rs.dtype) for k in rs.kind])
    best = int(np.argmin(np.mean(np.square(by_kind[:, scored] - measured[None, scored]), axis=1)))
    by_layer = left_out(rs.layer_name, g[best:best + 1])[0]
    full = Choice(rs, np.ones(n, bool), g[best:best + 1])
    params = {k: float(np.exp(v[0])) for k, v in full.params.items()}
    tile, exponent, dispatch, conv_call = (float(x) for x in g[best])
    return {
        "constants": {"channel_tile": tile, "compute_memory_exponent": exponent, "dispatch_s": dispatch,
                      "conv_call_s": conv_call, "efficiency_tf32": params["log_eff_tf32"],
                      "efficiency_bfloat16": params["log_eff_tf32"] * params["log_bf16_ratio"],
                      "saturation_output_elements": params["log_saturation"]},
        "in_sample": _relative(full.log_pred[0], rs),
        "leave_kind_out": _relative(by_kind[best], rs),
        "leave_layer_out": _relative(by_layer, rs),
        "grid_points": len(g),
    }


COLUMNS = ("in_sample", "leave_layer_out", "leave_kind_out")


def report_lines(res: dict, rs: RowSet) -> tuple[list[str], list[dict]]:
    """Median and 90th percentile per dtype (and per kind) of each column,
    side by side, as printed lines and as rows."""
    head = f"{'rows':<20}{'n':>4}" + "".join(f"{c + ' med':>22}{c + ' p90':>22}" for c in COLUMNS)
    lines = [f"The kernel model's constants chosen from the rows ({res['grid_points']} grid points, by the error "
             f"leaving each layer kind out): {res['constants']}; error in-sample and left out", head]
    table = []
    for dt in ("float32", "bfloat16"):
        for kind in (None, "conv", "dense"):
            mask = (rs.dtype == dt) & (True if kind is None else rs.kind == kind)
            if not mask.any() or (kind is not None and mask.sum() == (rs.dtype == dt).sum()):
                continue
            label = f"{dt} {kind or 'all'}"
            row = {"rows": label, "n": int(mask.sum())}
            for c in COLUMNS:
                row[f"{c}_median"] = float(np.median(res[c][mask]))
                row[f"{c}_p90"] = float(np.percentile(res[c][mask], 90))
            table.append(row)
            lines.append(f"{label:<20}{row['n']:>4}" + "".join(
                f"{row[c + '_median'] * 100:>21.1f}%{row[c + '_p90'] * 100:>21.1f}%" for c in COLUMNS))
    return lines, table
