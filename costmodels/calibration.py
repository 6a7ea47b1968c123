"""Measured shard times that override the compute model.

Version 3 (what ``shardplan profile`` writes) keys every measured point by
the **operation shape**: the op (layer kind, spatial rank, dtype, kernel
window, stride, dilation, feature groups, pooling type), the unsharded
layer's dimensions (input and output channels, input and output spatial
dims) and the shard one device ran (samples ``b``, input channels ``c``,
output channels ``f``, input spatial dims incl. halo rows, output spatial
dims, as :class:`costmodels.shards.ShardShapes` gives them). Every layer of a
graph with the same op and layer dimensions shares the points, so a point
measured on VGG16's conv10 serves conv11 and conv12. The file records the
device it was measured on; using it for other hardware is refused unless
asked for (:func:`check_hardware`).

```json
{"schema": "shardplan/calibration", "version": 3, "dtype": "float32",
 "device": {"preset": "h200", "name": "NVIDIA H200"},
 "points": [{"op": {"kind": "conv", "rank": 2, "dtype": "float32", "kernel": [3, 3], "stride": [1, 1],
                    "dilation": [1, 1], "groups": 1},
             "layer": {"C": 512, "F": 512, "in": [14, 14], "out": [14, 14]},
             "strategy": "filter",
             "shard": {"b": 64, "c": 512, "f": 256, "in": [14, 14], "out": [14, 14]},
             "seconds": 6.2e-4}]}
```

Lookup of a layer's shard under a strategy (:func:`shape_calibrated_seconds`):

1. a point of the same operation with exactly the shard's dimensions: its
   measured seconds (the mean over such points);
2. else, the operation's points: the strategy's own if it has at least 2,
   else all the operation's points; with 2 or more a latency-plus-throughput
   line ``t = alpha + beta * x`` (Hockney's alpha-beta form, as for messages,
   paradl.md §3.1), ``x`` the compute model's own time for the shard, fitted
   by least squares in relative error (weights ``1 / t_k^2``) with
   ``alpha, beta >= 0``; with one point the ratio ``t = model * t_k / x_k``;
3. else (no point of that operation): the model, unchanged.

Why ``x`` = the model's time rather than the shard's FLOPs: on the H200
measurements (``reference/measurements``), with each strategy's own points
removed (so the operation's other strategies must carry over), the fit in
model time has a 90th-percentile error of 0.35 against 0.49 for the fit in
FLOPs (median 0.12 against 0.13): the model sees what FLOPs do not (halo
rows, memory traffic, tile padding) and the fit corrects only its scale and
fixed cost. Within a strategy both do equally (p = 4 from p in {1, 2, 8}:
median 0.07 either way).

Versions 1 and 2 (keyed by layer name) are read as before: per layer
measured seconds at a few amounts of *work* (samples per device divided by
the shard ways), optionally per strategy (version 2); log-log
interpolation between points, the end segment beyond them, time
proportional to work with one point (:func:`calibrated_seconds`).

```json
{"schema": "shardplan/calibration", "version": 2, "hardware": "dgx-a100", "dtype": "float32",
 "layers": {"features/0": {"work": [1, 8, 64], "seconds": [1.1e-4, 6.0e-4, 4.5e-3],
                           "strategies": {"filter": {"work": [8], "seconds": [7.0e-4]}}}}}
```
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from costmodels.compute import DTYPE_BYTES
from costmodels.files import read_json
from costmodels.layers import LayerKind, LayerTable
from costmodels.shards import ShardShapes
from costmodels.strategies import STRATEGY_NAMES

__all__ = [
    "Calibration",
    "CalibrationArrays",
    "ShapeCalibrationArrays",
    "OpKey",
    "LayerDims",
    "ShardDims",
    "ShapePoint",
    "load_calibration",
    "calibration_arrays",
    "calibrated_seconds",
    "shape_calibrated_seconds",
    "calibrate_compute",
    "check_hardware",
    "graph_op_keys",
]

CALIBRATION_SCHEMA = "shardplan/calibration"
CALIBRATION_VERSION = 3  # written by shardplan profile
CALIBRATION_VERSIONS = (1, 2, 3)  # read
MAX_POINTS = 16  # per point list of a version 1/2 file
MAX_SHAPE_POINTS = 65536  # points of a version 3 file
OP_KINDS = ("conv", "dense", "pool", "batch_norm", "elementwise", "add", "concat")  # the kinds profile measures
POOL_TYPES = ("max", "avg", "global")

Points = tuple[tuple[float, float], ...]  # ((work, seconds), ...), work ascending


# -- version 3: points keyed by operation shape ----------------------------------------------


@dataclasses.dataclass(frozen=True)
class OpKey:
    """What a layer computes, independent of its size."""

    kind: str  # one of OP_KINDS
    dtype: str
    rank: int = 0  # spatial dims of the input
    kernel: tuple[int, ...] = ()  # conv kernel / pooling window; () for the other kinds
    stride: tuple[int, ...] = ()
    dilation: tuple[int, ...] = ()
    groups: int = 1  # conv feature groups
    pool: str = ""  # pooling only: max | avg | global

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "rank": self.rank, "dtype": self.dtype}
        if self.kernel:
            out.update(kernel=list(self.kernel), stride=list(self.stride), dilation=list(self.dilation))
        if self.kind == "conv":
            out["groups"] = self.groups
        if self.pool:
            out["pool"] = self.pool
        return out


@dataclasses.dataclass(frozen=True)
class LayerDims:
    """The unsharded layer's dimensions (per sample)."""

    in_channels: float  # C (dense: input features)
    out_channels: float  # F (dense: output features)
    in_spatial: tuple[float, ...] = ()  # input spatial dims, one per rank
    out_spatial: tuple[float, ...] = ()  # output spatial dims

    def to_dict(self) -> dict[str, Any]:
        return {"C": _num(self.in_channels), "F": _num(self.out_channels),
                "in": [_num(v) for v in self.in_spatial], "out": [_num(v) for v in self.out_spatial]}


