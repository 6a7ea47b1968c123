"""The calibration record (:class:`Calibration`) and its file, versions 1 to 3
(:mod:`costmodels.calibration` describes the format); reading refuses what the
format cannot hold with one line naming the file; :func:`check_hardware`
refuses a calibration measured on other hardware."""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from costmodels.calibration._keys import (
    LayerDims,
    OpKey,
    Points,
    ShapePoint,
    graph_op_keys,
    point_from_dict,
    positive_seconds,
    record_point,
    shape_work,
)
from costmodels.compute import DTYPE_BYTES
from costmodels.files import check_float32, read_json
from costmodels.layers import LayerTable
from costmodels.strategies import STRATEGY_NAMES

__all__ = ["CALIBRATION_SCHEMA", "CALIBRATION_VERSION", "CALIBRATION_VERSIONS", "MAX_WORK_POINTS", "Calibration",
           "check_hardware", "load_calibration"]

CALIBRATION_SCHEMA = "shardplan/calibration"
CALIBRATION_VERSION = 3  # written by shardplan profile
CALIBRATION_VERSIONS = (1, 2, 3)  # read
MAX_WORK_POINTS = 16  # per point list of a version 1/2 file
MAX_SHAPE_POINTS = 65536  # points of a version 3 file


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
            points.append(record_point(r, dtype, f"{source}: row {k}"))
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
            return tuple((w, float(statistics.median(by_work[w]))) for w in sorted(by_work)[:MAX_WORK_POINTS])

        for name, key in zip(graph.names, keys, strict=True):
            pts = groups.get(key) if key is not None else None
            if not pts:
                continue
            every: dict[float, list[float]] = {}
            own: dict[str, dict[float, list[float]]] = {}
            for p in pts:
                w = shape_work(p)
                every.setdefault(w, []).append(p.seconds)
                own.setdefault(p.strategy, {}).setdefault(w, []).append(p.seconds)
            layers[name] = points(every)
            strategies[name] = {s: points(own[s]) for s in STRATEGY_NAMES if s in own}
        return Calibration(hardware=self.hardware, dtype=self.dtype, layers=layers, strategies=strategies,
                           source=self.source)


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
    points = tuple(point_from_dict(p, dtype, f"{source}: points[{k}]") for k, p in enumerate(pts))
    return Calibration(hardware=dev.get("preset") or "", dtype=dtype, points=points,
                       device_name=dev.get("name") or "", source=source)


def _points(entry: Mapping[str, Any], where: str) -> Points:
    w, s = entry.get("work"), entry.get("seconds")
    if not (isinstance(w, list) and isinstance(s, list) and len(w) == len(s) and 1 <= len(w) <= MAX_WORK_POINTS):
        raise ValueError(f"{where}: work and seconds must be lists of equal length, 1 to {MAX_WORK_POINTS}")
    pts = []
    for x, y in zip(w, s, strict=True):
        for v, what in ((x, "work"), (y, "seconds")):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"{where}: {what} values must be positive finite numbers, got {v!r}")
        pts.append((float(check_float32(x, f"{where}: work")), positive_seconds(y, f"{where}: seconds")))
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
