"""Bad input: every command and public function rejects a mistake
in what it is given with one actionable line, never a traceback, a
``KeyError``/``TypeError``/``ZeroDivisionError``, or a silently wrong plan.

Two tables: ``shardplan`` invocations (exit status 2 for usage errors, 1
for an infeasible plan; exactly one ``shardplan: error: ...`` line on
stderr carrying a key phrase of the expected message) and public-function
calls (``ValueError`` whose message carries the key phrase). The files the
rows read are written once per module: valid ones (a tiny ParaDL network,
a preset's hardware JSON, a calibration, plans) with one field broken.
"""

from __future__ import annotations

import json
import math
import re

import pytest
from reference_files import TINY_NET

from costmodels import load_calibration, load_hardware
from planner.cli import main
from planner.models.netfile import parse_net
from planner.models.zoo import MODEL_NAMES, get_model


def _graph(**change):
    """The tiny network's layer-graph dict with ``change`` applied to its first layer."""
    d = parse_net(TINY_NET).to_dict()
    d["layers"][0].update(change)
    return d


def _graph_row(row, **change):
    """The tiny network's layer-graph dict with ``change`` applied to layer ``row``."""
    d = parse_net(TINY_NET).to_dict()
    d["layers"][row].update(change)
    return d


def _shape_calibration() -> dict:
    """A version 3 calibration, hand-written: one point of a 3x3 conv 3->64 on 224x224."""
    return {"schema": "shardplan/calibration", "version": 3, "dtype": "float32",
            "device": {"preset": "abci-v100", "name": "Tesla V100"},
            "points": [{"op": {"kind": "conv", "rank": 2, "dtype": "float32", "kernel": [3, 3], "stride": [1, 1],
                               "dilation": [1, 1], "groups": 1},
                        "layer": {"C": 3, "F": 64, "in": [224, 224], "out": [224, 224]}, "strategy": "data",
                        "shard": {"b": 8, "c": 3, "f": 64, "in": [224, 224], "out": [224, 224]},
                        "seconds": 1e-3}]}


def _hardware(mutate):
    d = load_hardware("abci-v100").to_dict()
    mutate(d)
    return d


def _calibration(seconds, layer="CONV1"):
    return {"schema": "shardplan/calibration", "version": 1, "hardware": "abci-v100", "dtype": "float32",
            "layers": {layer: {"work": [1, 8], "seconds": seconds}}}


def _plan_rows(model: str) -> dict:
    """What ``evaluate --plan`` reads, as ``plan -o`` writes it: every layer of
    ``model`` on ``data``, with the model's name and graph fingerprint."""
    g = get_model(model)
    return {"model": g.model_name, "graph_fingerprint": g.fingerprint,
            "layers": [{"name": n, "strategy": "data"} for n in g.names]}


def _valid_plan_file() -> dict:
    """A complete plan file (``Plan.to_dict``) for the tiny network, hand-written."""
    g = parse_net(TINY_NET)
    layer = {"kind": "conv2d", "strategy": "data", "compute_s": 1e-3, "comm_s": 0.0, "reshard_s": 0.0,
             "memory_bytes": 1e6}
    return {
        "schema": "shardplan/plan", "version": 1, "model": "tiny", "hardware": "abci-v100", "devices": 4,
        "mesh": [4, 1], "axis_names": ["data", "model"], "batch": 8, "dtype": "float32", "optimizer": "adam",
        "iteration_s": 1e-3, "memory_bytes_per_device": 1e6, "memory_capacity_bytes": 16e9,
        "memory_limit_bytes": 16e9, "fits_memory": True, "data_parallel_iteration_s": 1e-3,
        "data_parallel_memory_bytes": 1e6, "speedup_over_data_parallel": 1.0, "method": "dp", "seed": 0,
        "seconds": 0.1, "optimality_gap": 0.0, "graph_fingerprint": g.fingerprint,
        "input_shape": list(g.input_shape),
        "layers": [{"name": n, **layer} for n in g.names], "collectives": [],
        "meshes": [{"mesh": [4, 1], "feasible": True, "iteration_s": 1e-3, "memory_bytes_per_device": 1e6,
                    "min_memory_bytes": 1e6, "method": "dp", "optimality_gap": 0.0}],
    }


def _with(d: dict, **change) -> dict:
    return {**d, **change}


def _plan5(change_layer=None, **change) -> dict:
    """The hand-written plan file read and written back (version 5, every field)
    with ``change`` applied, and ``change_layer`` to its first layer row."""
    from planner.planning import Plan

    d = Plan.from_dict(_valid_plan_file()).to_dict()
    d["layers"][0].update(change_layer or {})
    return {**d, **change}


def _rows(change_layer=None, **change) -> dict:
    """What ``evaluate --json`` writes for the tiny network (no schema),
    with ``change`` applied, and ``change_layer`` to its first layer row."""
    d = _plan5()
    rows = [{k: r[k] for k in ("name", "strategy", "zero_stage", "remat", "joins")} for r in d["layers"]]
    rows[0].update(change_layer or {})
    return {"model": "tiny", "hardware": "abci-v100", "devices": 4, "mesh": [4, 1], "batch": 8,
            "layers": rows, **change}


