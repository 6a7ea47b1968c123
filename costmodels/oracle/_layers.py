"""The oracle's view of a model: ParaDL's per-layer table (ParaDL §1, §5),
the ``.lc`` strategy masks, and per-layer compute time (§4.10).

:func:`oracle_layers` turns a :class:`~planner.ir.graph.LayerGraph` into an
:class:`OracleLayers`: one row per layer of the model, in order, without the
``flatten`` rows the ``.net`` importer inserts before FC layers (ParaDL's FC
takes its input unflattened, §1), so the rows correspond one-to-one to the
lines of a ``.net`` file and of its ``.lc`` masks. Each row carries ParaDL's
layer type (CONV, FC, MPOOL, APOOL, RELU, BNORM, ADD, DROPOUT, OTHER), its
input / output / weight element counts per sample, its window, both FLOP
counts (the graph's, and the original code's quirky ``estimate_layer_flop``)
and the DAG edges between rows (flattens bridged).

Compute time per layer (§4.10): with a measured whole-network time per
sample (the ``.net`` files carry one), that time is spread over the layers
by FLOP share; without one, the hardware roofline
(:mod:`costmodels.compute`) at the layer's actual work.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from costmodels.calibration import CalibrationArrays, calibrated_seconds
from costmodels.compute import hardware_arrays, op_class_efficiency, roofline_s
from costmodels.compute import shard_compute_s as kernel_model_s
from costmodels.hardware import Hardware, KernelSpec
from costmodels.layers import LayerKind, LayerTable, layer_type
from costmodels.shards import shard_shapes
from costmodels.strategies import Strategy
from costmodels.transport import IDEAL

__all__ = [
    "MASK_FAMILIES",
    "OracleLayers",
    "compat_flops",
    "layer_compute_s",
    "oracle_calibration",
    "oracle_layers",
    "per_sample_compute_s",
    "shard_compute_s",
    "weight_update_s",
]

MASK_FAMILIES = ("filter", "channel", "spatial")  # what a .lc file can configure (§5)
_INPLACE = ("RELU", "BNORM")  # §4.3: x and y of ReLU / BN are not counted (in-place)


@dataclasses.dataclass(frozen=True)
class OracleLayers:
    """ParaDL's per-layer table of one model; arrays have one entry per row."""

    model_name: str
    names: tuple[str, ...]
    ptypes: tuple[str, ...]  # ParaDL layer type (§5 NAME rule, else from the graph kind)
    kind: np.ndarray  # LayerKind codes
    x_elements: np.ndarray  # |x| per sample
    y_elements: np.ndarray  # |y| per sample
    params: np.ndarray  # |w|
    in_channels: np.ndarray  # C (flattened size for a dense layer)
    out_channels: np.ndarray  # F
    in_spatial: np.ndarray  # [n, 3] graph order (D,) H, W, padded with 1
    out_spatial: np.ndarray  # [n, 3]
    spatial_rank: np.ndarray  # dims of x
    out_spatial_rank: np.ndarray
    kernel: np.ndarray  # [n, 3]
    stride: np.ndarray  # [n, 3]
    dilation: np.ndarray  # [n, 3]
    flops: np.ndarray  # forward + backward FLOPs per sample (the graph's, XLA's counting)
    flops_compat: np.ndarray  # the original's 2 FW + prod(w) (§4.10, quirks of §9.8 kept)
    inplace: np.ndarray  # bool: ReLU / BN rows, left out of ParaDL's Σ|x|, Σ|y| (§4.3)
    source: np.ndarray  # bool: fed only by the model input (no input gradient needed)
    sink: np.ndarray  # bool: no consumer (the model output)
    last_consumer: np.ndarray  # int: the last row reading this row's output (-1 if none)
    measured_time_per_sample_s: float | None
    arrays: Any = None  # the graph's per-layer arrays at these rows (edges dropped), for the kernel model

    @property
    def n(self) -> int:
        return len(self.names)

    def width(self) -> np.ndarray:
        """ParaDL's x[1] / y[1] of a CONV row: the W extent, the last graph
        spatial dim (1 for a flat input) — pairs of (x, y)."""
        return _last_dim(self.in_spatial, self.spatial_rank), _last_dim(self.out_spatial, self.out_spatial_rank)

    def kernel_w(self) -> np.ndarray:
        """ParaDL's w[2]: the kernel along W (0-size windows count as 1)."""
        return _last_dim(self.kernel, self.spatial_rank)


_TRANSFORMER_KINDS = (LayerKind.NORM, LayerKind.ATTENTION, LayerKind.CAUSAL_ATTENTION, LayerKind.EMBED,
                      LayerKind.MULTIPLY)


