"""A memory limit is a promise: the search plans against the limit
less the platform's margin, the plan file records both, and ``validate``
fails, naming the part that grew, when the compiled program exceeds the
plan's limit. Oracles: hand-computed margins and XLA's memory_analysis."""

import dataclasses
import json

import numpy as np
import optax
import pytest
from builders import TINY_CNN_BATCH, TINY_CNN_FACTORY, tiny_cnn

from costmodels import (
    CostSettings,
    cost_table,
    hardware_arrays,
    load_hardware,
    one_hot,
    schedule_note,
    scheduled_memory_per_device,
)
from planner import extract
from planner.models.zoo import get_model
from planner.planning import (
    MEMORY_MARGIN,
    InfeasibleMemoryError,
    Plan,
    mesh_shapes,
    plan,
)
from search import discrete_problem, minimum_memory

B = TINY_CNN_BATCH  # the tiny CNN's global batch


def test_margin_values_and_bytes():
    from planner.planning import memory_margin_bytes

    assert MEMORY_MARGIN["cpu"] == 0.20  # measured, docs/validation.md "The memory promise"
    assert memory_margin_bytes(1e9, "cpu") == 2e8  # 20% of 1 GB, by hand
    assert memory_margin_bytes(1e9, "gpu") == 0.0  # not measured: none
    with pytest.raises(ValueError, match="unknown platform 'npu'"):
        memory_margin_bytes(1e9, "npu")


def test_the_search_plans_against_the_limit_less_the_margin():
    limit = 300e6  # bytes; vgg16-cifar10 at batch 256 on 8 devices
    p = plan("vgg16-cifar10", devices=8, hardware="dgx-a100", batch=256, memory_limit=limit, platform="cpu",
             verify=False)  # the search alone (planner.verification compiles on top)
    assert p.memory_limit_bytes == limit  # what the user asked for
    # 20% of the limit, and the input batch per device: 32 images of 32x32x3 float32
    # and 32 int32 labels = 32 * (12,288 + 4) = 393,344 B (validate's "inputs" row)
    assert p.memory_margin_bytes == pytest.approx(0.20 * limit + 393_344)
    assert p.platform == "cpu"
    assert p.memory_bytes_per_device <= 240e6 - 393_344  # predicted within limit - margin, by hand
    # the unlimited plan needs more than that, so the margin did constrain the search
    free = plan("vgg16-cifar10", devices=8, hardware="dgx-a100", batch=256, platform="cpu", verify=False)
    assert free.memory_bytes_per_device > 240e6


def test_a_cpu_plan_on_another_jaxlib_says_which_it_models(monkeypatch):
    import jaxlib

    assert schedule_note("0.10.2") == schedule_note("0.10.7") == ""  # the measured minor release
    note = schedule_note("0.12.0.1")
    assert "jaxlib 0.10.2" in note and "jaxlib 0.12.0.1" in note
    assert schedule_note() == schedule_note(jaxlib.__version__)  # default: the installed jaxlib
    graph = extract(*tiny_cnn())
    # only XLA:CPU's schedule is version-bound
    for version, platform, notes in (("0.12.0.1", "cpu", [note]), ("0.12.0.1", "gpu", []), ("0.10.2", "cpu", [])):
        monkeypatch.setattr(jaxlib, "__version__", version)
        events = []
        plan(graph, devices=8, hardware="dgx-a100", batch=B, platform=platform, levers="none", callback=events.append)
        assert [e.message for e in events if e.stage == "schedule" and "jaxlib" in e.message] == notes


def test_default_platform_is_the_hardware_s():
    assert plan("vgg16-cifar10", devices=8, hardware="cpu-local", batch=64, verify=False).platform == "cpu"
    p = plan("vgg16-cifar10", devices=8, hardware="dgx-a100", batch=64, memory_limit="1GB")
    assert (p.platform, p.memory_margin_bytes) == ("gpu", 8 * (32 * 32 * 3 * 4 + 4))  # only the input batch


