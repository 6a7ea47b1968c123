"""Cost models: collectives against ParaDL's worked example and hand
arithmetic, a tiny table entry by entry by hand, the one-hot identity against
an independent plain-Python evaluator, gradients against finite differences,
one compilation for 1,000 vmapped configurations, and SplitBrain's memory
saving and group-local exchanges."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from costmodels import (
    CostSettings,
    Strategy,
    cost_table,
    hardware_arrays,
    iteration_time,
    load_hardware,
    memory_per_device,
    one_hot,
    plan_collectives,
)
from costmodels.collectives import (
    all_to_all_s,
    allgather_s,
    allreduce_s,
    network_arrays,
    p2p_s,
    reduce_scatter_s,
    ring_allreduce_s,
    tier_of,
    tree_allreduce_s,
)
from costmodels.reference import reference_iteration_time, reference_memory
from costmodels.reshard import conversion_s
from costmodels.strategies import Layout
from planner import GraphBuilder
from planner.models.zoo import get_model

S = len(Strategy)
ABCI = load_hardware("abci-v100")


# -- collectives ------------------------------------------------------------------------


def test_paradl_worked_example_gradient_allreduce():
    # paradl.md §6: ResNet-50 (.net, sum|w| delta = 90,936,064 B), p = 16:
    # 2 * 15 * (40.31e-6 + 90.936e6 * 8e-11 / 16) = 0.014850 s.
    alpha, bw = tier_of(network_arrays(ABCI), 16, True)
    assert float(alpha) == pytest.approx(40.31e-6, rel=1e-6)
    t = ring_allreduce_s(16.0, 90_936_064.0, alpha, bw)
    assert float(t) == pytest.approx(0.014850, rel=2e-4)


def test_collective_formulas_by_hand():
    a, bw = 1e-5, 1e9
    assert float(allgather_s(4.0, 1e6, a, bw)) == pytest.approx(3 * (1e-5 + 1e-3))
    assert float(reduce_scatter_s(4.0, 4e6, a, bw)) == pytest.approx(3 * (1e-5 + 1e-3))
    assert float(all_to_all_s(4.0, 4e6, a, bw)) == pytest.approx(3 * (1e-5 + 1e-3))
    assert float(p2p_s(2e6, a, bw)) == pytest.approx(1e-5 + 2e-3)
    assert float(p2p_s(0.0, a, bw)) == 0.0
    assert float(tree_allreduce_s(8.0, 1e3, a, bw)) == pytest.approx(2 * 3 * 1e-5 + 2e-6)
    assert float(ring_allreduce_s(1.0, 1e9, a, bw)) == 0.0


def test_hierarchical_allreduce_by_hand():
    # 16 ranks, 4 per node, 1e8 bytes on ABCI. Flat ring on IB leaf: 30 (40.31us + 5e-4 s);
    # hierarchical: reduce-scatter and all-gather on NVLink, 3 (9us + 5e-4 s) each,
    # plus a ring over 4 nodes of 2.5e7 bytes on IB: 6 (40.31us + 5e-4 s).
    net = network_arrays(ABCI)
    flat = 30 * (40.31e-6 + 1e8 / 16 / 12.5e9)
    hier = 2 * 3 * (9e-6 + 1e8 / 4 / 50e9) + 6 * (40.31e-6 + 2.5e7 / 4 / 12.5e9)
    assert hier < flat
    assert float(allreduce_s(net, 16.0, 4.0, 1e8)) == pytest.approx(hier, rel=1e-6)
    # inside one node: plain ring on NVLink, 6 (9us + 2.5e7/50e9)
    assert float(allreduce_s(net, 4.0, 4.0, 1e8)) == pytest.approx(6 * (9e-6 + 2.5e7 / 50e9), rel=1e-6)


def test_read_parameter_fraction_by_hand():
    from costmodels.layers import LayerKind, read_parameter_fraction

    kind = np.array([LayerKind.ELEMENTWISE, LayerKind.ELEMENTWISE, LayerKind.ELEMENTWISE, LayerKind.NORM,
                     LayerKind.ELEMENTWISE])
    params = np.array([128 * 128, 64 * 128, 0, 128, 1])  # a table sliced to 64 of its 128 rows; read whole; none;
    out_elements = np.array([64 * 128] * 5, float)  # a norm's scale; a scalar gate
    assert read_parameter_fraction(kind, params, out_elements).tolist() == [0.5, 1.0, 1.0, 1.0, 1.0]
    got = read_parameter_fraction(jnp.asarray(kind), jnp.asarray(params, jnp.float32), jnp.asarray(out_elements))
    assert np.asarray(got).tolist() == [0.5, 1.0, 1.0, 1.0, 1.0]


@pytest.mark.parametrize(
    "src, dst, expected",
    [
        (Layout.BATCH, Layout.REPLICATED, 3 * (9e-6 + 1e6 / 50e9)),  # all-gather, 1/4 each
        (Layout.CHANNEL, Layout.BATCH, 3 * (9e-6 + 1e6 / 4 / 50e9)),  # all-to-all
        (Layout.PARTIAL, Layout.CHANNEL, 3 * (9e-6 + 1e6 / 50e9)),  # reduce-scatter
        (Layout.PARTIAL, Layout.REPLICATED, 6 * (9e-6 + 1e6 / 50e9)),  # all-reduce (ring)
        (Layout.REPLICATED, Layout.SPATIAL, 0.0),  # a local slice
        (Layout.SPATIAL, Layout.SPATIAL, 0.0),
    ],
)
def test_conversion_costs_by_hand(src, dst, expected):
    t = conversion_s(jnp.int32(src), jnp.int32(dst), 4e6, 4.0, 9e-6, 50e9)
    assert float(t) == pytest.approx(expected, rel=1e-6)


# -- a tiny table by hand ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny():
    b = GraphBuilder("tiny", (4, 8, 8))
    c = b.conv("conv", b.input, 8, 3)
    f = b.flatten("flatten", c)
    b.dense("fc", f, 16)
    g = b.build()
    t = cost_table(g.arrays, hardware_arrays(ABCI), 8.0, 2.0, 2.0)  # batch 8 on a 2 x 2 mesh
    return g, t


def test_memory_phases_and_the_cpu_max_pool_expansion_by_hand():
    """A 3x3 conv (4 -> 8 channels, 8x8, no bias) and a 2x2 max pool, batch 8 on a
    2 x 2 mesh (4 samples per model group), fp32 Adam, every layer data parallel
    (2 samples per device). By hand:

    * the conv holds 288 weights, 20 B each (weights, gradients, two slots, the
      update): 5,760 B, of which the update is 1,152 B;
    * saved activations: the conv's input, 2 x 256 x 4 B = 2,048 B, and the pool's,
      2 x 512 x 4 B = 4,096 B; the largest transient, the conv's input and output
      gradients, 2 x (256 + 512) x 4 B = 6,144 B (the pool's: 2 x (512 + 128) x 4 B
      = 5,120 B);
    * memory = max(backward: 5,760 - 1,152 + 6,144 + 6,144 = 16,896 B, optimizer
      step: 5,760 B).

    On XLA:CPU the pool also keeps an int32 index matrix [outputs, 4 dims],
    2 x 128 x 4 x 4 B = 4,096 B, and its gradient step holds four int32 iotas of its
    input's shape, 2 x 512 x 4 x 4 B = 16,384 B, which make its transient the
    largest, 5,120 + 16,384 = 21,504 B: max(5,760 - 1,152 + 6,144 + 4,096 + 21,504
    = 36,352 B, 5,760 B). The conv's backward step there also holds a transposed copy
    of its output gradient, 2 x 512 x 4 B = 4,096 B (its transient 10,240 B)."""
    b = GraphBuilder("pool", (4, 8, 8))
    c = b.conv("conv", b.input, 8, 3, padding="SAME", bias=False)
    b.max_pool("pool", c, 2)
    g = b.build()
    data = one_hot(jnp.zeros(g.arrays.mask.shape[0], jnp.int32), len(Strategy))
    gpu = cost_table(g.arrays, hardware_arrays(ABCI), 8.0, 2.0, 2.0, CostSettings(optimizer="adam"))
    cpu = cost_table(g.arrays, hardware_arrays(ABCI), 8.0, 2.0, 2.0, CostSettings(optimizer="adam", platform="cpu"))
    assert float(gpu.state_bytes[0, Strategy.DATA]) == 5760 and float(gpu.update_bytes[0, Strategy.DATA]) == 1152
    assert float(memory_per_device(gpu, data)) == 16896
    assert float(cpu.activation_bytes[1, Strategy.DATA] - gpu.activation_bytes[1, Strategy.DATA]) == 4096
    assert float(cpu.workspace_bytes[1, Strategy.DATA] - gpu.workspace_bytes[1, Strategy.DATA]) == 16384
    assert float(cpu.workspace_bytes[0, Strategy.DATA] - gpu.workspace_bytes[0, Strategy.DATA]) == 4096
    assert float(memory_per_device(cpu, data)) == 36352
    for table, settings in ((gpu, CostSettings(optimizer="adam")), (cpu, CostSettings(optimizer="adam", platform="cpu"))):
        assert reference_memory(g, [0, 0], 8.0, 2, 2, settings) == float(memory_per_device(table, data))


def test_tiny_table_by_hand(tiny):
    g, t = tiny
    conv, flat, fc = 0, 1, 2
    dense_params = 512 * 16 + 16
    # Gradient sync: one 25 MiB bucket all-reduced over the 4 ranks of a node (NVLink
    # ring), 6 (9us + 2**25 * 25/32 / 4 / 50e9); a layer pays params * 4 B of it.
    bucket = 25 * 2**20
    bucket_s = 6 * (9e-6 + bucket / 4 / 50e9)
    assert float(t.grad_sync_s[fc, Strategy.DATA]) == pytest.approx(bucket_s * dense_params * 4 / bucket, rel=1e-5)
    # Filter over m = 2: half the weights, all-reduced over the d = 2 data ranks of the node.
    bucket_d = 2 * (9e-6 + bucket / 2 / 50e9)
    assert float(t.grad_sync_s[fc, Strategy.FILTER]) == pytest.approx(bucket_d * dense_params * 2 / bucket, rel=1e-5)
    # Channel over m = 2: the kernel's 512 input rows split, the 16 biases whole
    # (paradl.md §4.7): 512 * 16 / 2 + 16 = 4,112 gradients per device.
    assert float(t.grad_sync_s[fc, Strategy.CHANNEL]) == pytest.approx(bucket_d * 4112 * 4 / bucket, rel=1e-5)
    # Memory: adam fp32 = 4 (weights) + 4 (gradients) + 2 x 4 (slots) + 4 (the update
    # XLA keeps at the optimizer step) = 20 B per parameter held: all 8,208 under data,
    # half under filter (kernel and bias), 4,112 under channel (the bias whole).
    assert float(t.state_bytes[fc, Strategy.FILTER]) == pytest.approx(20 * dense_params / 2, rel=1e-6)
    assert float(t.state_bytes[fc, Strategy.DATA]) == pytest.approx(20 * dense_params, rel=1e-6)
    assert float(t.state_bytes[fc, Strategy.CHANNEL]) == pytest.approx(20 * 4112, rel=1e-6)
    # conv 4 -> 8, 3x3: 288 kernel + 8 bias; channel holds 144 + 8 = 152.
    assert float(t.state_bytes[conv, Strategy.CHANNEL]) == pytest.approx(20 * 152, rel=1e-6)
    assert float(t.state_bytes[flat, Strategy.DATA]) == 0.0  # the flatten has no parameters
    # Workspace: the input and output gradients of one layer per device, 4 B each. The
    # conv (4 x 64 in, 8 x 64 out per sample, the group's 4 samples): under data both
    # split by batch over m = 2 (2 samples); under filter the input gradient is whole
    # (partial sums) and the output gradient split by channels.
    assert float(t.workspace_bytes[conv, Strategy.DATA]) == pytest.approx(4 * 2 * (256 + 512), rel=1e-6)
    assert float(t.workspace_bytes[conv, Strategy.FILTER]) == pytest.approx(4 * 4 * (256 + 512 / 2), rel=1e-6)
    # The dense layer keeps its input: 512 floats x 4 samples per group, split by batch
    # under data (2 per device), replicated under filter.
    assert float(t.activation_bytes[fc, Strategy.DATA]) == pytest.approx(512 * 2 * 4, rel=1e-6)
    assert float(t.activation_bytes[fc, Strategy.FILTER]) == pytest.approx(512 * 4 * 4, rel=1e-6)
    # flatten (data, batch-split) -> fc (filter, needs the group's whole batch):
    # forward all-gather and backward reduce-scatter of 512 x 4 samples x 4 B over m = 2.
    group_bytes = 512 * 4 * 4
    one = 1 * (9e-6 + group_bytes / 2 / 50e9)
    e = next(i for i, (s, d) in enumerate(g.edges) if (s, d) == (flat, fc))
    assert float(t.reshard_s[e, Strategy.DATA, Strategy.FILTER]) == pytest.approx(2 * one, rel=1e-5)
    assert float(t.reshard_s[e, Strategy.DATA, Strategy.DATA]) == 0.0
    # fc under filter is the model output: its channel-split logits are gathered for
    # the loss (16 x 4 samples x 4 B), and the loss gradient is sliced for free.
    out_bytes = 16 * 4 * 4
    assert float(t.output_s[fc, Strategy.FILTER]) == pytest.approx(9e-6 + out_bytes / 2 / 50e9, rel=1e-5)
    assert float(t.output_s[conv, Strategy.FILTER]) == 0.0  # not an output
    # Compute, kernel by kernel on a V100 without a kernel block (costmodels/compute.py: a
    # roofline per kernel; 15.7 TFLOP/s fp32 at 60% for convs; 900 GB/s at 80%): data works
    # on 8 / 4 = 2 samples per device, replicated on the group's 4, filter on the group's
    # 4 samples with half the output channels. The conv reads the model input, so it runs a forward and a
    # backward-weight kernel only, each reading x and w and writing y (or the reverse).
    a = g.arrays
    for s, samples in ((Strategy.DATA, 2), (Strategy.REPLICATED, 4), (Strategy.FILTER, 4)):
        shard = 2 if s == Strategy.FILTER else 1
        moved = 4 * (samples * 4 * 64 + 3 * 3 * 4 * 8 / shard + samples * 8 / shard * 64)
        expect = sum(max(float(k) * samples / shard / (15.7e12 * 0.6), moved / (900e9 * 0.8))
                     for k in (a.flops_fwd[conv], a.flops_bwd_weight[conv]))
        assert float(a.flops_bwd_data[conv]) == 0.0
        assert float(t.compute_s[conv, s]) == pytest.approx(expect, rel=1e-5)
    # Spatial halo of a 3x3 SAME conv: 1 row each way of x (4 ch x 8 wide, the group's
    # 4 samples) forward, and again for the weight gradient; the conv reads the model
    # input, so no input gradient and no rows of dy: four messages on NVLink.
    x_row = 4 * 8 * 4 * 4
    halo = 4 * (9e-6 + x_row / 50e9)
    assert float(t.halo_s[conv, Strategy.SPATIAL]) == pytest.approx(halo, rel=1e-5)
    assert float(t.halo_s[conv, Strategy.DATA]) == 0.0


def test_masks_by_hand(tiny):
    g, t = tiny
    f = np.asarray(t.feasible)
    assert f[0].tolist() == [True, True, True, True, True]  # conv 4 -> 8, 8 rows, m = 2
    assert f[1].tolist() == [True, False, False, False, True]  # flatten: data or replicated
    assert f[2].tolist() == [True, True, True, False, True]  # dense: no spatial dim to split
    assert f[3:].all()  # padding rows cost nothing under any strategy
    t3 = cost_table(g.arrays, hardware_arrays(ABCI), 8.0, 1.0, 3.0)
    f3 = np.asarray(t3.feasible)
    assert not f3[0, Strategy.FILTER] and not f3[0, Strategy.CHANNEL]  # 3 divides neither 8 nor 4
    t16 = cost_table(g.arrays, hardware_arrays(ABCI), 8.0, 1.0, 16.0)
    assert not np.asarray(t16.feasible)[0, Strategy.SPATIAL]  # 8 rows < 16 shards
    assert not np.asarray(t16.feasible)[0, Strategy.DATA]  # 8 samples < 16 devices
    # spatial needs two rows per shard: 8 rows over m = 4 give 2 each, over m = 8 one.
    t4 = cost_table(g.arrays, hardware_arrays(ABCI), 8.0, 1.0, 4.0)
    t8 = cost_table(g.arrays, hardware_arrays(ABCI), 8.0, 1.0, 8.0)
    assert np.asarray(t4.feasible)[0, Strategy.SPATIAL]
    assert not np.asarray(t8.feasible)[0, Strategy.SPATIAL]
    assert np.asarray(t8.feasible)[0, Strategy.FILTER]  # 8 output channels over 8


def test_halo_of_first_and_later_layers_by_hand():
    # conv0 reads the model input; pool (3x3, stride 1, SAME) and conv1 follow it.
    b = GraphBuilder("halo", (4, 8, 8))
    c0 = b.conv("conv0", b.input, 8, 3)
    p = b.max_pool("pool", c0, 3, stride=1, padding="SAME")
    b.conv("conv1", p, 16, 3)
    g = b.build()
    t = cost_table(g.arrays, hardware_arrays(ABCI), 8.0, 2.0, 2.0)  # group of 4 samples, m = 2 on NVLink
    msg = lambda nbytes: 9e-6 + nbytes / 50e9
    x0, x1, y1 = 4 * 8 * 4 * 4, 8 * 8 * 4 * 4, 16 * 8 * 4 * 4  # one row of x or dy, 4 B
    # 3x3, stride 1: one row from each neighbour per exchange.
    # conv0: forward x, weight gradient x again; no input gradient.
    assert float(t.halo_s[0, Strategy.SPATIAL]) == pytest.approx(4 * msg(x0), rel=1e-5)
    # pool: forward x and the input gradient's dy; no weights.
    assert float(t.halo_s[1, Strategy.SPATIAL]) == pytest.approx(2 * msg(x1) + 2 * msg(x1), rel=1e-5)
    # conv1: forward x, input gradient dy (16 channels), weight gradient x again.
    assert float(t.halo_s[2, Strategy.SPATIAL]) == pytest.approx(4 * msg(x1) + 2 * msg(y1), rel=1e-5)
    # The plain-Python evaluator agrees (all spatial: halos + compute + gradients).
    choice = np.full(t.layer_mask.shape[0], int(Strategy.SPATIAL))  # padded rows cost nothing
    assert float(iteration_time(t, one_hot(choice, S))) == pytest.approx(
        reference_iteration_time(g, choice, ABCI, 8, 2, 2), rel=2e-5)
    recs = [r for r in plan_collectives(g, choice, 8, 2, 2) if r.kind == "collective-permute"]
    # the collective list counts the same exchanges as bytes (both rows at once)
    assert [(r.where, r.bytes_per_device) for r in recs] == [
        ("conv0", 2 * x0), ("conv0 (weight gradient)", 2 * x0),
        ("pool", 2 * x1), ("pool", 2 * x1),
        ("conv1", 2 * x1), ("conv1", 2 * y1), ("conv1 (weight gradient)", 2 * x1)]


# -- the one-hot identity against an independent evaluator -------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "model, hw, batch, d, m, dtype, optimizer",
    [
        ("resnet50", "abci-v100", 256, 8, 4, "float32", "adam"),
        ("vgg16", "dgx-a100", 128, 4, 8, "bfloat16", "momentum"),
        ("cosmoflow-256", "dgx-h100", 16, 2, 8, "float32", "sgd"),
        ("vgg16-cifar10-splitbrain", "abci-v100", 64, 16, 2, "float32", "adam"),
        ("alexnet", "h200", 512, 64, 8, "bfloat16", "adam"),
        # transformers: attention (sequence parallelism's gathered keys and values), embeddings,
        # products; 17 tokens over 4 shards pad to 20
        ("vit-tiny", "dgx-a100", 16, 2, 4, "float32", "adam"),
        ("decoder-tiny", "h200", 32, 8, 4, "bfloat16", "adam"),
        ("gpt2-small", "dgx-h100", 64, 16, 4, "float32", "adam"),
    ],
)
def test_one_hot_equals_plain_python_evaluation(model, hw, batch, d, m, dtype, optimizer):
    g, hardware = get_model(model), load_hardware(hw)
    settings = CostSettings(dtype=dtype, optimizer=optimizer)
    t = cost_table(g.arrays, hardware_arrays(hardware, dtype), batch, d, m, settings)
    feasible = np.asarray(t.feasible)
    rng = np.random.default_rng(0)
    for _ in range(3):
        choice = np.array([rng.choice(np.flatnonzero(row)) for row in feasible])
        p = one_hot(choice, S)
        got_t, got_m = float(iteration_time(t, p)), float(memory_per_device(t, p))
        assert got_t == pytest.approx(reference_iteration_time(g, choice, hardware, batch, d, m, settings), rel=2e-5)
        assert got_m == pytest.approx(reference_memory(g, choice, batch, d, m, settings), rel=2e-5)
    # XLA:CPU's memory (max-pool expansion, transposed conv output gradients), against the reference
    cpu = CostSettings(dtype=dtype, optimizer=optimizer, platform="cpu")
    t = cost_table(g.arrays, hardware_arrays(hardware, dtype), batch, d, m, cpu)
    for _ in range(2):
        choice = np.array([rng.choice(np.flatnonzero(row)) for row in np.asarray(t.feasible)])
        got_m = float(memory_per_device(t, one_hot(choice, S)))
        assert got_m == pytest.approx(reference_memory(g, choice, batch, d, m, cpu), rel=2e-5)


def test_overlap_hides_gradient_sync():
    g = get_model("resnet50")
    hw = load_hardware("dgx-a100")
    overlapped = type(hw)(**{**hw.__dict__, "gradient_overlap": 1.0})
    data = one_hot(np.zeros(g.arrays.mask.shape[0], int), S)
    t0 = cost_table(g.arrays, hardware_arrays(hw), 512.0, 64.0, 1.0)
    t1 = cost_table(g.arrays, hardware_arrays(overlapped), 512.0, 64.0, 1.0)
    grad = float(jnp.sum(t0.grad_sync_s[:, 0] * t0.layer_mask))
    bwd = float(jnp.sum(t0.backward_compute_s[:, 0] * t0.layer_mask))
    assert float(iteration_time(t0, data) - iteration_time(t1, data)) == pytest.approx(min(grad, bwd), rel=1e-4)
    choice = np.zeros(g.arrays.mask.shape[0], int)
    assert float(iteration_time(t1, data)) == pytest.approx(
        reference_iteration_time(g, choice, overlapped, 512, 64, 1), rel=2e-5
    )


# -- differentiability and vectorisation -------------------------------------------------------


def test_gradients_match_finite_differences():
    g = get_model("vgg16-cifar10-splitbrain")
    t = cost_table(g.arrays, hardware_arrays(ABCI), 64.0, 4.0, 4.0)
    logits = jax.random.normal(jax.random.key(0), t.feasible.shape)
    probs = jax.nn.softmax(jnp.where(t.feasible, logits, -1e9), axis=-1)
    direction = jax.random.normal(jax.random.key(1), probs.shape) * t.feasible
    for f in (iteration_time, memory_per_device):
        grad = jax.grad(lambda p, f=f: f(t, p))(probs)
        eps = 1e-2  # the time is quadratic in probs, so central differences are exact up to rounding
        fd = (f(t, probs + eps * direction) - f(t, probs - eps * direction)) / (2 * eps)
        assert float(jnp.vdot(grad, direction)) == pytest.approx(float(fd), rel=2e-3)


def test_vmap_over_1000_configurations_compiles_once():
    g = get_model("resnet50")
    presets = [hardware_arrays(load_hardware(n)) for n in ("abci-v100", "dgx-a100", "dgx-h100", "h200")]
    rng = np.random.default_rng(0)
    n = 1000
    idx = rng.integers(0, 4, n)
    hw = jax.tree.map(lambda *xs: jnp.stack(xs)[idx], *presets)
    m = jnp.asarray(rng.choice([1, 2, 4, 8], n), jnp.float32)
    d = jnp.asarray(rng.choice([1, 2, 8, 32], n), jnp.float32)
    batch = d * m * jnp.asarray(rng.choice([1, 4, 32], n), jnp.float32)
    data = one_hot(np.zeros(g.arrays.mask.shape[0], int), S)
    traces = []

    @jax.jit
    def sweep(hw, batch, d, m):
        traces.append(1)
        return jax.vmap(lambda h, b, dd, mm: iteration_time(cost_table(g.arrays, h, b, dd, mm), data))(hw, batch, d, m)

    out = sweep(hw, batch, d, m)
    out2 = sweep(hw, batch * 2, d, m)
    assert out.shape == (n,) and bool(jnp.all(jnp.isfinite(out))) and bool(jnp.all(out2 > out))
    assert len(traces) == 1
    # spot-check one configuration against the unvectorised call
    k = 17
    single = iteration_time(cost_table(g.arrays, presets[idx[k]], batch[k], d[k], m[k]), data)
    assert float(out[k]) == pytest.approx(float(single), rel=1e-5)


# -- SplitBrain (splitbrain.md §1.2-1.4) ----------------------------------------------------------


def _splitbrain_choice(g, feasible):
    """Conv stack data-parallel; FC layers (and the ReLUs between them) filter-sharded
    where m divides their outputs, else replicated."""
    kinds = g.kind_names
    first_fc = kinds.index("dense")
    choice = np.zeros(feasible.shape[0], int)
    for i in range(first_fc, g.num_layers):
        choice[i] = Strategy.FILTER if feasible[i, Strategy.FILTER] else Strategy.REPLICATED
    return choice


def test_splitbrain_memory_saving():
    g = get_model("vgg16-cifar10-splitbrain")
    t = cost_table(g.arrays, hardware_arrays(ABCI), 128.0, 1.0, 8.0)
    feasible = np.asarray(t.feasible)
    choice = _splitbrain_choice(g, feasible)
    assert feasible[np.arange(len(choice)), choice].all()
    state = np.asarray(t.state_bytes)
    dp = state[:, Strategy.DATA].sum()
    sb = state[np.arange(len(choice)), choice].sum()
    # splitbrain.md §1.4: f (1 - 1/g) with f = 50,380,810 / 65,095,498 and g = 8 -> 67.7%.
    # The 10-way head cannot be split 8 ways and stays replicated (40,970 parameters).
    assert 1 - sb / dp == pytest.approx(0.677, abs=5e-4)
    expected = (50_380_810 - 40_970) / 65_095_498 * (1 - 1 / 8)
    assert 1 - sb / dp == pytest.approx(expected, rel=1e-5)


def test_splitbrain_collectives_are_group_local():
    g = get_model("vgg16-cifar10-splitbrain")
    d, m, batch = 2, 8, 128
    t = cost_table(g.arrays, hardware_arrays(ABCI), float(batch), float(d), float(m))
    choice = _splitbrain_choice(g, np.asarray(t.feasible))
    recs = plan_collectives(g, choice, batch, d, m)
    gathers = [r for r in recs if r.kind == "all-gather"]
    # L_M before the first FC (the group's batch), L_S before each later FC (the features).
    assert [r.where for r in gathers] == ["flatten -> classifier/0", "relu_13 -> classifier/1", "relu_14 -> classifier/2"]
    assert all(r.axes == ("model",) and r.phase == "forward" for r in gathers)
    group = batch // d
    assert [r.bytes_per_device for r in gathers] == [8192 * group * 4, 4096 * group * 4, 4096 * group * 4]
    # Their backward mirrors are reduce-scatters of the partial input gradients, except
    # before the replicated head, whose input gradient is sliced for free.
    scatters = [r.where for r in recs if r.kind == "reduce-scatter"]
    assert scatters == ["flatten -> classifier/0", "relu_13 -> classifier/1"]
    # Nothing but gradient all-reduces crosses groups: conv gradients over all 16
    # devices, FC shard gradients over the 2 data-parallel groups.
    activation = [r for r in recs if r.phase != "gradient"]
    assert all(r.axes == ("model",) for r in activation)
    grads = {r.where: r for r in recs if r.phase == "gradient"}
    assert grads["features/0"].axes == ("data", "model")
    assert grads["classifier/0"].axes == ("data",)
    assert grads["classifier/0"].bytes_per_device == (8192 * 4096 + 4096) * 4 / 8
    assert grads["classifier/2"].axes == ("data",) and grads["classifier/2"].bytes_per_device == 40_970 * 4


def test_settings_reject_unknown_values():
    with pytest.raises(ValueError, match="optimizer"):
        CostSettings(optimizer="lion")
    with pytest.raises(ValueError, match="dtype"):
        CostSettings(dtype="int8")
    with pytest.raises(ValueError, match="dtype"):
        hardware_arrays(ABCI, "float64")


# -- calibration ---------------------------------------------------------------------------------


def test_calibration_overrides_roofline_and_interpolates(tiny, tmp_path):
    import json

    from costmodels.calibration import calibration_arrays, load_calibration

    g, t = tiny
    path = tmp_path / "cal.json"
    # conv measured at 1, 4 and 16 sample-equivalents; fc at one point only.
    path.write_text(json.dumps({
        "schema": "shardplan/calibration", "version": 1, "hardware": "abci-v100", "dtype": "float32",
        "layers": {"conv": {"work": [1, 4, 16], "seconds": [1e-3, 2e-3, 8e-3]}, "fc": {"work": [2], "seconds": [3e-4]}},
    }))
    cal = calibration_arrays(load_calibration(path), g)
    tc = cost_table(g.arrays, hardware_arrays(ABCI), 8.0, 2.0, 2.0, calibration=cal)
    # batch 8 on 2 x 2: data/filter/channel/spatial do 2 sample-equivalents, replicated 4.
    # log-log between (1, 1e-3) and (4, 2e-3): slope 1/2, so 2 -> 1e-3 * sqrt(2).
    assert float(tc.compute_s[0, Strategy.DATA]) == pytest.approx(1e-3 * 2**0.5, rel=1e-5)
    assert float(tc.compute_s[0, Strategy.REPLICATED]) == pytest.approx(2e-3, rel=1e-5)
    assert float(tc.compute_s[2, Strategy.REPLICATED]) == pytest.approx(6e-4, rel=1e-5)  # proportional
    assert float(tc.compute_s[1, Strategy.DATA]) == float(t.compute_s[1, Strategy.DATA])  # not measured
    # beyond the last point: the last segment's slope (1) continues: 32 -> 1.6e-2
    tb = cost_table(g.arrays, hardware_arrays(ABCI), 64.0, 1.0, 2.0, calibration=cal)
    assert float(tb.compute_s[0, Strategy.DATA]) == pytest.approx(1.6e-2, rel=1e-5)


@pytest.mark.parametrize(
    "layers, message",
    [
        ({"nope": {"work": [1], "seconds": [1.0]}}, "does not have"),
        ({"conv": {"work": [1, 2], "seconds": [1.0]}}, "equal length"),
        ({"conv": {"work": [0], "seconds": [1.0]}}, "positive"),
        ({"conv": {"work": [1, 1], "seconds": [1.0, 2.0]}}, "repeated"),
    ],
)
def test_bad_calibration_rejected(tiny, layers, message):
    from costmodels.calibration import Calibration, calibration_arrays

    g, _ = tiny
    with pytest.raises(ValueError, match=message):
        data = {"schema": "shardplan/calibration", "version": 1, "hardware": "x", "dtype": "float32", "layers": layers}
        calibration_arrays(Calibration.from_dict(data), g)


def _cal_v2(layers, version=2):
    return {"schema": "shardplan/calibration", "version": version, "hardware": "x", "dtype": "float32",
            "layers": layers}


_CONV_POINTS = {"work": [1, 4, 16], "seconds": [1e-3, 2e-3, 8e-3]}


def test_strategy_points_take_precedence(tiny):
    """A strategy with its own points uses them, the others the layer's
    work-only points, and a layer with only some strategies' points keeps
    the roofline for the rest; the plain-Python evaluator agrees."""
    import itertools

    from costmodels.calibration import Calibration, calibration_arrays

    g, t = tiny
    cal = Calibration.from_dict(_cal_v2({
        "conv": {**_CONV_POINTS, "strategies": {"filter": {"work": [1, 4], "seconds": [4e-3, 1.6e-2]}}},
        "fc": {"strategies": {"channel": {"work": [2], "seconds": [5e-4]}}},
    }))
    arrays = calibration_arrays(cal, g)
    tc = cost_table(g.arrays, hardware_arrays(ABCI), 8.0, 2.0, 2.0, calibration=arrays)
    c = np.asarray(tc.compute_s)
    # batch 8 on 2 x 2: work 2 for data / filter / channel / spatial, 4 for replicated.
    assert c[0, Strategy.FILTER] == pytest.approx(8e-3, rel=1e-5)  # own points, slope 1: 4e-3 * 2
    for s in (Strategy.DATA, Strategy.CHANNEL, Strategy.SPATIAL):
        assert c[0, s] == pytest.approx(1e-3 * 2**0.5, rel=1e-5)  # work-only, log-log midpoint of 1 and 4
    assert c[0, Strategy.REPLICATED] == pytest.approx(2e-3, rel=1e-5)
    assert c[2, Strategy.CHANNEL] == pytest.approx(5e-4, rel=1e-5)  # fc's only measured strategy
    for s in (Strategy.DATA, Strategy.FILTER, Strategy.REPLICATED):
        assert c[2, s] == float(t.compute_s[2, s])  # not measured: the roofline
    # d(seconds)/d(batch) of filter conv: 4e-3 s per sample-equivalent, work = batch / 4.
    grad = jax.grad(lambda b: cost_table(g.arrays, hardware_arrays(ABCI), b, 2.0, 2.0,
                                         calibration=arrays).compute_s[0, Strategy.FILTER])(8.0)
    assert float(grad) == pytest.approx(1e-3, rel=1e-4)
    feasible = np.asarray(tc.feasible)
    rows = [np.flatnonzero(feasible[i]) for i in range(g.num_layers)]
    for choice in itertools.product(*rows):
        choice = np.array(list(choice) + [0] * (feasible.shape[0] - g.num_layers))
        assert float(iteration_time(tc, one_hot(choice, S))) == pytest.approx(
            reference_iteration_time(g, choice, ABCI, 8, 2, 2, calibration=cal), rel=2e-5)


def test_version_1_file_applies_to_every_strategy(tiny):
    """A version-1 file (work-only points) gives the same table as a
    version-2 file that repeats those points for every strategy, and the
    plain-Python evaluator agrees with it."""
    from costmodels.calibration import Calibration, calibration_arrays

    g, _ = tiny
    fc = {"work": [2], "seconds": [3e-4]}
    v1 = Calibration.from_dict(_cal_v2({"conv": _CONV_POINTS, "fc": fc}, version=1))
    v2 = Calibration.from_dict(_cal_v2({  # conv's own work-only point is never used: every strategy has its own
        "conv": {"work": [7], "seconds": [1.0], "strategies": {s.name.lower(): _CONV_POINTS for s in Strategy}},
        "fc": {"strategies": {s.name.lower(): fc for s in Strategy}},
    }))
    assert v1.to_dict()["version"] == 1 and v2.to_dict()["version"] == 2
    assert Calibration.from_dict(v2.to_dict()) == v2
    hw = hardware_arrays(ABCI)
    t1 = cost_table(g.arrays, hw, 8.0, 2.0, 2.0, calibration=calibration_arrays(v1, g))
    t2 = cost_table(g.arrays, hw, 8.0, 2.0, 2.0, calibration=calibration_arrays(v2, g))
    np.testing.assert_array_equal(np.asarray(t1.compute_s), np.asarray(t2.compute_s))
    assert float(t1.compute_s[0, Strategy.FILTER]) == pytest.approx(1e-3 * 2**0.5, rel=1e-5)
    feasible = np.asarray(t1.feasible)
    for s in (Strategy.DATA, Strategy.FILTER, Strategy.CHANNEL, Strategy.REPLICATED):
        choice = np.where(feasible[:, s], int(s), int(Strategy.REPLICATED))
        assert float(iteration_time(t1, one_hot(choice, S))) == pytest.approx(
            reference_iteration_time(g, choice, ABCI, 8, 2, 2, calibration=v1), rel=2e-5)


_GOOD = {"work": [1, 2], "seconds": [1e-3, 2e-3]}


@pytest.mark.parametrize(
    "layers, version, message",
    [
        ({"conv": {"strategies": {"diagonal": _GOOD}}}, 2, "unknown strategy 'diagonal'"),
        ({"conv": {"strategies": {"filter": {"work": [1, 2], "seconds": [1e-3, math.nan]}}}}, 2,
         r"\['filter'\]: seconds values must be positive finite"),
        ({"conv": {"strategies": {"filter": {"work": [1, math.inf], "seconds": [1e-3, 1e-3]}}}}, 2,
         r"\['filter'\]: work values must be positive finite"),
        ({"conv": {"strategies": {"data": {"work": [0], "seconds": [1e-3]}}}}, 2, r"\['data'\]: work .*positive"),
        ({"conv": {"strategies": {"data": {"work": [1], "seconds": [-1.0]}}}}, 2, "seconds values must be positive"),
        ({"conv": {"strategies": {"data": {"work": [1, 2], "seconds": [1.0]}}}}, 2, r"\['data'\]: .*equal length"),
        ({"conv": {"strategies": {"data": {"work": [1]}}}}, 2, r"\['data'\] must be"),
        ({"conv": {"strategies": {}}}, 2, "non-empty"),
        ({"conv": {"strategies": [_GOOD]}}, 2, "non-empty object"),
        ({"conv": {}}, 2, "must be"),
        ({"conv": {**_GOOD, "speed": 1}}, 2, "must be"),
        ({"conv": {**_GOOD, "strategies": {"filter": _GOOD}}}, 1, '"version": 2'),
        ({"nope": {"strategies": {"filter": _GOOD}}}, 2, "does not have"),
        ({"conv": _GOOD}, 4, "version 4 is not supported"),
    ],
)
def test_bad_strategy_calibration_rejected(tiny, layers, version, message):
    from costmodels.calibration import Calibration, calibration_arrays

    g, _ = tiny
    with pytest.raises(ValueError, match=message):
        calibration_arrays(Calibration.from_dict(_cal_v2(layers, version)), g)


def test_mask_needs_whole_samples_per_device(tiny):
    g, _ = tiny
    f = np.asarray(cost_table(g.arrays, hardware_arrays(ABCI), 12.0, 2.0, 4.0).feasible)
    assert not f[0, Strategy.DATA]  # 12 samples over 8 devices
    assert f[0, Strategy.FILTER]  # 6 per data group
    f = np.asarray(cost_table(g.arrays, hardware_arrays(ABCI), 9.0, 2.0, 1.0).feasible)
    assert not f[0].any()  # 9 samples cannot split over 2 data groups
