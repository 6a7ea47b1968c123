"""``planner.evaluate`` (:mod:`planner.evaluation`) and the ``evaluate`` / ``hardware`` commands."""

import json

import pytest

from costmodels import load_hardware
from planner.cli import main
from planner.evaluation import evaluate
from planner.models.zoo import get_model

LAYER_KEYS = {"name", "kind", "strategy", "compute_s", "comm_s", "reshard_s", "memory_bytes", "requested_strategy",
              "substitution_reason"}


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
    # ... and says so: the strategy asked for, and why it cannot run there
    marked = {r["name"]: r["substitution_reason"] for r in out["layers"] if r["requested_strategy"] != r["strategy"]}
    assert set(marked) == {"flatten", "classifier/0"}
    assert all(r["requested_strategy"] == "filter" for r in out["layers"])
    assert marked["classifier/0"] == "filter needs the model axis (8) to divide the 10 output channels"


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


# -- no silent substitution -------------------------------------------------------------------


def _rows_graph():
    """conv0 on 16 rows, a 2x2 pool to 8 rows, conv1 on 8 rows, then a 10-way dense."""
    from planner.ir.builder import GraphBuilder

    b = GraphBuilder("rows", (4, 16, 16))
    c0 = b.conv("conv0", b.input, 8, 3, padding="SAME")
    p = b.max_pool("pool", c0, 2)
    c1 = b.conv("conv1", p, 8, 3, padding="SAME")
    b.dense("fc", b.flatten("flatten", c1), 10)
    return b.build()


def test_spatial_substitution_is_marked_with_its_reason():
    # Model axis 8: spatial needs 2 x 8 = 16 rows in and out. By hand: conv0 has 16 in
    # and 16 out (runs spatial); the pool leaves 8 rows and conv1 has 8 (both replicated,
    # marked); flatten and fc have no spatial dim (replicated, marked).
    ev = evaluate(_rows_graph(), load_hardware("dgx-a100"), 8, mesh=(1, 8), strategy="spatial", batch=8)
    by = {r.name: r for r in ev.layers}
    assert by["conv0"].strategy == "spatial" and not by["conv0"].substituted
    assert by["conv0"].requested_strategy == "spatial" and by["conv0"].substitution_reason is None
    for name in ("pool", "conv1", "flatten", "fc"):
        assert by[name].strategy == "replicated" and by[name].requested_strategy == "spatial", name
    assert "2 rows per shard (16 rows" in by["conv1"].substitution_reason
    assert "2 rows per shard (16 rows" in by["pool"].substitution_reason
    assert "flatten" in by["flatten"].substitution_reason
    assert [r.name for r in ev.substituted] == ["pool", "conv1", "flatten", "fc"]
    rows = {r["name"]: r for r in ev.to_dict()["layers"]}
    assert rows["conv1"]["requested_strategy"] == "spatial" and rows["conv1"]["strategy"] == "replicated"
    assert rows["conv0"]["requested_strategy"] == "spatial" and rows["conv0"]["substitution_reason"] is None


def test_no_mark_where_the_strategy_runs():
    # Model axis 2 needs 4 rows: every map (16 and 8 rows) runs spatial; only flatten and fc
    # (no spatial dim) fall back. Under data nothing is substituted.
    g = _rows_graph()
    ev = evaluate(g, load_hardware("dgx-a100"), 2, mesh=(1, 2), strategy="spatial", batch=8)
    assert [r.name for r in ev.substituted] == ["flatten", "fc"]
    ev = evaluate(g, load_hardware("dgx-a100"), 8, mesh=(8, 1), strategy="data", batch=8)
    assert not ev.substituted
    assert all(r["requested_strategy"] == r["strategy"] for r in ev.to_dict()["layers"])
    # filter on m = 4: 8 conv filters split, the 10-way dense does not (10 % 4 != 0)
    ev = evaluate(g, load_hardware("dgx-a100"), 4, mesh=(1, 4), strategy="filter", batch=8)
    by = {r.name: r for r in ev.layers}
    assert [r.name for r in ev.substituted] == ["flatten", "fc"]
    assert by["fc"].substitution_reason == "filter needs the model axis (4) to divide the 10 output channels"


@pytest.mark.slow
def test_every_infeasible_strategy_has_a_reason():
    # The words follow strategy_mask's rules: wherever the mask excludes a strategy,
    # unavailable_reason names a rule (not the fallback), and where it allows one, none.
    import numpy as np

    from costmodels import cost_table, hardware_arrays
    from planner.unavailable import unavailable_reason

    hw = hardware_arrays(load_hardware("dgx-a100"))
    for model, batch, d, m in (("resnet50", 64, 2, 4), ("vgg16-cifar10", 64, 1, 8), ("alexnet", 32, 4, 2)):
        g = get_model(model)
        feasible = np.asarray(cost_table(g.arrays, hw, float(batch), float(d), float(m)).feasible)
        for i in range(g.num_layers):
            for s in range(feasible.shape[1]):
                why = unavailable_reason(g, i, s, batch, d, m)
                assert bool(why) == (not feasible[i, s]), (model, g.names[i], s, why)


