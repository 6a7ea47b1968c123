"""Compiled collectives against the plan's where XLA used to depart from it.

Two causes, both closed by pinning in the export (docs/validation.md,
"XLA's behaviour that validation models", item 12):

* a ``channel`` layer's output gradient: the layer's output is partial sums,
  which no sharding states, so its cotangent was unconstrained and XLA
  computed the weight gradient from operands gathered over ``data`` (and the
  output gradient over every device) instead of all-reducing it over
  ``data``. The export now pins that cotangent to the plan's layout
  (replicated over ``model``).
* functional ops right after a module (ReLU after a ``channel`` conv): XLA
  ran the ReLU's backward on gathered operands (the gradient *and* its
  boolean mask). The export now pins a module's output to the layout of the
  functional ops that read it.

A third, XLA:CPU's lowering of a ``channel`` layer's reduce-scatter as an
all-reduce of the whole output plus a slice, is closed by the export
reduce-scattering those partial sums itself (``psum_scatter`` in
``shard_map``).

Oracles are hand-computed byte counts; a mis-pinned program must be flagged.
"""

import jax
import jax.numpy as jnp
import optax
import pytest
from builders import TINY_CNN_BATCH, TinyCNN, tiny_cnn
from flax import nnx

from costmodels.strategies import parse_strategy
from planner.runtime.validation import collective_rows, fixed_plan, validate

B = TINY_CNN_BATCH  # global batch; input 16x16x3


Tiny = TinyCNN
tiny = tiny_cnn


def _by(rows):
    return {(r.kind, r.axes): r for r in rows}


@pytest.mark.slow
def test_channel_conv_before_a_data_layer(devices):
    # convs/1 channel (8 -> 16, 8x8 maps), everything else data, 2x4. Its output
    # gradient arrives batch-split over all 8 devices (relu_1 is data) and the plan
    # gathers it over model: each group's 8 samples x 8 x 8 x 16 x 4 B = 32,768 B.
    # Before the cotangent pin XLA gathered it over all 8 devices (65,536 B).
    model, x = tiny()
    plan = fixed_plan(model, x, (2, 4), strategies={"convs/1": "channel"}, batch=B)
    report = validate(model, plan, memory_rtol=0.40)
    by = _by(report.collectives)
    assert by[("all-gather", ("model",))].compiled_bytes == 8 * 8 * 8 * 16 * 4
    assert ("all-gather", ("data", "model")) not in by
    assert ("all-gather", ("data",)) not in by
    assert all(r.ok for r in report.collectives), [r for r in report.collectives if not r.ok]