def test_infeasible_limit_includes_the_margin():
    with pytest.raises(InfeasibleMemoryError) as err:
        plan("vgg16-cifar10", devices=8, hardware="dgx-a100", batch=256, memory_limit="50MB", platform="cpu",
             levers="none")
    g, hw = get_model("vgg16-cifar10"), load_hardware("dgx-a100")
    needs = []
    for d, m in mesh_shapes(8, 256, hw.devices_per_node):
        t = cost_table(g.arrays, hardware_arrays(hw), 256.0, float(d), float(m), CostSettings(platform="cpu"))
        mm = minimum_memory(discrete_problem(t))  # the solvers' smallest plan, and what XLA:CPU's schedule holds for it
        peak = scheduled_memory_per_device(t, one_hot(np.pad(mm.choice, (0, t.feasible.shape[0] - mm.choice.size)),
                                                      t.feasible.shape[1]))
        needs.append(max(mm.memory_bytes, float(peak)))
    least = min(needs)
    # the smallest limit: the least memory any plan needs and the inputs are 80% of it
    assert err.value.required_bytes == pytest.approx((least + 393_344) / 0.80 / (1 - 1e-5), rel=1e-8)  # + rounding slack
    assert "20% of the limit kept free" in str(err.value)
    assert "XLA:CPU's schedule holds more" in str(err.value)  # here the schedule, not the two phases, binds
    p = plan("vgg16-cifar10", devices=8, hardware="dgx-a100", batch=256, memory_limit=err.value.required_bytes,
             platform="cpu", verify=False)
    assert p.memory_bytes_per_device <= least * (1 + 1e-6)


def test_plan_file_records_limit_margin_and_platform(tmp_path):
    p = plan("vgg16-cifar10", devices=8, hardware="dgx-a100", batch=64, memory_limit="1GB", platform="cpu",
             verify=False)
    data = json.loads(p.to_json())
    margin = 2e8 + 8 * (32 * 32 * 3 * 4 + 4)  # 20% of 1 GB and the input batch per device
    assert data["memory_limit_bytes"] == 1e9 and data["memory_margin_bytes"] == margin and data["platform"] == "cpu"
    back = Plan.from_dict(data)
    assert (back.memory_margin_bytes, back.platform) == (margin, "cpu")
    # a file written before margins existed reads as planned with none
    old = {k: v for k, v in data.items() if k not in ("memory_margin_bytes", "platform")}
    assert (Plan.from_dict(old).memory_margin_bytes, Plan.from_dict(old).platform) == (0.0, "")


@pytest.fixture(scope="module")
def tight_tiny(devices):
    """The tiny CNN planned at 0.1% above the smallest limit any lever-free plan fits, for XLA:CPU
    (whose schedule the search checks lever-free plans against: planner.schedule_fit)."""
    model, x = tiny_cnn()
    graph = extract(model, x)
    kw = dict(devices=8, hardware="dgx-a100", batch=B, platform="cpu", levers="none")
    with pytest.raises(InfeasibleMemoryError) as err:
        plan(graph, memory_limit="1kB", **kw)
    return model, x, graph, plan(graph, memory_limit=err.value.required_bytes * 1.001, **kw)


@pytest.mark.slow
def test_a_tight_plan_fits_once_compiled(tight_tiny):
    from planner.runtime.export import lower_training, make_mesh
    from planner.runtime.sharding import export_options

    model, x, graph, p = tight_tiny
    d, m = p.mesh
    # compiled as planner.shard compiles it: what a user's step needs
    lowered, _ = lower_training(model, p.strategies, make_mesh(d, m), optax.adam(1e-3), x,
                                **export_options(graph, p))
    ma = lowered.compile().memory_analysis()
    compiled = ma.argument_size_in_bytes + ma.output_size_in_bytes - ma.alias_size_in_bytes + ma.temp_size_in_bytes
    assert compiled <= p.memory_limit_bytes, (compiled, p.memory_limit_bytes)