def _last_dim(a: np.ndarray, rank: np.ndarray) -> np.ndarray:
    idx = np.maximum(rank.astype(int) - 1, 0)
    v = a[np.arange(a.shape[0]), idx]
    return np.where(rank > 0, v, 1.0)


def _ptype(name: str, kind: int) -> str:
    named = layer_type(name)
    if kind == LayerKind.CONV:
        return "CONV"
    if kind == LayerKind.DENSE:
        return "FC"
    if kind == LayerKind.POOL:
        return named if named in ("MPOOL", "APOOL") else "MPOOL"
    if kind == LayerKind.BATCH_NORM:
        return "BNORM"
    if kind == LayerKind.ADD:
        return "ADD"
    if kind == LayerKind.ELEMENTWISE:
        return named if named in ("RELU", "DROPOUT", "ADD") else "RELU"
    return "OTHER"


def compat_flops(kind, in_c, out_c, kernel, out_spatial, x_el, y_el, ptypes) -> np.ndarray:
    """The original ``estimate_layer_flop`` (§4.10): ``2·FW + prod(w)``, with
    CONV FW = 2·C·F·prod(K·Y), pooling C_x·F_y·prod(K·Y) (C², §9.8), RELU and
    ADD prod(y), FC prod(w) (no factor 2, §9.8), BNORM 4·prod(x), others 0."""
    k = np.prod(kernel, axis=-1)
    y_sp = np.prod(out_spatial, axis=-1)
    conv_w = in_c * out_c * k
    fw = np.zeros(len(ptypes))
    w = np.zeros(len(ptypes))
    for i, t in enumerate(ptypes):
        if t == "CONV":
            fw[i], w[i] = 2.0 * conv_w[i] * y_sp[i], conv_w[i]
        elif t in ("MPOOL", "APOOL"):
            fw[i] = in_c[i] * out_c[i] * k[i] * y_sp[i]
        elif t in ("RELU", "ADD"):
            fw[i] = y_el[i]
        elif t == "FC":
            fw[i] = w[i] = in_c[i] * out_c[i]
        elif t == "BNORM":
            fw[i] = 4.0 * x_el[i]
    return 2.0 * fw + w


def oracle_layers(graph: LayerTable) -> OracleLayers:
    """ParaDL's per-layer table of ``graph`` (flatten rows bridged)."""
    a = graph.unpadded()
    n = graph.num_layers
    kind = np.asarray(a.kind, dtype=int)
    # ParaDL's formulas are for CNN layers (ParaDL §5's layer types): a transformer's
    # attention, embeddings, norms and products would be costed as nothing.
    foreign = [i for i in range(n) if kind[i] in _TRANSFORMER_KINDS]
    if foreign:
        kinds = sorted({graph.kind_names[i] for i in foreign})
        raise ValueError(
            f"the ParaDL oracle models CNN layers; model {graph.model_name!r} has {len(foreign)} layer(s) of kind "
            f"{', '.join(kinds)} (e.g. {graph.names[foreign[0]]!r}) it has no formulas for; cost it with "
            "shardplan plan or evaluate (planner.plan / planner.evaluate) instead")
    keep = np.flatnonzero(kind != LayerKind.FLATTEN)
    if keep.size == 0:
        raise ValueError(f"model {graph.model_name!r} has no layers besides flattens")
    row_of = np.full(n, -1)
    row_of[keep] = np.arange(keep.size)
    # A flatten stands for its producer: edges through it are bridged.
    producer = {}
    for s, d in graph.edges:
        if kind[d] == LayerKind.FLATTEN:
            producer[d] = s
    def resolve(i: int) -> int:
        while i in producer:
            i = producer[i]
        return int(row_of[i])
    edges = sorted({(resolve(s), int(row_of[d])) for s, d in graph.edges if kind[d] != LayerKind.FLATTEN})
    edges = [(s, d) for s, d in edges if s >= 0]
    m = keep.size
    has_input = np.zeros(m, bool)
    last = np.full(m, -1)
    for s, d in edges:
        has_input[d] = True
        last[s] = max(last[s], d)
    names = tuple(graph.names[i] for i in keep)
    ptypes = tuple(_ptype(graph.names[i], kind[i]) for i in keep)
    pick = lambda v: np.asarray(v, dtype=np.float64)[keep]
    in_c, out_c = pick(a.in_channels), pick(a.out_channels)
    in_sp, out_sp = pick(a.in_spatial), pick(a.out_spatial)
    x_el, y_el = in_c * np.prod(in_sp, axis=-1), out_c * np.prod(out_sp, axis=-1)
    k = pick(a.kernel)
    return OracleLayers(
        model_name=graph.model_name,
        names=names,
        ptypes=ptypes,
        kind=kind[keep],
        x_elements=x_el,
        y_elements=y_el,
        params=pick(a.params),
        in_channels=in_c,
        out_channels=out_c,
        in_spatial=in_sp,
        out_spatial=out_sp,
        spatial_rank=pick(a.spatial_rank),
        out_spatial_rank=pick(a.out_spatial_rank),
        kernel=k,
        stride=pick(a.stride),
        dilation=pick(a.dilation),
        flops=pick(a.flops_fwd) + pick(a.flops_bwd_data) + pick(a.flops_bwd_weight),
        flops_compat=compat_flops(kind[keep], in_c, out_c, k, out_sp, x_el, y_el, ptypes),
        inplace=np.array([t in _INPLACE for t in ptypes]),
        source=~has_input,
        sink=last < 0,
        last_consumer=last,
        measured_time_per_sample_s=graph.measured_time_per_sample_s,
        arrays=a._replace(**{f: np.asarray(getattr(a, f), np.float64)[keep] for f in a._fields
                             if not f.startswith("edge_")}),
    )


