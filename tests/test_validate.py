"""Validation against XLA: the compiled step's argument shardings and
``memory_analysis`` and its HLO collectives against the plan's predictions.
Oracles are hand-computed byte counts of a tiny CNN and what XLA reports."""

import json

import jaxlib
import numpy as np
import pytest
from builders import TINY_CNN_BATCH, TINY_CNN_FACTORY, TinyCNN, tiny_cnn  # noqa: E402
from flax import nnx

from costmodels.collective_list import auxiliary_collectives, sharded_parameters
from planner.runtime.validation import cpu_scheduler, fixed_plan, validate

B = TINY_CNN_BATCH  # global batch; input 16x16x3


Tiny = TinyCNN
tiny = tiny_cnn


CONV0, CONV1, BN = 3 * 3 * 3 * 8 + 8, 3 * 3 * 8 * 16 + 16, 2 * 16
FC0_W, FC0_B, FC1_W, FC1_B = 256 * 32, 32, 32 * 16, 16
PARAMS = CONV0 + CONV1 + BN + FC0_W + FC0_B + FC1_W + FC1_B  # 10,176

CASES = {  # name: (mesh, one strategy for all, or per-layer strategies)
    "data-8x1": ((8, 1), "data"),
    "spatial": ((2, 4), "spatial"),
    "filter": ((2, 4), "filter"),
    "replicated": ((4, 2), "replicated"),
    "splitbrain": ((2, 4), {"fcs/0": "filter", "relu_2": "filter", "fcs/1": "filter"}),
    "megatron": ((2, 4), {"fcs/0": "filter", "relu_2": "filter", "fcs/1": "channel"}),
}


# The tiny CNN's compiled temporaries are dominated by what XLA:CPU adds for its
# two max-pool gradients: SelectAndScatterExpander turns each select-and-scatter
# into a scatter driven by int32 iota tensors of the pool's input shape, which the
# (platform-independent) cost model does not count: about 64 kB of 246 kB under
# splitbrain (see test_memory_against_hand_counts). Hence 40% on the total here.
TINY_MEMORY_RTOL = 0.40


@pytest.fixture(scope="module")
def reports(devices):
    model, x = tiny()
    out = {}
    for name, (mesh, s) in CASES.items():
        kw = {"strategy": s} if isinstance(s, str) else {"strategies": s}
        plan = fixed_plan(model, x, mesh, batch=B, optimizer="adam", **kw)
        out[name] = (plan, validate(model, plan, memory_rtol=TINY_MEMORY_RTOL))
    return out


def _by(report):
    return {(r.kind, r.axes): r for r in report.collectives}


@pytest.mark.slow
def test_every_case_validates(reports):
    for name, (_, report) in reports.items():
        bad = [r for r in (*report.memory, *report.collectives) if not r.ok]
        assert report.ok, f"{name}: {bad}"
        assert not any(r.crosses_processes for r in report.collectives)  # one process
        # this process's XLA:CPU scheduler (parsing tested below), in the report and its JSON
        assert report.scheduler == cpu_scheduler() and report.to_dict()["scheduler"] == report.scheduler
        # the XLA:CPU schedule's version note on a jaxlib of another minor release than 0.10.2's
        assert bool(report.notes) == (jaxlib.__version__.split(".")[:2] != ["0", "10"])
        assert report.to_dict()["notes"] == list(report.notes)


def test_cpu_scheduler_is_read_from_xla_flags():
    """The last setting of the flag wins, as in XLA's own flag parsing; absent, XLA's default."""
    flag = "--xla_cpu_enable_concurrency_optimized_scheduler"
    assert cpu_scheduler("") == "concurrency"
    assert cpu_scheduler("--xla_force_host_platform_device_count=8") == "concurrency"
    assert cpu_scheduler(f"--xla_force_host_platform_device_count=8 {flag}=false") == "memory"
    assert cpu_scheduler(f"{flag}=false {flag}=true") == "concurrency"
    assert cpu_scheduler(f"{flag}=true {flag}=0") == "memory"
    assert cpu_scheduler(flag) == "concurrency"


