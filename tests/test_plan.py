"""``planner.plan`` and ``shardplan plan``: SplitBrain's finding coming out of
the search, the mesh search, the infeasible-memory error, memory-limit
parsing, determinism, and the command line's JSON and exit codes."""

import json

import numpy as np
import pytest

from costmodels import CostSettings, cost_table, hardware_arrays, load_hardware
from planner.cli import main
from planner.evaluation import evaluate
from planner.models.zoo import get_model
from planner.planning import (
    InfeasibleMemoryError,
    mesh_shapes,
    parse_memory_limit,
    plan,
)
from search import discrete_problem, minimum_memory

GB = 1e9


def test_splitbrain_conv_data_parallel_fc_sharded_in_groups():
    """VGG16 (ImageNet) on 64 V100s under 6 GB per device, where pure data
    parallelism (6.72 GB) does not fit: the exact search keeps every conv
    layer data-parallel and shards every fully-connected layer over the
    model axis, i.e. within groups of m devices of one node (SplitBrain,
    splitbrain.md §1.2). Nothing in the search knows about layer types."""
    hw = load_hardware("abci-v100")
    p = plan("vgg16", devices=64, hardware=hw, memory_limit="6GB")
    assert p.data_parallel_memory_bytes > 6 * GB >= p.memory_bytes_per_device
    d, m = p.mesh
    assert 1 < m <= hw.devices_per_node and d * m == 64
    kinds = {r.name: r.kind for r in p.layers}
    convs = [r for r in p.layers if kinds[r.name] == "conv2d"]
    fcs = [r for r in p.layers if kinds[r.name] == "dense"]
    assert len(convs) == 13 and len(fcs) == 3
    assert all(r.strategy == "data" for r in convs)
    assert all(r.strategy in ("filter", "channel") for r in fcs)
    assert p.method == "dp" and p.optimality_gap == 0.0
    assert p.speedup_over_data_parallel > 1.0


def test_plan_is_the_best_mesh_and_matches_exact_solvers():
    p = plan("alexnet", devices=16, hardware="dgx-a100", memory_limit="3GB", method="gradient", seed=1)
    by_mesh = {m.mesh: m for m in p.meshes}
    assert set(by_mesh) == {(16, 1), (8, 2), (4, 4), (2, 8)}
    fitting = [m.iteration_s for m in p.meshes if m.feasible]
    assert by_mesh[p.mesh].iteration_s == min(fitting)
    exact = plan("alexnet", devices=16, hardware="dgx-a100", memory_limit="3GB", method="milp")
    dp = plan("alexnet", devices=16, hardware="dgx-a100", memory_limit="3GB", method="dp")
    assert exact.iteration_s == pytest.approx(dp.iteration_s, rel=1e-6)
    assert p.iteration_s >= exact.iteration_s * (1 - 1e-6)
    assert p.memory_bytes_per_device <= 3 * GB
    # the per-layer rows add up to the total (no overlap on this preset)
    parts = sum(r.compute_s + r.comm_s + r.reshard_s for r in p.layers)
    assert p.iteration_s == pytest.approx(parts, rel=1e-5)


def test_same_inputs_and_seed_give_the_same_plan():
    kw = dict(devices=32, hardware="dgx-a100", memory_limit="2.5GB", method="gradient", seed=7)
    a, b = plan("alexnet", **kw).to_dict(), plan("alexnet", **kw).to_dict()
    a.pop("seconds"), b.pop("seconds")
    assert a == b


def test_infeasible_memory_names_the_optimizer_step_where_it_is_the_peak():
    """SplitBrain VGG16-CIFAR-10 at one sample per device: its FC head's state
    dwarfs the activations, so the smallest plan peaks at the optimizer step,
    and the message names that phase and the FC layers, not a workspace.
    Its size is that plan's state summed (weights, gradients, Adam's slots and
    the update), recomputed here from the cost tables of the meshes searched."""
    with pytest.raises(InfeasibleMemoryError) as err:
        plan("vgg16-cifar10-splitbrain", devices=8, hardware="dgx-a100", batch=8, memory_limit="1MB")
    msg = str(err.value)
    assert "the optimizer step" in msg and "classifier/0" in msg and "workspace" not in msg
    g, hw = get_model("vgg16-cifar10-splitbrain"), load_hardware("dgx-a100")
    problems = [discrete_problem(cost_table(g.arrays, hardware_arrays(hw), 8.0, float(d), float(m), CostSettings()))
                for d, m in mesh_shapes(8, 8, 8)]
    p = min(problems, key=lambda q: minimum_memory(q).memory_bytes)
    mm = minimum_memory(p)
    rows = np.arange(p.num_layers)
    backward = p.persistent_bytes[rows, mm.choice].sum() + p.workspace_bytes[rows, mm.choice].max()
    state = p.optimizer_bytes[rows, mm.choice].sum()
    assert state > backward and mm.memory_bytes == state
    inputs = 32 * 32 * 3 * 4 + 4  # one image and its label per device
    assert err.value.required_bytes == pytest.approx((state + inputs) / (1 - 1e-5), rel=1e-8)