# -- .lc masks (§5) ------------------------------------------------------------------

def per_sample_compute_s(layers: OracleLayers, compat: bool, node_speed_flops_per_s: float) -> np.ndarray | None:
    """Per-layer FW+BW seconds per sample, or ``None`` when it has to come from
    the roofline. Measured: t_sample · flop_l / Σ flop (§4.10; compat uses the
    original's FLOP formula, the default the graph's). Compat without a
    measurement: flop_l / NODE_SPEED, as the original."""
    fl = layers.flops_compat if compat else layers.flops
    t = layers.measured_time_per_sample_s
    if t:
        total = float(np.sum(fl))
        if total <= 0:
            raise ValueError(f"model {layers.model_name!r} has no FLOPs to spread its measured time over")
        return t * fl / total
    if compat:
        return fl / node_speed_flops_per_s
    return None


def layer_compute_s(
    layers: OracleLayers,
    hw: Hardware,
    per_sample: np.ndarray | None,
    samples: float,
    split: np.ndarray | float,
    bytes_per_item: float = 4.0,
    calibration: CalibrationArrays | None = None,
) -> np.ndarray:
    """Seconds per iteration of each layer on one device that runs ``samples``
    samples of it split ``split`` ways (channels, filters or rows).
    Calibrated: linear in the work; roofline otherwise (weights read three
    times and their gradient written once, activations moved 3δ(|x|+|y|)).
    Layers a ``calibration`` (rows aligned with ``layers``) measured take its
    log-log interpolated time at work = samples / split instead
    (:mod:`costmodels.calibration`, ``shardplan profile``)."""
    split = np.broadcast_to(np.asarray(split, dtype=np.float64), (layers.n,))
    work = samples / split
    if per_sample is not None:
        t = per_sample * work
    else:
        hwa = hardware_arrays(hw, "float32")
        acts = 3.0 * bytes_per_item * (layers.x_elements + layers.y_elements) * work
        moved = acts + 4.0 * bytes_per_item * layers.params / split
        eff = op_class_efficiency(hwa, jnp.asarray(layers.kind))
        t = roofline_s(hwa, jnp.asarray(layers.flops * work, jnp.float32), jnp.asarray(moved, jnp.float32), eff)
        t = np.asarray(t, dtype=np.float64)
    if calibration is not None:
        measured = np.asarray(_calibrated_seconds(calibration, jnp.asarray(work[:, None], jnp.float32)), np.float64)
        t = np.where(np.asarray(calibration.count) > 0, measured[:, 0], t)
    return t


_calibrated_seconds = jax.jit(calibrated_seconds)

SPLIT_DIMS = ("filter", "channel", "rows")


def kernel_model_fraction(layers: OracleLayers, hw: Hardware, samples: float, split: np.ndarray,
                          split_dim: str, bytes_per_item: float = 4.0) -> np.ndarray:
    """Each layer's shard time over its whole time on ``samples`` samples,
    ``[n]``, by the kernel model of :mod:`costmodels.compute` (the device's
    ``kernel`` block: tiles, saturation, launches). A layer split ``p`` ways
    along its output channels (``filter``), input channels (``channel``) or
    output rows (``rows``) runs the shard :func:`costmodels.shards.shard_shapes`
    gives that strategy on a ``1 x p`` mesh; the whole layer is its
    ``replicated`` column there."""
    a = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), layers.arrays)
    p = np.asarray(split, np.float64)
    column = {"filter": Strategy.FILTER, "channel": Strategy.CHANNEL, "rows": Strategy.SPATIAL}[split_dim]
    hwa = hardware_arrays(hw, "float32")
    whole = None
    frac = np.ones(layers.n)
    for ways in np.unique(p[p > 1]):  # one split factor in practice (p, or p2 in the hybrids)
        shapes = shard_shapes(a, float(samples), 1.0, float(ways))
        t = np.asarray(kernel_model_s(hwa, a, shapes, bytes_per_item).total_s, np.float64)
        whole = t[:, Strategy.REPLICATED]
        ratio = t[:, column] / np.where(whole > 0, whole, 1.0)
        frac = np.where(p == ways, np.where(whole > 0, ratio, 1.0 / ways), frac)
    return frac