@pytest.mark.slow
def test_memory_against_hand_counts(reports):
    # data parallel: everything replicated; adam = 2 slots + a 4-byte int32 count
    mem = {r.part: r for r in reports["data-8x1"][1].memory}
    assert mem["parameters"].compiled_bytes == PARAMS * 4
    assert mem["optimizer state"].compiled_bytes == 2 * PARAMS * 4 + 4
    assert mem["batch statistics"].compiled_bytes == 2 * 16 * 4
    assert mem["inputs"].compiled_bytes == (B * 16 * 16 * 3 + B) * 4 / 8
    # Megatron FC pair on a 2x4 mesh: fcs/0 kernel and bias split 4 ways, fcs/1 kernel
    # split by rows and its bias whole (paradl.md §4.7).
    mem = {r.part: r for r in reports["megatron"][1].memory}
    local = CONV0 + CONV1 + BN + (FC0_W + FC0_B) / 4 + FC1_W / 4 + FC1_B
    assert mem["parameters"].compiled_bytes == local * 4 == mem["parameters"].predicted_bytes
    assert mem["arguments"].compiled_bytes == mem["arguments"].predicted_bytes
    # On CPU the prediction counts XLA:CPU's max-pool expansion (costmodels/table.py):
    # the first pool's gradient (2 samples per device under the data-parallel convs,
    # 16 x 16 x 8) finds its argmax with four int32 iotas of its input's shape,
    # 4 x 4,096 x 4 B = 65,536 B, without which the prediction was 21% under
    # (measured: 245,848 B compiled). Hand counts of the expansion: test_costmodels.py.
    # The total is XLA:CPU's schedule (costmodels/xla_cpu.py), within the validation grid's 10%
    # (splitbrain: 233,036 B predicted, 5.2% under).
    for name in ("splitbrain", "megatron"):
        total = {r.part: r for r in reports[name][1].memory}["total"]
        assert total.compiled_bytes == pytest.approx(total.predicted_bytes, rel=0.10)


