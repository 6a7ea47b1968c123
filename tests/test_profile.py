"""Calibration from measurements: ``planner.calibrate.profile`` (shard
bookkeeping with a fake clock, ops checked against the layer graph's shapes
and XLA's FLOP count, one tiny real profile), ``shardplan profile`` into
``plan``, ``--calibration`` in the oracle, and ``planner.calibrate.fit`` recovering
known hardware parameters from synthetic step times."""

import dataclasses
import json
import math

import jax
import numpy as np
import pytest

from costmodels import Calibration, load_calibration, load_hardware
from costmodels.calibration import LayerDims, OpKey
from costmodels.strategies import STRATEGY_NAMES, Strategy
from planner import GraphBuilder
from planner.calibrate.fit import StepTime, fit_hardware
from planner.calibrate.profile import menu_meshes, profile_layers
from planner.calibrate.shard_ops import _forward, shard_op
from planner.cli import main
from planner.evaluation import evaluate
from planner.paradl.report import oracle


def _conv_relu():
    g = GraphBuilder("conv_relu", (3, 8, 8))
    g.relu("relu", g.conv("conv", g.input, 8, 3))
    return g.build()


def _every_kind():
    g = GraphBuilder("every_kind", (4, 8, 8))
    a = g.conv("conv", g.input, 8, 3, stride=2, padding=((1, 1), (0, 1)))
    b = g.batch_norm("bn", a)
    r = g.relu("relu", b)
    c = g.conv("conv_b", r, 8, 3, bias=False)
    s = g.conv("skip", r, 8, 1)
    x = g.add("add", [g.max_pool("pool_c", c, 2), g.avg_pool("pool_s", s, 2, stride=2)])
    x = g.concat("cat", [x, g.conv("conv_g", x, 4, 1, groups=4)])
    x = g.dense("fc_spatial", x, 6)
    x = g.flatten("flat", g.global_avg_pool("gap", x))
    g.dense("fc", x, 3)
    return g.build()


