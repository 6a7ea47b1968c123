"""Fit a :class:`~costmodels.Hardware`'s free parameters to measured step
times by gradient descent on the (differentiable) cost model.

Given a handful of measured training-step times (:class:`StepTime`: a model,
a global batch, a mesh, a plan and the seconds it took), :func:`fit_hardware`
adjusts

* the attained fraction of peak per op class (``efficiency``: conv, matmul,
  elementwise, memory), and
* when some measurement runs on more than one device, every network tier's
  latency and bandwidth,

to minimise the mean squared error of log time,
``mean_k (log predicted_k - log measured_k)^2``, with Adam (optax). Each
parameter is optimised as its logarithm, so it stays positive. The
prediction of a measurement is :func:`costmodels.iteration_time` of its plan
on :func:`costmodels.cost_table` (the same cost ``shardplan evaluate``
reports). Parameters that no measurement depends on (a roofline branch no
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

from costmodels.collectives import MAX_TIERS
from costmodels.compute import hardware_arrays
from costmodels.evaluate import iteration_time, one_hot
from costmodels.hardware import OP_CLASSES, Hardware
from costmodels.strategies import Strategy, strategy_mask
from costmodels.table import CostSettings, cost_table
from planner.evaluate import _choice_from_mapping, uniform_choice
from planner.graph import LayerGraph

__all__ = ["FIT_GROUPS", "FitEvent", "HardwareFit", "StepTime", "fit_hardware"]

FIT_GROUPS = ("efficiency", "network")
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
    return base._replace(efficiency=jnp.exp(params["log_efficiency"]), network=net)


def _predict(params, base, tiers, groups, settings):
    """Predicted seconds of every measurement, group by group (one graph each)."""
    hwa = _hardware_arrays(base, params, tiers)

    def one(arrays, b, d, m, probs):
        return iteration_time(cost_table(arrays, hwa, b, d, m, settings), probs)

    return jnp.concatenate([
        jax.vmap(one, in_axes=(None, 0, 0, 0, 0))(g["arrays"], g["batch"], g["d"], g["m"], g["probs"]) for g in groups
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
        grads = {k: v * trainable[k] for k, v in grads.items()}  # frozen groups: zero gradient, no Adam step
        updates, s = tx.update(grads, s, p)
        return (optax.apply_updates(p, updates), s), loss

    (params, state), losses = jax.lax.scan(step, (params, state), None, length=n)
    return params, state, losses


def _result_hardware(hw: Hardware, dtype: str, start, params, fitted: tuple[str, ...], n: int) -> Hardware:
    def moved(key):  # which entries the fit changed (the others keep their exact starting values)
        return np.asarray(params[key]) != np.asarray(start[key])

    eff = dict(hw.device.efficiency)
    fitted_eff = np.exp(np.asarray(params["log_efficiency"], np.float64))
    for c, v, changed in zip(OP_CLASSES, fitted_eff, moved("log_efficiency"), strict=True):
        if changed:
            eff[c] = float(v)
    peaks = dict(hw.device.peak_flops_per_s)
    bandwidth = hw.device.memory_bandwidth_bytes_per_s
    # Only peak * efficiency enters a compute time (and bandwidth * efficiency a
    # memory time): fold efficiencies above 1 into the peak, times unchanged.
    top = max(eff["conv"], eff["matmul"], eff["elementwise"])
    if top > 1.0:
        peaks[dtype] = peaks[dtype] * top
        for c in ("conv", "matmul", "elementwise"):
            eff[c] /= top
    if eff["memory"] > 1.0:
        bandwidth *= eff["memory"]
        eff["memory"] = 1.0
    eff = {c: min(v, 1.0) for c, v in eff.items()}
    lat = np.exp(np.asarray(params["log_latency_s"], np.float64))
    bw = np.exp(np.asarray(params["log_bandwidth_bytes_per_s"], np.float64))
    tiers = tuple(
        dataclasses.replace(
            t, latency_s=float(a) if da else t.latency_s, bandwidth_bytes_per_s=float(b) if db else t.bandwidth_bytes_per_s
        )
        for t, a, b, da, db in zip(hw.tiers, lat, bw, moved("log_latency_s"), moved("log_bandwidth_bytes_per_s"),
                                   strict=True)
    )
    device = dataclasses.replace(hw.device, peak_flops_per_s=peaks, memory_bandwidth_bytes_per_s=float(bandwidth),
                                 efficiency=eff)
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
    to fit, of ``("efficiency", "network")``; default: efficiency, plus
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

    # group the measurements by graph, remembering their order
    grouped: dict[str, list[int]] = {}
    choices = []
    for k, t in enumerate(measurements):
        g = _graph_for(by_name, t.model)
        choices.append(_choice(g, t))
        grouped.setdefault(g.model_name, []).append(k)
    order = np.concatenate([np.asarray(ix) for ix in grouped.values()])
    groups = []
    for name, ix in grouped.items():
        g = by_name[name]
        groups.append({
            "arrays": jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), g.arrays),
            "batch": jnp.asarray([float(measurements[k].batch) for k in ix]),
            "d": jnp.asarray([float(measurements[k].mesh[0]) for k in ix]),
            "m": jnp.asarray([float(measurements[k].mesh[1]) for k in ix]),
            "probs": jnp.stack([one_hot(choices[k], len(Strategy)) for k in ix]),
        })
    measured = np.asarray([float(t.seconds) for t in measurements])
    log_measured = jnp.asarray(np.log(measured[order]), jnp.float32)

    tiers = len(hardware.tiers)
    e = hardware.device.efficiency
    params = {
        "log_efficiency": jnp.log(jnp.asarray([e[c] for c in OP_CLASSES], jnp.float32)),
        "log_latency_s": jnp.log(jnp.asarray([max(t.latency_s, _MIN_LATENCY_S) for t in hardware.tiers], jnp.float32)),
        "log_bandwidth_bytes_per_s": jnp.log(jnp.asarray([t.bandwidth_bytes_per_s for t in hardware.tiers],
                                                         jnp.float32)),
    }
    trainable = {
        "log_efficiency": jnp.float32("efficiency" in fitted),
        "log_latency_s": jnp.float32("network" in fitted),
        "log_bandwidth_bytes_per_s": jnp.float32("network" in fitted),
    }
    start = params
    data = (groups, log_measured, trainable, base)
    state = optax.adam(learning_rate).init(params)
    initial = np.asarray(_predict_all(params, data, tiers, settings), np.float64)
    history: list[float] = []
    chunk = min(steps, _CHUNK)
    while len(history) < steps:
        n = min(chunk, steps - len(history))
        params, state, losses = _run(params, state, data, tiers, settings, float(learning_rate), n)
        for loss in np.asarray(losses, np.float64):
            history.append(float(loss))
            if callback is not None:
                callback(FitEvent(len(history), steps, float(loss)))
    final = np.asarray(_predict_all(params, data, tiers, settings), np.float64)
    history.append(float(np.mean(np.square(np.log(final) - np.log(measured[order])))))
    unsort = np.empty_like(order)
    unsort[order] = np.arange(len(order))
    return HardwareFit(
        hardware=_result_hardware(hardware, dtype, start, params, fitted, len(measurements)),
        loss_history=tuple(history),
        measured_s=tuple(float(x) for x in measured),
        initial_s=tuple(float(x) for x in initial[unsort]),
        predicted_s=tuple(float(x) for x in final[unsort]),
        fitted=fitted,
    )
