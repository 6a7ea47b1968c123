"""The keys of a version 3 calibration (:mod:`costmodels.calibration`): what an
operation is (:class:`OpKey`), the unsharded layer's and the shard's dimensions,
a measured point, reading them from a file's or a profile's records, and a
graph's layers as keys."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from costmodels.files import check_float32
from costmodels.layers import LayerKind, LayerTable
from costmodels.strategies import STRATEGY_NAMES

__all__ = ["MAX_SECONDS", "OP_KINDS", "POOL_TYPES", "LayerDims", "OpKey", "Points", "ShapePoint", "ShardDims", "graph_op_keys",
           "point_from_dict", "positive_seconds", "record_point", "shape_work"]

OP_KINDS = ("conv", "dense", "pool", "batch_norm", "elementwise", "add", "concat")  # the kinds profile measures
POOL_TYPES = ("max", "avg", "global")
# The longest measured time of one shard's forward and backward pass: 10^6 s, 11.6 days, far
# beyond any kernel; a larger value is a unit or typing mistake that overflows float32 sums.
MAX_SECONDS = 1e6

Points = tuple[tuple[float, float], ...]  # ((work, seconds), ...), work ascending (versions 1 and 2)


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


def shape_work(p: ShapePoint) -> float:
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
    return float(check_float32(v, where))


def positive_seconds(v: Any, where: str) -> float:
    """A measured time: positive, at most :data:`MAX_SECONDS`, a normal float32."""
    if isinstance(v, (int, float)) and not isinstance(v, bool) and MAX_SECONDS < v <= math.inf:
        raise ValueError(f"{where} = {v!r} seconds is more than {MAX_SECONDS:g} s (11.6 days); give seconds")
    return _positive(v, where)


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


def point_from_dict(d: Any, dtype: str, where: str) -> ShapePoint:
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
        seconds=positive_seconds(d["seconds"], f"{where}.seconds"),
    )


def record_point(r: Mapping[str, Any], dtype: str, where: str) -> ShapePoint:
    def need(key: str) -> Any:
        if key not in r:
            raise ValueError(f"{where}: missing {key!r}")
        return r[key]

    kind, strategy, shard = need("kind"), need("strategy"), need("shard")
    if strategy not in STRATEGY_NAMES:
        raise ValueError(f"{where}: unknown strategy {strategy!r}; choose from {', '.join(STRATEGY_NAMES)}")
    if not isinstance(shard, Mapping):
        raise ValueError(f"{where}: shard must be an object")
    seconds = positive_seconds(need("fwd_bwd_s"), f"{where}: fwd_bwd_s")

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
    halo = max(0.0, (k - 1) * dil + 1 - stride)  # ParaDL §4.4, as costmodels.shards.halo_rows
    rows_out = (h - halo) / stride if strategy == "spatial" and h < H else out[0]
    return ShapePoint(op, layer, strategy, ShardDims(sh("b"), sh("c"), sh("f"), (h, w), (rows_out, out[1])),
                      seconds)


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
        if kind is LayerKind.POOL:  # as planner.calibrate.profile builds the op
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