@dataclasses.dataclass(frozen=True)
class ShardDims:
    """One device's shard, as :class:`costmodels.shards.ShardShapes` gives it."""

    batch: float  # b, samples
    in_channels: float  # c
    out_channels: float  # f
    in_spatial: tuple[float, ...] = ()  # input spatial dims incl. halo rows
    out_spatial: tuple[float, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"b": _num(self.batch), "c": _num(self.in_channels), "f": _num(self.out_channels),
                "in": [_num(v) for v in self.in_spatial], "out": [_num(v) for v in self.out_spatial]}


@dataclasses.dataclass(frozen=True)
class ShapePoint:
    """One measured shard: forward + backward seconds."""

    op: OpKey
    layer: LayerDims
    strategy: str  # the strategy the shard was measured under
    shard: ShardDims
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op.to_dict(), "layer": self.layer.to_dict(), "strategy": self.strategy,
                "shard": self.shard.to_dict(), "seconds": self.seconds}


def _num(v: float) -> int | float:
    return int(v) if float(v).is_integer() else float(v)


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Measured times. Versions 1/2: ``layers`` / ``strategies`` keyed by layer
    name. Version 3: ``points`` keyed by operation shape."""

    hardware: str  # v1/v2: the hardware name in the file; v3: the hardware preset measured on ("" = not recorded)
    dtype: str
    layers: dict[str, Points] = dataclasses.field(default_factory=dict)  # v1/v2: name -> work-only points
    strategies: dict[str, dict[str, Points]] = dataclasses.field(default_factory=dict)  # v2: name -> strategy -> points
    points: tuple[ShapePoint, ...] = ()  # v3
    device_name: str = ""  # v3: the device's own name (JAX device kind), e.g. "NVIDIA H200"
    source: str = dataclasses.field(default="calibration", compare=False)  # file name, for messages

    def __post_init__(self) -> None:
        if self.points and (self.layers or self.strategies):
            raise ValueError("a calibration holds either per-layer points (version 1/2) or shape points "
                             "(version 3), not both")

    @property
    def version(self) -> int:
        return 3 if self.points else 2 if any(self.strategies.values()) else 1

    @property
    def device_label(self) -> str:
        """``h200 (NVIDIA H200)``, ``NVIDIA H200``, or the v1/v2 hardware name."""
        if self.version < 3:
            return self.hardware
        if self.hardware and self.device_name:
            return f"{self.hardware} ({self.device_name})"
        return self.hardware or self.device_name or "an unnamed device"

    def to_dict(self) -> dict[str, Any]:
        if self.points:
            return {
                "schema": CALIBRATION_SCHEMA,
                "version": 3,
                "device": {"preset": self.hardware or None, "name": self.device_name or None},
                "dtype": self.dtype,
                "points": [p.to_dict() for p in self.points],
            }

        def pts(p: Points) -> dict[str, list[float]]:
            return {"work": [w for w, _ in p], "seconds": [s for _, s in p]}

        layers: dict[str, dict[str, Any]] = {}
        for name in [*self.layers, *(n for n in self.strategies if n not in self.layers)]:
            entry = pts(self.layers[name]) if name in self.layers else {}
            own = self.strategies.get(name)
            if own:
                entry["strategies"] = {s: pts(p) for s, p in own.items()}
            layers[name] = entry
        return {
            "schema": CALIBRATION_SCHEMA,
            "version": 2 if any(self.strategies.values()) else 1,
            "hardware": self.hardware,
            "dtype": self.dtype,
            "layers": layers,
        }

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "calibration") -> Calibration:
        if not isinstance(data, dict) or data.get("schema") != CALIBRATION_SCHEMA:
            raise ValueError(f'{source}: not a calibration file ("schema" must be {CALIBRATION_SCHEMA!r})')
        version = data.get("version")
        if isinstance(version, bool) or version not in CALIBRATION_VERSIONS:
            raise ValueError(f"{source}: calibration version {version!r} is not supported (expected 1, 2 or 3)")
        if version == 3:
            return _from_dict_v3(data, source)
        for k in ("hardware", "dtype"):
            if not isinstance(data.get(k), str):
                raise ValueError(f'{source}: "{k}" must be a string')
        layers = data.get("layers")
        if not isinstance(layers, dict):
            raise ValueError(f'{source}: "layers" must be an object mapping layer names to measurements')
        out: dict[str, Points] = {}
        per: dict[str, dict[str, Points]] = {}
        allowed = {"work", "seconds", "strategies"} if version == 2 else {"work", "seconds"}
        for name, entry in layers.items():
            where = f"{source}: layers[{name!r}]"
            keys = set(entry) if isinstance(entry, dict) else set()
            if version == 1 and "strategies" in keys:
                raise ValueError(f'{where}["strategies"]: per-strategy points need "version": 2')
            if not isinstance(entry, dict) or not keys <= allowed or not (keys & {"work", "seconds", "strategies"}):
                shape = '{"work": [...], "seconds": [...]' + (', "strategies": {...}}' if version == 2 else "}")
                raise ValueError(f"{where} must be {shape}")
            if "work" in entry or "seconds" in entry:
                out[str(name)] = _points(entry, where)
            if "strategies" in entry:
                own = entry["strategies"]
                if not isinstance(own, dict) or not own:
                    raise ValueError(f'{where}["strategies"] must be a non-empty object mapping strategy names to points')
                per[str(name)] = {}
                for s, pts in own.items():
                    if s not in STRATEGY_NAMES:
                        raise ValueError(f'{where}["strategies"]: unknown strategy {s!r}; '
                                         f"choose from {', '.join(STRATEGY_NAMES)}")
                    swhere = f'{where}["strategies"][{s!r}]'
                    if not isinstance(pts, dict) or set(pts) != {"work", "seconds"}:
                        raise ValueError(f'{swhere} must be {{"work": [...], "seconds": [...]}}')
                    per[str(name)][s] = _points(pts, swhere)
        return cls(hardware=data["hardware"], dtype=data["dtype"], layers=out, strategies=per, source=source)

    @classmethod
    def from_records(
        cls,
        records: Iterable[Mapping[str, Any]],
        *,
        hardware: str,
        device_name: str = "",
        dtype: str | None = None,
        source: str = "records",
    ) -> Calibration:
        """A version-3 calibration from measurement rows in the format of
        ``reference/measurements/*.jsonl``: ``kind`` (conv | dense), ``C``,
        ``F``, ``H``, ``W``, ``K`` (conv) or ``I``, ``O`` (dense),
        ``strategy``, ``shard`` (``{b, c, f, h, w}``, ``h`` the input rows incl.
        halo, or ``{b, i, o}``), ``dtype``, ``fwd_bwd_s``. Convolutions are
        taken as 2-D, stride 1, dilation 1, one group, SAME padding (output
        dims = input dims; a spatial shard computes ``h - (K - 1)`` output
        rows) unless a row gives ``stride``, ``dilation`` or ``groups``
        (integers). ``hardware``: the preset the rows were measured on (e.g.
        ``"h200"``); ``device_name``: the device's own name. ``dtype``: keep
        only rows of that dtype (default: the rows must share one). Other
        fields (``layer``, ``p``, ``B``, ...) are ignored."""
        rows = list(records)
        dtypes = sorted({str(r.get("dtype")) for r in rows if isinstance(r, Mapping)})
        if dtype is None:
            if len(dtypes) != 1:
                raise ValueError(f"{source}: the rows hold dtypes {dtypes}; pass dtype= to calibrate one of them")
            dtype = dtypes[0]
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"{source}: unknown dtype {dtype!r}; choose from {', '.join(DTYPE_BYTES)}")
        points = []
        for k, r in enumerate(rows):
            if not isinstance(r, Mapping):
                raise ValueError(f"{source}: row {k} must be an object")
            if r.get("dtype") != dtype:
                continue
            points.append(_record_point(r, dtype, f"{source}: row {k}"))
        if not points:
            raise ValueError(f"{source}: no {dtype} rows to calibrate with")
        return cls(hardware=hardware, dtype=dtype, points=tuple(points), device_name=device_name, source=source)

    def by_layer(self, graph: LayerTable) -> Calibration:
        """A version-3 calibration as per-layer work points (version 2) for
        ``graph``, the form the ParaDL oracle reads: each layer's points are
        its operation's, at work = ``b * (c / C) * (f / F) * (out rows / H_out)``
        (conv and dense; channel-wise layers: ``b * (f / F) * ...``), the
        median over points of equal work, per strategy and overall."""
        if not self.points:
            return self
        keys = graph_op_keys(graph, self.dtype)
        groups: dict[tuple[OpKey, LayerDims], list[ShapePoint]] = {}
        for p in self.points:
            groups.setdefault((p.op, p.layer), []).append(p)
        layers: dict[str, Points] = {}
        strategies: dict[str, dict[str, Points]] = {}

        def points(by_work: dict[float, list[float]]) -> Points:
            return tuple((w, float(statistics.median(by_work[w]))) for w in sorted(by_work)[:MAX_POINTS])

        for name, key in zip(graph.names, keys, strict=True):
            pts = groups.get(key) if key is not None else None
            if not pts:
                continue
            every: dict[float, list[float]] = {}
            own: dict[str, dict[float, list[float]]] = {}
            for p in pts:
                w = _work(p)
                every.setdefault(w, []).append(p.seconds)
                own.setdefault(p.strategy, {}).setdefault(w, []).append(p.seconds)
            layers[name] = points(every)
            strategies[name] = {s: points(own[s]) for s in STRATEGY_NAMES if s in own}
        return Calibration(hardware=self.hardware, dtype=self.dtype, layers=layers, strategies=strategies,
                           source=self.source)


def _work(p: ShapePoint) -> float:
    """Samples per device / shard ways of a shape point (the v1/v2 x axis)."""
    share = p.shard.out_channels / p.layer.out_channels
    if p.op.kind in ("conv", "dense"):
        share *= p.shard.in_channels / p.layer.in_channels
    if p.shard.out_spatial and p.layer.out_spatial:
        share *= p.shard.out_spatial[0] / p.layer.out_spatial[0]
    return float(p.shard.batch * share)


def _positive(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ValueError(f"{where} must be a positive finite number, got {v!r}")
    return float(v)


def _positive_ints(v: Any, n: int, where: str) -> tuple[int, ...]:
    if not isinstance(v, list) or len(v) != n or any(
            isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in v):
        raise ValueError(f"{where} must be a list of {n} positive integers, got {v!r}")
    return tuple(v)


def _dims(v: Any, n: int, where: str) -> tuple[float, ...]:
    if not isinstance(v, list) or len(v) != n:
        raise ValueError(f"{where} must be a list of {n} positive numbers, got {v!r}")
    return tuple(_positive(x, f"{where}[{i}]") for i, x in enumerate(v))


def _op_from_dict(d: Any, dtype: str, where: str) -> OpKey:
    if not isinstance(d, dict):
        raise ValueError(f'{where} must be an object {{"kind": ..., "rank": ..., "dtype": ...}}')
    unknown = set(d) - {"kind", "rank", "dtype", "kernel", "stride", "dilation", "groups", "pool"}
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {sorted(unknown)}")
    kind = d.get("kind")
    if kind not in OP_KINDS:
        raise ValueError(f"{where}: kind must be one of {', '.join(OP_KINDS)}, got {kind!r}")
    if d.get("dtype") != dtype:
        raise ValueError(f'{where}: dtype {d.get("dtype")!r} is not the file\'s "dtype" {dtype!r}')
    rank = d.get("rank", 0)
    if isinstance(rank, bool) or rank not in (0, 1, 2, 3):
        raise ValueError(f"{where}: rank must be 0, 1, 2 or 3, got {rank!r}")
    pool = d.get("pool", "")
    if kind == "pool" and pool not in POOL_TYPES:
        raise ValueError(f"{where}: a pool needs \"pool\": one of {', '.join(POOL_TYPES)}")
    if kind != "pool" and pool:
        raise ValueError(f'{where}: "pool" is for pooling ops only')
    windowed = kind == "conv" or pool in ("max", "avg")
    kernel = stride = dilation = ()
    if windowed:
        kernel = _positive_ints(d.get("kernel"), rank, f"{where}.kernel")
        stride = _positive_ints(d.get("stride", [1] * rank), rank, f"{where}.stride")
        dilation = _positive_ints(d.get("dilation", [1] * rank), rank, f"{where}.dilation")
    elif any(k in d for k in ("kernel", "stride", "dilation")):
        raise ValueError(f"{where}: kernel, stride and dilation are for conv and max/avg pooling only")
    groups = d.get("groups", 1)
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1 or (kind != "conv" and groups != 1):
        raise ValueError(f"{where}: groups must be a positive integer (conv only), got {groups!r}")
    return OpKey(kind=kind, dtype=dtype, rank=rank, kernel=kernel, stride=stride, dilation=dilation,
                 groups=groups, pool=pool)


def _spatial_fields(d: dict, where: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    sin, sout = d.get("in", []), d.get("out", [])
    if not isinstance(sin, list) or not isinstance(sout, list) or len(sin) > 3 or len(sout) > 3:
        raise ValueError(f'{where}: "in" and "out" must be lists of at most 3 spatial dims')
    return _dims(sin, len(sin), f"{where}.in"), _dims(sout, len(sout), f"{where}.out")


def _point_from_dict(d: Any, dtype: str, where: str) -> ShapePoint:
    if not isinstance(d, dict) or set(d) != {"op", "layer", "strategy", "shard", "seconds"}:
        raise ValueError(f'{where} must be {{"op": ..., "layer": ..., "strategy": ..., "shard": ..., "seconds": ...}}')
    op = _op_from_dict(d["op"], dtype, f"{where}.op")
    lay, sh = d["layer"], d["shard"]
    if not isinstance(lay, dict) or not set(lay) <= {"C", "F", "in", "out"} or not {"C", "F"} <= set(lay):
        raise ValueError(f'{where}.layer must be {{"C": ..., "F": ..., "in": [...], "out": [...]}}')
    if not isinstance(sh, dict) or not set(sh) <= {"b", "c", "f", "in", "out"} or not {"b", "c", "f"} <= set(sh):
        raise ValueError(f'{where}.shard must be {{"b": ..., "c": ..., "f": ..., "in": [...], "out": [...]}}')
    lin, lout = _spatial_fields(lay, f"{where}.layer")
    sin, sout = _spatial_fields(sh, f"{where}.shard")
    if len(lin) != op.rank or len(sin) != op.rank or len(sout) != len(lout):
        raise ValueError(f"{where}: layer and shard need {op.rank} input spatial dims (the op's rank) "
                         "and equally many output dims")
    if d["strategy"] not in STRATEGY_NAMES:
        raise ValueError(f"{where}: unknown strategy {d['strategy']!r}; choose from {', '.join(STRATEGY_NAMES)}")
    return ShapePoint(
        op=op,
        layer=LayerDims(_positive(lay["C"], f"{where}.layer.C"), _positive(lay["F"], f"{where}.layer.F"), lin, lout),
        strategy=d["strategy"],
        shard=ShardDims(_positive(sh["b"], f"{where}.shard.b"), _positive(sh["c"], f"{where}.shard.c"),
                        _positive(sh["f"], f"{where}.shard.f"), sin, sout),
        seconds=_positive(d["seconds"], f"{where}.seconds"),
    )


def _from_dict_v3(data: dict, source: str) -> Calibration:
    unknown = set(data) - {"schema", "version", "device", "dtype", "points"}
    if unknown:
        raise ValueError(f"{source}: unknown field(s) {sorted(unknown)} in a version 3 calibration")
    dtype = data.get("dtype")
    if dtype not in DTYPE_BYTES:
        raise ValueError(f'{source}: "dtype" must be one of {", ".join(DTYPE_BYTES)}, got {dtype!r}')
    dev = data.get("device")
    if not isinstance(dev, dict) or not set(dev) <= {"preset", "name"} or not any(
            isinstance(dev.get(k), str) and dev.get(k) for k in ("preset", "name")) or not all(
            dev.get(k) is None or isinstance(dev.get(k), str) for k in ("preset", "name")):
        raise ValueError(f'{source}: "device" must be {{"preset": NAME or null, "name": NAME or null}} '
                         "naming what it was measured on")
    pts = data.get("points")
    if not isinstance(pts, list) or not 1 <= len(pts) <= MAX_SHAPE_POINTS:
        raise ValueError(f'{source}: "points" must be a list of 1 to {MAX_SHAPE_POINTS} measured shards')
    points = tuple(_point_from_dict(p, dtype, f"{source}: points[{k}]") for k, p in enumerate(pts))
    return Calibration(hardware=dev.get("preset") or "", dtype=dtype, points=points,
                       device_name=dev.get("name") or "", source=source)


def _record_point(r: Mapping[str, Any], dtype: str, where: str) -> ShapePoint:
    def need(key: str) -> Any:
        if key not in r:
            raise ValueError(f"{where}: missing {key!r}")
        return r[key]

    kind, strategy, shard = need("kind"), need("strategy"), need("shard")
    if strategy not in STRATEGY_NAMES:
        raise ValueError(f"{where}: unknown strategy {strategy!r}; choose from {', '.join(STRATEGY_NAMES)}")
    if not isinstance(shard, Mapping):
        raise ValueError(f"{where}: shard must be an object")
    seconds = _positive(need("fwd_bwd_s"), f"{where}: fwd_bwd_s")

    def sh(key: str) -> float:
        if key not in shard:
            raise ValueError(f"{where}: shard misses {key!r}")
        return _positive(shard[key], f"{where}: shard.{key}")

    if kind == "dense":
        op = OpKey(kind="dense", dtype=dtype)
        layer = LayerDims(_positive(need("I"), f"{where}: I"), _positive(need("O"), f"{where}: O"))
        return ShapePoint(op, layer, strategy, ShardDims(sh("b"), sh("i"), sh("o")), seconds)
    if kind != "conv":
        raise ValueError(f"{where}: kind must be conv or dense, got {kind!r}")
    k = int(_positive(need("K"), f"{where}: K"))
    stride, dil, groups = (int(_positive(r.get(key, 1), f"{where}: {key}")) for key in ("stride", "dilation", "groups"))
    H, W = _positive(need("H"), f"{where}: H"), _positive(need("W"), f"{where}: W")
    out = (float(math.ceil(H / stride)), float(math.ceil(W / stride)))  # SAME padding
    op = OpKey(kind="conv", dtype=dtype, rank=2, kernel=(k, k), stride=(stride, stride), dilation=(dil, dil),
               groups=groups)
    layer = LayerDims(_positive(need("C"), f"{where}: C"), _positive(need("F"), f"{where}: F"), (H, W), out)
    h, w = sh("h"), sh("w")
    halo = max(0.0, (k - 1) * dil + 1 - stride)  # paradl.md §4.4, as costmodels.shards.halo_rows
    rows_out = (h - halo) / stride if strategy == "spatial" and h < H else out[0]
    return ShapePoint(op, layer, strategy, ShardDims(sh("b"), sh("c"), sh("f"), (h, w), (rows_out, out[1])),
                      seconds)


def _points(entry: Mapping[str, Any], where: str) -> Points:
    w, s = entry.get("work"), entry.get("seconds")
    if not (isinstance(w, list) and isinstance(s, list) and len(w) == len(s) and 1 <= len(w) <= MAX_POINTS):
        raise ValueError(f"{where}: work and seconds must be lists of equal length, 1 to {MAX_POINTS}")
    pts = []
    for x, y in zip(w, s, strict=True):
        for v, what in ((x, "work"), (y, "seconds")):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"{where}: {what} values must be positive finite numbers, got {v!r}")
        pts.append((float(x), float(y)))
    pts.sort()
    if len({x for x, _ in pts}) != len(pts):
        raise ValueError(f"{where}: repeated work values")
    return tuple(pts)


def load_calibration(path: str | Path) -> Calibration:
    p = Path(path)
    data = read_json(p, "calibration JSON file (shardplan profile)")
    return Calibration.from_dict(data, source=str(p))


def check_hardware(calibration: Calibration, hardware_name: str, *, allow_other_hardware: bool = False) -> None:
    """Refuse ``calibration`` for hardware ``hardware_name`` other than the
    one it was measured on (version 3: its preset; versions 1/2: its
    ``hardware`` name), unless ``allow_other_hardware``."""
    if allow_other_hardware or calibration.hardware == hardware_name:
        return
    hint = "" if calibration.hardware or calibration.version < 3 else \
        f" (no hardware preset recorded; profile with --hardware {hardware_name})"
    raise ValueError(
        f"{calibration.source} was measured on {calibration.device_label}{hint}, not {hardware_name}; "
        "pass --allow-other-hardware (API: allow_other_hardware=True) to use it anyway"
    )


# -- a graph's layers as operation keys ---------------------------------------------------------


def graph_op_keys(graph: LayerTable, dtype: str) -> list[tuple[OpKey, LayerDims] | None]:
    """Per real layer of ``graph``: its (op, unsharded dims) key, or ``None``
    for kinds that are not measured (flatten, other)."""
    a = graph.arrays
    out: list[tuple[OpKey, LayerDims] | None] = []
    for i in range(graph.num_layers):
        kind = LayerKind(int(a.kind[i]))
        name = kind.name.lower()
        if name not in OP_KINDS:
            out.append(None)
            continue
        r, ro = int(a.spatial_rank[i]), int(a.out_spatial_rank[i])
        pool = ""
        if kind is LayerKind.POOL:  # as planner.profile builds the op
            pool = "global" if ro == 0 else ("max" if float(a.saved_elements[i]) > 0 else "avg")
        windowed = kind is LayerKind.CONV or pool in ("max", "avg")
        ints = lambda v, n: tuple(int(x) for x in np.asarray(v)[:n])  # noqa: E731
        op = OpKey(
            kind=name, dtype=dtype, rank=r,
            kernel=ints(a.kernel[i], r) if windowed else (), stride=ints(a.stride[i], r) if windowed else (),
            dilation=ints(a.dilation[i], r) if windowed else (),
            groups=int(a.groups[i]) if kind is LayerKind.CONV else 1, pool=pool,
        )
        dims = LayerDims(
            float(a.in_channels[i]), float(a.out_channels[i]),
            tuple(float(x) for x in np.asarray(a.in_spatial[i])[:r]),
            tuple(float(x) for x in np.asarray(a.out_spatial[i])[:ro]),
        )
        out.append((op, dims))
    return out


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
    lw, ls, cnt = np.zeros((rows, MAX_POINTS)), np.zeros((rows, MAX_POINTS)), np.zeros(rows)
    slw, sls, scnt = np.zeros((rows, S, MAX_POINTS)), np.zeros((rows, S, MAX_POINTS)), np.zeros((rows, S))
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
    idx = jnp.clip(jnp.searchsorted(lw[:MAX_POINTS], x), 1, jnp.maximum(k - 1, 1))
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