@pytest.mark.slow
def test_channel_conv_reduce_scatters_its_partial_sums(devices):
    # convs/1 channel (8 -> 16, 8x8 maps) feeding a filter relu_1 and max_pool_1 (channels split), 2x4. The
    # plan reduce-scatters the partial sums over model: each group's 8 samples x 8 x 8 x 16 x 4 B
    # = 32,768 B, a quarter a device (8,192 B), and all-gathers their gradient back (32,768 B).
    # The export does it inside shard_map (psum_scatter), so XLA:CPU compiles a reduce-scatter,
    # not the partitioner's all-reduce of the whole output plus a slice (which kept the whole
    # all-reduce result for the backward pass). The bias is added once: its gradient, with the
    # kernel's, all-reduced over data only (convs/1: 3x3x8x16 / 4 + 16, convs/0: (3x3x3x8 + 8) / 4).
    model, x = tiny()
    split = {"convs/0": "filter", "relu": "filter", "max_pool": "filter", "convs/1": "channel", "relu_1": "filter",
             "max_pool_1": "filter"}
    plan = fixed_plan(model, x, (2, 4), strategies=split, batch=B)
    report = validate(model, plan, memory_rtol=0.40)
    by = _by(report.collectives)
    rs = by[("reduce-scatter", ("model",))]
    assert rs.compiled_bytes == rs.predicted_bytes == 8 * 8 * 8 * 16 * 4 / 4
    assert rs.count == 1 and rs.note == ""
    assert ("all-reduce", ("model",)) not in by
    assert by[("all-reduce", ("data",))].compiled_bytes == (9 * 8 * 16 // 4 + 16 + (9 * 3 * 8 + 8) // 4) * 4
    assert all(r.ok for r in report.collectives), [r for r in report.collectives if not r.ok]


@pytest.mark.slow
def test_channel_conv_under_zero_is_validated_as_compiled(devices):
    # The same channel conv at ZeRO stage 2 keeps the export's reduce-scatter of its partial
    # sums (8,192 B over model); at stage 3 its call gathers its weights itself, so XLA's
    # partitioner converts the partial sums: an all-reduce of the whole 32,768 B on CPU,
    # counted so. Either way validate expects what shard compiles (every row within 5%).
    model, x = tiny()
    split = {"convs/0": "filter", "relu": "filter", "max_pool": "filter", "relu_1": "filter", "max_pool_1": "filter"}
    for stage, kind, nbytes in ((2, "reduce-scatter", 8192), (3, "all-reduce", 32768)):
        plan = fixed_plan(model, x, (2, 4), strategies=split | {"convs/1": f"channel+zero{stage}"}, batch=B,
                          optimizer="adam")
        report = validate(model, plan, memory_rtol=1.0, activation_rtol=1.0)
        row = _by(report.collectives)[(kind, ("model",))]
        assert row.compiled_bytes == row.predicted_bytes == nbytes, stage
        assert all(r.ok for r in report.collectives), (stage, [r for r in report.collectives if not r.ok])


@pytest.mark.slow
def test_misplaced_pin_is_caught(devices):
    # A data-parallel plan, compiled with fcs/0's input pinned to the channel layout
    # (features over model) instead of its producer's batch layout: XLA converts
    # batch -> channel -> batch with all-to-alls over model, which the plan does not
    # have, and the rows say which kind and axes.
    from planner import extract
    from planner.runtime.export import (
        consumer_layouts,
        lower_training,
        make_mesh,
        producer_layouts,
    )

    model, x = tiny()
    plan = fixed_plan(model, x, (2, 4), strategy="data", batch=B)
    graph = extract(model, x)
    pins = producer_layouts(graph, plan.strategies)
    assert pins["fcs/0"] == "batch"
    mesh = make_mesh(2, 4)
    rows = {}
    for label, layouts in (("plan", pins), ("mis-pinned", {**pins, "fcs/0": "channel"})):
        lowered, _ = lower_training(model, plan.strategies, mesh, optax.adam(1e-3), x, input_layouts=layouts,
                                    output_layouts=consumer_layouts(graph, plan.strategies))
        rows[label] = collective_rows(model, plan, lowered.compile().as_text(), mesh=mesh)
    assert all(r.ok for r in rows["plan"])
    bad = [r for r in rows["mis-pinned"] if not r.ok]
    assert [(r.kind, r.axes, r.predicted_bytes) for r in bad] == [("all-to-all", ("model",), 0.0)]
    assert bad[0].compiled_bytes > 0


@pytest.mark.slow
def test_vgg16_cifar10_batch_256_validates(devices):
    # The planner's batch-256 plan on 4x2 (dgx-a100, no memory limit): the 4x4 and
    # 2x2 blocks run filter, filter, channel, each channel conv followed by data
    # layers. Before the pins XLA gathered two channel convs' operands over data
    # (+ all-gathers over data and over data+model, -36% all-reduce over data).
    from planner.models.flax_zoo import flax_model

    model, x = flax_model("vgg16-cifar10", batch=256)
    split = {f"features/{i}": "filter" for i in (7, 8, 10, 11)} | {f"relu_{i}": "filter" for i in (7, 8, 10, 11)}
    plan = fixed_plan(model, x, (4, 2), strategies=split | {"features/9": "channel", "features/12": "channel"},
                      batch=256)
    report = validate(model, plan)
    by = _by(report.collectives)
    assert all(r.ok for r in report.collectives), [r for r in report.collectives if not r.ok]
    assert {k for k in by if k[0] == "all-gather"} == {("all-gather", ("model",))}
    # Weight gradients of the split convs over data, one shard each: features/7
    # (3x3x256x512 + 512) / 2, features/8, 10, 11 (3x3x512x512 + 512) / 2 (filter:
    # kernel and bias split), features/9, 12 3x3x512x512 / 2 + 512 (channel: the
    # kernel's input channels split, the bias whole); 4 B each.
    filt7, filt = (9 * 256 * 512 + 512) // 2, (9 * 512 * 512 + 512) // 2
    chan = 9 * 512 * 512 // 2 + 512
    assert by[("all-reduce", ("data",))].compiled_bytes == (filt7 + 3 * filt + 2 * chan) * 4


def test_block_layouts_by_hand():
    from builders import TinyResNet

    from planner import extract
    from planner.runtime.export import block_layouts

    model = nnx.eval_shape(lambda: TinyResNet(nnx.Rngs(0)))
    g = extract(model, jax.ShapeDtypeStruct((8, 16, 16, 3), jnp.float32))
    every = {n: "data" for n in g.names}
    # blocks/0 is fed by the stem's ReLU; blocks/1 by blocks/0's last ReLU, whose
    # output it reads twice (conv1 and the projection); blocks/1's last ReLU feeds
    # the global pool. "blocks" (the list) holds both.
    assert block_layouts(g, every) == {"blocks": ("batch", "batch"), "blocks/0": ("batch", "batch"),
                                       "blocks/1": ("batch", "batch")}
    split = every | {"relu": "filter", "blocks/0/relu_1": "filter", "blocks/1/relu_1": "replicated"}
    assert block_layouts(g, split) == {"blocks": ("channel", "replicated"), "blocks/0": ("channel", "channel"),
                                       "blocks/1": ("channel", "replicated")}
    # two layers feeding a block from outside in different layouts (a filter conv's
    # output split by channels, a data layer's by batch): its input is left to XLA
    from types import SimpleNamespace

    names = ("stem", "side", "b/conv", "b/add", "head")
    toy = SimpleNamespace(names=names, kind_names=("conv2d", "elementwise", "conv2d", "add", "dense"),
                          edges=((0, 2), (1, 3), (2, 3), (3, 4)))
    strategies = {"stem": "filter", "side": "data", "b/conv": "data", "b/add": "data", "head": "data"}
    assert block_layouts(toy, strategies) == {"b": (None, "batch")}


@pytest.mark.slow
def test_residual_block_input_is_pinned(devices):
    # TinyResNet's identity block blocks/0 with conv1 `channel`, everything else data,
    # 2x4, batch 32: the block input (16x16x8 per sample, batch-split) is converted to
    # channels for conv1 (all-to-all over model, 16 samples per group x 16 x 16 x 8 x
    # 4 B / 4 = 32,768 B) and its gradient back (32,768 B); the shortcut's add reads
    # the batch-split input as it is. Without the block pin, XLA fed the add from
    # conv1's converted copy and converted it back: a third all-to-all. Since the export
    # reduce-scatters conv1's partial sums itself, XLA no longer does that for this plan; it
    # still does with conv1 `spatial` (the input converted to rows, 32,768 B each way, and
    # conv1's output back to the batch split for bn1, 32,768 B each way: 131,072 B; unpinned,
    # a fifth all-to-all, 163,840 B).
    from builders import TinyResNet

    from planner import extract
    from planner.runtime.export import (
        block_layouts,
        consumer_layouts,
        lower_training,
        make_mesh,
        producer_layouts,
        scatter_layouts,
    )

    model = nnx.eval_shape(lambda: TinyResNet(nnx.Rngs(0)))
    x = jax.ShapeDtypeStruct((32, 16, 16, 3), jnp.float32)
    plan = fixed_plan(model, x, (2, 4), strategies={"blocks/0/conv1": "channel"}, batch=32)
    report = validate(model, plan, memory_rtol=0.5)
    assert all(r.ok for r in report.collectives), [r for r in report.collectives if not r.ok]
    by = _by(report.collectives)
    assert by[("all-to-all", ("model",))].predicted_bytes == by[("all-to-all", ("model",))].compiled_bytes == 65_536

    graph = extract(model, x)
    plan = fixed_plan(model, x, (2, 4), strategies={"blocks/0/conv1": "spatial"}, batch=32)
    lowered, _ = lower_training(model, plan.strategies, make_mesh(2, 4), optax.adam(1e-3), x,
                                input_layouts=producer_layouts(graph, plan.strategies),
                                output_layouts=consumer_layouts(graph, plan.strategies),
                                blocks={**block_layouts(graph, plan.strategies), "blocks/0": (None, None)},
                                scatters=scatter_layouts(graph, plan.strategies, 4))
    rows = collective_rows(model, plan, lowered.compile().as_text(), mesh=make_mesh(2, 4))
    bad = [(r.kind, r.axes, r.predicted_bytes, r.compiled_bytes) for r in rows if not r.ok]
    assert bad == [("all-to-all", ("model",), 131_072.0, 163_840.0)]


@pytest.mark.slow
def test_an_add_between_split_operands_runs_batch_split_before_its_relu(devices):
    # TinyResNet's identity block blocks/0 with its second half `filter` (conv2, bn2, the
    # add and the ReLU after it), everything else data, batch 32: the add's operands
    # arrive split by channels (bn2) and by batch (the block input). On 2x4 and 4x2
    # XLA converts bn2's output to the batch split, adds there and converts the ReLU's
    # input back (costmodels.collective_list.adds_run_batch_split): one all-to-all over
    # `model` of the add's output more than converting the shortcut, 16 x 16 x 8 per
    # sample x (32 / d) samples x 4 B / m = 32,768 B on both meshes. On 1x8 it does not.
    from builders import TinyResNet

    from costmodels.collective_list import adds_run_batch_split
    from planner import extract

    model = nnx.eval_shape(lambda: TinyResNet(nnx.Rngs(0)))
    x = jax.ShapeDtypeStruct((32, 16, 16, 3), jnp.float32)
    graph = extract(model, x)
    second_half = {n: "filter" for n in ("blocks/0/conv2", "blocks/0/bn2", "blocks/0/add", "blocks/0/relu_1")}
    plain = {}
    for mesh in ((2, 4), (4, 2), (1, 8)):
        plan = fixed_plan(model, x, mesh, strategies=second_half, batch=32)
        choice = [int(parse_strategy(plan.strategies[n])) for n in graph.names]
        runs = {graph.names[i] for i in adds_run_batch_split(graph, choice, *mesh)}
        assert runs == ({"blocks/0/add"} if mesh != (1, 8) else set())
        row = _by(validate(model, plan, memory_rtol=0.5).collectives)[("all-to-all", ("model",))]
        assert row.ok and row.predicted_bytes == row.compiled_bytes, (mesh, row)
        plain[mesh] = row.compiled_bytes
    # the extra conversion, by hand: the compiled all-to-alls of 2x4 and 4x2 beside 1x8's
    # (on 1x8 every conversion is of the group's whole batch: 32 samples / 8, the same shards)
    assert plain[(2, 4)] - plain[(1, 8)] == plain[(4, 2)] - plain[(1, 8)] == 32_768
