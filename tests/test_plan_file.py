"""Plan files: exact round trip, and rejection of malformed or foreign files."""

import dataclasses
import json

import pytest
from jax.sharding import PartitionSpec as P

from planner.planning import Plan, plan


@pytest.fixture(scope="module")
def vgg_plan():
    return plan("vgg16-cifar10-splitbrain", devices=16, hardware="abci-v100", batch=256, method="dp", levers="none")


def test_round_trip_is_exact(vgg_plan, tmp_path):
    text = vgg_plan.to_json()
    back = Plan.from_json(text)
    assert back == vgg_plan
    assert back.to_json() == text
    path = tmp_path / "plan.json"
    vgg_plan.write(path)
    assert Plan.read(path) == vgg_plan
    assert json.loads(text)["schema"] == "shardplan/plan" and json.loads(text)["version"] == 5


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.update(schema="shardplan/layer-graph"), "not a plan file"),
        (lambda d: d.update(version=6), "newer"),
        (lambda d: d.update(version="1"), "integer"),
        (lambda d: d.pop("mesh"), 'missing "mesh"'),
        (lambda d: d.update(mesh=[3, 5]), "does not hold"),
        (lambda d: d.update(iteration_s=float("nan")), "finite"),
        (lambda d: d["layers"][0].update(strategy="diagonal"), "not one of"),
        (lambda d: d["layers"][0].pop("compute_s"), 'missing "compute_s"'),
        (lambda d: d.update(layers=[]), "must not be empty"),
        (lambda d: d.update(axis_names=["x", "y"]), "axis_names"),
        (lambda d: d["collectives"][0].update(axes="model"), "axes"),
        (lambda d: d.update(input_shape=[3, -1]), "positive integers"),
    ],
)
def test_malformed_plans_rejected(vgg_plan, mutate, message):
    d = json.loads(vgg_plan.to_json())
    mutate(d)
    with pytest.raises(ValueError, match=message):
        Plan.from_dict(d)


def test_truncated_and_missing_files(vgg_plan, tmp_path):
    with pytest.raises(ValueError, match="malformed JSON"):
        Plan.from_json(vgg_plan.to_json()[:100])
    with pytest.raises(ValueError, match="No such file or directory; expected a plan file"):
        Plan.read(tmp_path / "nope.json")


# -- version 2: layer specs, embedded hardware, package version, history ----------


def test_file_embeds_hardware_version_and_history(vgg_plan):
    from importlib.metadata import version

    from costmodels import load_hardware

    d = json.loads(vgg_plan.to_json())
    assert d["hardware_spec"] == load_hardware("abci-v100").to_dict()
    assert d["package_version"] == version("shardplan")  # what pip installed, not the module constant
    assert d["history"] and {h["stage"] for h in d["history"]} >= {"dp"}


def test_gradient_plans_record_their_search_history():
    p = plan("vgg16-cifar10", devices=8, hardware="dgx-a100", batch=64, method="gradient")
    stages = [h.stage for h in p.history]
    assert "relaxed" in stages and stages.index("relaxed") < len(stages) - 1
    assert Plan.from_json(p.to_json()).history == p.history


def _flax_param_specs(name, strategies):
    """(layer, param) -> PartitionSpec that planner.runtime.export applies to the real nnx state."""
    import jax
    from flax import nnx

    from planner.models.flax_zoo import flax_model
    from planner.runtime.export import partition_specs

    model, _ = flax_model(name)
    specs = partition_specs(nnx.state(model), strategies)
    out = {}
    for path, spec in jax.tree_util.tree_leaves_with_path(specs, is_leaf=lambda x: isinstance(x, P)):
        keys = [str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey)]
        out["/".join(keys[:-1]), keys[-1]] = spec
    return out



def test_recorded_param_specs_are_what_export_applies():
    p = plan("vgg16-cifar10-splitbrain", devices=8, hardware="abci-v100", batch=64, method="dp",
             memory_limit="375MB")  # 300 MB x 20/16: the optimizer update (4 B/param) joined the state
    strategies_by_layer = p.strategies
    assert len(set(strategies_by_layer.values())) > 1, "want a mixed plan"
    applied = _flax_param_specs("vgg16-cifar10-splitbrain", strategies_by_layer)
    recorded = {(s.name, n): P(*spec) for s in p.layer_specs for n, spec in s.param_specs}
    for key, spec in applied.items():
        assert recorded[key] == spec, key
    assert set(applied) <= set(recorded)