class FakeClock:
    """Each timed call lasts ``deltas(k)`` seconds, k the timed call's index."""

    def __init__(self, deltas):
        self.deltas, self.now, self.calls = deltas, 0.0, 0

    def __call__(self):
        if self.calls % 2:
            self.now += self.deltas(self.calls // 2)
        self.calls += 1
        return self.now


def test_menu_meshes_are_every_split_of_powers_of_two():
    assert menu_meshes(4) == ((1, 1), (2, 1), (1, 2), (4, 1), (2, 2), (1, 4))
    assert menu_meshes(3) == ((1, 1), (2, 1), (1, 2))
    for bad in (0, -2, 2.0, True):
        with pytest.raises(ValueError, match="max_devices"):
            menu_meshes(bad)


@pytest.mark.slow
def test_fake_clock_bookkeeping():
    """conv(3 -> 8, 3x3) + relu on 8x8, batch 4, up to 2 devices. By hand:
    meshes 1x1 (work 4, every strategy runs the whole layer), 2x1 (work 2,
    whole layer at batch 2), 1x2 (data at batch 2; filter: batch 4, 4
    filters; spatial: batch 4, 4 output rows reading 6 input rows; channel
    impossible for the conv's 3 input channels, never for relu; replicated:
    batch 4, work 4). Distinct ops: 4 per layer; timed calls: 2 clock reads
    per repeat."""
    graph = _conv_relu()
    clock = FakeClock(lambda k: (1.0, 2.0, 9.0)[k % 3])  # median 2 (mean 4, min 1, last 9)
    prof = profile_layers(graph, 4, max_devices=2, repeats=3, warmup=1, timer=clock)
    assert clock.calls == 8 * 3 * 2
    rows = {(t.layer, t.strategy, t.mesh): t for t in prof.timings}
    expected = set()
    for layer, strategies in (("conv", ("data", "filter", "channel", "spatial", "replicated")),
                              ("relu", ("data", "filter", "spatial", "replicated"))):
        for mesh in ((1, 1), (2, 1)):
            expected |= {(layer, s, mesh) for s in strategies}
        expected |= {(layer, s, (1, 2)) for s in ("data", "filter", "spatial", "replicated")}
    assert set(rows) == expected and len(prof.timings) == len(expected) == 26
    assert rows["conv", "filter", (1, 2)].shape == "x[4,8,8,3] -> 4"
    assert rows["conv", "spatial", (1, 2)].shape == "x[4,6,8,3] -> 8"
    assert rows["relu", "filter", (1, 2)].shape == "x[4,8,8,4] -> 4"
    assert rows["relu", "spatial", (1, 2)].shape == "x[4,4,8,8] -> 8"
    assert rows["conv", "data", (1, 2)].shape == "x[2,8,8,3] -> 8"
    assert rows["conv", "replicated", (1, 2)].work == 4.0 and rows["conv", "filter", (1, 2)].work == 2.0
    assert {t.seconds for t in prof.timings} == {2.0}
    assert prof.layer_calibration().layers == {"conv": ((2.0, 2.0), (4.0, 2.0)), "relu": ((2.0, 2.0), (4.0, 2.0))}

    # Op k (in measuring order) takes k + 1 seconds: 1x1 conv, 1x1 relu, 2x1 conv, 2x1 relu,
    # 1x2 conv filter, 1x2 conv spatial, 1x2 relu filter, 1x2 relu spatial. Work 2 is the
    # median over its distinct shapes: conv {3, 5, 6} -> 5, relu {4, 7, 8} -> 7.
    clock = FakeClock(lambda k: 1.0 + k // 3)
    prof = profile_layers(graph, 4, max_devices=2, repeats=3, warmup=0, timer=clock, hardware="dgx-a100")
    cal = prof.layer_calibration()
    assert cal.layers == {"conv": ((2.0, 5.0), (4.0, 1.0)), "relu": ((2.0, 7.0), (4.0, 2.0))}
    assert cal.dtype == "float32"
    # Per strategy, the median over that strategy's own distinct shapes at each work. On
    # m = 1 every strategy runs the whole layer: 1x1 (work 4) and 2x1 (work 2); replicated
    # on 1x2 is the 1x1 shape (work 4) and data on 1x2 the 2x1 shape. Channel is not on the
    # menu at m = 2 (3 input channels) nor for relu at all.
    assert cal.strategies == {
        "conv": {"data": ((2.0, 3.0), (4.0, 1.0)), "filter": ((2.0, 4.0), (4.0, 1.0)),  # {3, 5}
                 "channel": ((2.0, 3.0), (4.0, 1.0)), "spatial": ((2.0, 4.5), (4.0, 1.0)),  # {3, 6}
                 "replicated": ((2.0, 3.0), (4.0, 1.0))},
        "relu": {"data": ((2.0, 4.0), (4.0, 2.0)), "filter": ((2.0, 5.5), (4.0, 2.0)),  # {4, 7}
                 "spatial": ((2.0, 6.0), (4.0, 2.0)), "replicated": ((2.0, 4.0), (4.0, 2.0))},  # {4, 8}
    }
    assert cal.to_dict()["version"] == 2 and Calibration.from_dict(json.loads(json.dumps(cal.to_dict()))) == cal

    # Version 3: one point per distinct (operation, strategy, shard). Per layer: 5 strategies
    # (4 for relu) x 2 meshes with m = 1, plus filter and spatial on 1 x 2 (data there, b = 2, is
    # the 2 x 1 data point again; replicated, b = 4, the 1 x 1 one): conv 12, relu 10.
    v3 = prof.calibration()
    assert v3.version == 3 and v3.hardware == "dgx-a100" and v3.device_name == prof.device
    conv = [p for p in v3.points if p.op.kind == "conv"]
    assert len(conv) == 5 * 2 + 2 and len(v3.points) == 12 + 4 * 2 + 2
    assert conv[0].op == OpKey("conv", "float32", 2, (3, 3), (1, 1), (1, 1), 1)
    assert conv[0].layer == LayerDims(3.0, 8.0, (8.0, 8.0), (8.0, 8.0))
    by = {(p.strategy, p.shard.batch, p.shard.out_channels, p.shard.in_spatial): p for p in conv}
    assert by["filter", 4.0, 4.0, (8.0, 8.0)].seconds == 5.0  # 1x2 conv filter: op 4, 5 s
    spatial = by["spatial", 4.0, 8.0, (6.0, 8.0)]  # 4 output rows reading 6
    assert spatial.shard.out_spatial == (4.0, 8.0) and spatial.seconds == 6.0
    assert by["data", 2.0, 8.0, (8.0, 8.0)].seconds == 3.0  # the 2x1 shard
    assert Calibration.from_dict(json.loads(json.dumps(v3.to_dict()))) == v3


def test_shard_ops_have_the_layer_graphs_shapes():
    """Every shard op's output (jax.eval_shape) is the layer's output from
    the graph's own shape inference, cut as the strategy says: whole
    (data / replicated), filters / m, ceil(rows / m) (spatial)."""
    graph = _every_kind()
    a = graph.unpadded()
    producers = {i: [s for s, d in graph.edges if d == i] for i in range(graph.num_layers)}
    for i, name in enumerate(graph.names):
        if name == "flat":
            continue
        r = int(a.out_spatial_rank[i])
        out_sp = [int(x) for x in a.out_spatial[i][:r]]
        f = int(a.out_channels[i])
        kind = graph.kind_names[i]
        parts = tuple(int(a.out_channels[p]) for p in producers[i]) if kind == "concat" else \
            (int(a.in_channels[i]),) * max(len(producers[i]), 1)
        for strategy, m, want in (
            (Strategy.DATA, 1, (4, *out_sp, f)),
            (Strategy.FILTER, 2, (4, *out_sp, f // 2)),
            (Strategy.SPATIAL, 2, (4, math.ceil(out_sp[0] / 2), *out_sp[1:], f) if r else None),
        ):
            if want is None or (strategy is Strategy.FILTER and (kind == "concat" or name == "conv_g")):
                continue
            op = shard_op(graph, i, strategy, 4, m, parts, True, "float32")
            params = {k: jax.ShapeDtypeStruct(s, np.float32) for k, s in _params(op).items()}
            xs = tuple(jax.ShapeDtypeStruct((op.batch, *op.in_spatial, c), np.float32) for c in op.inputs)
            got = jax.eval_shape(_forward(op), params, xs).shape
            assert got == want, (name, strategy.name, got, want)


def _params(op):
    from planner.calibrate.shard_ops import _param_shapes

    return _param_shapes(op)


@pytest.mark.slow
def test_conv_and_dense_ops_do_the_graphs_flops():
    """XLA's FLOP count of the forward op equals the graph's forward FLOPs x batch
    (the graph counts as XLA does, padding-aware)."""
    graph = _every_kind()
    a = graph.unpadded()
    for name in ("conv", "conv_b", "fc_spatial", "fc"):
        i = graph.names.index(name)
        n_in = 1
        op = shard_op(graph, i, Strategy.DATA, 4, 1, (int(a.in_channels[i]),) * n_in, True, "float32")
        params = {k: np.zeros(s, np.float32) for k, s in _params(op).items()}
        xs = tuple(np.zeros((op.batch, *op.in_spatial, c), np.float32) for c in op.inputs)
        flops = jax.jit(_forward(op)).lower(params, xs).compile().cost_analysis()["flops"]
        assert flops == pytest.approx(4 * float(a.flops_fwd[i]), rel=1e-6), name


@pytest.mark.slow
def test_real_profile_of_every_kind():
    graph = _every_kind()
    events = []
    prof = profile_layers(graph, 2, max_devices=1, repeats=1, warmup=1, callback=events.append)
    assert events[0].done == 0 and events[-1].done == events[-1].total == len(events) - 1 == 13
    assert all(t.seconds > 0 and math.isfinite(t.seconds) for t in prof.timings)
    cal = prof.layer_calibration()
    assert set(cal.layers) == set(graph.names) - {"flat"}
    assert all([w for w, _ in pts] == [2.0] for pts in cal.layers.values())
    v3 = prof.calibration()
    assert Calibration.from_dict(json.loads(json.dumps(v3.to_dict()))) == v3  # a valid file
    assert {p.op.kind for p in v3.points} == {"conv", "batch_norm", "elementwise", "dense", "pool", "add", "concat"}


def test_profile_rejects_bad_input():
    graph = _conv_relu()
    with pytest.raises(ValueError, match="dtype"):
        profile_layers(graph, 4, dtype="int8")
    with pytest.raises(ValueError, match="batch"):
        profile_layers(graph, 0)
    with pytest.raises(ValueError, match="repeats"):
        profile_layers(graph, 4, repeats=0)
    with pytest.raises(ValueError, match="no layer"):
        profile_layers(graph, 4, layers=["nope"])


def test_cli_profile_usage_errors(capsys, tmp_path):
    path = tmp_path / "m.json"
    path.write_text(_conv_relu().to_json())
    assert main(["profile", str(path), "--batch", "0", "-o", str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("shardplan: error: --batch must be") and "\n" not in err
    assert main(["profile", str(path)]) == 2  # --batch is required


@pytest.mark.slow
def test_cli_profile_then_plan_uses_the_measurements(tmp_path, capsys):
    path = tmp_path / "model.json"
    path.write_text(_conv_relu().to_json())
    cal_path = tmp_path / "cal.json"
    assert main(["profile", str(path), "--batch", "4", "--max-devices", "2", "--repeats", "1", "--warmup", "1",
                 "--hardware", "dgx-a100", "-o", str(cal_path)]) == 0
    summary = json.loads(capsys.readouterr().out)
    cal = load_calibration(cal_path)
    assert cal.version == 3 and cal.hardware == "dgx-a100"
    assert {"conv", "relu"} == {r["name"] for r in summary["layers"]}
    assert main(["plan", str(path), "--devices", "2", "--batch", "4", "--hardware", "dgx-a100",
                 "--calibration", str(cal_path), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    d, m = plan["mesh"]
    for row in plan["layers"]:  # every shard of the plan's mesh was measured: its time, exactly
        s = STRATEGY_NAMES.index(row["strategy"])
        kind = "conv" if row["name"] == "conv" else "elementwise"
        b = 4 / d if s == Strategy.REPLICATED else 4 / (d * m) if s == Strategy.DATA else 4 / d
        f = 8 / m if s == Strategy.FILTER else 8
        rows = 8 if s != Strategy.SPATIAL or m == 1 else (6 if kind == "conv" else 4)
        hits = [p.seconds for p in cal.points if p.op.kind == kind and p.shard.batch == b
                and p.shard.out_channels == f and p.shard.in_spatial[0] == rows]
        assert hits and row["compute_s"] == pytest.approx(hits[0], rel=1e-5)
    assert main(["plan", str(path), "--devices", "2", "--batch", "4", "--hardware", "abci-v100",
                 "--calibration", str(cal_path), "--json"]) == 2
    assert "was measured on dgx-a100" in capsys.readouterr().err


def _chain():
    g = GraphBuilder("chain", (4, 8, 8))
    x = g.conv("conv", g.input, 8, 3)
    x = g.relu("relu", x)
    x = g.flatten("flat", x)
    g.dense("fc", x, 4)
    return g.build()


def test_oracle_calibration_replaces_layer_compute(tmp_path, capsys):
    """Each measured layer takes 1 ms per sample-equivalent (one point: time
    proportional to work). Data on b = 4 samples: 3 layers x 4 ms (flatten is
    not an oracle row). Filter over 2: the conv is split (2 ms), relu and fc
    are not (4 ms each). Unmeasured layers keep the roofline."""
    graph = _chain()
    cal = Calibration("abci-v100", "float32", {n: ((1.0, 1e-3),) for n in graph.names})
    rep = oracle(graph, "abci-v100", [1, 2], ["data", "filter"], batch_per_device=4, calibration=cal)
    assert rep.row("data", 1).compute_s == pytest.approx(12e-3, rel=1e-5)
    assert rep.row("filter", 2).compute_s == pytest.approx(10e-3, rel=1e-5)
    # The oracle uses the work-only points: per-strategy points (10x slower) change nothing.
    own = {n: {"filter": ((1.0, 1e-2),), "data": ((1.0, 1e-2),)} for n in graph.names}
    rep2 = oracle(graph, "abci-v100", [1, 2], ["data", "filter"], batch_per_device=4,
                  calibration=dataclasses.replace(cal, strategies=own))
    assert rep2.row("filter", 2).compute_s == pytest.approx(10e-3, rel=1e-5)
    plain = oracle(graph, "abci-v100", [1], ["data"], batch_per_device=4)
    only_conv = oracle(graph, "abci-v100", [1], ["data"], batch_per_device=4,
                       calibration=Calibration("abci-v100", "float32", {"conv": ((4.0, 1.0),)}))
    conv_roofline = plain.row("data", 1).compute_s - only_conv.row("data", 1).compute_s + 1.0
    assert 0 < conv_roofline < plain.row("data", 1).compute_s
    f = tmp_path / "cal.json"
    f.write_text(json.dumps(cal.to_dict()))
    assert main(["oracle", _write(tmp_path, graph), "--devices", "1", "--strategies", "data",
                 "--batch-per-device", "4", "--calibration", str(f), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["compute_s"] == pytest.approx(12e-3, rel=1e-5)
    with pytest.raises(ValueError, match="compat"):
        oracle(graph, "abci-v100", [1], ["data"], batch_per_device=4, calibration=cal, compat="paradl")
    with pytest.raises(ValueError, match="another model"):
        oracle(graph, "abci-v100", [1], ["data"],
               calibration=Calibration("abci-v100", "float32", {"nope": ((1.0, 1.0),)}))
    with pytest.raises(ValueError, match="measured on abci-v100, not dgx-a100"):
        oracle(graph, "dgx-a100", [1], ["data"], batch_per_device=4, calibration=cal)
    # A version 3 calibration: the oracle reads it as per-layer work points (by_layer). Every layer
    # measured at its whole-layer shard of 4 samples, 1 ms: data on 1 device, 3 x 1 ms.
    v3 = profile_layers(graph, 4, max_devices=1, repeats=1, warmup=0, timer=FakeClock(lambda k: 1e-3),
                        hardware="abci-v100").calibration()
    assert oracle(graph, "abci-v100", [1], ["data"], batch_per_device=4, calibration=v3).row(
        "data", 1).compute_s == pytest.approx(3e-3, rel=1e-5)


def _write(tmp_path, graph):
    p = tmp_path / f"{graph.model_name}.json"
    p.write_text(graph.to_json())
    return str(p)


def _fit_graph():
    g = GraphBuilder("cnn", (8, 64, 64))
    x = g.conv("c1", g.input, 8, 3)
    x = g.relu("r1", x)
    x = g.conv("c2", x, 8, 3)
    x = g.global_avg_pool("gap", x)
    x = g.dense("fc1", x, 512)
    g.dense("fc2", x, 512)
    return g.build()


@pytest.mark.slow
def test_fit_recovers_known_parameters():
    """Step times generated by ``evaluate`` with known efficiencies and a known
    intra-node tier (latency 8 us, 120 GB/s), fitted from the dgx-a100
    preset's values: the fit finds them. Elementwise efficiency (no layer is
    compute-bound on it) and the inter-node tier (no measurement crosses
    nodes) get no gradient and keep their starting values."""
    from costmodels.hardware import KernelSpec

    graph = _fit_graph()
    # the plain roofline per kernel at true float32 (matmul precision highest, 19.5 TFLOP/s):
    # the convolutions are compute-bound at some batch, every efficiency is identifiable
    start = load_hardware("dgx-a100")
    start = dataclasses.replace(start, device=dataclasses.replace(
        start.device, kernel=KernelSpec(dispatch_s=1e-4), matmul_precision="highest"))
    eff = {"conv": 0.35, "matmul": 0.5, "elementwise": 0.8, "memory": 0.45}
    tiers = (dataclasses.replace(start.tiers[0], latency_s=8e-6, bandwidth_bytes_per_s=120e9), start.tiers[1])
    true = dataclasses.replace(start, tiers=tiers, device=dataclasses.replace(start.device, efficiency=eff))
    runs = [((1, 1), "data", b) for b in (1, 4, 32, 256, 2048)]
    runs += [(mesh, s, b) for b in (2, 64, 1024, 8192) for mesh, s in (((1, 2), "spatial"), ((2, 1), "data"),
                                                                       ((1, 2), "filter"))]
    dispatch = true.device.kernel.dispatch_s  # a measured step is one jitted call: one dispatch
    measured = [StepTime(evaluate(graph, true, mesh[0] * mesh[1], mesh=mesh, strategy=s, batch=b).iteration_s + dispatch,
                         b, mesh, s) for mesh, s, b in runs]
    events = []
    fit = fit_hardware(graph, measured, start, steps=2000, learning_rate=0.1, callback=events.append)
    assert fit.fitted == ("efficiency", "network")
    assert len(events) == 2000 and len(fit.loss_history) == 2001
    assert fit.loss_history[-1] < 1e-6 < fit.loss_history[0]
    got = fit.hardware.device
    for c in ("conv", "matmul", "memory"):  # the float32 entries are the ones fitted
        assert got.efficiency_of(c, "float32") == pytest.approx(eff[c], rel=2e-2), c  # from 0.8
    assert got.efficiency_of("conv", "bfloat16") == start.device.efficiency_of("conv", "bfloat16")  # not measured
    assert got.efficiency["elementwise"] == pytest.approx(start.device.efficiency["elementwise"], rel=1e-6)
    assert got.kernel == start.device.kernel  # not asked for
    assert fit.hardware.tiers[0].latency_s == pytest.approx(8e-6, rel=1e-2)
    assert fit.hardware.tiers[0].bandwidth_bytes_per_s == pytest.approx(120e9, rel=1e-2)
    assert fit.hardware.tiers[1] == start.tiers[1]
    assert fit.predicted_s == pytest.approx(fit.measured_s, rel=1e-3)
    assert fit.initial_s != pytest.approx(fit.measured_s, rel=1e-2)
    # the fitted hardware is plain data that evaluate accepts
    again = evaluate(graph, fit.hardware, 2, mesh=(1, 2), strategy="spatial", batch=64).iteration_s
    assert again + dispatch == pytest.approx(measured[8].seconds, rel=1e-3)


@pytest.mark.slow
def test_fit_recovers_kernel_parameters():
    """Step times generated with a known kernel model (launch 7 us, saturation
    3e4 output elements, exponent 1.7, dispatch 150 us, tile 32) on one
    device, fitted from a neutral start of the same device: the fit picks the
    tile among CHANNEL_TILES and finds the continuous parameters."""
    from costmodels.hardware import KernelSpec
    from planner.calibrate.fit import CHANNEL_TILES

    graph = _fit_graph()
    start = load_hardware("dgx-a100")
    start = dataclasses.replace(start, device=dataclasses.replace(start.device, kernel=KernelSpec()))
    kernel = KernelSpec(launch_s=7e-6, channel_tile=32.0, reduction_tile=1.0, saturation_output_elements=3e4,
                        compute_memory_exponent=1.7, dispatch_s=1.5e-4)
    true = dataclasses.replace(start, device=dataclasses.replace(start.device, kernel=kernel))
    # two graphs of different kernel counts: launch_s and dispatch_s are told apart
    graphs = [graph, _chain()]
    runs = [(g, (1, 1), "data", b) for g in graphs for b in (1, 4, 16, 64, 256, 1024)]
    runs += [(graph, (1, 2), s, b) for b in (1, 4, 16, 256) for s in ("filter", "channel")]
    measured = [StepTime(evaluate(g, true, mesh[0] * mesh[1], mesh=mesh, strategy=s, batch=b).iteration_s
                         + kernel.dispatch_s, b, mesh, s, model=g.model_name) for g, mesh, s, b in runs]
    fit = fit_hardware(graphs, measured, start, fit=("kernel",), steps=4000, learning_rate=0.02)
    got = fit.hardware.device.kernel
    assert 32.0 in CHANNEL_TILES and got.channel_tile == 32.0
    assert fit.loss_history[-1] < 1e-5
    assert got.launch_s == pytest.approx(7e-6, rel=5e-2)
    assert got.dispatch_s == pytest.approx(1.5e-4, rel=5e-2)
    assert got.saturation_output_elements == pytest.approx(3e4, rel=5e-2)
    # the exponent matters only where a kernel's compute and memory times are close: few here
    assert got.compute_memory_exponent == pytest.approx(1.7, rel=0.3)
    assert fit.predicted_s == pytest.approx(fit.measured_s, rel=5e-3)


def test_fit_rejects_bad_input():
    graph = _fit_graph()
    hw = load_hardware("dgx-a100")
    with pytest.raises(ValueError, match="at least one measured"):
        fit_hardware(graph, [], hw)
    with pytest.raises(ValueError, match="positive and finite"):
        fit_hardware(graph, [StepTime(0.0, 8)], hw)
    with pytest.raises(ValueError, match="fit must name"):
        fit_hardware(graph, [StepTime(1.0, 8)], hw, fit=["peak"])
    with pytest.raises(ValueError, match="multiple of the data axis"):
        fit_hardware(graph, [StepTime(1.0, 3, (2, 1))], hw)
    other = _chain()
    with pytest.raises(ValueError, match="ambiguous"):
        fit_hardware([graph, other], [StepTime(1.0, 8)], hw)
    with pytest.raises(ValueError, match="names model 'nope'"):
        fit_hardware([graph, other], [StepTime(1.0, 8, model="nope")], hw)


def test_only_the_meshes_asked_for():
    """meshes=[(1, 2)]: only that mesh's shards, by hand as in
    test_fake_clock_bookkeeping: data, filter, spatial and replicated of each
    layer (channel cannot split the conv's 3 input channels)."""
    graph = _conv_relu()
    clock = FakeClock(lambda k: 1.0)
    prof = profile_layers(graph, 4, max_devices=2, repeats=1, warmup=0, timer=clock, meshes=[(1, 2)])
    assert {t.mesh for t in prof.timings} == {(1, 2)}
    assert {(t.layer, t.strategy) for t in prof.timings} == {
        (layer, s) for layer in ("conv", "relu") for s in ("data", "filter", "spatial", "replicated")}
    with pytest.raises(ValueError, match="meshes must be"):
        profile_layers(graph, 4, meshes=[])
