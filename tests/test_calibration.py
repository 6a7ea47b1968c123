"""Calibration keyed by operation shape: exact shard matches
shared by every layer of one shape, the latency-plus-throughput trend per
operation (own strategy first), the single-point ratio, version 1/2 files
as before, the device check, a version 3 round trip, measurement rows, and
one compilation per bucket. Expected numbers are computed by hand."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from costmodels import load_hardware
from costmodels.calibration import (
    Calibration,
    LayerDims,
    OpKey,
    ShapeCalibrationArrays,
    ShapePoint,
    ShardDims,
    calibration_arrays,
    load_calibration,
    shape_calibrated_seconds,
)
from costmodels.compute import hardware_arrays
from costmodels.shards import ShardShapes
from costmodels.strategies import Strategy
from costmodels.table import cost_table
from planner import GraphBuilder
from planner.cli import main
from planner.evaluation import evaluate

S = len(Strategy)
CONV = OpKey(kind="conv", dtype="float32", rank=2, kernel=(3, 3), stride=(1, 1), dilation=(1, 1), groups=1)
DIMS = LayerDims(8.0, 8.0, (8.0, 8.0), (8.0, 8.0))  # 8 -> 8 channels, 8x8, SAME


def _twin():
    """relu -> conv a (8 -> 8, 3x3, 8x8) -> relu -> conv b (same shape) -> conv c (8 -> 16)."""
    g = GraphBuilder("twin", (8, 8, 8))
    x = g.conv("a", g.relu("r0", g.input), 8, 3)
    x = g.conv("b", g.relu("r1", x), 8, 3)
    g.conv("c", x, 16, 3)
    return g.build()


def _point(strategy, b, c, f, seconds, rows=8.0, out_rows=8.0):
    return ShapePoint(CONV, DIMS, strategy, ShardDims(b, c, f, (rows, 8.0), (out_rows, 8.0)), seconds)


def _cal(*points, hardware="abci-v100"):
    return Calibration(hardware=hardware, dtype="float32", points=tuple(points), device_name="Tesla V100")


@pytest.mark.slow
def test_exact_shard_shared_by_every_layer_of_the_shape():
    """Batch 8 on a 1 x 2 mesh: data shard b = 4 (whole layer), filter b = 8,
    f = 4; spatial b = 8, 4 output rows reading 4 + 2 = 6 input rows. The
    points describe a's shape; b has the same one and takes them too; c
    (8 -> 16) has none and keeps the model."""
    g = _twin()
    cal = _cal(_point("data", 4, 8, 8, 1e-3), _point("filter", 8, 8, 4, 7e-4),
               _point("spatial", 8, 8, 8, 9e-4, rows=6.0, out_rows=4.0))
    hw = hardware_arrays(load_hardware("abci-v100"))
    plain = np.asarray(cost_table(g.arrays, hw, 8.0, 1.0, 2.0).compute_s)
    t = np.asarray(cost_table(g.arrays, hw, 8.0, 1.0, 2.0, calibration=calibration_arrays(cal, g)).compute_s)
    for name in ("a", "b"):
        i = g.names.index(name)
        assert t[i, Strategy.DATA] == pytest.approx(1e-3, rel=1e-6)
        assert t[i, Strategy.FILTER] == pytest.approx(7e-4, rel=1e-6)
        assert t[i, Strategy.SPATIAL] == pytest.approx(9e-4, rel=1e-6)
    c = g.names.index("c")
    np.testing.assert_array_equal(t[c], plain[c])
    # On a 2 x 1 mesh every strategy of a and b is the data shard at b = 4: the same point.
    t2 = np.asarray(cost_table(g.arrays, hw, 8.0, 2.0, 1.0, calibration=calibration_arrays(cal, g)).compute_s)
    assert t2[g.names.index("b")] == pytest.approx([1e-3] * S, rel=1e-6)


def _arrays(points, seconds, strategies):
    """One layer (row group 0); points ``[N]`` of shard batch = 100 + k (never the query's)."""
    n = len(seconds)
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    return ShapeCalibrationArrays(
        row_group=f32([0.0]), point_group=f32([0.0] * n), point_strategy=f32(strategies),
        point_row=jnp.zeros(n, jnp.int32), point_batch=f32([100.0 + k for k in range(n)]),
        point_in_channels=f32([1.0] * n), point_out_channels=f32([1.0] * n),
        point_in_spatial=jnp.ones((n, 3)), point_out_spatial=jnp.ones((n, 3)), point_seconds=f32(seconds),
    ), f32(points)


def _query(model_s):
    one = jnp.ones((1, S))
    shapes = ShardShapes(batch=one, in_channels=one, out_channels=one, in_spatial=jnp.ones((1, S, 3)),
                         out_spatial=jnp.ones((1, S, 3)))
    return shapes, jnp.full((1, S), model_s, jnp.float32)


def test_latency_plus_throughput_fit_by_hand():
    """Data points at model times x = 1, 2, 3 measured t = 1, 2, 2. Least
    squares in relative error (weights 1/t^2 = 1, 1/4, 1/4): weighted means
    x = 1.5, t = 4/3; Sxx = 0.875, Sxy = 0.5; beta = 4/7, alpha = 4/3 - 6/7 =
    10/21. At x = 4: 10/21 + 16/7 = 58/21."""
    cal, x = _arrays([1.0, 2.0, 3.0], [1.0, 2.0, 2.0], [0, 0, 0])
    shapes, model = _query(4.0)
    measured, t = shape_calibrated_seconds(cal, shapes, model, x)
    assert bool(measured[0, Strategy.DATA])
    assert float(t[0, Strategy.DATA]) == pytest.approx(58 / 21, rel=1e-5)
    # d t / d model = beta = 4/7, by autodiff and by central differences
    f = lambda m: shape_calibrated_seconds(cal, shapes, jnp.full((1, S), m), x)[1][0, Strategy.DATA]  # noqa: E731
    assert float(jax.grad(f)(4.0)) == pytest.approx(4 / 7, rel=1e-5)
    assert float((f(4.01) - f(3.99)) / 0.02) == pytest.approx(4 / 7, rel=1e-3)


@pytest.mark.slow
def test_gradients_are_finite_with_a_calibration():
    """Rows without points (relu, conv c, padding) must not poison the
    hardware gradient through the unused fit."""
    g = _twin()
    cal = calibration_arrays(_cal(_point("data", 4, 8, 8, 1e-3), _point("data", 8, 8, 8, 1.5e-3),
                                  _point("filter", 8, 8, 4, 7e-4)), g)
    hw = hardware_arrays(load_hardware("h200"))
    grad = jax.jit(jax.grad(lambda h: cost_table(g.arrays, h, 16.0, 1.0, 2.0, calibration=cal).compute_s.sum()))(hw)
    assert all(np.all(np.isfinite(leaf)) for leaf in jax.tree.leaves(grad))


def test_fit_keeps_latency_and_throughput_non_negative():
    """x = 1, 2 measured t = 2, 1: the free line falls (beta < 0). Edges:
    beta = 0 gives alpha = sum(1/t) / sum(1/t^2) = 1.5 / 1.25 = 1.2 (weighted
    squared error 0.2); alpha = 0 gives beta = 2.5 / 4.25 (error 0.53). So
    t = 1.2 at any x."""
    cal, x = _arrays([1.0, 2.0], [2.0, 1.0], [0, 0])
    shapes, model = _query(10.0)
    _, t = shape_calibrated_seconds(cal, shapes, model, x)
    assert float(t[0, Strategy.DATA]) == pytest.approx(1.2, rel=1e-5)


def test_own_strategy_trend_before_other_strategies():
    """Data points (1, 2), (3, 4): t = 1 + x. Filter points (1, 2), (2, 4): t
    = 2x. At x = 4: data 5, filter 8. Replicated has no points of its own:
    the operation's four, weights 1/4, 1/16, 1/4, 1/16: means x = 1.3, t =
    2.4; Sxx = 0.25625, Sxy = 0.3; beta = 48/41, alpha = 36/41; at 4: 228/41."""
    cal, x = _arrays([1.0, 3.0, 1.0, 2.0], [2.0, 4.0, 2.0, 4.0], [0, 0, 1, 1])
    shapes, model = _query(4.0)
    _, t = shape_calibrated_seconds(cal, shapes, model, x)
    assert float(t[0, Strategy.DATA]) == pytest.approx(5.0, rel=1e-5)
    assert float(t[0, Strategy.FILTER]) == pytest.approx(8.0, rel=1e-5)
    assert float(t[0, Strategy.REPLICATED]) == pytest.approx(228 / 41, rel=1e-5)


def test_single_point_is_a_ratio_not_proportional_to_work():
    """One point: model 2 s, measured 3 s. A shard the model puts at 5 s: 7.5 s."""
    cal, x = _arrays([2.0], [3.0], [1])
    shapes, model = _query(5.0)
    measured, t = shape_calibrated_seconds(cal, shapes, model, x)
    assert np.asarray(measured).all()
    assert np.asarray(t)[0] == pytest.approx([7.5] * S, rel=1e-6)


def test_operation_without_points_keeps_the_model():
    cal, x = _arrays([2.0], [3.0], [0])
    cal = cal._replace(row_group=jnp.asarray([-1.0]))
    shapes, model = _query(5.0)
    measured, t = shape_calibrated_seconds(cal, shapes, model, x)
    assert not np.asarray(measured).any() and np.asarray(t)[0] == pytest.approx([5.0] * S)


def _chain():
    g = GraphBuilder("chain", (4, 8, 8))
    x = g.conv("conv", g.input, 8, 3)
    g.dense("fc", g.flatten("flat", x), 16)
    return g.build()


def test_version_1_and_2_files_read_as_before():
    """Batch 8 on 2 x 2: work 2 (data, filter, channel, spatial), 4
    (replicated). v1 conv points (1, 1 ms), (4, 2 ms): log-log midpoint 1.414
    ms at 2, 2 ms at 4; fc one point (2, 0.3 ms). v2 adds filter's own (1, 4
    ms), (4, 16 ms): 8 ms at 2."""
    g = _chain()
    v1 = Calibration.from_dict({"schema": "shardplan/calibration", "version": 1, "hardware": "abci-v100",
                                "dtype": "float32", "layers": {"conv": {"work": [1, 4], "seconds": [1e-3, 2e-3]},
                                                               "fc": {"work": [2], "seconds": [3e-4]}}})
    hw = hardware_arrays(load_hardware("abci-v100"))
    t = np.asarray(cost_table(g.arrays, hw, 8.0, 2.0, 2.0, calibration=calibration_arrays(v1, g)).compute_s)
    assert t[0, Strategy.DATA] == pytest.approx(1e-3 * 2**0.5, rel=1e-5)
    assert t[0, Strategy.REPLICATED] == pytest.approx(2e-3, rel=1e-5)
    assert t[2, Strategy.FILTER] == pytest.approx(3e-4, rel=1e-5)
    v2 = Calibration.from_dict({**v1.to_dict(), "version": 2, "layers": {
        "conv": {"work": [1, 4], "seconds": [1e-3, 2e-3],
                 "strategies": {"filter": {"work": [1, 4], "seconds": [4e-3, 1.6e-2]}}}}})
    t = np.asarray(cost_table(g.arrays, hw, 8.0, 2.0, 2.0, calibration=calibration_arrays(v2, g)).compute_s)
    assert t[0, Strategy.FILTER] == pytest.approx(8e-3, rel=1e-5)
    assert t[0, Strategy.CHANNEL] == pytest.approx(1e-3 * 2**0.5, rel=1e-5)
    assert v1.version == 1 and v2.version == 2


@pytest.mark.slow
def test_other_hardware_is_refused_unless_allowed(tmp_path, capsys):
    g = _twin()
    cal = _cal(_point("data", 8, 8, 8, 1e-3), hardware="h200")
    cal = Calibration(hardware="h200", dtype="float32", points=cal.points, device_name="NVIDIA H200",
                      source="calibration.json")
    a100 = load_hardware("dgx-a100")
    with pytest.raises(ValueError, match=r"^calibration\.json was measured on h200 \(NVIDIA H200\), not dgx-a100; "
                                         r"pass --allow-other-hardware \(API: allow_other_hardware=True\)"):
        evaluate(g, a100, 1, strategy="data", batch=8, calibration=cal)
    ev = evaluate(g, a100, 1, strategy="data", batch=8, calibration=cal, allow_other_hardware=True)
    assert ev.layers[g.names.index("a")].compute_s == pytest.approx(1e-3, rel=1e-6)
    assert evaluate(g, load_hardware("h200"), 1, strategy="data", batch=8, calibration=cal).layers[
        g.names.index("b")].compute_s == pytest.approx(1e-3, rel=1e-6)
    # A version 1 file names its hardware; the CLI reports the refusal as one line, exit 2.
    f = tmp_path / "v1.json"
    f.write_text(json.dumps({"schema": "shardplan/calibration", "version": 1, "hardware": "abci-v100",
                             "dtype": "float32", "layers": {"a": {"work": [8], "seconds": [1e-3]}}}))
    model = tmp_path / "twin.json"
    model.write_text(g.to_json())
    args = ["evaluate", str(model), "--devices", "1", "--strategy", "data", "--batch", "8", "--hardware", "dgx-a100",
            "--calibration", str(f), "--json"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert f"{f} was measured on abci-v100, not dgx-a100" in err and "--allow-other-hardware" in err
    assert "\n" not in err
    assert main([*args, "--allow-other-hardware"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["layers"][g.names.index("a")]["compute_s"] == pytest.approx(1e-3, rel=1e-6)


def test_version_3_round_trip(tmp_path):
    cal = Calibration(
        hardware="h200", dtype="float32", device_name="NVIDIA H200",
        points=(_point("spatial", 8, 8, 8, 9e-4, rows=6.0, out_rows=4.0),
                ShapePoint(OpKey("dense", "float32"), LayerDims(25088.0, 4096.0), "filter",
                           ShardDims(64.0, 25088.0, 512.0), 2.5e-4)),
    )
    data = cal.to_dict()
    assert data["version"] == 3 and data["device"] == {"preset": "h200", "name": "NVIDIA H200"}
    assert data["points"][0] == {
        "op": {"kind": "conv", "rank": 2, "dtype": "float32", "kernel": [3, 3], "stride": [1, 1],
               "dilation": [1, 1], "groups": 1},
        "layer": {"C": 8, "F": 8, "in": [8, 8], "out": [8, 8]}, "strategy": "spatial",
        "shard": {"b": 8, "c": 8, "f": 8, "in": [6, 8], "out": [4, 8]}, "seconds": 9e-4}
    f = tmp_path / "cal.json"
    f.write_text(json.dumps(data))
    back = load_calibration(f)
    assert back == cal and back.source == str(f)
    bad = dict(data, points=[dict(data["points"][0], strategy="diagonal")])
    with pytest.raises(ValueError, match=r"points\[0\]: unknown strategy 'diagonal'"):
        Calibration.from_dict(bad)
    with pytest.raises(ValueError, match='"device" must be'):
        Calibration.from_dict(dict(data, device="h200"))
    with pytest.raises(ValueError, match="not the file's"):
        Calibration.from_dict(dict(data, dtype="bfloat16"))


def test_from_measurement_rows():
    """A spatial row of a 3x3 SAME conv at H = 8 over 2: h = 4 + 2 input rows,
    4 output rows; a dense row: c = I, f = O / 2. Rows of another dtype are
    skipped when dtype is given, and mixing them without is an error."""
    rows = [
        {"kind": "conv", "C": 8, "F": 8, "H": 8, "W": 8, "K": 3, "B": 16, "strategy": "spatial", "p": 2,
         "shard": {"b": 8, "c": 8, "f": 8, "h": 6, "w": 8}, "dtype": "float32", "fwd_bwd_s": 9e-4},
        {"kind": "dense", "I": 64, "O": 32, "B": 16, "strategy": "filter", "p": 2,
         "shard": {"b": 16, "i": 64, "o": 16}, "dtype": "float32", "fwd_bwd_s": 1e-4},
        {"kind": "dense", "I": 64, "O": 32, "B": 16, "strategy": "data", "p": 1,
         "shard": {"b": 16, "i": 64, "o": 32}, "dtype": "bfloat16", "fwd_bwd_s": 1e-4},
    ]
    cal = Calibration.from_records(rows, hardware="h200", device_name="NVIDIA H200", dtype="float32")
    assert cal.points == (
        _point("spatial", 8, 8, 8, 9e-4, rows=6.0, out_rows=4.0),
        ShapePoint(OpKey("dense", "float32"), LayerDims(64.0, 32.0), "filter", ShardDims(16.0, 64.0, 16.0), 1e-4),
    )
    with pytest.raises(ValueError, match="pass dtype="):
        Calibration.from_records(rows, hardware="h200")
    with pytest.raises(ValueError, match="row 0: missing 'K'"):
        Calibration.from_records([{k: v for k, v in rows[0].items() if k != "K"}], hardware="h200")


def test_by_layer_for_the_oracle():
    """The oracle's per-layer work points: data b = 4 (work 4), filter b = 8
    f = 4 of 8 (work 4 too), filter b = 4 f = 4 (work 2); a and b alike."""
    g = _twin()
    cal = _cal(_point("data", 4, 8, 8, 1e-3), _point("filter", 8, 8, 4, 3e-3), _point("filter", 4, 8, 4, 6e-4))
    v2 = cal.by_layer(g)
    assert v2.layers == {"a": ((2.0, 6e-4), (4.0, 2e-3)), "b": ((2.0, 6e-4), (4.0, 2e-3))}
    assert v2.strategies["a"] == {"data": ((4.0, 1e-3),), "filter": ((2.0, 6e-4), (4.0, 3e-3))}


def test_cost_table_compiles_once_per_bucket_with_a_calibration():
    g = _twin()
    cal = calibration_arrays(_cal(_point("data", 4, 8, 8, 1e-3), _point("filter", 8, 8, 4, 7e-4)), g)
    hw = hardware_arrays(load_hardware("abci-v100"))
    cost_table(g.arrays, hw, 8.0, 1.0, 2.0, calibration=cal)
    before = cost_table._cache_size()
    for batch, d, m in ((16.0, 2.0, 1.0), (8.0, 1.0, 4.0), (32.0, 4.0, 2.0)):
        cost_table(g.arrays, hw, batch, d, m, calibration=cal)
    assert cost_table._cache_size() == before
