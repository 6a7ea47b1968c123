"""Measured per-layer times that override the roofline.

A calibration file holds, per layer name, measured forward + backward
seconds at a few amounts of work, where *work* is the number of samples a
device processes divided by how many ways the layer's channels or rows are
split (``samples / shard``; a filter-sharded layer over m = 4 on 32 samples
does 8 sample-equivalents). ``shardplan profile`` writes such files (issue
7); users may write them by hand.

Between measured points time is interpolated linearly in log(work) -
log(time); outside them it is extrapolated along the nearest segment (with
one point, time is taken as proportional to work).

```json
{"schema": "shardplan/calibration", "version": 1, "hardware": "dgx-a100", "dtype": "float32",
 "layers": {"features/0": {"work": [1, 8, 64], "seconds": [1.1e-4, 6.0e-4, 4.5e-3]}}}
```
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from planner.graph import LayerGraph

__all__ = ["Calibration", "CalibrationArrays", "load_calibration", "calibration_arrays", "calibrated_seconds"]

CALIBRATION_SCHEMA = "shardplan/calibration"
CALIBRATION_VERSION = 1
MAX_POINTS = 16


@dataclasses.dataclass(frozen=True)
class Calibration:
    hardware: str
    dtype: str
    layers: dict[str, tuple[tuple[float, float], ...]]  # name -> ((work, seconds), ...), work ascending

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": CALIBRATION_SCHEMA,
            "version": CALIBRATION_VERSION,
            "hardware": self.hardware,
            "dtype": self.dtype,
            "layers": {n: {"work": [w for w, _ in p], "seconds": [s for _, s in p]} for n, p in self.layers.items()},
        }

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "calibration") -> Calibration:
        if not isinstance(data, dict) or data.get("schema") != CALIBRATION_SCHEMA:
            raise ValueError(f'{source}: not a calibration file ("schema" must be {CALIBRATION_SCHEMA!r})')
        if data.get("version") != CALIBRATION_VERSION:
            raise ValueError(f"{source}: calibration version {data.get('version')!r} is not supported (expected 1)")
        for k in ("hardware", "dtype"):
            if not isinstance(data.get(k), str):
                raise ValueError(f'{source}: "{k}" must be a string')
        layers = data.get("layers")
        if not isinstance(layers, dict):
            raise ValueError(f'{source}: "layers" must be an object mapping layer names to measurements')
        out: dict[str, tuple[tuple[float, float], ...]] = {}
        for name, entry in layers.items():
            where = f"{source}: layers[{name!r}]"
            if not isinstance(entry, dict) or set(entry) != {"work", "seconds"}:
                raise ValueError(f'{where} must be {{"work": [...], "seconds": [...]}}')
            w, s = entry["work"], entry["seconds"]
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
            out[str(name)] = tuple(pts)
        return cls(hardware=data["hardware"], dtype=data["dtype"], layers=out)


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
    log_work: jnp.ndarray  # [L, K] log of work (sample-equivalents), ascending, padded by repeating the last
    log_seconds: jnp.ndarray  # [L, K] log of measured seconds
    count: jnp.ndarray  # [L] measured points per layer (0 = use the roofline)


def calibration_arrays(calibration: Calibration, graph: LayerGraph) -> CalibrationArrays:
    """Align a calibration with a graph's (bucketed) rows by layer name.
    Names the graph does not have are an error (a calibration for another model)."""
    unknown = sorted(set(calibration.layers) - set(graph.names))
    if unknown:
        raise ValueError(
            f"calibration names {len(unknown)} layer(s) that model {graph.model_name!r} does not have, "
            f"e.g. {unknown[:3]}; was it measured on another model?"
        )
    rows = int(np.shape(graph.arrays.mask)[0])
    lw = np.zeros((rows, MAX_POINTS))
    ls = np.zeros((rows, MAX_POINTS))
    cnt = np.zeros(rows)
    index = {n: i for i, n in enumerate(graph.names)}
    for name, pts in calibration.layers.items():
        i = index[name]
        w = np.log([x for x, _ in pts])
        s = np.log([y for _, y in pts])
        k = len(pts)
        lw[i, :k], ls[i, :k] = w, s
        lw[i, k:], ls[i, k:] = w[-1], s[-1]
        cnt[i] = k
    return CalibrationArrays(jnp.asarray(lw, jnp.float32), jnp.asarray(ls, jnp.float32), jnp.asarray(cnt, jnp.float32))


def _interp_one(lw, ls, n, x):
    """Piecewise-linear in log-log with end-segment extrapolation; one layer."""
    k = jnp.maximum(n, 1.0).astype(jnp.int32)
    idx = jnp.clip(jnp.searchsorted(lw[:MAX_POINTS], x), 1, jnp.maximum(k - 1, 1))
    x0, x1 = lw[idx - 1], lw[idx]
    y0, y1 = ls[idx - 1], ls[idx]
    slope = jnp.where(x1 > x0, (y1 - y0) / jnp.where(x1 > x0, x1 - x0, 1.0), 1.0)
    single = ls[0] + (x - lw[0])  # one point: time proportional to work
    return jnp.where(n >= 2, y0 + slope * (x - x0), single)


def calibrated_seconds(cal: CalibrationArrays, work):
    """Interpolated seconds ``[L, S]`` for work ``[L, S]`` (sample-equivalents)."""
    x = jnp.log(jnp.maximum(work, 1e-30))
    f = jax.vmap(jax.vmap(_interp_one, in_axes=(None, None, None, 0)), in_axes=(0, 0, 0, 0))
    return jnp.exp(f(cal.log_work, cal.log_seconds, cal.count, x))