def test_hand_checked_specs():
    from planner.models.zoo import get_model
    from planner.plans.specs import layer_specs

    g = get_model("vgg16-cifar10")
    names = list(g.names)
    strat = ["data"] * len(names)
    conv = names.index(next(n for n, k in zip(names, g.kind_names) if k == "conv2d"))
    dense = max(i for i, k in enumerate(g.kind_names) if k == "dense")
    strat[conv], strat[dense] = "filter", "channel"
    specs = layer_specs(g, strat)
    c, f = specs[conv], specs[dense]
    assert dict(c.param_specs) == {"kernel": (None, None, None, "model"), "bias": ("model",)}
    assert c.input_spec == ("data",) and c.output_spec == ("data", None, None, "model")
    assert dict(f.param_specs) == {"kernel": ("model", None), "bias": ()}
    assert f.input_spec == ("data", "model") and f.output_spec is None  # partial sums: XLA decides
    assert specs[0 if conv else 1].input_spec in (("data",), (("data", "model"),))


@pytest.mark.parametrize("model", ["vgg16-cifar10-splitbrain", "resnet50", "cosmoflow-256"])
def test_version_1_files_upgrade_to_the_same_specs(model):
    """A version-1 file (no specs, hardware, version or history) reads back with
    the specs the graph itself gives (the kinds-only rule agrees with the graph)."""
    from costmodels import load_hardware
    from planner.models.zoo import get_model
    from planner.plans.specs import layer_specs

    g = get_model(model)
    p = plan(model, devices=8, hardware="dgx-a100", batch=64, method="auto", levers="none")  # version 1 had no levers
    d = json.loads(p.to_json())
    d["version"] = 1
    for key in ("package_version", "hardware_spec", "history", "levers"):
        d.pop(key)
    for row in d["layers"]:
        for key in ("input_spec", "output_spec", "param_specs", "zero_stage", "remat"):
            row.pop(key)
    back = Plan.from_dict(d)
    assert back.layer_specs == layer_specs(g, [r.strategy for r in p.layers])
    assert back.hardware_spec == load_hardware("dgx-a100")
    assert back.package_version.startswith("unknown") and back.history == ()
    assert back.strategies == p.strategies and back.to_dict()["version"] == 5


def test_summary_has_one_row_per_layer(vgg_plan):
    text = vgg_plan.summary()
    lines = text.splitlines()
    assert len(lines) == 2 + len(vgg_plan.layers) + 1
    for line, r in zip(lines[2:], vgg_plan.layers):
        assert line.split()[:3] == [r.name, r.kind, r.strategy]
    assert f"{vgg_plan.iteration_s * 1e3:.3f} ms/iteration" in lines[0]


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d["layers"][0].update(input_spec="data"), "input_spec must be a list"),
        (lambda d: d["layers"][0].update(output_spec=["rows"]), "entries must be null"),
        (lambda d: d["layers"][0].pop("param_specs"), 'missing "param_specs"'),
        (lambda d: d.pop("package_version"), 'missing "package_version"'),
        (lambda d: d["hardware_spec"].pop("tiers"), "tiers"),
        (lambda d: d["history"][0].update(fits="yes"), "fits must be true or false"),
        # version 3: the levers
        (lambda d: d["layers"][0].update(zero_stage=4), "zero_stage must be 0, 1, 2 or 3"),
        (lambda d: d["layers"][0].update(zero_stage=True), "zero_stage must be an integer"),
        (lambda d: d["layers"][0].update(remat="yes"), "remat must be true or false"),
        (lambda d: d["layers"][0].pop("remat"), 'missing "remat"'),
        (lambda d: d.update(levers="zero3"), "plan.levers must be one of"),
    ],
)
def test_malformed_version_2_and_3_fields_rejected(vgg_plan, mutate, message):
    d = json.loads(vgg_plan.to_json())
    mutate(d)
    with pytest.raises(ValueError, match=message):
        Plan.from_dict(d)


# -- version 3: memory levers per layer --------------------------------------------


def test_version_2_files_read_with_no_levers(vgg_plan):
    """A file written before the levers (version 2: no zero_stage or remat on
    its rows) reads as the same plan, every layer without a lever."""
    d = json.loads(vgg_plan.to_json())
    d["version"] = 2
    assert d.pop("levers") == "none"
    for row in d["layers"]:
        assert (row.pop("zero_stage"), row.pop("remat")) == (0, False)
    back = Plan.from_dict(d)
    assert back == vgg_plan and back.zero_stages == {} and back.remat_layers == ()


