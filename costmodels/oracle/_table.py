"""The ParaDL oracle's table (ParaDL §3-§4): every parallelization strategy at
every device count (:func:`oracle_table`), each row with the one-line
bottleneck that bounds it, from the evaluation context
(:func:`oracle_context`) and the formulas of the mode it asks for
(:mod:`costmodels.oracle._default`, or :mod:`costmodels.oracle._compat` with
``compat=True``; pipeline parallelism in :mod:`costmodels.oracle._pipeline`).
:mod:`costmodels.oracle` describes the modes and the batch convention.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np

from costmodels.calibration import CalibrationArrays
from costmodels.hardware import MAX_DEVICES, Hardware
from costmodels.oracle import _compat, _default
from costmodels.oracle._compat import PARADL_COMPAT
from costmodels.oracle._cost import COMM_KINDS, COMM_LABELS, OracleContext, StrategyCost
from costmodels.oracle._layers import OracleLayers, per_sample_compute_s
from costmodels.oracle._masks import resolve_masks
from costmodels.oracle._pipeline import pipeline
from costmodels.table import OPTIMIZER_SLOTS

__all__ = [
    "STRATEGIES",
    "bottleneck",
    "default_batch_per_device",
    "format_gb",
    "oracle_context",
    "oracle_table",
    "parse_strategies",
    "replicas",
    "strategy_cost",
]

STRATEGIES = ("data", "spatial", "filter", "channel", "pipeline", "data+filter", "data+spatial")
_ALIASES = {"d": "data", "s": "spatial", "f": "filter", "c": "channel", "p": "pipeline",
            "df": "data+filter", "ds": "data+spatial", "filter+data": "data+filter",
            "spatial+data": "data+spatial", "layer": "pipeline"}


def parse_strategies(names: Sequence[str] | None) -> tuple[str, ...]:
    """Canonical strategy names (ParaDL's letters d, s, f, c, p, df, ds
    accepted), all seven by default."""
    if not names:
        return STRATEGIES
    out = []
    for name in names:
        key = _ALIASES.get(name.strip().lower(), name.strip().lower())
        if key not in STRATEGIES:
            raise ValueError(
                f"unknown strategy {name!r}; choose from {', '.join(STRATEGIES)} (or d, s, f, c, p, df, ds)"
            )
        if key not in out:
            out.append(key)
    return tuple(out)


def oracle_context(
    layers: OracleLayers,
    hardware: Hardware,
    *,
    compat: bool = False,
    masks: Mapping[str, Sequence[bool] | np.ndarray] | None = None,
    dataset_size: int | None = None,
    optimizer: str = "sgd",
    calibration: CalibrationArrays | None = None,
) -> OracleContext:
    """The evaluation context: masks resolved, per-layer compute calibrated
    (§4.10). ``calibration``: measured per-layer times (rows aligned with
    ``layers``, :func:`costmodels.oracle.oracle_calibration`) that
    override the compute of the layers they measured; default mode only."""
    if calibration is not None and compat:
        raise ValueError("a calibration cannot be used in compat mode (it reproduces ParaDL's own compute model); "
                         "drop --compat or --calibration")
    if optimizer not in OPTIMIZER_SLOTS:
        raise ValueError(f"unknown optimizer {optimizer!r}; choose from {', '.join(OPTIMIZER_SLOTS)}")
    if dataset_size is not None and dataset_size < 1:
        raise ValueError(f"dataset size must be a positive number of samples, got {dataset_size}")
    return OracleContext(
        layers=layers,
        hardware=hardware,
        compat=compat,
        masks=resolve_masks(layers, compat, masks),
        per_sample_s=per_sample_compute_s(layers, compat, PARADL_COMPAT["node_speed_flops_per_s"]),
        dataset_size=dataset_size,
        optimizer_slots=0 if compat else OPTIMIZER_SLOTS[optimizer],
        bytes_per_item=PARADL_COMPAT["bytes_per_item"],
        calibration=calibration,
    )


def replicas(strategy: str, p: int, devices_per_node: int) -> float:
    """Data-parallel replicas that split the global batch: p (data), p/p2
    (hybrids, p2 = one node), 1 (the others)."""
    if strategy == "data":
        return float(p)
    if strategy in ("data+filter", "data+spatial"):
        return p / min(p, devices_per_node)
    return 1.0


def default_batch_per_device(ctx: OracleContext) -> int:
    """ParaDL's default b: the largest power of two of samples per device that
    data parallelism fits in memory (§4.2), at least 1."""
    L = ctx.layers
    keep = ~L.inplace
    act = float((L.x_elements + L.y_elements)[keep].sum())
    W = float(L.params.sum())
    d = ctx.bytes_per_item
    b_max = (ctx.capacity_bytes / d / 2 - W * (1 + ctx.optimizer_slots / 2)) / act
    return 1 if b_max < 2 else 2 ** math.floor(math.log2(b_max))


def strategy_cost(ctx: OracleContext, strategy: str, p: int, b: float, segments: int | None = None) -> StrategyCost:
    """One strategy on p devices, b samples per device (module docstring)."""
    if p < 1:
        raise ValueError(f"device counts must be positive integers, got {p}")
    if strategy == "pipeline":
        return pipeline(ctx, p, b, segments)
    formulas = _compat if ctx.compat else _default  # the original's formulas, or the corrected ones
    if strategy in ("filter", "channel"):
        return formulas.filter_or_channel(ctx, p, b, strategy)
    one = {"data": formulas.data, "spatial": formulas.spatial, "data+filter": formulas.data_filter,
           "data+spatial": formulas.data_spatial}.get(strategy)
    if one is None:
        raise ValueError(f"no formula for strategy {strategy!r}")
    return one(ctx, p, b)


def oracle_table(
    ctx: OracleContext,
    devices: Sequence[int],
    strategies: Sequence[str] = STRATEGIES,
    *,
    batch_per_device: float | None = None,
    batch: float | None = None,
    segments: int | None = None,
) -> tuple[StrategyCost, ...]:
    """Every strategy at every device count, with bottlenecks, strategy-major."""
    if batch is not None and batch_per_device is not None:
        raise ValueError("give either batch (global) or batch_per_device, not both")
    if batch is not None and not batch > 0:
        raise ValueError(f"batch must be positive, got {batch}")
    if batch_per_device is not None and not batch_per_device > 0:
        raise ValueError(f"batch per device must be positive, got {batch_per_device}")
    if segments is not None and segments < 1:
        raise ValueError(f"segments must be a positive integer, got {segments}")
    devices = sorted({int(p) for p in devices})
    if not devices or devices[0] < 1:
        raise ValueError("give one or more positive device counts, e.g. 16,32,64")
    if devices[-1] > MAX_DEVICES:
        raise ValueError(f"device count {devices[-1]} is more than {MAX_DEVICES} (2^20), the most a plan may span")
    strategies = parse_strategies(strategies)
    if batch is None and batch_per_device is None:
        batch_per_device = default_batch_per_device(ctx)
    rows: list[StrategyCost] = []
    for s in strategies:
        group = []
        for p in devices:
            b = batch_per_device if batch is None else batch / replicas(s, p, ctx.devices_per_node)
            group.append(strategy_cost(ctx, s, p, float(b), segments))
        rows.extend(dataclasses.replace(r, bottleneck=bottleneck(r, group)) for r in group)
    return tuple(rows)


def format_gb(nbytes: float) -> str:
    """Decimal gigabytes, as the issue's "17.2 GB > 16 GB"."""
    return f"{nbytes / 1e9:.3g} GB" if nbytes < 1e11 else f"{nbytes / 1e9:.0f} GB"