def test_table_marks_substitutions_with_a_footnote(capsys, monkeypatch):
    from planner.cli.cost import _render_evaluation

    monkeypatch.setenv("COLUMNS", "200")
    ev = evaluate(_rows_graph(), load_hardware("dgx-a100"), 8, mesh=(1, 8), strategy="spatial", batch=8)
    _render_evaluation(ev.to_dict())
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()}
    assert rows["conv1"][2] == "replicated*" and rows["conv0"][2] == "spatial"
    assert "* requested spatial (pool, conv1); cannot run here: spatial needs >= 2 rows per shard" in " ".join(
        out.split())


def test_plan_file_keeps_the_requested_strategy(tmp_path):
    import json as _json

    from planner.planning import Plan

    g = _rows_graph()
    ev = evaluate(g, load_hardware("dgx-a100"), 8, mesh=(1, 8), strategy="spatial", batch=8)
    plan = _plan_of(ev, g)
    back = Plan.from_json(plan.to_json())
    assert back == plan and [r.name for r in back.layers if r.substituted] == ["pool", "conv1", "flatten", "fc"]
    assert "replicated*" in back.summary() and "* requested spatial" in back.summary()
    # A file written before the fields existed reads unchanged: requested = costed.
    old = _json.loads(plan.to_json())
    for row in old["layers"]:
        row.pop("requested_strategy"), row.pop("substitution_reason")
    layers = Plan.from_dict(old).layers
    assert all(r.requested_strategy == r.strategy and r.substitution_reason is None for r in layers)


def _plan_of(ev, g):
    from costmodels import load_hardware as _lh
    from planner.planning import AXIS_NAMES, Plan
    from planner.plans.specs import layer_specs

    return Plan(
        evaluation=ev, axis_names=AXIS_NAMES, memory_limit_bytes=ev.memory_capacity_bytes,
        data_parallel_iteration_s=None, data_parallel_memory_bytes=None, speedup_over_data_parallel=None,
        method="fixed", seed=0, seconds=0.0, optimality_gap=None, meshes=(), graph_fingerprint=g.fingerprint,
        input_shape=tuple(g.input_shape), layer_specs=layer_specs(g, [r.strategy for r in ev.layers]),
        hardware_spec=_lh(ev.hardware), package_version="test",
    )


# -- evaluate --plan runs under the plan's own settings ------------------------------------------


def test_evaluate_plan_uses_the_plans_own_settings(capsys, tmp_path):
    """A plan made on dgx-a100, 8 devices at mesh 2x4, batch 64: evaluate --plan
    with no other flags costs it exactly as planned (the CLI defaults, abci-v100
    and 32 samples per device, do not re-mesh it silently)."""
    f = tmp_path / "p.json"
    assert main(["plan", "vgg16-cifar10", "--devices", "8", "--batch", "64", "--hardware", "dgx-a100",
                 "-o", str(f), "--json"]) == 0
    made = json.loads(capsys.readouterr().out)
    again = run_json(capsys, "evaluate", "vgg16-cifar10", "--plan", str(f), "--json")
    for key in ("hardware", "devices", "mesh", "batch", "dtype", "optimizer", "iteration_s",
                "memory_bytes_per_device"):
        assert again[key] == made[key], key


@pytest.mark.slow
@pytest.mark.parametrize("flags, message", [
    (["--mesh", "8x1"], "--mesh 8x1 contradicts the plan's mesh"),
    (["--devices", "4"], "--devices 4 contradicts the plan's devices 8"),
    (["--batch", "128"], "--batch 128 contradicts the plan's batch 64"),
    (["--batch-per-device", "32"], "--batch-per-device 32 (256 in all) contradicts the plan's batch 64"),
    (["--hardware", "h200"], "--hardware h200 contradicts the plan's hardware dgx-a100"),
    (["--dtype", "bfloat16"], "--dtype bfloat16 contradicts the plan's dtype float32"),
    (["--optimizer", "sgd"], "--optimizer sgd contradicts the plan's optimizer adam"),
])
def test_evaluate_plan_refuses_contradicting_flags_unless_overridden(capsys, tmp_path, flags, message):
    f = tmp_path / "p.json"
    assert main(["plan", "vgg16-cifar10", "--devices", "8", "--batch", "64", "--hardware", "dgx-a100",
                 "-o", str(f), "--json"]) == 0
    capsys.readouterr()
    assert main(["evaluate", "vgg16-cifar10", "--plan", str(f), *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and "--override" in err and len(err.strip().splitlines()) == 1
    if flags[0] in ("--optimizer", "--hardware"):  # these keep the plan's mesh valid: the override runs
        out = run_json(capsys, "evaluate", "vgg16-cifar10", "--plan", str(f), *flags, "--override", "--json")
        assert out[flags[0].lstrip("-")] == flags[1]