def shard_compute_s(
    layers: OracleLayers,
    hw: Hardware,
    per_sample: np.ndarray | None,
    samples: float,
    split: np.ndarray | float,
    split_dim: str = "filter",
    bytes_per_item: float = 4.0,
    calibration: CalibrationArrays | None = None,
) -> np.ndarray:
    """Seconds per iteration of each layer's shard on one device: the one
    place the oracle's default mode costs split compute.

    The whole layer's time (:func:`layer_compute_s`: the measured per-sample
    time by FLOP share, or the roofline) times the shard's fraction, plus a
    fixed cost per pass that no split divides:

        t_l = T_l(samples) · frac_l + passes_l · kernel_fixed_s

    frac_l for a layer split p_l ways along ``split_dim`` (filter, channel
    or rows) is the shard's time over the whole layer's in the device's
    kernel model (:func:`kernel_model_fraction`, :mod:`costmodels.compute`:
    tile quantisation and saturation make a narrow shard run below peak,
    ParaDL §8 "barely changes"); on a device without a kernel block it is
    ParaDL's ideal 1/p for filter / channel (§4.6) and ⌈H/p⌉/H for rows (a
    device owns whole rows). Unsplit layers: 1. passes_l = 3 (forward,
    backward-data, backward-weight) for layers with weights, else 2;
    kernel_fixed_s is the framework's cost per pass, from the hardware's
    environment (``shard_compute``; 0 without one). Layers a
    ``calibration`` measured keep its time at work = samples / split."""
    if split_dim not in SPLIT_DIMS:
        raise ValueError(f"unknown split dimension {split_dim!r}; expected one of {', '.join(SPLIT_DIMS)}")
    sc = (hw.environment if hw.environment is not None else IDEAL).shard_compute
    split = np.broadcast_to(np.asarray(split, dtype=np.float64), (layers.n,))
    ideal = layer_compute_s(layers, hw, per_sample, samples, split, bytes_per_item)  # T_l(samples) / p_l
    if hw.device.kernel != KernelSpec() and layers.arrays is not None:  # the device's kernel model
        frac = kernel_model_fraction(layers, hw, samples, split, split_dim, bytes_per_item)
    elif split_dim == "rows":  # whole output rows per device
        rows = np.maximum(layers.out_spatial[:, 0], 1.0)
        frac = np.ceil(rows / split) / rows
    else:  # ParaDL's ideal split (ParaDL §4.6)
        frac = 1.0 / np.maximum(split, 1.0)
    t = ideal * np.where(split > 1, frac * split, 1.0)  # T_l·frac_l as (T_l/p_l)·p_l·frac_l: the roofline's bytes kept
    t = t + np.where(layers.params > 0, 3.0, 2.0) * sc.kernel_fixed_s
    if calibration is not None:
        measured = layer_compute_s(layers, hw, per_sample, samples, split, bytes_per_item, calibration)
        t = np.where(np.asarray(calibration.count) > 0, measured, t)
    return t


def oracle_calibration(calibration: CalibrationArrays, graph: LayerTable, layers: OracleLayers) -> CalibrationArrays:
    """``calibration`` (aligned with ``graph``'s rows by
    :func:`costmodels.calibration_arrays`) re-aligned with the oracle's rows
    (flatten rows, which the oracle bridges, dropped)."""
    index = {name: i for i, name in enumerate(graph.names)}
    rows = np.asarray([index[name] for name in layers.names])
    return CalibrationArrays(*(jnp.asarray(np.asarray(x)[rows]) for x in calibration))


def weight_update_s(hw: Hardware, params: float, optimizer_slots: int, bytes_per_item: float = 4.0) -> float:
    """An optimizer step is memory-bound: read w and dL/dw, write w, and read
    and write each optimizer slot: (3 + 2·slots)·δ·|w| bytes at the
    attained HBM bandwidth (the WU term of §4.1, which the original drops)."""
    if params <= 0:
        return 0.0
    bw = hw.device.memory_bandwidth_bytes_per_s * hw.device.efficiency["memory"]
    return (3.0 + 2.0 * optimizer_slots) * bytes_per_item * params / bw