def test_infeasible_memory_says_the_smallest_limit_that_fits():
    with pytest.raises(InfeasibleMemoryError) as err:
        plan("vgg16", devices=64, hardware="abci-v100", memory_limit="2GB", levers="none")
    e = err.value
    assert isinstance(e, ValueError)
    msg = str(e)
    assert "smallest memory limit" in msg and "classifier/0" in msg and "workspace" in msg
    # the required size is the exact minimum over the mesh shapes searched ...
    g, hw = get_model("vgg16"), load_hardware("abci-v100")
    mins = [minimum_memory(discrete_problem(cost_table(g.arrays, hardware_arrays(hw), 2048.0, float(d), float(m),
                                                         CostSettings()))).memory_bytes
            for d, m in mesh_shapes(64, 2048, 4)]
    # plus the input batch the search keeps free: 32 images 224x224x3 float32 + labels per device
    # + the input batch, then the float32 rounding slack the search keeps (planning.FLOAT32_ROUNDING)
    assert e.required_bytes == pytest.approx((min(mins) + 32 * (224 * 224 * 3 * 4 + 4)) / (1 - 1e-5), rel=1e-8)
    assert f"{e.required_bytes:,.0f} bytes" in msg
    # ... so a plan fits exactly there, and not just below
    assert plan("vgg16", devices=64, hardware=hw, memory_limit=e.required_bytes, levers="none"
                ).memory_bytes_per_device <= e.required_bytes * (1 + 1e-6)
    with pytest.raises(InfeasibleMemoryError):
        plan("vgg16", devices=64, hardware=hw, memory_limit=e.required_bytes * 0.999, levers="none")


def test_infeasible_memory_advice_is_advice_that_helps():
    """Checked by planning what the message suggests (or rules out)."""
    kw = dict(hardware="abci-v100", memory_limit="2GB")  # 4 GPUs per node
    with pytest.raises(InfeasibleMemoryError) as err:
        plan("vgg16", devices=64, **kw)  # 32 samples per device, fixed
    msg = str(err.value)
    assert "smaller per-device batch (now 32)" in msg and "more devices would not help" in msg
    with pytest.raises(InfeasibleMemoryError):  # ... and indeed they do not
        plan("vgg16", devices=128, **kw)
    assert plan("vgg16", devices=64, batch_per_device=2, **kw).fits_memory
    with pytest.raises(InfeasibleMemoryError) as err:
        plan("vgg16", devices=64, batch=2048, **kw)  # a fixed global batch: more devices, fewer samples each
    assert "use more devices (the global batch of 2048" in str(err.value)
    assert plan("vgg16", devices=1024, batch=2048, **kw).fits_memory
    with pytest.raises(InfeasibleMemoryError) as err:
        plan("vgg16", devices=2, memory_limit="2GB", hardware="abci-v100")  # the model axis could grow to 4
    assert "or more devices for a wider model axis (up to 4 in a node)" in str(err.value)


def test_memory_limit_units():
    assert parse_memory_limit("16GiB") == 16 * 2**30
    assert parse_memory_limit("16GB") == 16e9
    assert parse_memory_limit("16 gb") == 16e9
    assert parse_memory_limit("500MiB") == 500 * 2**20
    assert parse_memory_limit("1.5e9") == 1.5e9
    assert parse_memory_limit(123) == 123.0
    for bad, match in (("16GX", "unknown unit"), ("lots", "not a size"), ("0GB", "positive"), (-5, "positive")):
        with pytest.raises(ValueError, match=match):
            parse_memory_limit(bad)


def test_mesh_shapes():
    assert mesh_shapes(64, 2048, 8) == [(64, 1), (32, 2), (16, 4), (8, 8)]
    assert mesh_shapes(64, 2048, 8, allow_cross_node_model_axis=True)[-1] == (1, 64)
    assert mesh_shapes(12, 20, 8) == [(4, 3), (2, 6)]  # d must divide the batch: not 12, 6 or 3
    with pytest.raises(ValueError, match="divisible"):
        mesh_shapes(64, 100, 8)


def test_batch_not_split_by_all_devices_masks_data_parallelism():
    # 24 samples on 16 devices: meshes (8, 2), (4, 4), (2, 8) split it over d; no layer can be data-parallel
    p = plan("alexnet", devices=16, hardware="dgx-a100", batch=24)
    assert p.mesh[0] in (8, 4, 2) and all(r.strategy != "data" for r in p.layers)
    assert p.speedup_over_data_parallel is None