def _files() -> dict[str, str | bytes]:
    """File name -> text. Python's json writes NaN / Infinity literals, which
    its reader accepts: exactly what a sloppy tool would produce."""
    good_graph = json.dumps(parse_net(TINY_NET).to_dict())
    good_hw = json.dumps(load_hardware("abci-v100").to_dict())
    good_plan = json.dumps(_valid_plan_file())
    def tiers(f):
        return lambda d: f(d["tiers"][1])

    return {
        "tiny.net": TINY_NET,
        "net_nan_time.net": TINY_NET.replace("4x8x8|0.5", "4x8x8|nan"),
        "net_inf_time.net": TINY_NET.replace("4x8x8|0.5", "4x8x8|inf"),
        "net_zero_dims.net": TINY_NET.replace("CONV1|3x8x8|3x4x3x3|4x8x8", "CONV1|3x8x8|3x4x3x3|0x8x8"),
        "net_negative_dims.net": TINY_NET.replace("Input|100x3x8x8", "Input|100x3x-8x8"),
        "net_truncated.net": TINY_NET[: TINY_NET.index("RELU") + 9],
        "graph_nan.json": json.dumps(_graph(flops_fwd=math.nan)),
        "graph_inf.json": json.dumps(_graph(params=math.inf)),
        "graph_truncated.json": good_graph[: len(good_graph) // 2],
        "graph_zero_channels.json": json.dumps(_graph(in_channels=0)),
        "graph_negative_spatial.json": json.dumps(_graph(in_spatial=[-8, 8, 1])),
        "graph_zero_stride.json": json.dumps(_graph(stride=[0, 1, 1])),
        "graph_fractional_channels.json": json.dumps(_graph(out_channels=2.5)),
        "graph_rank_9.json": json.dumps(_graph(spatial_rank=9)),
        "hw_nan.json": json.dumps(_hardware(tiers(lambda t: t.update(bandwidth_bytes_per_s=math.nan)))),
        "hw_inf.json": json.dumps(_hardware(lambda d: d["device"].update(memory_bytes=math.inf))),
        "hw_truncated.json": good_hw[: len(good_hw) // 2],
        "hw_missing_latency.json": json.dumps(_hardware(tiers(lambda t: t.pop("latency_s")))),
        "hw_missing_device.json": json.dumps(_hardware(lambda d: d.pop("device"))),
        "hw_gbps.json": json.dumps(_hardware(tiers(lambda t: t.update(
            bandwidth_gbps=t.pop("bandwidth_bytes_per_s") / 1e9)))),
        "hw_negative_bandwidth.json": json.dumps(_hardware(tiers(lambda t: t.update(bandwidth_bytes_per_s=-12.5e9)))),
        "hw_memory_in_gb.json": json.dumps(_hardware(lambda d: d["device"].update(memory_bytes=16))),
        "hw_bandwidth_in_gb.json": json.dumps(_hardware(tiers(lambda t: t.update(bandwidth_bytes_per_s=12.5)))),
        "hw_latency_in_us.json": json.dumps(_hardware(tiers(lambda t: t.update(latency_s=40.31)))),
        "hw_bandwidth_string.json": json.dumps(_hardware(tiers(lambda t: t.update(bandwidth_bytes_per_s="12.5 GB/s")))),
        "cal_nan.json": json.dumps(_calibration([1e-4, math.nan])),
        "cal_inf.json": json.dumps(_calibration([1e-4, math.inf])),
        "cal_truncated.json": json.dumps(_calibration([1e-4, 2e-4]))[:40],
        "cal_negative.json": json.dumps(_calibration([1e-4, -2e-4])),
        "cal_tiny.json": json.dumps(_calibration([1e-4, 2e-4])),
        "cal_float32.json": json.dumps(_calibration([1e-4, 2e-4], layer="features/0")),
        "plan_vgg16.json": json.dumps(_plan_rows("vgg16")),
        "plan_vgg16_cifar10.json": json.dumps(_plan_rows("vgg16-cifar10")),
        "plan_nan.json": json.dumps(_with(_plan_rows("vgg16-cifar10"), iteration_s=math.nan)),
        "plan_truncated.json": json.dumps(_plan_rows("vgg16-cifar10"))[:100],
        "plan_file.json": good_plan,
        "plan_file_nan.json": json.dumps(_with(_valid_plan_file(), iteration_s=math.nan)),
        "plan_file_inf_memory.json": json.dumps(_with(_valid_plan_file(), memory_limit_bytes=math.inf)),
        "plan_file_truncated.json": good_plan[:-30],
        "plan_file_zero_devices.json": json.dumps(_with(_valid_plan_file(), devices=0, mesh=[0, 1])),
        "plan_duplicate_layer.json": json.dumps(_with(_plan_rows(M), layers=_plan_rows(M)["layers"] * 2)),
        "binary.json": b"\x89PNG\r\n\x1a\n\xff\xfe",
        # numbers JSON holds but float32, in which the cost model computes, does not
        "hw_tiny_efficiency.json": json.dumps(_hardware(lambda d: d["device"]["efficiency"].update(conv=1e-40))),
        "hw_subnormal_efficiency.json": json.dumps(_hardware(lambda d: d["device"]["efficiency"].update(conv=1e-300))),
        "hw_huge_bandwidth.json": json.dumps(_hardware(tiers(lambda t: t.update(bandwidth_bytes_per_s=1e39)))),
        "hw_tiny_latency.json": json.dumps(_hardware(tiers(lambda t: t.update(latency_s=1e-300)))),
        "cal_huge_seconds.json": json.dumps(_calibration([1e-4, 1e300], layer="features/0")),
        "cal_tiny_seconds.json": json.dumps(_calibration([1e-4, 1e-300], layer="features/0")),
        # a version 3 calibration of VGG16's first conv (3->64 on 224x224): no layer of vgg16-cifar10
        "cal_v3_imagenet_conv.json": json.dumps(_shape_calibration()),
        # layers that do not hold together (the tiny network: CONV1 3x3 pad 1 on 3x8x8 -> 4x8x8, no bias)
        "graph_conv_100.json": json.dumps(_graph(out_spatial=[100, 100, 1])),
        "graph_relu_64.json": json.dumps(_graph_row(1, out_channels=64)),
        "graph_conv_no_params.json": json.dumps(_graph(params=0)),
        "graph_flops_x1000.json": json.dumps(_graph(flops_fwd=11616 * 1000)),
        # plan files evaluate --plan reads as Plan.read does: types checked, nothing coerced
        "plan5.json": json.dumps(_plan5()),
        "plan5_mesh3.json": json.dumps(_plan5(mesh=[2, 2, 1])),
        "plan5_mesh_string.json": json.dumps(_plan5(mesh="4x1")),
        "plan5_no_mesh.json": json.dumps(_plan5(mesh=None)),
        "plan5_future.json": json.dumps(_plan5(version=99)),
        "plan5_remat_string.json": json.dumps(_plan5({"remat": "false"})),
        "plan5_zero_fraction.json": json.dumps(_plan5({"zero_stage": 2.7})),
        "plan5_hardware_path.json": json.dumps(_plan5(hardware="/etc/passwd", hardware_spec=None)),
        "rows.json": json.dumps(_rows()),
        "rows_mesh3.json": json.dumps(_rows(mesh=[2, 2, 1])),
        "rows_mesh_string.json": json.dumps(_rows(mesh="4x1")),
        "rows_remat_string.json": json.dumps(_rows({"remat": "false"})),
        "rows_zero_fraction.json": json.dumps(_rows({"zero_stage": 2.7})),
        "rows_hardware_stdin.json": json.dumps(_rows(hardware="/dev/stdin")),
        "rows_hardware_file.json": json.dumps(_rows(hardware="hw_nan.json")),
    }


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("bad_input")
    out = {}
    for name, text in _files().items():
        if isinstance(text, bytes):
            (root / name).write_bytes(text)
        else:
            (root / name).write_text(text)
        out[name.rsplit(".", 1)[0]] = str(root / name)
    out["missing"] = str(root / "missing.json")
    out["folder"] = str(root)
    return out


USAGE, INFEASIBLE = 2, 1
M = "vgg16-cifar10"  # a small zoo model: every row below fails before any cost table is built

CLI_CASES = [
    # -- unknown names -------------------------------------------------------------------
    pytest.param(["layers", "resnet5"], USAGE, "did you mean 'resnet50'", id="unknown-model-hint"),
    pytest.param(["layers", "no/such/model.net"], USAGE, "no such file", id="missing-model-file"),
    pytest.param(["evaluate", M, "--devices", "8", "--strategy", "data", "--hardware", "h100"], USAGE,
                 "did you mean 'dgx-h100'", id="unknown-preset-hint"),
    pytest.param(["hardware", "abci"], USAGE, "did you mean 'abci-v100'", id="hardware-unknown-preset"),
    pytest.param(["plan", M, "--devices", "8", "--hardware", "{missing}"], USAGE, "no such hardware file",
                 id="hardware-file-missing"),
    pytest.param(["evaluate", M, "--devices", "8", "--strategy", "diagonal"], USAGE, "unknown strategy",
                 id="unknown-strategy"),
    pytest.param(["plan", M, "--devices", "8", "--method", "annealing"], USAGE, "invalid choice",
                 id="unknown-method"),
    pytest.param(["frobnicate"], USAGE, "invalid choice", id="unknown-command"),
    # -- malformed or truncated files --------------------------------------------------
    pytest.param(["layers", "{graph_truncated}"], USAGE, "malformed", id="graph-truncated"),
    pytest.param(["layers", "{net_truncated}"], USAGE, "net_truncated.net:5", id="net-truncated"),
    pytest.param(["hardware", "{hw_truncated}"], USAGE, "malformed JSON", id="hardware-truncated"),
    pytest.param(["evaluate", M, "--devices", "8", "--strategy", "data", "--calibration", "{cal_truncated}"],
                 USAGE, "malformed JSON", id="calibration-truncated"),
    pytest.param(["evaluate", M, "--devices", "8", "--plan", "{plan_truncated}"], USAGE, "malformed JSON",
                 id="plan-truncated"),
    pytest.param(["evaluate", M, "--devices", "8", "--plan", "{missing}"], USAGE, "No such file or directory; expected a plan file",
                 id="plan-missing"),
    pytest.param(["hardware", "{binary}"], USAGE, "not UTF-8 text", id="hardware-binary-file"),
    pytest.param(["evaluate", M, "--devices", "8", "--plan", "{binary}"], USAGE, "not UTF-8 text",
                 id="plan-binary-file"),
    pytest.param(["plan", M, "--devices", "8", "--calibration", "{binary}"], USAGE, "not UTF-8 text",
                 id="calibration-binary-file"),
    pytest.param(["layers", "{hw_missing_latency}"], USAGE, "not a layer graph", id="hardware-file-given-as-model"),
    pytest.param(["evaluate", M, "--devices", "8", "--strategy", "data", "--hardware", "{graph_zero_channels}"], USAGE,
                 "not a hardware file", id="layer-graph-given-as-hardware"),
    # -- NaN and infinity: refused when the JSON is read (costmodels/files.py) -------------
    pytest.param(["layers", "{graph_nan}"], USAGE, "NaN is not a number JSON allows", id="graph-nan"),
    pytest.param(["layers", "{graph_inf}"], USAGE, "Infinity is not a number JSON allows", id="graph-infinity"),
    pytest.param(["layers", "{net_nan_time}"], USAGE, "is not a time", id="net-nan-time"),
    pytest.param(["hardware", "{hw_nan}"], USAGE, "NaN is not a number JSON allows",
                 id="hardware-nan"),
    pytest.param(["evaluate", M, "--devices", "8", "--strategy", "data", "--hardware", "{hw_inf}"], USAGE,
                 "Infinity is not a number JSON allows", id="hardware-infinity"),
    pytest.param(["plan", M, "--devices", "8", "--calibration", "{cal_nan}"], USAGE,
                 "NaN is not a number JSON allows", id="calibration-nan"),
    pytest.param(["evaluate", M, "--devices", "8", "--plan", "{plan_nan}"], USAGE, "NaN", id="plan-nan"),
    pytest.param(["plan", M, "--devices", "8", "--memory-limit", "nan"], USAGE, "not a size",
                 id="memory-limit-nan"),
    pytest.param(["plan", M, "--devices", "8", "--memory-limit", "inf"], USAGE, "not a size",
                 id="memory-limit-inf"),
    # -- negative or zero sizes --------------------------------------------------------
    pytest.param(["evaluate", M, "--devices", "0", "--strategy", "data"], USAGE, "devices must be a positive",
                 id="evaluate-zero-devices"),
    pytest.param(["plan", M, "--devices", "-4"], USAGE, "devices must be a positive", id="plan-negative-devices"),
    pytest.param(["oracle", M, "--devices", "0,8"], USAGE, "positive integers", id="oracle-zero-devices"),
    pytest.param(["layers", M, "--batch", "0"], USAGE, "--batch must be a positive", id="layers-zero-batch"),
    pytest.param(["evaluate", M, "--devices", "8", "--strategy", "data", "--batch", "-64"], USAGE,
                 "batch must be a positive", id="evaluate-negative-batch"),
    pytest.param(["plan", M, "--devices", "8", "--batch-per-device", "0"], USAGE,
                 "batch per device must be a positive", id="plan-zero-batch-per-device"),
    pytest.param(["oracle", M, "--devices", "8", "--batch-per-device", "-2"], USAGE,
                 "--batch-per-device must be a positive", id="oracle-negative-batch-per-device"),
    pytest.param(["evaluate", M, "--devices", "8", "--mesh", "0x8", "--strategy", "data"], USAGE,
                 "mesh 0x8", id="zero-mesh-axis"),
    pytest.param(["evaluate", M, "--devices", "8", "--mesh", "4by2", "--strategy", "data"], USAGE,
                 "not of the form DxM", id="malformed-mesh"),
    pytest.param(["layers", "{net_zero_dims}"], USAGE, "y dims '0x8x8' is malformed", id="net-zero-dims"),
    pytest.param(["layers", "{net_negative_dims}"], USAGE, "Input '100x3x-8x8' is malformed",
                 id="net-negative-dims"),
    pytest.param(["layers", "{graph_zero_channels}"], USAGE, "in_channels must be a positive integer",
                 id="graph-zero-channels"),
    pytest.param(["layers", "{graph_negative_spatial}"], USAGE, "in_spatial must be a list of 3 positive",
                 id="graph-negative-spatial"),
    # -- batch against the mesh ----------------------------------------------------------
    pytest.param(["evaluate", M, "--devices", "8", "--mesh", "4x2", "--batch", "6", "--strategy", "filter"],
                 USAGE, "not divisible by the data-parallel degree 4", id="batch-not-divisible-by-data-axis"),
    pytest.param(["evaluate", M, "--devices", "8", "--mesh", "8x1", "--batch", "4", "--strategy", "data"],
                 USAGE, "fewer samples", id="evaluate-more-devices-than-samples"),
    pytest.param(["plan", M, "--devices", "64", "--batch", "8"], USAGE, "not divisible by any data-parallel degree",
                 id="plan-more-devices-than-samples"),
    # -- memory limits -------------------------------------------------------------------
    pytest.param(["plan", M, "--devices", "8", "--memory-limit", "16 GQ"], USAGE, "unknown unit 'GQ'",
                 id="memory-limit-unknown-unit"),
    pytest.param(["plan", M, "--devices", "8", "--memory-limit=-5GB"], USAGE, "not a size",
                 id="memory-limit-negative"),
    pytest.param(["plan", M, "--devices", "8", "--memory-limit", "-5GB"], USAGE, "expected one argument",
                 id="memory-limit-negative-read-as-an-option"),
    pytest.param(["plan", M, "--devices", "8", "--memory-limit", "0GiB"], USAGE, "positive size",
                 id="memory-limit-zero"),
    # -- hardware files: missing fields, wrong units ------------------------------------
    pytest.param(["hardware", "{hw_missing_latency}"], USAGE, "is missing latency_s", id="hardware-missing-field"),
    pytest.param(["evaluate", M, "--devices", "8", "--strategy", "data", "--hardware", "{hw_missing_device}"],
                 USAGE, "is missing device", id="hardware-missing-device"),
    pytest.param(["hardware", "{hw_gbps}"], USAGE, "unknown field(s) bandwidth_gbps", id="hardware-unit-in-key"),
    pytest.param(["hardware", "{hw_negative_bandwidth}"], USAGE, "bandwidth_bytes_per_s must be positive",
                 id="hardware-negative-bandwidth"),
    pytest.param(["hardware", "{hw_memory_in_gb}"], USAGE, "memory_bytes = 16 is implausibly small",
                 id="hardware-memory-in-gb"),
    pytest.param(["plan", M, "--devices", "8", "--hardware", "{hw_bandwidth_in_gb}"], USAGE,
                 "bandwidth_bytes_per_s = 12.5 is implausibly small", id="hardware-bandwidth-in-gb"),
    pytest.param(["hardware", "{hw_latency_in_us}"], USAGE, "latency_s = 40.31 is implausibly large",
                 id="hardware-latency-in-us"),
    pytest.param(["hardware", "{hw_bandwidth_string}"], USAGE, "must be a finite number, got '12.5 GB/s'",
                 id="hardware-value-with-unit"),
    # -- plans for another model ---------------------------------------------------------
    pytest.param(["evaluate", "resnet50", "--devices", "8", "--plan", "{plan_vgg16}"], USAGE,
                 "made for model 'vgg16'", id="plan-for-vgg16-on-resnet50"),
    pytest.param(["evaluate", "vgg16", "--devices", "8", "--plan", "{plan_vgg16_cifar10}"], USAGE,
                 "made for model 'vgg16-cifar10'", id="plan-for-cifar-vgg-on-imagenet-vgg"),
    pytest.param(["evaluate", M, "--devices", "8", "--plan", "{plan_duplicate_layer}"], USAGE,
                 "appear more than once", id="plan-duplicate-layers"),
    pytest.param(["evaluate", M, "--devices", "8", "--strategy", "data", "--calibration", "{cal_nan}"], USAGE,
                 "NaN is not a number JSON allows", id="evaluate-calibration-nan"),
    pytest.param(["evaluate", M, "--devices", "8", "--strategy", "data", "--calibration", "{cal_tiny}"], USAGE,
                 "was it measured on another model", id="calibration-for-another-model"),
    pytest.param(["evaluate", M, "--devices", "8", "--strategy", "data", "--dtype", "bfloat16",
                  "--calibration", "{cal_float32}"], USAGE, "measured in float32, but the plan computes in bfloat16",
                 id="calibration-for-another-dtype"),
    # -- knobs past their cap: work or memory would grow with the value ------------------
    pytest.param(["plot", "{plan_file}", "-o", "{missing}.png", "--dpi", "5000"], USAGE,
                 "--dpi must be an integer from 1 to 1200, got 5000 (the image's pixel count grows with dpi squared",
                 id="plot-dpi-above-cap"),
    pytest.param(["profile", M, "--batch", "100000"], USAGE, "--batch must be at most 65536, got 100000",
                 id="profile-batch-above-cap"),
    pytest.param(["profile", M, "--batch", "8", "--max-devices", "131072"], USAGE,
                 "--max-devices must be at most 65536, got 131072", id="profile-max-devices-above-cap"),
    pytest.param(["profile", M, "--batch", "8", "--repeats", "5000"], USAGE, "--repeats must be at most 1000",
                 id="profile-repeats-above-cap"),
    pytest.param(["profile", M, "--batch", "8", "--warmup", "1001"], USAGE, "--warmup must be at most 1000",
                 id="profile-warmup-above-cap"),
    # -- an output that is one of the command's inputs: refused before any work ---------
    pytest.param(["plan", "{tiny}", "--devices", "4", "-o", "{tiny}"], USAGE, "is one of this command's input files",
                 id="plan-output-onto-the-model"),
    pytest.param(["plan", M, "--devices", "8", "--hardware", "{hw_nan}", "-o", "{hw_nan}"], USAGE,
                 "is one of this command's input files", id="plan-output-onto-the-hardware"),
    pytest.param(["plan", M, "--devices", "8", "--calibration", "{cal_tiny}", "-o", "{cal_tiny}"], USAGE,
                 "is one of this command's input files", id="plan-output-onto-the-calibration"),
    pytest.param(["profile", "{tiny}", "--batch", "8", "-o", "{tiny}"], USAGE, "is one of this command's input files",
                 id="profile-output-onto-the-model"),
    pytest.param(["plot", "{plan_file}", "-o", "{plan_file}"], USAGE, "is one of this command's input files",
                 id="plot-output-onto-the-plan"),
    pytest.param(["oracle", "{tiny}", "--devices", "4", "--hardware", "{hw_nan}", "--plot", "{hw_nan}"], USAGE,
                 "is one of this command's input files", id="oracle-plot-onto-the-hardware"),
    # -- evaluate --plan reads as Plan.read does: types checked, nothing coerced -------------
    pytest.param(["evaluate", "{tiny}", "--plan", "{plan5_mesh3}"], USAGE,
                 "plan.mesh must be a list of 2 positive integers, got [2, 2, 1]", id="plan-file-mesh-of-three"),
    pytest.param(["evaluate", "{tiny}", "--plan", "{plan5_mesh_string}"], USAGE,
                 "plan.mesh must be a list of 2 positive integers, got '4x1'", id="plan-file-mesh-string"),
    pytest.param(["evaluate", "{tiny}", "--plan", "{plan5_no_mesh}"], USAGE,
                 "plan.mesh must be a list of 2 positive integers, got None", id="plan-file-mesh-null"),
    pytest.param(["evaluate", "{tiny}", "--plan", "{plan5_future}"], USAGE, "plan version 99 is newer",
                 id="plan-file-future-version"),
    pytest.param(["evaluate", "{tiny}", "--plan", "{plan5_remat_string}"], USAGE,
                 "plan.layers[0].remat must be true or false", id="plan-file-remat-string"),
    pytest.param(["evaluate", "{tiny}", "--plan", "{plan5_zero_fraction}"], USAGE,
                 "plan.layers[0].zero_stage must be an integer >= 0, got 2.7", id="plan-file-zero-stage-fraction"),
    pytest.param(["evaluate", "{tiny}", "--plan", "{rows_mesh3}"], USAGE,
                 "plan.mesh must be a list of 2 positive integers, got [2, 2, 1]", id="evaluate-json-mesh-of-three"),
    pytest.param(["evaluate", "{tiny}", "--plan", "{rows_mesh_string}"], USAGE,
                 "plan.mesh must be a list of 2 positive integers, got '4x1'", id="evaluate-json-mesh-string"),
    pytest.param(["evaluate", "{tiny}", "--plan", "{rows_remat_string}"], USAGE,
                 "plan.layers[0].remat must be true or false", id="evaluate-json-remat-string"),
    pytest.param(["evaluate", "{tiny}", "--plan", "{rows_zero_fraction}"], USAGE,
                 "plan.layers[0].zero_stage must be an integer >= 0, got 2.7", id="evaluate-json-zero-stage-fraction"),
    # -- reads bounded: regular files only; hardware from a plan file by preset name only -------
    pytest.param(["evaluate", M, "--devices", "8", "--plan", "/dev/zero"], USAGE,
                 "/dev/zero: not a regular file", id="plan-from-dev-zero"),
    pytest.param(["evaluate", M, "--devices", "8", "--strategy", "data", "--calibration", "/dev/zero"], USAGE,
                 "/dev/zero: not a regular file", id="calibration-from-dev-zero"),
    pytest.param(["hardware", "/dev/zero"], USAGE, "/dev/zero: not a regular file", id="hardware-from-dev-zero"),
    pytest.param(["layers", "{folder}"], USAGE, "is not a file", id="model-from-a-folder"),
    pytest.param(["evaluate", "{tiny}", "--plan", "{plan5_hardware_path}"], USAGE,
                 "records hardware '/etc/passwd', which is not a preset", id="plan-file-hardware-path"),
    pytest.param(["evaluate", "{tiny}", "--plan", "{rows_hardware_stdin}"], USAGE,
                 "records hardware '/dev/stdin', which is not a preset", id="evaluate-json-hardware-stdin"),
    pytest.param(["evaluate", "{tiny}", "--plan", "{rows_hardware_file}"], USAGE,
                 "records hardware 'hw_nan.json', which is not a preset", id="evaluate-json-hardware-file"),
    # -- device counts within MAX_DEVICES ----------------------------------------------------
    pytest.param(["plan", M, "--devices", str(2**41)], USAGE, "devices must be at most 1048576 (2^20)",
                 id="plan-devices-above-cap"),
    pytest.param(["evaluate", M, "--devices", str(2**41), "--strategy", "data"], USAGE,
                 "devices must be at most 1048576 (2^20)", id="evaluate-devices-above-cap"),
    pytest.param(["oracle", M, "--devices", f"8,{2**41}"], USAGE, "more than 1048576 (2^20)",
                 id="oracle-devices-above-cap"),
    pytest.param(["plan", M, "--devices", "8", "--seed", str(2**32)], USAGE,
                 "--seed must be a non-negative integer below 2^32", id="plan-seed-above-cap"),
    # -- calibrations where they do not belong (costmodels.check_calibration) -----------------
    pytest.param(["plan", M, "--devices", "8", "--dtype", "bfloat16", "--calibration", "{cal_float32}"], USAGE,
                 "measured in float32, but the plan computes in bfloat16", id="plan-calibration-for-another-dtype"),
    pytest.param(["plan", M, "--devices", "8", "--calibration", "{cal_tiny}"], USAGE,
                 "was it measured on another model? Model 'vgg16-cifar10' has 33 layers",
                 id="plan-calibration-for-another-model"),
    pytest.param(["plan", M, "--devices", "8", "--calibration", "{cal_v3_imagenet_conv}"], USAGE,
                 "measures no layer of model 'vgg16-cifar10': its 1 point(s) are of 1 layer shape(s), "
                 "e.g. ['conv 3x3 3->64 on [224, 224]']", id="plan-shape-calibration-for-another-model"),
    pytest.param(["evaluate", M, "--devices", "8", "--strategy", "data", "--calibration", "{cal_v3_imagenet_conv}"],
                 USAGE, "was it profiled on another model?", id="evaluate-shape-calibration-for-another-model"),
    pytest.param(["oracle", M, "--devices", "8", "--calibration", "{cal_v3_imagenet_conv}"], USAGE,
                 "measures no layer of model 'vgg16-cifar10'", id="oracle-shape-calibration-for-another-model"),
    # -- numbers in range for JSON, not for float32 ---------------------------------------------
    pytest.param(["evaluate", M, "--devices", "8", "--strategy", "data", "--hardware", "{hw_tiny_efficiency}", "--json"],
                 USAGE, "hw_tiny_efficiency.json: efficiency.conv must be at least 1e-06, got 1e-40",
                 id="hardware-efficiency-1e-40"),
    pytest.param(["plan", M, "--devices", "8", "--hardware", "{hw_subnormal_efficiency}"], USAGE,
                 "efficiency.conv must be at least 1e-06, got 1e-300", id="hardware-efficiency-1e-300"),
    pytest.param(["hardware", "{hw_huge_bandwidth}"], USAGE,
                 "tiers[1].bandwidth_bytes_per_s = 1e+39 is outside what float32 holds", id="hardware-bandwidth-1e39"),
    pytest.param(["hardware", "{hw_tiny_latency}"], USAGE, "tiers[1].latency_s = 1e-300 is outside what float32 holds",
                 id="hardware-latency-1e-300"),
    pytest.param(["plan", M, "--devices", "8", "--calibration", "{cal_huge_seconds}"], USAGE,
                 "cal_huge_seconds.json: layers['features/0']: seconds = 1e+300 seconds is more than 1e+06 s",
                 id="calibration-seconds-1e300"),
    pytest.param(["evaluate", M, "--devices", "8", "--strategy", "data", "--calibration", "{cal_tiny_seconds}"], USAGE,
                 "seconds = 1e-300 is outside what float32 holds", id="calibration-seconds-1e-300"),
    # -- layers of a graph file that do not hold together ----------------------------------------
    pytest.param(["layers", "{graph_conv_100}"], USAGE,
                 "layer 'CONV1' (conv): out_spatial is [100, 100, 1], but in_spatial [8, 8, 1] with kernel [3, 3, 1], "
                 "stride [1, 1, 1], dilation [1, 1, 1] and padding [1, 1, 0]/[1, 1, 0] gives [8, 8, 1]",
                 id="graph-conv-8x8-to-100x100"),
    pytest.param(["layers", "{graph_relu_64}"], USAGE,
                 "layer 'RELU' (elementwise): out_channels is 64, but layers of kind elementwise keep their input's 4",
                 id="graph-relu-4-to-64-channels"),
    pytest.param(["plan", "{graph_conv_no_params}", "--devices", "4"], USAGE,
                 "layer 'CONV1' (conv): params is 0, but its shapes give 108 or 112", id="graph-conv-without-params"),
    pytest.param(["evaluate", "{graph_flops_x1000}", "--devices", "4", "--strategy", "data"], USAGE,
                 "layer 'CONV1' (conv): flops_fwd is 11616000, but its shapes give 11616 (planner/ir/flops.py)",
                 id="graph-flops-times-1000"),
    # -- an infeasible plan: exit 1 -------------------------------------------------------
    pytest.param(["plan", "{tiny}", "--devices", "4", "--batch", "8", "--memory-limit", "1kB"], INFEASIBLE,
                 "raise the memory limit to at least", id="plan-does-not-fit", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("argv, status, phrase", CLI_CASES)
def test_cli_rejects_bad_input(capsys, paths, argv, status, phrase):
    code = main([a.format(**paths) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    assert err.startswith("shardplan: error: ") and err.count("\n") == 1, err
    assert phrase in err, err
    assert code == status, err
    assert out == ""


def _plan(**kw):
    """``planner.plan`` on the tiny network (cheap if a row is wrongly accepted)."""
    from planner.planning import plan

    return plan(**{"model": parse_net(TINY_NET), "devices": 8, "batch": 8, **kw})


def _evaluate(model=M, devices=8, **kw):
    from planner.evaluation import evaluate

    return evaluate(get_model(model), load_hardware("abci-v100"), devices, **kw)


def _oracle(**kw):
    from planner.paradl.report import oracle

    return oracle(**{"model": M, "hardware": "abci-v100", "devices": [8], **kw})


def _cost_fn(**kw):
    from planner.automl import cost_fn
    from planner.automl.templates import resnet_parametric

    return cost_fn(resnet_parametric((1, 1), (8, 16), resolution=32, num_classes=10),
                   **{"devices": 8, "hardware": "abci-v100", **kw})


def _plot_plan(**kw):
    from planner.plot import plot_plan

    return plot_plan(None, **kw)  # the resolution is checked first


def _parse_memory_limit(value):
    from planner.planning import parse_memory_limit

    return parse_memory_limit(value)


def _plan_from(paths, key):
    from planner.planning import Plan

    return Plan.read(paths[key])


def _load_net(path):
    from planner.models.netfile import load_net

    return load_net(path)


def _graph_from_json(value):
    from planner.ir.graph import LayerGraph

    return LayerGraph.from_json(value)


def _graph_from(paths, key):
    from planner.ir.graph import LayerGraph

    with open(paths[key]) as f:
        return LayerGraph.from_json(f.read())



API_CASES = [
    # -- unknown names -------------------------------------------------------------------
    pytest.param(lambda p: get_model("resnet5"), "unknown model 'resnet5'", id="get_model-unknown"),
    pytest.param(lambda p: get_model("resnet5"), "did you mean 'resnet50'", id="get_model-unknown-hint"),
    pytest.param(lambda p: load_hardware("h100"), "did you mean 'dgx-h100'", id="load_hardware-unknown-hint"),
    pytest.param(lambda p: _plan(model=42), "built-in model name, a LayerGraph or a TransformerConfig", id="plan-model-not-a-name"),
    pytest.param(lambda p: _plan(method="annealing"), "annealing", id="plan-unknown-method"),
    pytest.param(lambda p: _evaluate(strategy="diagonal"), "unknown strategy", id="evaluate-unknown-strategy"),
    pytest.param(lambda p: _evaluate(strategy="data", dtype="float64"), "unknown dtype", id="evaluate-unknown-dtype"),
    pytest.param(lambda p: _oracle(hardware="abci"), "did you mean 'abci-v100'", id="oracle-unknown-hardware"),
    pytest.param(lambda p: _oracle(strategies=["diagonal"]), "diagonal", id="oracle-unknown-strategy"),
    # -- malformed, truncated, NaN and infinite files -----------------------------------
    pytest.param(lambda p: _graph_from(p, "graph_truncated"), "malformed", id="LayerGraph.from_json-truncated"),
    pytest.param(lambda p: _graph_from(p, "graph_nan"), "NaN is not a number", id="LayerGraph.from_json-nan"),
    pytest.param(lambda p: _graph_from(p, "graph_inf"), "Infinity is not a number", id="LayerGraph.from_json-infinity"),
    pytest.param(lambda p: _graph_from(p, "graph_zero_stride"), "stride must be a list of 3 positive",
                 id="LayerGraph.from_json-zero-stride"),
    pytest.param(lambda p: _graph_from(p, "graph_fractional_channels"), "out_channels must be a positive integer",
                 id="LayerGraph.from_json-fractional-channels"),
    pytest.param(lambda p: _graph_from(p, "graph_rank_9"), "spatial_rank must be", id="LayerGraph.from_json-rank"),
    pytest.param(lambda p: parse_net(TINY_NET.replace("4x8x8|0.5", "4x8x8|inf")), "is not a time",
                 id="parse_net-infinite-time"),
    pytest.param(lambda p: parse_net(TINY_NET.replace("3x4x3x3", "3x4x3")), "w dims", id="parse_net-short-kernel"),
    pytest.param(lambda p: parse_net(""), "no layers", id="parse_net-empty"),
    pytest.param(lambda p: load_hardware(p["hw_nan"]), "finite", id="load_hardware-nan"),
    pytest.param(lambda p: load_hardware(p["hw_truncated"]), "malformed JSON", id="load_hardware-truncated"),
    pytest.param(lambda p: load_hardware(p["hw_memory_in_gb"]), "implausibly small", id="load_hardware-gb"),
    pytest.param(lambda p: load_calibration(p["cal_inf"]), "Infinity is not a number JSON allows", id="load_calibration-infinity"),
    pytest.param(lambda p: load_calibration(p["cal_negative"]), "positive finite", id="load_calibration-negative"),
    pytest.param(lambda p: load_calibration(p["missing"]), "No such file or directory; expected a calibration JSON file",
                 id="load_calibration-missing"),
    pytest.param(lambda p: _plan_from(p, "plan_file_nan"), "NaN is not a number JSON allows",
                 id="Plan.read-nan"),
    pytest.param(lambda p: _plan_from(p, "plan_file_inf_memory"), "Infinity is not a number JSON allows",
                 id="Plan.read-infinity"),
    pytest.param(lambda p: _plan_from(p, "plan_file_truncated"), "malformed JSON", id="Plan.read-truncated"),
    pytest.param(lambda p: _plan_from(p, "plan_file_zero_devices"), "positive integers", id="Plan.read-zero-mesh"),
    pytest.param(lambda p: _plan_from(p, "missing"), "No such file or directory; expected a plan file", id="Plan.read-missing"),
    # -- sizes -----------------------------------------------------------------------------
    pytest.param(lambda p: _parse_memory_limit("16 GQ"), "unknown unit 'GQ'", id="memory-limit-unknown-unit"),
    pytest.param(lambda p: _parse_memory_limit("-5GB"), "not a size", id="memory-limit-negative"),
    pytest.param(lambda p: _parse_memory_limit("nan"), "not a size", id="memory-limit-nan-string"),
    pytest.param(lambda p: _parse_memory_limit(math.inf), "positive size", id="memory-limit-inf"),
    pytest.param(lambda p: _parse_memory_limit(math.nan), "positive size", id="memory-limit-nan"),
    pytest.param(lambda p: _parse_memory_limit(True), "memory limit must be bytes", id="memory-limit-bool"),
    pytest.param(lambda p: _plan(devices=0), "devices must be a positive", id="plan-zero-devices"),
    pytest.param(lambda p: _plan(devices=2.5), "devices must be a positive integer", id="plan-fractional-devices"),
    pytest.param(lambda p: _plan(batch=0), "batch must be a positive", id="plan-zero-batch"),
    pytest.param(lambda p: _plan(batch=math.nan), "batch must be a positive integer", id="plan-nan-batch"),
    pytest.param(lambda p: _plan(batch=None, batch_per_device=-1), "batch per device must be", id="plan-negative-per-device"),
    pytest.param(lambda p: _plan(memory_limit="16 GQ"), "unknown unit", id="plan-memory-limit-unit"),
    pytest.param(lambda p: _evaluate(devices=-8, strategy="data"), "devices must be a positive",
                 id="evaluate-negative-devices"),
    pytest.param(lambda p: _evaluate(devices=8.5, strategy="data"), "devices must be a positive integer",
                 id="evaluate-fractional-devices"),
    pytest.param(lambda p: _evaluate(strategy="data", batch=64.5), "batch must be a positive integer",
                 id="evaluate-fractional-batch"),
    pytest.param(lambda p: _evaluate(mesh=(4.5, 2), strategy="data"), "mesh 4.5x2 needs positive integer axes",
                 id="evaluate-fractional-mesh"),
    pytest.param(lambda p: _evaluate(strategy=3), "strategy must be a strategy name", id="evaluate-strategy-not-a-name"),
    pytest.param(lambda p: _evaluate(mesh=(4, 2), batch=6, strategy="filter"),
                 "not divisible by the data-parallel degree 4", id="evaluate-batch-not-divisible"),
    pytest.param(lambda p: _evaluate(mesh=(8, 1), batch=4, strategy="data"), "fewer samples",
                 id="evaluate-more-devices-than-samples"),
    pytest.param(lambda p: _plan(devices=64, batch=8), "not divisible by any data-parallel degree",
                 id="plan-more-devices-than-samples"),
    pytest.param(lambda p: _oracle(devices=[0]), "positive device counts", id="oracle-zero-devices"),
    pytest.param(lambda p: _oracle(batch_per_device=math.nan), "batch per device must be positive, got nan",
                 id="oracle-nan-batch-per-device"),
    pytest.param(lambda p: _oracle(batch=-64), "batch must be positive, got -64", id="oracle-negative-batch"),
    pytest.param(lambda p: _oracle(segments=0), "segments must be a positive integer", id="oracle-zero-segments"),
    # -- reads bounded; values in range; the wrong type named -------------------------------
    pytest.param(lambda p: _plan_from({"zero": "/dev/zero"}, "zero"), "/dev/zero: not a regular file",
                 id="Plan.read-dev-zero"),
    pytest.param(lambda p: load_calibration("/dev/zero"), "/dev/zero: not a regular file",
                 id="load_calibration-dev-zero"),
    pytest.param(lambda p: load_hardware(p["folder"]), "is a folder; expected a hardware JSON file",
                 id="load_hardware-folder"),
    pytest.param(lambda p: _load_net(p["folder"]), "is a folder; expected a ParaDL .net", id="load_net-folder"),
    pytest.param(lambda p: parse_net(None), "parse_net takes the text of a .net file, got NoneType",
                 id="parse_net-none"),
    pytest.param(lambda p: _graph_from_json({"layers": []}), "takes JSON text (a str), got dict",
                 id="LayerGraph.from_json-dict"),
    pytest.param(lambda p: _plan(seed=-1), "seed must be a non-negative integer below 2^32, got -1",
                 id="plan-negative-seed"),
    pytest.param(lambda p: _plan(seed=2**70), "seed must be a non-negative integer below 2^32",
                 id="plan-seed-above-cap"),
    pytest.param(lambda p: _plan(seed=1.5), "seed must be a non-negative integer", id="plan-fractional-seed"),
    pytest.param(lambda p: _plan(devices=2**41), "devices must be at most 1048576 (2^20), got 2199023255552",
                 id="plan-devices-above-cap"),
    pytest.param(lambda p: _evaluate(devices=2**41, strategy="data"), "devices must be at most 1048576",
                 id="evaluate-devices-above-cap"),
    pytest.param(lambda p: _oracle(devices=[8, 2**41]), "more than 1048576 (2^20)", id="oracle-devices-above-cap"),
    pytest.param(lambda p: _cost_fn(devices=True), "devices must be a positive integer, got True",
                 id="cost_fn-devices-bool"),
    pytest.param(lambda p: _cost_fn(memory_limit="1TiB"), "is more than a abci-v100 device has",
                 id="cost_fn-limit-above-the-device"),
    pytest.param(lambda p: _plot_plan(dpi=20000), "dpi must be an integer from 1 to 1200, got 20000",
                 id="plot_plan-dpi-above-cap"),
    # -- plans for another model ---------------------------------------------------------
    pytest.param(lambda p: _evaluate(model="resnet50", plan={n: "data" for n in get_model("vgg16").names}),
                 "was it made for another model", id="evaluate-plan-for-another-model"),
    pytest.param(lambda p: _evaluate(plan={**{n: "data" for n in get_model(M).names}, "features/0": "diagonal"}),
                 "unknown strategy 'diagonal'", id="evaluate-plan-unknown-strategy"),
    # -- calibrations where they do not belong; numbers float32 cannot hold; layers that do not hold together
    pytest.param(lambda p: _plan(dtype="bfloat16", calibration=load_calibration(p["cal_float32"])),
                 "measured in float32, but the plan computes in bfloat16", id="plan-calibration-for-another-dtype"),
    pytest.param(lambda p: _plan(calibration=load_calibration(p["cal_v3_imagenet_conv"])),
                 "measures no layer of model 'tiny'", id="plan-shape-calibration-for-another-model"),
    pytest.param(lambda p: _evaluate(strategy="data", calibration=load_calibration(p["cal_v3_imagenet_conv"])),
                 "measures no layer of model 'vgg16-cifar10'", id="evaluate-shape-calibration-for-another-model"),
    pytest.param(lambda p: _oracle(calibration=p["cal_v3_imagenet_conv"]), "measures no layer of model",
                 id="oracle-shape-calibration-for-another-model"),
    pytest.param(lambda p: load_hardware(p["hw_tiny_efficiency"]), "efficiency.conv must be at least 1e-06",
                 id="load_hardware-efficiency-1e-40"),
    pytest.param(lambda p: load_hardware(p["hw_huge_bandwidth"]), "outside what float32 holds",
                 id="load_hardware-bandwidth-1e39"),
    pytest.param(lambda p: load_calibration(p["cal_huge_seconds"]), "is more than 1e+06 s",
                 id="load_calibration-seconds-1e300"),
    pytest.param(lambda p: load_calibration(p["cal_tiny_seconds"]), "outside what float32 holds",
                 id="load_calibration-seconds-1e-300"),
    pytest.param(lambda p: _graph_from(p, "graph_conv_100"), "out_spatial is [100, 100, 1]",
                 id="LayerGraph.from_json-conv-8x8-to-100x100"),
    pytest.param(lambda p: _graph_from(p, "graph_relu_64"), "out_channels is 64", id="LayerGraph.from_json-relu-64"),
    pytest.param(lambda p: _graph_from(p, "graph_conv_no_params"), "params is 0, but its shapes give 108 or 112",
                 id="LayerGraph.from_json-conv-without-params"),
    pytest.param(lambda p: _graph_from(p, "graph_flops_x1000"), "flops_fwd is 11616000",
                 id="LayerGraph.from_json-flops-times-1000"),
]


@pytest.mark.parametrize("call, phrase", API_CASES)
def test_public_function_rejects_bad_input(paths, call, phrase):
    with pytest.raises(ValueError, match=re.escape(phrase)) as info:
        call(paths)
    assert "\n" not in str(info.value)


def test_tables_are_large_enough():
    assert len(CLI_CASES) >= 30 and len(API_CASES) >= 30
    assert len({c.id for c in CLI_CASES}) == len(CLI_CASES)
    assert len({c.id for c in API_CASES}) == len(API_CASES)


def _tiny_flax_model():
    from flax import nnx

    class Tiny(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.conv = nnx.Conv(3, 4, (3, 3), rngs=rngs)
            self.head = nnx.Linear(4, 10, rngs=rngs)

        def __call__(self, x):
            return self.head(nnx.relu(self.conv(x)).mean(axis=(1, 2)))

    return Tiny(nnx.Rngs(0))


@pytest.mark.slow  # imports flax and traces the model
@pytest.mark.parametrize("change, phrase", [
    pytest.param({}, "the model given extracts to", id="other-graph"),  # same input shape, another network
    pytest.param({"input_shape": [7, 8, 8]}, "which the model given cannot run", id="other-input-shape"),
])
def test_shard_rejects_a_plan_for_another_model(change, phrase):
    """``planner.shard`` with a plan of the tiny ParaDL network (a 4-channel
    conv, a pool and an FC) applied to another 3-channel Flax network."""
    import optax

    from planner.planning import Plan
    from planner.runtime.sharding import shard

    plan = Plan.from_dict({**_valid_plan_file(), **change})
    with pytest.raises(ValueError, match="this plan was made for another model") as info:
        shard(_tiny_flax_model(), plan, optax.sgd(0.1))
    assert phrase in str(info.value) and "\n" not in str(info.value)


# -- inconsistent layer graphs, values a plan file cannot hold --------------------------------------


def _graph_json(tmp_path, mutate):
    import copy

    from planner.models.zoo import get_model

    d = copy.deepcopy(get_model("vgg16-cifar10").to_dict())
    mutate(d)
    f = tmp_path / "g.json"
    f.write_text(json.dumps(d))
    return str(f)


@pytest.mark.parametrize("mutate, words", [
    (lambda d: d["layers"][2].update(in_channels=32), "layer 'features/1' reads (32, 32, 32, 1) but its input 'relu'"),
    (lambda d: d["layers"][0].update(in_channels=4), "from the model input"),
    (lambda d: d["layers"][0].update(kernel=[99, 3, 1]), "window [99, 3, 1]"),
    (lambda d: d["layers"][2].update(groups=3), "groups 3 must divide"),
    (lambda d: d["layers"][0].update(spatial_rank=1), "spatial_rank 1"),
], ids=["channels-mismatch", "input-mismatch", "window-too-large", "groups", "rank"])
def test_inconsistent_layer_graph_is_one_line_naming_the_layer(tmp_path, capsys, mutate, words):
    f = _graph_json(tmp_path, mutate)
    assert main(["layers", f]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("argv, words", [
    (["plan", "vgg16-cifar10", "--devices", "8", "--seed", "-1"], "--seed must be a non-negative integer"),
    (["plan", "vgg16-cifar10", "--devices", "8", "--batch", "1" + "0" * 20], "--batch must be below 10^15"),
    (["plan", "vgg16-cifar10", "--devices", "8", "--memory-limit", "200GB", "--hardware", "dgx-a100"],
     "more than a dgx-a100 device has"),
], ids=["negative-seed", "huge-batch", "limit-above-device"])
def test_values_a_plan_file_could_not_hold_are_refused(capsys, argv, words):
    assert main(argv) == 2
    assert words in capsys.readouterr().err


def test_evaluate_reads_the_valid_plan_files_on_their_mesh(capsys, paths):
    """The files the rejected rows above break, unbroken, are read: both
    forms, on the mesh they record (4x1, not the default of 4 devices)."""
    for key in ("plan5", "rows"):
        assert main(["evaluate", paths["tiny"], "--plan", paths[key], "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        assert data["mesh"] == [4, 1] and data["devices"] == 4 and data["hardware"] == "abci-v100", key


def test_shard_takes_a_plan_or_a_path_and_names_anything_else(paths):
    from planner.runtime.sharding import shard

    with pytest.raises(TypeError, match="shard takes a Plan .* or the path of a plan file, got dict; for a dict, "
                                        "use Plan.from_dict"):
        shard(None, _valid_plan_file(), None)
    with pytest.raises(ValueError, match="not a regular file"):
        shard(None, "/dev/zero", None)


# -- calibrations where they belong; JSON output always JSON; graph files that hold together ----------


def test_a_partial_calibration_is_used_with_a_note(capsys, paths):
    """cal_float32 measures features/0 only: 1 of vgg16-cifar10's 33 layers
    (13 convs, 13 ReLUs, 5 pools, flatten and the classifier, counted by hand
    from the VGG16 configuration). Said on stderr by the CLI, through the
    callback by the library; the answer is still JSON on stdout."""
    note = "measures 1 of the 33 layers of model 'vgg16-cifar10'; the other 32 are timed by the compute model"
    for argv in (["evaluate", M, "--devices", "8", "--strategy", "data", "--json"],
                 ["plan", M, "--devices", "8", "--method", "dp", "--json"]):
        assert main([*argv, "--calibration", paths["cal_float32"]]) == 0
        out, err = capsys.readouterr()
        assert json.loads(out)["model"] == M
        assert err.count(note) == 1 and err.startswith("shardplan: note: "), err
    events = []
    _evaluate(strategy="data", calibration=load_calibration(paths["cal_float32"]), callback=events.append)
    assert [(e.stage, note in e.message) for e in events] == [("calibration", True)]
    events.clear()
    _evaluate(strategy="data", callback=events.append)  # no calibration: nothing to say
    assert events == []


def test_a_calibration_of_every_layer_is_used_without_a_note(capsys, tmp_path):
    names = parse_net(TINY_NET).names
    cal = {"schema": "shardplan/calibration", "version": 1, "hardware": "abci-v100", "dtype": "float32",
           "layers": {n: {"work": [1, 8], "seconds": [1e-4, 2e-4]} for n in names}}
    f = tmp_path / "all.json"
    f.write_text(json.dumps(cal))
    path = tmp_path / "tiny.net"
    path.write_text(TINY_NET)
    assert main(["evaluate", str(path), "--devices", "4", "--strategy", "data", "--json", "--calibration", str(f)]) == 0
    assert capsys.readouterr().err == ""


def test_json_output_never_holds_nan(capsys, monkeypatch):
    """A non-finite number reaching a JSON writer is our bug: exit 3 saying
    so, never a ``NaN`` on stdout (which no JSON reader but Python's accepts)."""
    import planner.evaluation
    from planner.usage import InternalError, json_text

    with pytest.raises(InternalError, match="holds a NaN or infinite number, which JSON cannot hold"):
        json_text({"iteration_s": math.nan})
    with pytest.raises(InternalError, match="NaN or infinite"):
        json_text([1.0, math.inf])
    assert json.loads(json_text({"x": 1e-300})) == {"x": 1e-300}

    class _Broken:
        def to_dict(self):
            return {"model": M, "iteration_s": math.nan}

    monkeypatch.setattr(planner.evaluation, "evaluate", lambda *a, **k: _Broken())
    assert main(["evaluate", M, "--devices", "8", "--strategy", "data", "--json"]) == 3
    out, err = capsys.readouterr()
    assert out == "" and "internal error" in err and "NaN or infinite" in err


@pytest.mark.parametrize("value, ok", [
    (3.4028234663852886e38, True), (3.5e38, False),  # FLT_MAX = (2 - 2^-23) 2^127 (IEEE 754 binary32)
    (1.1754943508222875e-38, True), (1.1e-38, False),  # FLT_MIN = 2^-126, the smallest normal
])
def test_float32_range_is_the_boundary(value, ok):
    from costmodels.files import check_float32

    if ok:
        assert check_float32(value, "x") == value
    else:
        with pytest.raises(ValueError, match="outside what float32 holds"):
            check_float32(value, "x")


@pytest.mark.parametrize("scale, ok", [(1.0 + 1e-9, True), (1.0 + 1e-4, False), (1.0 - 1e-4, False)])
def test_file_flops_within_the_tolerance_are_read(scale, ok):
    """CONV1: 3x3, 3->4 on 8x8, pad 1, no bias: 2 * 3 * 4 * (8*3 - 2)^2 = 11616
    forward FLOPs (valid taps per dim: 8 outputs x 3 taps less the 2 in the padding)."""
    from planner.ir.graph import LayerGraph

    assert 2 * 3 * 4 * (8 * 3 - 2) ** 2 == 11616
    d = _graph(flops_fwd=11616 * scale)
    if ok:
        assert LayerGraph.from_dict(d).num_layers == 5
    else:
        with pytest.raises(ValueError, match="layer 'CONV1' \\(conv\\): flops_fwd is"):
            LayerGraph.from_dict(d)


@pytest.mark.parametrize("name", sorted(MODEL_NAMES))
def test_every_zoo_model_reads_back_through_the_layer_checks(name):
    from planner.ir.graph import LayerGraph

    g = get_model(name)
    assert LayerGraph.from_json(g.to_json()).fingerprint == g.fingerprint


# -- every class of bad input, each with its test(s) ----------------------------------------------
# Where a class needs more than a table row (a killed writer, a traced function, a plan that must fit),
# its tests live beside the code they exercise; this index names them and fails if one goes missing.
CLASS_TESTS = {
    "files: a killed writer leaves the old file whole": ["test_files.py::test_killed_writer_leaves_the_old_file_whole"],
    "files: concurrent writers never interleave": ["test_files.py::test_concurrent_writers_never_interleave"],
    "files: the output path is checked before the work": ["test_files.py::test_plan_output_checked_before_the_search",
                                                         "test_files.py::test_check_writable_before_the_work"],
    "files: deep nesting, huge integers, NaN/inf, non-UTF-8 refused naming the file": [
        "test_files.py::test_parse_json_refuses_with_one_line",
        "test_files.py::test_every_reader_refuses_bad_json_naming_the_file",
        "test_files.py::test_cli_bad_json_is_one_line_exit_2"],
    "files: inconsistent layer graphs name the layer": [
        "test_bad_input.py::test_inconsistent_layer_graph_is_one_line_naming_the_layer"],
    "plan/CLI contradictions: evaluate --plan with contradicting flags": [
        "test_evaluate.py::test_evaluate_plan_refuses_contradicting_flags_unless_overridden"],
    "plans: what the CLI writes is readable; what Plan.read accepts never crashes a later command": [
        "test_bad_input.py::test_values_a_plan_file_could_not_hold_are_refused",
        "test_bad_input.py::test_shard_rejects_a_plan_for_another_model"],
    "values: cost_fn's devices and memory limit as plan's; plot_plan's resolution capped (rows 'cost_fn-...', "
    "'plot_plan-...')": ["test_bad_input.py::test_public_function_rejects_bad_input"],
    "numbers: cost_fn never answers 0 for what it cannot plan": [
        "test_automl.py::test_cost_fn_refuses_architectures_it_cannot_plan",
        "test_automl.py::test_cost_fn_refuses_a_batch_no_mesh_can_split",
        "test_automl.py::test_cost_fn_traced_bad_architecture_is_nan_not_zero"],
    "numbers: a plan at exactly the suggested limit fits it": [
        "test_plan.py::test_infeasible_memory_says_the_smallest_limit_that_fits"],
    "numbers: a limit above the device's memory is an error": ["test_plan.py::test_a_limit_above_the_devices_memory_is_an_error"],
    "answers: the header says when pure data parallelism does not fit; the hint helps": [
        "test_cli.py::test_plan_header_says_when_pure_data_parallelism_does_not_fit",
        "test_plan.py::test_infeasible_memory_advice_is_advice_that_helps"],
    "answers: the simpler plan within the tolerance": ["test_plan.py::test_tolerance_picks_the_simplest_plan_within_it"],
    "errors: one line for any exception, Ctrl-C exits 130, --debug shows the traceback": [
        "test_cli_boundary.py::test_every_exception_is_one_line", "test_cli_boundary.py::test_debug_shows_the_traceback"],
    "factories that raise, exit or return the wrong thing": [
        "test_cli_boundary.py::test_a_misbehaving_factory_is_one_line_naming_it"],
    "sizes: work bounded by the input's size, not its values": [
        "test_bounded_work.py::test_mesh_shapes_of_2_to_the_40_devices", "test_bounded_work.py::test_net_file_with_a_huge_image_parses",
        "test_bounded_work.py::test_valid_taps_equals_brute_force"],
    "sizes: knobs past their cap (CLI_CASES rows '...-above-cap')": ["test_bad_input.py::test_cli_rejects_bad_input"],
    "files: -o never destroys what it names (links followed, devices and pipes in place, folders refused)": [
        "test_files.py::test_writer_follows_symbolic_links_to_their_target",
        "test_files.py::test_writer_writes_devices_in_place",
        "test_files.py::test_writer_appends_to_an_open_descriptor_never_replacing_it",
        "test_files.py::test_writer_refuses_folders"],
    "files: -o onto one of the command's inputs, however named (rows '...-output-onto-...')": [
        "test_files.py::test_output_onto_an_input_is_refused_however_named",
        "test_files.py::test_cli_output_onto_an_input_by_another_name_exits_2_and_keeps_it",
        "test_bad_input.py::test_cli_rejects_bad_input"],
    "plans: evaluate --plan reads as strictly as Plan.read (rows 'plan-file-...', 'evaluate-json-...')": [
        "test_bad_input.py::test_cli_rejects_bad_input",
        "test_bad_input.py::test_evaluate_reads_the_valid_plan_files_on_their_mesh"],
    "files: reads bounded: regular files of at most MAX_INPUT_BYTES; hardware from a plan file by preset only": [
        "test_files.py::test_read_input_refuses_devices_pipes_folders_and_oversize",
        "test_bad_input.py::test_cli_rejects_bad_input", "test_bad_input.py::test_public_function_rejects_bad_input"],
    "values: seeds and device counts in range, the wrong type named (rows '...-above-cap', '...-none', '...-dict')": [
        "test_bad_input.py::test_public_function_rejects_bad_input",
        "test_bad_input.py::test_shard_takes_a_plan_or_a_path_and_names_anything_else"],
    "signals: Ctrl-C at any moment (imports, tables, compilation) is one line and exit 130": [
        "test_cli_boundary.py::test_the_interrupt_handler_prints_one_line_and_exits_130",
        "test_cli_boundary.py::test_ctrl_c_at_any_moment_is_one_line_and_exit_130"],
    "user code: a factory's or forward pass's errors (BaseException included) are the user's, exit 2": [
        "test_cli_boundary.py::test_a_base_exception_from_a_factory_is_one_line_exit_2",
        "test_cli_boundary.py::test_a_forward_pass_that_raises_is_the_users_error",
        "test_cli_boundary.py::test_extract_names_the_model_whose_forward_pass_raised"],
    "user code: what it prints never reaches --json's stdout": [
        "test_cli_boundary.py::test_what_user_code_prints_never_reaches_json_stdout"],
    "terminal: control characters in names from files are shown escaped": [
        "test_terminal_hygiene.py::test_printable_escapes_every_control_character_but_newline_and_tab",
        "test_terminal_hygiene.py::test_a_table_on_a_terminal_shows_hostile_names_escaped",
        "test_terminal_hygiene.py::test_an_error_line_shows_a_hostile_name_escaped"],
    "cache: a folder another user owns or every user may write is not used (one warning)": [
        "test_terminal_hygiene.py::test_cache_folder_refusal",
        "test_terminal_hygiene.py::test_cli_refuses_an_unsafe_cache_with_one_warning",
        "test_terminal_hygiene.py::test_library_cost_table_cache_refuses_an_unsafe_folder_with_a_warning"],
    "calibrations: applicability (hardware, dtype, the model's layers) checked in one place for plan, evaluate "
    "and oracle; a partial one noted (rows '...-calibration-for-another-...')": [
        "test_bad_input.py::test_cli_rejects_bad_input", "test_bad_input.py::test_public_function_rejects_bad_input",
        "test_bad_input.py::test_a_partial_calibration_is_used_with_a_note",
        "test_bad_input.py::test_a_calibration_of_every_layer_is_used_without_a_note"],
    "numbers: hardware and calibration values in float32's range, efficiencies in [1e-6, 1], seconds <= 1e6; "
    "JSON output never NaN (rows '...-1e-40', '...-1e300', '...-1e39')": [
        "test_bad_input.py::test_cli_rejects_bad_input", "test_bad_input.py::test_public_function_rejects_bad_input",
        "test_bad_input.py::test_float32_range_is_the_boundary", "test_bad_input.py::test_json_output_never_holds_nan"],
    "files: each layer of a graph file holds together: shapes, parameters and FLOPs from its shapes (rows 'graph-...')": [
        "test_bad_input.py::test_cli_rejects_bad_input", "test_bad_input.py::test_file_flops_within_the_tolerance_are_read",
        "test_bad_input.py::test_every_zoo_model_reads_back_through_the_layer_checks"],
    "time: the MILP stops at its time limit with the best plan and its gap": [
        "test_plan.py::test_milp_time_limit_returns_the_best_plan_with_its_gap"],
}


def test_every_class_has_its_tests():
    from pathlib import Path

    here = Path(__file__).parent
    missing = []
    for cls, tests in CLASS_TESTS.items():
        for ref in tests:
            file, _, name = ref.partition("::")
            text = (here / file).read_text(encoding="utf-8")
            if not re.search(rf"^def {re.escape(name)}\(", text, re.MULTILINE):
                missing.append(f"{cls}: {ref}")
    assert not missing, "classes whose test is gone: " + "; ".join(missing)
    cap_rows = [c for c in CLI_CASES if "above-cap" in str(getattr(c, "id", ""))]
    assert len(cap_rows) >= 5, "the '-above-cap' rows of CLI_CASES"