def bottleneck(row: StrategyCost, group: Sequence[StrategyCost] = ()) -> str:
    """One line on what bounds ``row``: the broken limit; running out of
    memory (with where it starts, from the other device counts of its
    strategy in ``group``); or the largest share of the iteration time."""
    if row.limit:
        return row.limit
    if not row.fits_memory:
        mem = f"{format_gb(row.memory_bytes_per_device)} > {format_gb(row.memory_capacity_bytes)}"
        same = sorted((r for r in group if r.strategy == row.strategy and r.limit is None), key=lambda r: r.devices)
        fits = [r.devices for r in same if r.fits_memory]
        oom = [r.devices for r in same if not r.fits_memory]
        if fits and oom and max(fits) < min(oom):
            return f"out of memory above {max(fits)} GPUs: {mem}"
        if fits and oom and min(fits) > max(oom):
            return f"out of memory below {min(fits)} GPUs: {mem}"
        return f"out of memory at {row.devices} GPUs: {mem}"
    total = row.total_s
    if total <= 0:
        return "nothing to run"
    parts = [("compute", row.compute_s, ""), ("weight update", row.weight_update_s, "")]
    parts += [(COMM_LABELS[k], getattr(row, f"{k}_s"), row.tier_of(k)) for k in COMM_KINDS]
    label, value, where = max(parts, key=lambda t: t[1])
    over = f" over {where}" if where else ""
    return f"{label}{over}: {100 * value / total:.0f}%"
