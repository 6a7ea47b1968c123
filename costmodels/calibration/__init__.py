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
asked for (:func:`check_hardware`); :func:`check_calibration` checks that
and the rest of whether a calibration belongs to a cost question (its dtype,
the model's layers it measures).

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
   ParaDL §3.1), ``x`` the compute model's own time for the shard, fitted
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

The parts: :mod:`costmodels.calibration._keys` (operation keys and points),
:mod:`costmodels.calibration._file` (the record and its file),
:mod:`costmodels.calibration._applicable` (whether it belongs to a question),
:mod:`costmodels.calibration._lookup` (arrays and the jitted lookup); this
module's ``__all__`` is what the rest of shardplan uses.
"""

from costmodels.calibration._applicable import check_calibration
from costmodels.calibration._file import MAX_WORK_POINTS, Calibration, check_hardware, load_calibration
from costmodels.calibration._keys import (
    LayerDims,
    OpKey,
    ShapePoint,
    ShardDims,
    graph_op_keys,
)
from costmodels.calibration._lookup import (
    CalibrationArrays,
    ShapeCalibrationArrays,
    calibrate_compute,
    calibrated_seconds,
    calibration_arrays,
    shape_calibrated_seconds,
)

__all__ = [
    "MAX_WORK_POINTS",
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
    "check_calibration",
    "graph_op_keys",
]
