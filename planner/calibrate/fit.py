"""Fit a :class:`~costmodels.Hardware`'s free parameters to measured step
times by gradient descent on the (differentiable) cost model.

Given a handful of measured training-step times (:class:`StepTime`: a model,
a global batch, a mesh, a plan and the seconds it took), :func:`fit_hardware`
adjusts

* the attained fraction of peak per op class (``efficiency``: conv, matmul,
  elementwise, memory), and
* when some measurement runs on more than one device, every network tier's
  latency and bandwidth,
* on request (``fit=(..., "kernel")``), the kernel model's fixed cost per
  kernel (``launch_s``), its saturation (``saturation_output_elements``),
  the compute/memory exponent, the per-call ``dispatch_s``, and the channel
  tile, which is discrete: the fit runs once per tile of
  :data:`CHANNEL_TILES` and keeps the best (costmodels/compute.py),

to minimise the mean squared error of log time,
``mean_k (log predicted_k - log measured_k)^2``, with Adam (optax). Each
parameter is optimised as its logarithm, so it stays positive. The
prediction of a measurement is :func:`costmodels.iteration_time` of its plan
on :func:`costmodels.cost_table` (the same cost ``shardplan evaluate``
reports), plus one jitted call's ``dispatch_s`` (each measured step is one
call; plans leave it out, as no plan changes it). Parameters that no measurement depends on (a roofline branch no
layer reaches, a tier no collective uses) get zero gradient and keep their
starting values.

The result is plain data: a new ``Hardware`` (efficiencies above 1 are
folded into the peak FLOP/s or the memory bandwidth, which leaves every
predicted time unchanged and keeps the file valid) and the loss history.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from costmodels import (
    MAX_TIERS,
    OP_CLASSES,
    CostSettings,
    Hardware,
    Strategy,
    cost_table,
    hardware_arrays,
    iteration_time,
    one_hot,
    strategy_mask,
)
from planner.evaluation import _choice_from_mapping, uniform_choice
from planner.ir.graph import LayerGraph

__all__ = ["FIT_GROUPS", "FitEvent", "HardwareFit", "StepTime", "fit_hardware"]

FIT_GROUPS = ("efficiency", "network", "kernel")
CHANNEL_TILES = (16.0, 32.0, 64.0, 128.0)  # tile widths of GPU GEMM kernels tried by the "kernel" group
_CHUNK = 100  # Adam steps per compiled scan (progress is reported after each)
_MIN_LATENCY_S = 1e-9  # a zero latency starts here (its log must be finite)


@dataclasses.dataclass(frozen=True)
class StepTime:
    """One measured training step: ``plan`` (a strategy name for every layer,
    or layer name -> strategy name) of ``model`` on a ``mesh = (d, m)`` at
    global ``batch`` took ``seconds``."""

    seconds: float
    batch: int
    mesh: tuple[int, int] = (1, 1)
    plan: str | Mapping[str, str] = "data"
    model: str | None = None  # the graph's model_name; may be omitted when fitting one graph


@dataclasses.dataclass(frozen=True)
class FitEvent:
    """Progress, for a callback to render (library code never prints)."""

    step: int
    steps: int
    loss: float  # mean squared log error at this step


@dataclasses.dataclass(frozen=True)
class HardwareFit:
    hardware: Hardware  # the fitted hardware
    loss_history: tuple[float, ...]  # mean squared log error before each step, then the final one
    measured_s: tuple[float, ...]  # per measurement, as given
    initial_s: tuple[float, ...]  # per measurement, predicted with the starting hardware
    predicted_s: tuple[float, ...]  # per measurement, predicted with the fitted hardware
    fitted: tuple[str, ...]  # the parameter groups fitted (efficiency, network)


def _graph_for(graphs: dict[str, LayerGraph], model: str | None) -> LayerGraph:
    if model is None:
        if len(graphs) != 1:
            raise ValueError(f"a measurement without a model name is ambiguous among {len(graphs)} graphs; "
                             f"set StepTime.model to one of {sorted(graphs)}")
        return next(iter(graphs.values()))
    if model not in graphs:
        raise ValueError(f"measurement names model {model!r}; the graphs given are {sorted(graphs)}")
    return graphs[model]


def _choice(graph: LayerGraph, t: StepTime) -> np.ndarray:
    d, m = (int(x) for x in t.mesh)
    if d < 1 or m < 1:
        raise ValueError(f"mesh {t.mesh} must be two positive integers (data, model)")
    if isinstance(t.batch, bool) or int(t.batch) != t.batch or t.batch < 1 or t.batch % d:
        raise ValueError(f"batch {t.batch!r} must be a positive multiple of the data axis {d}")
    if not (np.isfinite(t.seconds) and t.seconds > 0):
        raise ValueError(f"measured seconds must be positive and finite, got {t.seconds!r}")
    feasible = np.asarray(strategy_mask(graph.arrays, float(t.batch), float(d), float(m)))
    if isinstance(t.plan, str):
        return uniform_choice(feasible, t.plan)
    return _choice_from_mapping(graph, feasible, t.plan)


def _hardware_arrays(base, params, tiers: int):
    """The starting hardware arrays with the fitted parameters put in."""
    def padded(v):  # real tiers, then the last one repeated (network_arrays' padding)
        return jnp.concatenate([v, jnp.repeat(v[-1:], MAX_TIERS - tiers)])

    net = base.network._replace(
        latency_s=padded(jnp.exp(params["log_latency_s"])),
        bandwidth_bytes_per_s=padded(jnp.exp(params["log_bandwidth_bytes_per_s"])),
    )
    return base._replace(
        efficiency=jnp.exp(params["log_efficiency"]), network=net,
        launch_s=jnp.exp(params["log_launch_s"]),
        saturation_output_elements=jnp.exp(params["log_saturation_output_elements"]),
        compute_memory_exponent=1.0 + jnp.exp(params["log_exponent_minus_one"]),
        dispatch_s=jnp.exp(params["log_dispatch_s"]),
    )


def _predict(params, base, tiers, groups, settings):
    """Predicted seconds of every measurement, group by group (one graph each)."""
    hwa = _hardware_arrays(base, params, tiers)

    def one(arrays, b, d, m, probs):  # a measured step is one jitted call: one dispatch
        return iteration_time(cost_table(arrays, hwa, b, d, m, settings), probs) + hwa.dispatch_s

    return jnp.concatenate([
        jax.vmap(one)(g["arrays"], g["batch"], g["d"], g["m"], g["probs"]) for g in groups
    ])


@functools.partial(jax.jit, static_argnames=("tiers", "settings"))
def _predict_all(params, data, tiers, settings):
    groups, _, _, base = data
    return _predict(params, base, tiers, groups, settings)


@functools.partial(jax.jit, static_argnames=("tiers", "settings", "learning_rate", "n"))
def _run(params, state, data, tiers, settings, learning_rate, n):
    """``n`` Adam steps on the log-time error; returns the losses before each."""
    groups, log_measured, trainable, base = data
    tx = optax.adam(learning_rate)

    def loss_fn(p):
        pred = _predict(p, base, tiers, groups, settings)
        return jnp.mean(jnp.square(jnp.log(pred) - log_measured))  # log-time error: relative, scale-free

    def step(carry, _):
        p, s = carry
        loss, grads = jax.value_and_grad(loss_fn)(p)
        grads = {k: jnp.where(trainable[k] > 0, v, 0.0) for k, v in grads.items()}  # frozen groups: no Adam step
        updates, s = tx.update(grads, s, p)
        return (optax.apply_updates(p, updates), s), loss

    (params, state), losses = jax.lax.scan(step, (params, state), None, length=n)
    return params, state, losses


def _result_hardware(hw: Hardware, dtype: str, start, params, fitted: tuple[str, ...], n: int,
                     channel_tile: float) -> Hardware:
    def moved(key):  # which entries the fit changed (the others keep their exact starting values)
        return np.asarray(params[key]) != np.asarray(start[key])

    dev = hw.device
    mode = dev.math_mode(dtype)  # the efficiencies and peak the fit saw are this math mode's
    fitted_eff = dict(zip(OP_CLASSES, np.exp(np.asarray(params["log_efficiency"], np.float64)), strict=True))
    changed = dict(zip(OP_CLASSES, moved("log_efficiency"), strict=True))
    peaks = dict(dev.peak_flops_per_s)
    bandwidth = dev.memory_bandwidth_bytes_per_s
    # Only peak * efficiency enters a compute time (and bandwidth * efficiency a
    # memory time): fold efficiencies above 1 into the peak, times unchanged.
    top = max(fitted_eff["conv"], fitted_eff["matmul"]) if changed["conv"] or changed["matmul"] else 1.0
    if top > 1.0:
        peaks[mode] = peaks[mode] * top
        fitted_eff["conv"] /= top
        fitted_eff["matmul"] /= top
    if changed["elementwise"] and fitted_eff["elementwise"] > 1.0:  # element-wise runs at the float32 peak
        peaks["float32"] = peaks["float32"] * fitted_eff["elementwise"]
        fitted_eff["elementwise"] = 1.0
    if fitted_eff["memory"] > 1.0:
        bandwidth *= fitted_eff["memory"]
        fitted_eff["memory"] = 1.0
    eff = dict(dev.efficiency)
    for c in OP_CLASSES:
        if changed[c]:  # a per-mode entry keeps its other modes
            v = min(float(fitted_eff[c]), 1.0)
            eff[c] = {**eff[c], mode: v} if isinstance(eff[c], dict) else v
    lat = np.exp(np.asarray(params["log_latency_s"], np.float64))
    bw = np.exp(np.asarray(params["log_bandwidth_bytes_per_s"], np.float64))
    tiers = tuple(
        dataclasses.replace(
            t, latency_s=float(a) if da else t.latency_s, bandwidth_bytes_per_s=float(b) if db else t.bandwidth_bytes_per_s
        )
        for t, a, b, da, db in zip(hw.tiers, lat, bw, moved("log_latency_s"), moved("log_bandwidth_bytes_per_s"),
                                   strict=True)
    )
    kernel = dev.kernel
    if "kernel" in fitted:
        value = lambda key: float(np.exp(np.asarray(params[key], np.float64)))  # noqa: E731
        kernel = dataclasses.replace(
            kernel, launch_s=value("log_launch_s"), saturation_output_elements=value("log_saturation_output_elements"),
            compute_memory_exponent=1.0 + value("log_exponent_minus_one"), dispatch_s=value("log_dispatch_s"),
            channel_tile=float(channel_tile))
    device = dataclasses.replace(dev, peak_flops_per_s=peaks, memory_bandwidth_bytes_per_s=float(bandwidth),
                                 efficiency=eff, kernel=kernel)
    return dataclasses.replace(
        hw, name=f"{hw.name}-fitted", device=device, tiers=tiers,
        description=f"{hw.description} (fitted to {n} measured step times: {', '.join(fitted)})".strip(),
        sources=(*hw.sources, f"shardplan fit_hardware: {', '.join(fitted)} fitted to {n} measured step times"),
    )


def fit_hardware(
    graphs: LayerGraph | Sequence[LayerGraph],
    measurements: Sequence[StepTime],
    hardware: Hardware,
    *,
    dtype: str = "float32",
    optimizer: str = "adam",
    fit: Sequence[str] | None = None,
    steps: int = 500,
    learning_rate: float = 0.05,
    callback: Callable[[FitEvent], None] | None = None,
) -> HardwareFit:
    """Fit ``hardware``'s efficiencies (and network tiers) to
    ``measurements`` of ``graphs`` (module docstring). ``fit``: the groups
    to fit, of ``("efficiency", "network", "kernel")``; default: efficiency, plus
    network when some measurement uses more than one device. ``optimizer``
    is the training optimizer the measured steps ran (its state sizes the
    cost model's memory, not the fit)."""
    graph_list = [graphs] if isinstance(graphs, LayerGraph) else list(graphs)
    if not graph_list:
        raise ValueError("give at least one LayerGraph")
    by_name = {g.model_name: g for g in graph_list}
    if len(by_name) != len(graph_list):
        raise ValueError("graphs must have distinct model names (StepTime.model picks one)")
    if not measurements:
        raise ValueError("give at least one measured step time")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    if not learning_rate > 0:
        raise ValueError(f"learning_rate must be positive, got {learning_rate!r}")
    multi = any(int(t.mesh[0]) * int(t.mesh[1]) > 1 for t in measurements)
    fitted = tuple(fit) if fit is not None else (("efficiency", "network") if multi else ("efficiency",))
    bad = [g for g in fitted if g not in FIT_GROUPS]
    if bad or not fitted:
        raise ValueError(f"fit must name one or more of {', '.join(FIT_GROUPS)}, got {list(fitted)}")
    settings = CostSettings(dtype=dtype, optimizer=optimizer)
    base = hardware_arrays(hardware, dtype)

    # group the measurements by bucket (graphs of one padded size share one compiled
    # cost table: their arrays are stacked per measurement), remembering their order
    grouped: dict[tuple, list[int]] = {}
    choices, chosen = [], []
    for k, t in enumerate(measurements):
        g = _graph_for(by_name, t.model)
        choices.append(_choice(g, t))
        chosen.append(g)
        grouped.setdefault((np.shape(g.arrays.mask), np.shape(g.arrays.edge_mask)), []).append(k)
    order = np.concatenate([np.asarray(ix) for ix in grouped.values()])
    groups = []
    for ix in grouped.values():
        groups.append({
            "arrays": jax.tree.map(lambda *xs: jnp.asarray(np.stack(xs), jnp.float32), *[chosen[k].arrays for k in ix]),
            "batch": jnp.asarray([float(measurements[k].batch) for k in ix]),
            "d": jnp.asarray([float(measurements[k].mesh[0]) for k in ix]),
            "m": jnp.asarray([float(measurements[k].mesh[1]) for k in ix]),
            "probs": jnp.stack([one_hot(choices[k], len(Strategy)) for k in ix]),
        })
    measured = np.asarray([float(t.seconds) for t in measurements])
    log_measured = jnp.asarray(np.log(measured[order]), jnp.float32)

    tiers = len(hardware.tiers)
    k = hardware.device.kernel
    params = {
        "log_efficiency": jnp.log(base.efficiency),  # the dtype's math mode (costmodels.Device.math_mode)
        "log_latency_s": jnp.log(jnp.asarray([max(t.latency_s, _MIN_LATENCY_S) for t in hardware.tiers], jnp.float32)),
        "log_bandwidth_bytes_per_s": jnp.log(jnp.asarray([t.bandwidth_bytes_per_s for t in hardware.tiers],
                                                         jnp.float32)),
    }
    kernel_keys = ("log_launch_s", "log_saturation_output_elements", "log_exponent_minus_one", "log_dispatch_s")
    if "kernel" in fitted:  # a zero (or infinite) start is moved to where its log is finite and has a gradient
        start_values = (max(k.launch_s, 1e-7), max(k.saturation_output_elements, 1e3),
                        (k.compute_memory_exponent or 3.0) - 1.0, max(k.dispatch_s, 1e-6))
    else:  # the starting hardware exactly (logs of 0 and of an infinite exponent are frozen, never stepped)
        start_values = (base.launch_s, base.saturation_output_elements, base.compute_memory_exponent - 1.0,
                        base.dispatch_s)
    params.update({key: jnp.log(jnp.float32(v)) for key, v in zip(kernel_keys, start_values, strict=True)})
    trainable = {
        "log_efficiency": jnp.float32("efficiency" in fitted),
        "log_latency_s": jnp.float32("network" in fitted),
        "log_bandwidth_bytes_per_s": jnp.float32("network" in fitted),
        **{key: jnp.float32("kernel" in fitted) for key in kernel_keys},
    }
    start = params
    tiles = CHANNEL_TILES if "kernel" in fitted else (k.channel_tile,)
    total_steps = steps * len(tiles)
    initial = np.asarray(_predict_all(params, (groups, log_measured, trainable, base), tiers, settings), np.float64)
    best = None
    for r, tile in enumerate(tiles):  # the tile is discrete: one fit per candidate, keep the best
        data = (groups, log_measured, trainable, base._replace(channel_tile=jnp.float32(tile)))
        p, state = start, optax.adam(learning_rate).init(start)
        history: list[float] = []
        chunk = min(steps, _CHUNK)
        while len(history) < steps:
            n = min(chunk, steps - len(history))
            p, state, losses = _run(p, state, data, tiers, settings, float(learning_rate), n)
            for loss in np.asarray(losses, np.float64):
                history.append(float(loss))
                if callback is not None:
                    callback(FitEvent(r * steps + len(history), total_steps, float(loss)))
        final = np.asarray(_predict_all(p, data, tiers, settings), np.float64)
        history.append(float(np.mean(np.square(np.log(final) - np.log(measured[order])))))
        if best is None or history[-1] < best[0][-1]:
            best = (history, p, final, tile)
    history, params, final, tile = best
    unsort = np.empty_like(order)
    unsort[order] = np.arange(len(order))
    return HardwareFit(
        hardware=_result_hardware(hardware, dtype, start, params, fitted, len(measurements), tile),
        loss_history=tuple(history),
        measured_s=tuple(float(x) for x in measured),
        initial_s=tuple(float(x) for x in initial[unsort]),
        predicted_s=tuple(float(x) for x in final[unsort]),
        fitted=fitted,
    )