@pytest.mark.slow
def test_collectives_against_hand_counts(reports):
    by = _by(reports["splitbrain"][1])
    # SplitBrain's L_M (the group's 8 samples x 256 features) and L_S (8 x 32), the
    # logits (8 x 16) and labels (8 int32) gathered over the model axis.
    assert by[("all-gather", ("model",))].compiled_bytes == (8 * 256 + 8 * 32 + 8 * 16 + 8) * 4
    # XLA:CPU reduces the partial input gradients in full, then slices.
    assert by[("all-reduce", ("model",))].compiled_bytes == (8 * 256 + 8 * 32) * 4
    # FC shard gradients over data; the loss scalar too (it runs per group).
    assert by[("all-reduce", ("data",))].compiled_bytes == ((FC0_W + FC0_B + FC1_W + FC1_B) / 4 + 1) * 4
    # conv and bn gradients over all 8, plus bn statistics: 2 x 16 forward, 16 backward.
    assert by[("all-reduce", ("data", "model"))].compiled_bytes == (CONV0 + CONV1 + BN + 2 * 16 + 16) * 4
    # 8x1: the size-1 model axis is dropped, so "data" is every device.
    rows = reports["data-8x1"][1].collectives
    assert [(r.kind, r.axes) for r in rows] == [("all-reduce", ("data",))]
    assert rows[0].compiled_bytes == (PARAMS + 2 * 16 + 16 + 1) * 4
    # replicated layers on 4x2: the input batch is gathered over the model axis.
    by = _by(reports["replicated"][1])
    assert by[("all-gather", ("model",))].compiled_bytes == (B // 4 * 16 * 16 * 3 + B // 4) * 4


@pytest.mark.slow
def test_filter_everywhere_gathers_where_the_plan_converts(reports):
    by = _by(reports["filter"][1])
    # Conversions happen at module inputs (functional layers pinned, export.producer_layouts):
    # each group's 8 samples of the input (16x16x3), the pooled conv0 output (8x8x8)
    # before convs/1, the bn output (4x4x16) before flatten, fcs/0's output
    # (32) before fcs/1, the logits (16), and the 8 labels.
    expect = 8 * (16 * 16 * 3 + 8 * 8 * 8 + 4 * 4 * 16 + 32 + 16) * 4 + 8 * 4
    assert by[("all-gather", ("model",))].compiled_bytes == expect
    # Filter shards' gradients over data: everything split 4 ways.
    assert by[("all-reduce", ("data",))].compiled_bytes == (PARAMS / 4 + 2 * 4 + 4 + 1) * 4


@pytest.mark.slow
def test_spatial_halo_and_reduction_in_two_steps(reports):
    by = _by(reports["spatial"][1])
    assert by[("collective-permute", ("model",))].count > 0
    # The input arrives batch-split over all 8; spatial needs rows over model.
    assert by[("all-to-all", ("model",))].compiled_bytes == B // 8 * 16 * 16 * 3 * 4
    assert "model then data" in by[("all-reduce", ("model",))].note


def test_sharded_parameters_and_auxiliary_by_hand():
    from planner import extract

    model, x = tiny()
    g = extract(model, x)
    names = list(g.names)
    choice = np.zeros(len(names), int)
    choice[names.index("fcs/0")] = 1  # filter
    choice[names.index("fcs/1")] = 2  # channel
    local = sharded_parameters(g, choice, 4)
    assert local[names.index("fcs/0")] == (FC0_W + FC0_B) / 4
    assert local[names.index("fcs/1")] == FC1_W / 4 + FC1_B
    assert local[names.index("convs/1")] == CONV1
    recs = auxiliary_collectives(g, choice, B, 2, 4)
    bn = [r for r in recs if r.where.startswith("bn")]
    assert [(r.phase, r.bytes_per_device, r.axes) for r in bn] == [
        ("forward", 2 * 16 * 4, ("data", "model")), ("backward", 16 * 4, ("data", "model"))]
    # last layer channel: partial sums reduced, then the loss per group, labels gathered
    assert {r.where: r.bytes_per_device for r in recs}["labels -> loss"] == B / 2 * 4


def test_bad_inputs(devices):
    model, x = tiny()
    plan = fixed_plan(model, x, (4, 2), strategy="data", batch=B)
    with pytest.raises(ValueError, match="non-negative"):
        validate(model, plan, comm_rtol=-1)
    with pytest.raises(ValueError, match="another model"):
        validate(nnx.eval_shape(lambda: nnx.Linear(4, 2, rngs=nnx.Rngs(0))), plan)
    with pytest.raises(ValueError, match="does not have"):
        fixed_plan(model, x, (4, 2), strategies={"nope": "data"}, batch=B)


@pytest.mark.slow
def test_cli(tmp_path, monkeypatch, capsys, devices):
    from planner.cli import main

    model, x = tiny()
    plan = fixed_plan(model, x, (2, 4), strategies=CASES["megatron"][1], batch=B)
    path = tmp_path / "plan.json"
    plan.write(path)
    (tmp_path / "tiny_factory.py").write_text(TINY_CNN_FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).parent))
    assert main(["validate", "tiny_factory:make", "--plan", str(path), "--json",
                 "--memory-rtol", str(TINY_MEMORY_RTOL)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"memory", "collectives", "ok"} <= set(data)
    assert {"part", "predicted_bytes", "compiled_bytes"} <= set(data["memory"][0])
    assert {"kind", "axes", "predicted_bytes", "compiled_bytes", "ok", "crosses_processes"} <= set(
        data["collectives"][0])
    # zero tolerance on activations: the cost model's estimate is not exact -> exit 1
    assert main(["validate", "tiny_factory:make", "--plan", str(path), "--activation-rtol", "0"]) == 1
    capsys.readouterr()
    assert main(["validate", "no-such-model", "--plan", str(path)]) == 2
    assert "shardplan: error: unknown model" in capsys.readouterr().err


def test_producer_layouts_by_hand():
    from planner import extract
    from planner.runtime.export import producer_layouts

    model, x = tiny()
    g = extract(model, x)
    s = {n: "data" for n in g.names} | {"convs/0": "filter", "relu": "filter", "max_pool": "filter",
                                         "convs/1": "channel"}
    pl = producer_layouts(g, s)
    assert pl["relu"] == "channel"  # a filter conv leaves its output split by channels
    assert pl["convs/1"] == "channel"  # the pool keeps it so: no gather before the channel conv
    assert pl["relu_1"] == "partial"  # a channel conv leaves partial sums
    assert pl["fcs/0"] == "batch" and "convs/0" not in pl  # fed by the model input


@pytest.mark.slow
def test_table_rendering(reports, capsys, monkeypatch):
    from planner.cli.validate import _render

    monkeypatch.setenv("COLUMNS", "250")  # rich wraps to the terminal width

    _render(reports["megatron"][1])
    out = capsys.readouterr().out
    assert "optimizer state" in out and "reduce-scatters lowered" in out
    assert f"cpu ({cpu_scheduler()} scheduler)" in out
    assert "all figures within tolerance" in out


def test_an_output_pinned_for_its_readers_is_converted_once_each_way():
    """nanoGPT's fused c_attn (a module call) read by its three splits
    (functional): under ``filter`` with the splits on ``data`` on 2x4, the
    export pins its output to the splits' layout, one all-to-all of the
    whole output forward and one of the summed gradient back; counted per
    edge, three each."""
    import user_models

    from costmodels import STRATEGY_NAMES, plan_collectives
    from planner import extract
    from planner.runtime.layouts import pinned_outputs

    model, x = user_models.nanogpt(batch=8)
    g = extract(model, x)
    strategies = {n: "data" for n in g.names}
    strategies["h/0/attn/c_attn"] = "filter"
    modules = {"/".join(map(str, p)) for p, _ in nnx.iter_modules(model)}
    pinned = pinned_outputs(g, strategies, modules)
    c_attn = g.names.index("h/0/attn/c_attn")
    assert c_attn in pinned and g.names.index("h/0/attn/split") not in pinned
    choice = [STRATEGY_NAMES.index(strategies[n]) for n in g.names]

    def c_attn_conversions(once):
        recs = plan_collectives(g, choice, 8, 2, 4, one_conversion_per_output=once)
        return [(r.phase, r.bytes_per_device) for r in recs
                if r.kind == "all-to-all" and r.where.startswith("h/0/attn/c_attn ->")]

    whole = 8 / 2 * 64 * 3 * 128 * 4 / 4  # its output per data group, 4 bytes, an all-to-all's share
    assert c_attn_conversions(pinned) == [("forward", whole), ("backward", whole)]
    assert c_attn_conversions(False) == [("forward", whole), ("backward", whole)] * 3