# -- the command line ------------------------------------------------------------------------------


def test_cli_json_has_evaluate_keys_plus_mesh_method_seconds(capsys, tmp_path):
    assert main(["evaluate", "vgg16", "--devices", "64", "--strategy", "data", "--json"]) == 0
    eval_keys = set(json.loads(capsys.readouterr().out))
    out = tmp_path / "plan.json"
    assert main(["plan", "vgg16", "--devices", "64", "--memory-limit", "7GB", "--json", "-o", str(out)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert eval_keys | {"mesh", "method", "seconds"} <= set(data)
    assert data["schema"] == "shardplan/plan" and data["version"] == 5
    assert data["mesh"] == [16, 4] and data["method"] == "dp" and data["seconds"] > 0
    assert json.loads(out.read_text())["layers"] == data["layers"]
    # the written plan evaluates to the same prediction
    assert main(["evaluate", "vgg16", "--devices", "64", "--mesh", "16x4", "--plan", str(out), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["iteration_s"] == data["iteration_s"]
    assert again["memory_bytes_per_device"] == data["memory_bytes_per_device"]


def test_cli_infeasible_exits_1_with_one_line(capsys):
    assert main(["plan", "vgg16", "--devices", "64", "--memory-limit", "2GB"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("shardplan: error: no plan") and "GB" in err


@pytest.mark.parametrize(
    "argv, match",
    [
        (["plan", "vgg16", "--devices", "64", "--memory-limit", "2GX"], "unknown unit"),
        (["plan", "vgg16", "--devices", "64", "--method", "annealing"], "invalid choice"),
        (["plan", "vgg16", "--devices", "64", "--batch", "64", "--batch-per-device", "2"], "not allowed"),
        (["plan", "vgg17", "--devices", "64"], "unknown model"),
        (["plan", "vgg16"], "required"),
        (["plan", "resnet50", "--devices", "8", "--method", "dp"], "chain"),
    ],
)
def test_cli_usage_errors_exit_2(capsys, argv, match):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and match in err


def test_plan_predictions_equal_evaluate():
    p = plan("alexnet", devices=8, hardware="dgx-h100")
    mapping = {r.name: r.strategy for r in p.layers}
    ev = evaluate(get_model("alexnet"), load_hardware("dgx-h100"), 8, mesh=p.mesh, plan=mapping, batch=p.batch,
                  levers=p.levers)
    assert ev.iteration_s == p.iteration_s and ev.memory_bytes_per_device == p.memory_bytes_per_device
    assert np.isclose(p.speedup_over_data_parallel, p.data_parallel_iteration_s / p.iteration_s)


@pytest.mark.slow
@pytest.mark.parametrize("model, hardware, devices", [
    ("vgg16-cifar10", "dgx-a100", 8), ("resnet50", "dgx-a100", 8), ("vgg16", "h200", 16)])
def test_a_plan_at_the_suggested_limit_fits_it(model, hardware, devices):
    """The infeasibility error's smallest limit, given back, returns a plan whose
    memory plus what the search keeps free is within it, compared in float64."""
    import planner
    from planner.planning import InfeasibleMemoryError

    with pytest.raises(InfeasibleMemoryError) as e:
        planner.plan(model, devices=devices, hardware=hardware, memory_limit="1MB")
    required = e.value.required_bytes
    p = planner.plan(model, devices=devices, hardware=hardware, memory_limit=required)
    assert float(p.memory_bytes_per_device) + float(p.memory_margin_bytes) <= float(required)


def test_a_limit_above_the_devices_memory_is_an_error():
    import planner

    with pytest.raises(ValueError, match="more than a dgx-a100 device has"):
        planner.plan("vgg16-cifar10", devices=8, hardware="dgx-a100", memory_limit="200GB")


# -- prefer the simpler plan -------------------------------------------------------------------------


def test_resnet50_at_256_gpus_is_data_parallel_unless_sharding_clearly_wins():
    """Plain data parallelism, or a plan beating it by more than the tolerance."""
    import planner

    p = planner.plan("resnet50", devices=256, hardware="dgx-a100")
    off = [r.name for r in p.layers if r.strategy != "data"]
    assert not off or p.speedup_over_data_parallel > 1.01
    if p.fastest_iteration_s is not None:  # a faster, more sharded plan was found and passed over: said so
        assert p.fastest_iteration_s < p.iteration_s <= p.fastest_iteration_s * 1.01


def test_vgg16_at_64_gpus_keeps_the_splitbrain_pattern():
    import planner

    p = planner.plan("vgg16", devices=64, hardware="dgx-a100")
    g = planner.get_model("vgg16")
    kinds = dict(zip(g.names, g.kind_names, strict=True))
    assert all(r.strategy == "data" for r in p.layers if kinds[r.name] == "conv2d")
    assert any(r.strategy != "data" for r in p.layers if kinds[r.name] == "dense") and p.mesh[1] > 1
    assert p.fastest_iteration_s is None  # the SplitBrain plan is more than 1% faster


def test_tolerance_picks_the_simplest_plan_within_it(tmp_path):
    """VGG16 on 64 GPUs: data parallelism fits and is about 10% slower than the
    SplitBrain plan. Within a 50% tolerance it is returned, with the faster plan
    recorded; with tolerance 0 the fastest is returned; bad tolerances raise."""
    import planner
    from planner.planning import Plan

    fast = planner.plan("vgg16", devices=64, hardware="dgx-a100", simplicity_tolerance=0.0)
    simple = planner.plan("vgg16", devices=64, hardware="dgx-a100", simplicity_tolerance=0.5)
    assert simple.mesh == (64, 1) and all(r.strategy == "data" for r in simple.layers)
    assert simple.iteration_s == pytest.approx(fast.data_parallel_iteration_s, rel=1e-6)
    assert simple.fastest_iteration_s == pytest.approx(fast.iteration_s, rel=1e-6)
    assert simple.fastest_mesh == fast.mesh and fast.fastest_iteration_s is None
    f = tmp_path / "p.json"
    simple.write(f)
    again = Plan.read(f)
    assert (again.fastest_iteration_s, again.fastest_mesh) == (simple.fastest_iteration_s, simple.fastest_mesh)
    with pytest.raises(ValueError, match="simplicity_tolerance"):
        planner.plan("vgg16", devices=64, hardware="dgx-a100", simplicity_tolerance=1.5)


def test_milp_time_limit_returns_the_best_plan_with_its_gap():
    """A MILP stopped almost at once still returns a plan that fits, with each
    mesh's gap against its lower bound (or None without one) reported."""
    import math

    import planner

    p = planner.plan("resnet50", devices=64, hardware="dgx-a100", method="milp", milp_time_limit_s=0.01)
    assert p.fits_memory and p.memory_bytes_per_device + p.memory_margin_bytes <= p.memory_limit_bytes
    assert all(m.optimality_gap is None or (math.isfinite(m.optimality_gap) and m.optimality_gap >= 0)
               for m in p.meshes)
    with pytest.raises(ValueError, match="milp_time_limit_s"):
        planner.plan("vgg16-cifar10", devices=8, method="milp", milp_time_limit_s=-1)


def test_plan_builds_each_meshs_cost_table_once(monkeypatch):
    """plan() evaluates the plan it returns (and pure data parallelism) on the
    tables it searched: one cost table per mesh shape, none rebuilt."""
    from planner import evaluation, planning

    calls = []
    real = planning.cost_table

    def counted(*args, **kwargs):
        calls.append(args[3:5])  # (d, m)
        return real(*args, **kwargs)

    monkeypatch.setattr(planning, "cost_table", counted)
    monkeypatch.setattr(evaluation, "cost_table", counted)
    p = plan("vgg16", devices=64, hardware="dgx-a100")
    meshes = [tuple(r.mesh) for r in p.meshes]
    assert sorted(calls) == sorted(meshes) and len(meshes) == 4
    assert p.data_parallel_iteration_s is not None and p.layers  # both evaluations happened
    # the same figures as evaluate() building its own table
    again = evaluation.evaluate(get_model("vgg16"), load_hardware("dgx-a100"), 64, mesh=p.mesh,
                                plan=p.strategies, batch=p.batch)
    assert again.iteration_s == pytest.approx(p.iteration_s, rel=1e-6)
    assert [r.compute_s for r in again.layers] == pytest.approx([r.compute_s for r in p.layers], rel=1e-6)


def test_the_data_parallel_baseline_is_costed_for_the_plans_platform():
    """Where the meshes searched leave out ``(P, 1)``, pure data parallelism
    (the baseline, and the plan where it is the simplest) is evaluated for the
    platform the plan is for: on cpu its memory is XLA:CPU's, not the gpu's."""
    from planner.planning import _data_parallel

    graph, hw = get_model("vgg16-cifar10"), load_hardware("dgx-a100")
    for platform in ("cpu", "gpu"):
        ev = _data_parallel(graph, hw, 8, 64, [(2, 4)], [None], CostSettings(platform=platform), None, False)
        want = evaluate(graph, hw, 8, mesh=(8, 1), strategy="data", batch=64, platform=platform)
        assert ev.memory_bytes_per_device == want.memory_bytes_per_device
    cpu = _data_parallel(graph, hw, 8, 64, [(2, 4)], [None], CostSettings(platform="cpu"), None, False)
    gpu = _data_parallel(graph, hw, 8, 64, [(2, 4)], [None], CostSettings(platform="gpu"), None, False)
    assert cpu.memory_bytes_per_device != gpu.memory_bytes_per_device
