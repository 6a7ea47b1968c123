"""Measured per-layer times that override the roofline.

A calibration file holds, per layer name, measured forward + backward
seconds at a few amounts of work, where *work* is the number of samples a
device processes divided by how many ways the layer's channels or rows are
split (``samples / shard``; a filter-sharded layer over m = 4 on 32 samples
does 8 sample-equivalents). ``shardplan profile`` writes such files (issue
7); users may write them by hand.

A layer may also hold points per strategy (version 2): a strategy with its
own points uses them; the others use the layer's work-only points; a
strategy with neither keeps the roofline. Version 1 files (work-only
points, which then apply to every strategy) stay valid.

Between measured points time is interpolated linearly in log(work) -
log(time); outside them it is extrapolated along the nearest segment (with
one point, time is taken as proportional to work).

```json
{"schema": "shardplan/calibration", "version": 2, "hardware": "dgx-a100", "dtype": "float32",
 "layers": {"features/0": {"work": [1, 8, 64], "seconds": [1.1e-4, 6.0e-4, 4.5e-3],
                           "strategies": {"filter": {"work": [8], "seconds": [7.0e-4]}}}}}
```
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from costmodels.strategies import STRATEGY_NAMES
from planner.graph import LayerGraph

__all__ = ["Calibration", "CalibrationArrays", "load_calibration", "calibration_arrays", "calibrated_seconds"]

CALIBRATION_SCHEMA = "shardplan/calibration"
CALIBRATION_VERSION = 2  # written when some layer has per-strategy points; otherwise 1
CALIBRATION_VERSIONS = (1, 2)  # read
MAX_POINTS = 16

Points = tuple[tuple[float, float], ...]  # ((work, seconds), ...), work ascending


@dataclasses.dataclass(frozen=True)
class Calibration:
    hardware: str
    dtype: str
    layers: dict[str, Points]  # name -> work-only points (every strategy without its own)
    strategies: dict[str, dict[str, Points]] = dataclasses.field(default_factory=dict)  # name -> strategy -> points

    def to_dict(self) -> dict[str, Any]:
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
            raise ValueError(f"{source}: calibration version {version!r} is not supported (expected 1 or 2)")
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
        return cls(hardware=data["hardware"], dtype=data["dtype"], layers=out, strategies=per)


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
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{p}: not a text file; expected a calibration JSON file (shardplan profile)") from None
    except OSError as e:
        raise ValueError(f"cannot read calibration file {str(p)!r}: {e.strerror}; expected a calibration JSON file") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: malformed JSON: {e}") from None
    return Calibration.from_dict(data, source=str(p))


class CalibrationArrays(NamedTuple):
    log_work: jnp.ndarray  # [L, K] log of the work-only points' work (sample-equivalents), ascending, padded by repeating the last
    log_seconds: jnp.ndarray  # [L, K] log of their measured seconds
    count: jnp.ndarray  # [L] work-only points per layer (0 = none)
    strategy_log_work: jnp.ndarray  # [L, S, K] log work of each strategy's own points, padded likewise
    strategy_log_seconds: jnp.ndarray  # [L, S, K] log seconds of each strategy's own points
    strategy_count: jnp.ndarray  # [L, S] each strategy's own points (0 = use the work-only points)

    @property
    def measured(self):  # [L, S] bool: the strategy has points (its own or the layer's); else the roofline
        return (self.count[:, None] > 0) | (self.strategy_count > 0)


def _fill(lw: np.ndarray, ls: np.ndarray, pts: Points) -> int:
    w = np.log([x for x, _ in pts])
    s = np.log([y for _, y in pts])
    k = len(pts)
    lw[:k], ls[:k] = w, s
    lw[k:], ls[k:] = w[-1], s[-1]
    return k


def calibration_arrays(calibration: Calibration, graph: LayerGraph) -> CalibrationArrays:
    """Align a calibration with a graph's (bucketed) rows by layer name.
    Names the graph does not have are an error (a calibration for another model)."""
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
    """Interpolated seconds ``[L, S]`` for work ``[L, S]`` (sample-equivalents).

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