@pytest.mark.slow
def test_validate_fails_naming_the_part_when_over_the_limit(tight_tiny, tmp_path, monkeypatch, capsys):
    from planner.runtime.validation import validate

    model, x, graph, p = tight_tiny
    fits = validate(model, p, memory_rtol=1.0, activation_rtol=1.0, comm_rtol=1.0)
    assert fits.over_limit is None
    assert {r.part: r for r in fits.memory}["limit"].ok
    compiled = {r.part: r for r in fits.memory}["total"].compiled_bytes
    over = dataclasses.replace(p, memory_limit_bytes=compiled * 0.5, memory_margin_bytes=compiled * 0.15)
    r = validate(model, over, memory_rtol=1.0, activation_rtol=1.0, comm_rtol=1.0)
    assert not r.ok and r.over_limit is not None
    assert r.over_limit.predicted_bytes == compiled * 0.5 and r.over_limit.compiled_bytes == compiled
    # the arguments are exact, so the part that grew is what the cost model estimates
    assert "the part that grew: activations and temporaries" in r.over_limit.note
    # the CLI: exit status 1 and a line naming it
    from planner.cli import main

    path = tmp_path / "plan.json"
    over.write(path)
    (tmp_path / "tiny_factory.py").write_text(TINY_CNN_FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).parent))
    assert main(["validate", "tiny_factory:make", "--plan", str(path), "--json", "--memory-rtol", "1",
                 "--activation-rtol", "1", "--comm-rtol", "1"]) == 1
    err = capsys.readouterr().err
    assert "does not fit the plan's limit" in err and "activations and temporaries" in err


@pytest.mark.slow
def test_a_cnn_plan_with_zero_at_its_tightest_limit_fits_once_compiled(devices, monkeypatch):
    """VGG16-CIFAR-10 at batch 32 on a 4x2 mesh with ZeRO's levers, 2% above
    the smallest limit the planner accepts, which only plans with ZeRO meet:
    XLA's compiled total is within the limit (XLA:CPU's schedule checks plans
    with ZeRO too)."""
    from planner import planning
    from planner.models.flax_zoo import flax_model
    from planner.runtime.validation import validate

    monkeypatch.setattr(planning, "mesh_shapes", lambda *a, **k: [(4, 2)])
    model, x = flax_model("vgg16-cifar10", batch=32)
    graph = extract(model, x)
    kw = dict(devices=8, hardware="dgx-a100", batch=32, platform="cpu", optimizer="adam", levers="zero")
    with pytest.raises(InfeasibleMemoryError) as err:
        plan(graph, memory_limit="1kB", **kw)
    p = plan(graph, memory_limit=err.value.required_bytes * 1.02, **kw)
    assert any("zero2" in r.option or "zero3" in r.option for r in p.layers)
    total = {r.part: r for r in validate(model, p).memory}["total"]
    assert total.compiled_bytes <= p.memory_limit_bytes, (total.compiled_bytes, p.memory_limit_bytes)


def test_a_search_that_starts_past_the_plans_time_budget_still_runs(monkeypatch):
    """A plan's searches (the first, and those again against XLA:CPU's
    schedule) share its time budget; one that starts after the budget is
    spent still runs, with the smallest positive budget (solve_many refuses
    0), and the plan is returned."""
    import itertools

    from planner import planning

    model, x = tiny_cnn()
    graph = extract(model, x)
    budgets = []
    real = planning.solve_many

    def solve_many(*args, **kw):
        budgets.append(kw["time_budget_s"])
        return real(*args, **kw)

    clock = itertools.count(0, 50)  # every reading of the clock 50 s after the last
    monkeypatch.setattr(planning, "solve_many", solve_many)
    monkeypatch.setattr(planning._time, "perf_counter", lambda: float(next(clock)))
    p = plan(graph, devices=8, hardware="dgx-a100", batch=B, platform="cpu", levers="none", time_budget_s=40.0)
    assert p.memory_bytes_per_device > 0 and budgets and all(0 < b <= 40.0 for b in budgets)
    assert budgets[-1] == 1e-3  # past the budget: the smallest