@pytest.fixture(scope="module")
def lever_plan():
    """VGG16-CIFAR-10 on 8 DGX A100s at batch 64 within 62 MB, which no
    lever-free plan fits (the smallest needs 65.0 MB): ZeRO shards the state."""
    return plan("vgg16-cifar10", devices=8, hardware="dgx-a100", batch=64, memory_limit="62MB", levers="zero")


def test_lever_plans_round_trip_with_their_levers(lever_plan, tmp_path):
    assert lever_plan.zero_stages  # the limit needs ZeRO
    path = tmp_path / "plan.json"
    lever_plan.write(path)
    back = Plan.read(path)
    assert back == lever_plan and back.zero_stages == lever_plan.zero_stages
    rows = json.loads(path.read_text())["layers"]
    assert {r["name"]: r["zero_stage"] for r in rows if r["zero_stage"]} == lever_plan.zero_stages
    # the table shows each layer's levers beside its strategy
    for line in lever_plan.summary(full=True).splitlines()[2:-1]:
        name, _, option = line.split()[:3]
        z = lever_plan.zero_stages.get(name, 0)
        assert option == (f"{lever_plan.strategies[name]}+zero{z}" if z else lever_plan.strategies[name])


def test_recorded_param_specs_of_zero_3_layers_are_what_the_plan_applies(lever_plan):
    """A stage-3 layer stores its weights sharded over its data-parallel group:
    the file records that spec, and Plan.partition_specs applies it."""
    import jax
    from flax import nnx

    from planner.models.flax_zoo import flax_model

    fsdp = {n for n, z in lever_plan.zero_stages.items() if z == 3}
    assert fsdp
    model, _ = flax_model("vgg16-cifar10")
    specs = lever_plan.partition_specs(nnx.state(model))
    applied = {}
    for path, spec in jax.tree_util.tree_leaves_with_path(specs, is_leaf=lambda x: isinstance(x, P)):
        keys = [str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey)]
        applied["/".join(keys[:-1]), keys[-1]] = spec
    recorded = {(s.name, n): P(*spec) for s in lever_plan.layer_specs for n, spec in s.param_specs}
    assert applied == {k: v for k, v in recorded.items() if k in applied} and set(applied) <= set(recorded)
    for name in fsdp:
        kernel = recorded[name, "kernel"]
        assert "data" in str(kernel), (name, kernel)  # split over the group as well


# -- version 4: a layer joining the run of recomputed layers before it -------------------


def _with_run(p, names):
    """``p`` with the layers ``names`` recomputed as one run (the first recomputes, the others join)."""
    layers = tuple(dataclasses.replace(r, remat=r.name in names, joins=r.name in names[1:]) for r in p.layers)
    return dataclasses.replace(p, evaluation=dataclasses.replace(p.evaluation, layers=layers))


def test_runs_round_trip_and_version_3_files_read_without_joins(vgg_plan, tmp_path):
    names = [r.name for r in vgg_plan.layers]
    run = _with_run(vgg_plan, names[:3])
    assert run.recompute_runs == (tuple(names[:3]),)
    path = tmp_path / "plan.json"
    run.write(path)
    back = Plan.read(path)
    assert back == run and back.recompute_runs == (tuple(names[:3]),)
    rows = json.loads(path.read_text())["layers"]
    assert [(r["remat"], r["joins"]) for r in rows[:4]] == [(True, False), (True, True), (True, True), (False, False)]
    d = json.loads(vgg_plan.to_json())
    d["version"] = 3
    for row in d["layers"]:
        assert row.pop("joins") is False
    assert Plan.from_dict(d) == vgg_plan
    d = json.loads(run.to_json())
    d["layers"][1]["remat"] = False
    with pytest.raises(ValueError, match=r"plan.layers\[1\] joins a run of recomputed layers but does not recompute"):
        Plan.from_dict(d)


def test_the_smallest_memory_may_be_left_out_from_version_4():
    """search.Solution.min_memory_bytes is None where the search did not need
    it (a table with runs whose fastest plan without runs fits); a version-4
    file says null, an older one must give a number."""
    p = plan("vgg16-cifar10", devices=8, hardware="dgx-a100", batch=64, levers="remat")
    assert all(m.min_memory_bytes is None for m in p.meshes)  # the fastest plans fit: no MILP over runs
    d = json.loads(p.to_json())
    assert Plan.from_dict(d) == p
    d["version"] = 3
    for row in d["layers"]:
        row.pop("joins")
    with pytest.raises(ValueError, match=r"plan.meshes\[0\].min_memory_bytes must be a finite number"):
        Plan.from_dict(d)
