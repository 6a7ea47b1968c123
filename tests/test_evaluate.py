"""``planner.evaluate`` and the ``evaluate`` / ``hardware`` commands."""

import json

import pytest

from costmodels import load_hardware
from planner.cli import main
from planner.evaluate import evaluate
from planner.zoo import get_model

LAYER_KEYS = {"name", "kind", "strategy", "compute_s", "comm_s", "reshard_s", "memory_bytes"}


def run_json(capsys, *argv):
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_evaluate_json_keys_and_totals_add_up(capsys):
    out = run_json(capsys, "evaluate", "vgg16-cifar10-splitbrain", "--devices", "16", "--mesh", "2x8",
                   "--strategy", "data", "--batch", "256", "--json")
    assert {"iteration_s", "memory_bytes_per_device", "layers", "mesh", "collectives"} <= set(out)
    assert out["mesh"] == [2, 8] and out["batch"] == 256
    assert all(set(r) >= LAYER_KEYS for r in out["layers"])
    parts = sum(r["compute_s"] + r["comm_s"] + r["reshard_s"] for r in out["layers"])
    assert out["iteration_s"] == pytest.approx(parts, rel=1e-5)  # no overlap on abci-v100
    assert all(r["strategy"] == "data" for r in out["layers"])
    assert all(r["reshard_s"] == 0 for r in out["layers"])


def test_filter_strategy_shards_every_layer_that_can_be(capsys):
    out = run_json(capsys, "evaluate", "vgg16-cifar10", "--devices", "8", "--mesh", "1x8",
                   "--strategy", "filter", "--batch", "64", "--json")
    got = {r["name"]: r["strategy"] for r in out["layers"]}
    # By hand: every conv has 64..512 filters (divisible by 8), the ReLUs and pools
    # follow their channels; the flatten cannot be split, nor the 10-way classifier.
    for name, kind in ((r["name"], r["kind"]) for r in out["layers"]):
        expected = "replicated" if name in ("flatten", "classifier/0") else "filter"
        assert got[name] == expected, (name, kind)


def test_plan_file_round_trip(capsys, tmp_path):
    first = run_json(capsys, "evaluate", "resnet50", "--devices", "32", "--mesh", "8x4", "--strategy", "spatial",
                     "--hardware", "dgx-a100", "--batch", "256", "--json")
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(first))
    second = run_json(capsys, "evaluate", "resnet50", "--devices", "32", "--mesh", "8x4", "--plan", str(plan),
                      "--hardware", "dgx-a100", "--batch", "256", "--json")
    assert second["iteration_s"] == first["iteration_s"]
    assert [r["strategy"] for r in second["layers"]] == [r["strategy"] for r in first["layers"]]


def test_default_mesh_is_one_node_and_batch_per_device():
    ev = evaluate(get_model("alexnet"), load_hardware("dgx-h100"), 64, strategy="data", batch_per_device=16)
    assert ev.mesh == (8, 8) and ev.batch == 1024


def test_hardware_command(capsys):
    out = run_json(capsys, "hardware", "--json")
    assert {p["name"] for p in out["presets"]} >= {"abci-v100", "dgx-a100", "dgx-h100", "h200"}
    one = run_json(capsys, "hardware", "abci-v100")
    assert one["devices_per_node"] == 4 and one["tiers"][0]["latency_s"] == 9e-6


@pytest.mark.parametrize(
    "argv, message",
    [
        (["evaluate", "resnet50", "--devices", "6", "--mesh", "4x2", "--strategy", "data"], "mesh 4x2"),
        (["evaluate", "resnet50", "--devices", "8", "--mesh", "8by1", "--strategy", "data"], "DxM"),
        (["evaluate", "resnet50", "--devices", "8", "--strategy", "diagonal"], "unknown strategy"),
        (["evaluate", "resnet50", "--devices", "8", "--mesh", "2x4", "--batch", "7", "--strategy", "filter"], "not divisible"),
        (["evaluate", "resnet50", "--devices", "8", "--mesh", "1x8", "--batch", "4", "--strategy", "data"], "not divisible"),
        (["evaluate", "resnet50", "--devices", "0", "--strategy", "data"], "positive"),
        (["evaluate", "resnet50", "--devices", "8", "--batch-per-device", "0", "--strategy", "data"], "positive"),
        (["evaluate", "resnet50", "--devices", "8"], "exactly one"),
        (["evaluate", "resnet50", "--devices", "8", "--strategy", "data", "--hardware", "tpu-v9"], "unknown hardware"),
        (["evaluate", "resnet50", "--devices", "8", "--strategy", "data", "--dtype", "int8"], "invalid choice"),
        (["hardware", "nope"], "unknown hardware"),
    ],
)
def test_bad_input_exits_2_with_one_line(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


def test_plan_with_infeasible_or_unknown_layers(capsys, tmp_path):
    g = get_model("vgg16-cifar10")
    rows = [{"name": n, "strategy": "data"} for n in g.names]
    rows[0]["strategy"] = "channel"  # 3 input channels cannot be split 8 ways
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"layers": rows}))
    assert main(["evaluate", "vgg16-cifar10", "--devices", "8", "--mesh", "1x8", "--plan", str(bad)]) == 2
    assert "cannot run strategy channel" in capsys.readouterr().err
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"layers": [{"name": "x", "strategy": "data"}]}))
    assert main(["evaluate", "vgg16-cifar10", "--devices", "8", "--plan", str(other)]) == 2
    assert "does not have" in capsys.readouterr().err
    trunc = tmp_path / "trunc.json"
    trunc.write_text(json.dumps({"layers": rows})[:40])
    assert main(["evaluate", "vgg16-cifar10", "--devices", "8", "--plan", str(trunc)]) == 2
    assert "malformed JSON" in capsys.readouterr().err
