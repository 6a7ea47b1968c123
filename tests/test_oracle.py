"""The ParaDL oracle.

Compat mode against the original code's published outputs: the worked
example of paradl.md §6 and the tables of §7.2 (VGG16, ResNet-50 and
CosmoFlow from the shipped ``.net`` files and ``.lc`` masks, ABCI preset),
within 1%. Default mode: every corrected formula against a value computed
by hand on a tiny hand-built graph and a hand-written two-tier machine.
Pipeline partition and schedule by hand; bottleneck strings; limits; CLI.
"""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import pytest
from builders import tiny_oracle_graph  # noqa: E402
from reference_files import PARADL_MODELS as MODELS  # noqa: E402

from costmodels import hardware_from_dict, load_hardware
from costmodels.oracle import (
    StrategyCost,
    bottleneck,
    default_batch_per_device,
    oracle_context,
    oracle_layers,
    oracle_table,
    parse_lc,
)
from costmodels.oracle._pipeline import balanced_stages, boundary_elements
from planner.cli import main
from planner.ir.builder import GraphBuilder
from planner.paradl.report import net_dataset_size, oracle

RESNET = MODELS / "RESNET50_ImageNet_profall.net_sc"
VGG = MODELS / "VGG_ImageNet_profall.net_sc"
needs_models = pytest.mark.skipif(
    not (RESNET.is_file() and VGG.is_file()), reason=f"ParaDL model files not found under {MODELS}"
)
POW2 = [2**i for i in range(1, 11)]  # p = 2 ... 1024, as the original enumerates


def close(got, want, rel=0.01):
    """Within 1% (the issue's tolerance), and to the 4 decimals §7.2 prints."""
    return got == pytest.approx(want, rel=rel, abs=5e-5)


@pytest.fixture(scope="module")
def compat_resnet():
    if not RESNET.is_file():
        pytest.skip(f"{RESNET} is absent")
    lc = [MODELS / "filter_resnet.lc", MODELS / "spatial_resnet.lc"]
    return oracle(RESNET, "abci-v100", POW2, batch_per_device=64, compat="paradl", lc=lc)


@pytest.fixture(scope="module")
def compat_vgg():
    if not VGG.is_file():
        pytest.skip(f"{VGG} is absent")
    lc = [MODELS / "filter_vgg.lc", MODELS / "spatial_vgg.lc"]
    return oracle(VGG, "abci-v100", POW2, batch_per_device=32, compat="paradl", lc=lc)


def series(report, strategy, field, devices):
    return [getattr(report.row(strategy, p), field) for p in devices]


# -- compat: §6 worked example ---------------------------------------------------------


@needs_models
def test_worked_example_resnet50_data_p16(compat_resnet):
    """paradl.md §6: α = 40.31 µs, β = 1/12.5e9, Σ|w|δ = 90,936,064 B."""
    r = compat_resnet.row("data", 16)
    assert r.compute_s == pytest.approx(64 * 3.119502e-3, rel=1e-6)  # 0.19965 s
    assert r.grad_allreduce_s == pytest.approx(2 * 15 * (40.31e-6 + 90_936_064 / 16 / 12.5e9), rel=1e-5)
    assert round(r.total_s, 4) == 0.2145
    assert r.memory_bytes_per_device == pytest.approx(2 * 4 * (64 * (14_971_596 + 14_819_368) + 22_734_016))
    assert round(r.memory_bytes_per_device / 1e9, 2) == 15.43
    assert r.batch == 1024 and r.feasible
    assert r.bottleneck == "compute: 93%"
    assert r.iterations_per_epoch == 1250 and r.epoch_s == pytest.approx(1250 * r.total_s)


@needs_models
def test_worked_example_default_b_is_bmax_64():
    """§6: b_max = 66.37 rounds down to 64 (ParaDL's default samples per GPU)."""
    report = oracle(RESNET, "abci-v100", [16], ["data"], compat="paradl")
    assert report.row("data", 16).batch_per_device == 64


# -- compat: §7.2 tables -------------------------------------------------------------------

RESNET_DATA_COMM = [0.0018, 0.0028, 0.0133, 0.0148, 0.0166, 0.0194, 0.0247, 0.0354, 0.0564, 0.0984]
RESNET_DATA_TOTAL = [0.2015, 0.2024, 0.2129, 0.2145, 0.2162, 0.2187, 0.2234, 0.2328, 0.2514, 0.2933]


@needs_models
def test_resnet50_data(compat_resnet):
    for got, want in zip(series(compat_resnet, "data", "comm_s", POW2), RESNET_DATA_COMM, strict=True):
        assert close(got, want)
    for got, want in zip(series(compat_resnet, "data", "total_s", POW2), RESNET_DATA_TOTAL, strict=True):
        assert close(got, want)
    assert all(round(m / 1e9, 2) == 15.43 for m in series(compat_resnet, "data", "memory_bytes_per_device", POW2))


@needs_models
def test_resnet50_data_compute_follows_the_code_ceil_rounding(compat_resnet):
    """§7.2 summarises the compute as 0.1996 below 512 GPUs, but the code
    computes ceil(D/p)·t / ceil(D/B), which already drifts from p = 64
    (0.1993, 0.1987, 0.1974): the printed totals (0.2187 = 0.1993 + 0.0194)
    agree with the code, so the test follows the code."""
    D, t = 1_280_000, 3.119502e-3
    for p in POW2:
        want = math.ceil(D / p) * t / math.ceil(D / (64 * p))
        assert compat_resnet.row("data", p).compute_s == pytest.approx(want, rel=1e-9)
    assert round(compat_resnet.row("data", 32).compute_s, 4) == 0.1996
    assert round(compat_resnet.row("data", 512).compute_s, 4) == 0.1950


@needs_models
@pytest.mark.parametrize("strategy", ["filter", "channel"])
def test_resnet50_filter_and_channel(compat_resnet, strategy):
    ps = [2, 4, 8, 16, 32, 64]
    comp = [0.1049, 0.0575, 0.0338, 0.0220, 0.0161, 0.0131]
    comm = [0.0712, 0.1088, 0.5305, 0.6128, 0.7251, 0.9235]
    total = [0.1761, 0.1663, 0.5643, 0.6348, 0.7412, 0.9366]
    for field, want in (("compute_s", comp), ("comm_s", comm), ("total_s", total)):
        for got, w in zip(series(compat_resnet, strategy, field, ps), want, strict=True):
            assert close(got, w), (field, got, w)
    r4 = compat_resnet.row(strategy, 4)
    assert close(r4.act_allgather_s, 0.03625) and close(r4.act_allreduce_s, 0.07251)
    assert all(r.batch == 64 for r in compat_resnet.rows if r.strategy == strategy)  # B = b fixed
    assert compat_resnet.row(strategy, 128).limit is not None  # p ≤ 64 (min F / min C)


@needs_models
def test_resnet50_data_filter(compat_resnet):
    ps = POW2[1:]
    comm = [0.1088, 0.1670, 0.1963, 0.2112, 0.2191, 0.2240, 0.2285, 0.2347, 0.2456]
    for got, want in zip(series(compat_resnet, "data+filter", "comm_s", ps), comm, strict=True):
        assert close(got, want)
    assert all(close(c, 0.0575) for c in series(compat_resnet, "data+filter", "compute_s", ps))
    assert close(compat_resnet.row("data+filter", 4).total_s, 0.1663)
    assert close(compat_resnet.row("data+filter", 1024).total_s, 0.3031)
    # "filter 0.1088 + data 0, 0.0583, ..., 0.1368"
    assert compat_resnet.row("data+filter", 4).grad_allreduce_s == 0
    assert close(compat_resnet.row("data+filter", 8).grad_allreduce_s, 0.0583)
    assert close(compat_resnet.row("data+filter", 1024).grad_allreduce_s, 0.1368)


@needs_models
def test_resnet50_data_spatial(compat_resnet):
    ps = POW2[1:]
    comm = [0.2600, 0.3183, 0.3475, 0.3624, 0.3703, 0.3753, 0.3798, 0.3859, 0.3969]
    for got, want in zip(series(compat_resnet, "data+spatial", "comm_s", ps), comm, strict=True):
        assert close(got, want)
    assert close(compat_resnet.row("data+spatial", 4).compute_s, 0.0519)
    r4, r1024 = compat_resnet.row("data+spatial", 4), compat_resnet.row("data+spatial", 1024)
    assert close(r4.halo_s, 0.2344) and close(r4.act_allgather_s, 0.0228)
    assert close(r4.grad_allreduce_s, 0.0028) and close(r1024.grad_allreduce_s, 0.1396)
    # 17 layers × 4 messages × 3 ms: the no-GPUDirect latency dominates (§4.9)
    assert r4.halo_s > 17 * 4 * 3.00011e-3 and r4.bottleneck.startswith("halo exchange over pcie-host")
    assert r4.feasible and not r4.memory_checked  # the original never checks ds memory (§9.6)


@needs_models
def test_resnet50_spatial(compat_resnet):
    assert close(compat_resnet.row("spatial", 2).total_s, 0.3282)
    assert close(compat_resnet.row("spatial", 4).total_s, 0.3085)
    assert "p ≤ 7" in compat_resnet.row("spatial", 8).limit  # 4-way max: the last conv is 7 wide


@needs_models
def test_vgg16_data(compat_vgg):
    total = [0.2775, 0.2843, 0.3595, 0.3669, 0.3716, 0.3759, 0.3815, 0.3917, 0.4113, 0.4501]
    for got, want in zip(series(compat_vgg, "data", "total_s", POW2), total, strict=True):
        assert close(got, want)
    assert close(compat_vgg.row("data", 2).compute_s, 0.2639)
    assert round(compat_vgg.row("data", 64).memory_bytes_per_device / 1e9, 2) == 9.36


@needs_models
@pytest.mark.parametrize("strategy", ["filter", "channel"])
def test_vgg16_filter_and_channel(compat_vgg, strategy):
    total = [0.1905, 0.1544, 0.4269, 0.4503, 0.4809, 0.5339]
    for got, want in zip(series(compat_vgg, strategy, "total_s", [2, 4, 8, 16, 32, 64]), total, strict=True):
        assert close(got, want)
    # 2/3 of 0.3857 s of comm over 0.4269 s (§7.2 values): the backward all-reduce dominates
    assert compat_vgg.row(strategy, 8).bottleneck == "activation all-reduce over ib-leaf: 60%"


@needs_models
def test_vgg16_hybrids(compat_vgg):
    df = [0.1544, 0.5891, 0.8066, 0.9156, 0.9706, 0.9991, 1.0153, 1.0274, 1.0412]
    ds = [0.3550, 0.7898, 1.0073, 1.1163, 1.1712, 1.1997, 1.2159, 1.2279, 1.2416]
    for got, want in zip(series(compat_vgg, "data+filter", "total_s", POW2[1:]), df, strict=True):
        assert close(got, want)
    for got, want in zip(series(compat_vgg, "data+spatial", "total_s", POW2[1:]), ds, strict=True):
        assert close(got, want)


def test_cosmoflow_data_spatial():
    net = MODELS / "COSMOFLOW.net_256"
    if not net.is_file():
        pytest.skip(f"{net} is absent")
    r = oracle(net, "abci-v100", POW2[1:], ["ds"], batch_per_device=1, compat="paradl",
               lc={"spatial": MODELS / "spatial_cosmolow.lc"})
    want = [0.1539, 0.1594, 0.1623, 0.1640, 0.1653, 0.1669, 0.1697, 0.1751, 0.1856]  # §7.2; 16, 32 = TR Table IX
    for got, w in zip(series(r, "data+spatial", "total_s", POW2[1:]), want, strict=True):
        assert close(got, w)
    assert r.dataset_size == 1584 == net_dataset_size(net)
    big = MODELS / "COSMOFLOW.net"
    if big.is_file():  # §7.2: comp 0.5542, total ≈1.00 -> 1.03 (HEAD; the older log's 2.17-2.20 is another revision)
        r = oracle(big, "abci-v100", [4, 1024], ["ds"], batch_per_device=1, compat="paradl",
                   lc={"spatial": MODELS / "spatial_cosmolow.lc"})
        assert close(r.row("ds", 4).compute_s, 0.5542)
        assert round(r.row("ds", 4).total_s, 2) == 1.00 and round(r.row("ds", 1024).total_s, 2) == 1.03


# -- default mode: corrected formulas against hand computations ------------------------

TINY_HW = {
    "schema": "shardplan/hardware", "version": 1, "name": "tiny",
    "device": {"peak_flops_per_s": {"float32": 1e12}, "memory_bandwidth_bytes_per_s": 1e11, "memory_bytes": 1e9,
               "efficiency": {"conv": 1.0, "matmul": 1.0, "elementwise": 1.0, "memory": 1.0}},
    "devices_per_node": 4,
    "tiers": [
        {"name": "intra", "max_ranks": 4, "intra_node": True, "latency_s": 1e-5, "bandwidth_bytes_per_s": 1e10},
        {"name": "inter", "max_ranks": None, "intra_node": False, "latency_s": 1e-4, "bandwidth_bytes_per_s": 1e9},
    ],
}
A_INTRA, BW_INTRA, A_INTER, BW_INTER = 1e-5, 1e10, 1e-4, 1e9


tiny_graph = tiny_oracle_graph


def run(graph, strategies, devices, b, **kw):
    return oracle(graph, hardware_from_dict(TINY_HW), devices, strategies, batch_per_device=b, **kw)


def test_tiny_graph_totals():
    L = oracle_layers(tiny_graph())
    assert L.names == ("conv1", "relu", "conv2", "pool", "fc")  # the flatten is bridged
    keep = ~L.inplace
    assert (L.x_elements[keep].sum(), L.y_elements[keep].sum(), L.params.sum()) == (704, 586, 856)


def test_compat_flop_formula_and_node_speed():
    """§4.10 with §9.8's quirks, by hand on the tiny graph: conv 2·(2·C·F·K²·Y²) + C·F·K²;
    ReLU 2·|y|; pool C·C·K²·Y² (C², no factor 2 missing); FC 2·C·F + C·F (no 2 in FW).
    Without a measured time the original divides by NODE_SPEED = 7.8e12."""
    L = oracle_layers(tiny_graph(None))
    conv1 = 2 * (2 * 2 * 4 * 9 * 64) + 72
    conv2 = 2 * (2 * 4 * 4 * 9 * 64) + 144
    want = [conv1, 2 * 256, conv2, 2 * (4 * 4 * 4 * 16), 2 * 640 + 640]
    assert L.flops_compat.tolist() == want
    r = run(tiny_graph(None), ["data"], [1], 8, compat="paradl").row("data", 1)
    assert r.compute_s == pytest.approx(8 * sum(want) / 7.8e12)


def test_filter_memory_divides_weights_by_p_once():
    """§9.3: 2δ(b(Σ|x|+Σ|y|) + Σ_split|w|/p + Σ_rest|w|); the original divides by p²."""
    g = tiny_graph()
    d = run(g, ["filter"], [2], 8).row("filter", 2)
    assert d.memory_bytes_per_device == 2 * 4 * (8 * 1290 + (72 + 144) / 2 + 640)  # 88,544 B
    c = run(g, ["filter"], [2], 8, compat="paradl", lc={"filter": [1, 0, 1, 0, 0]}).row("filter", 2)
    assert c.memory_bytes_per_device == 2 * 4 * (8 * 1290 + ((72 + 144) / 2 + 640) / 2)  # the p² bug


def test_filter_and_channel_exchange_each_layers_tensors():
    """§4.6/§4.7 per layer, p = 2 in one node, b = 8, δ = 4: filter gathers
    conv1's and conv2's y (256 each) and all-reduces conv2's dL/dx (256; conv1
    reads the model input); channel (conv2 only by default) the reverse."""
    g = tiny_graph()
    r = run(g, ["filter", "channel"], [2], 8)
    one = 8 * 256 * 4 / 2 / BW_INTRA  # b|t|δ/p β
    f, c = r.row("filter", 2), r.row("channel", 2)
    assert f.act_allgather_s == pytest.approx(2 * (A_INTRA + one))
    assert f.act_allreduce_s == pytest.approx(2 * (A_INTRA + one))
    assert f.grad_allreduce_s == 0  # each device owns its filters; replicated layers agree
    assert c.act_allreduce_s == pytest.approx(2 * (A_INTRA + one))
    assert c.act_allgather_s == pytest.approx(A_INTRA + one)


def test_spatial_halo_is_channels_times_rows_times_other_dims():
    """§9.4: per split layer, forward x and backward dL/dy, rows = K-1 = 2 at
    stride 1 split one row per neighbour, a row = C·W·b·δ. p = 4 (one node),
    b = 8: conv1 rows of 2·8·8·4 = 512 B (x) and 1024 B (y); conv2 1024 B and
    1024 B; the 2x2/2 pool needs none."""
    r = run(tiny_graph(), ["spatial"], [4], 8).row("spatial", 4)
    p2p = lambda nbytes: A_INTRA + nbytes / BW_INTRA
    want = 2 * p2p(512) + 2 * p2p(1024) + 2 * p2p(1024) + 2 * p2p(1024)
    assert r.halo_s == pytest.approx(want)
    # the pooled output (4 rows) is gathered once, forward: (p-1)(α + b|y|δ/p β)
    assert r.act_allgather_s == pytest.approx(3 * (A_INTRA + 8 * 64 * 4 / 4 / BW_INTRA))


def test_halo_for_a_2x2_kernel():
    """§9.5: K = 2 at stride 1 needs one row (from one neighbour), where
    ⌊(K-1)/2⌋ = 0 gives none. 1x6x6 -> conv 2x2 VALID -> 2x5x5, p = 4, b = 4:
    x row 1·6·4·4 = 96 B, dL/dy row 2·5·4·4 = 160 B."""
    b = GraphBuilder("k2", (1, 6, 6))
    b.conv("conv", b.input, 2, 2, padding="VALID", bias=False)
    r = run(b.build(measured_time_per_sample_s=1e-3), ["spatial"], [4], 4).row("spatial", 4)
    assert r.halo_s == pytest.approx((A_INTRA + 96 / BW_INTRA) + (A_INTRA + 160 / BW_INTRA))


def test_weight_update_is_counted():
    """§9.2: WU = (3 + 2·slots)·δ·|w| / HBM bandwidth, added to the total."""
    g = tiny_graph()
    sgd = run(g, ["data"], [1], 8).row("data", 1)
    assert sgd.weight_update_s == pytest.approx(3 * 4 * 856 / 1e11)
    assert sgd.total_s == pytest.approx(sgd.compute_s + sgd.weight_update_s)
    assert sgd.compute_s == pytest.approx(8 * 1e-3)  # the measured time, all on one device
    adam = run(g, ["data"], [1], 8, optimizer="adam").row("data", 1)
    assert adam.weight_update_s == pytest.approx(7 * 4 * 856 / 1e11)
    assert adam.memory_bytes_per_device - sgd.memory_bytes_per_device == pytest.approx(2 * 4 * 856)
    assert run(g, ["data"], [1], 8, compat="paradl").row("data", 1).weight_update_s == 0


def test_compute_is_spread_by_the_graphs_flop_share():
    """§4.10 with the graph's FLOP counts (§9.8 fixed): filter over p = 2
    halves the conv layers' share of the measured time only."""
    g = tiny_graph(1e-3)
    a = g.unpadded()
    flops = np.asarray(a.flops_fwd + a.flops_bwd_data + a.flops_bwd_weight)
    share = flops / flops.sum()
    conv = np.isin(np.asarray(g.names), ["conv1", "conv2"])
    want = 8 * 1e-3 * (share[conv].sum() / 2 + share[~conv].sum())
    assert run(g, ["filter"], [2], 8).row("filter", 2).compute_s == pytest.approx(want)


def test_data_spatial_counts_every_layer_and_checks_memory():
    """§9.6: ds memory 2δ(b·Σ(|x|+|y|)/split + Σ|w|) with every layer (the
    split ones / p2 = 4): (128+256)/4 + (256+256)/4 + (256+64)/4 + (64+10) =
    378 elements per sample; b = 400 needs 1.22 MB > 1 MB."""
    hw = hardware_from_dict({**TINY_HW, "device": {**TINY_HW["device"], "memory_bytes": 1e6}})
    g = tiny_graph()
    r = oracle(g, hw, [4, 8], ["ds"], batch_per_device=400)
    mem = 2 * 4 * (400 * 378 + 856)
    assert r.row("ds", 4).memory_bytes_per_device == pytest.approx(mem)
    assert not r.row("ds", 4).feasible
    assert r.row("ds", 4).bottleneck == "out of memory at 4 GPUs: 0.00122 GB > 0.001 GB"
    c = oracle(g, hw, [4], ["ds"], batch_per_device=400, compat="paradl", lc={"spatial": [1, 0, 1, 0, 0]})
    assert c.row("ds", 4).feasible  # the original never checks (§9.6)
    # every layer's compute counts in the default mode (the dense one after the split too)
    share = oracle_layers(g).flops / oracle_layers(g).flops.sum()
    split = np.array([1, 1, 1, 1, 0], bool)
    assert r.row("ds", 8).compute_s == pytest.approx(400 * 1e-3 * (share[split].sum() / 4 + share[~split].sum()))


def test_data_filter_all_reduces_the_shard_not_the_full_weights():
    """§9.9: p = 8 = 2 nodes × 4. The conv shards (72 + 144)/4 = 54 weights
    = 216 B ring over the 2 nodes: 2(α + 216/2 β); the dense 640 weights
    = 2560 B over all 8 hierarchically (cheaper than the flat ring):
    reduce-scatter 3(α + 640 β) in the node, 2(α + 320 β) across, all-gather
    3(α + 640 β). The original: full 856·4 B at β·2·p2 (§9.10)."""
    g = tiny_graph()
    r = run(g, ["df"], [8], 8).row("data+filter", 8)
    shard = 2 * (A_INTER + 216 / 2 / BW_INTER)
    hier = 3 * (A_INTRA + 640 / BW_INTRA) + 2 * (A_INTER + 320 / BW_INTER) + 3 * (A_INTRA + 640 / BW_INTRA)
    assert hier < 14 * (A_INTER + 2560 / 8 / BW_INTER)  # the flat ring
    assert r.grad_allreduce_s == pytest.approx(shard + hier)
    c = run(g, ["df"], [8], 8, compat="paradl", lc={"filter": [1, 0, 1, 0, 0]}).row("data+filter", 8)
    assert c.grad_allreduce_s == pytest.approx(2 * (A_INTER + 856 * 4 / 2 / (BW_INTER / 8)))


def test_data_parallel_default_memory_is_the_tr_formula():
    """§4.1 Data: 2δ(b(Σ|x|+Σ|y|) + Σ|w|), ReLU / BN in place (§4.3)."""
    r = run(tiny_graph(), ["data"], [4], 8).row("data", 4)
    assert r.memory_bytes_per_device == 2 * 4 * (8 * 1290 + 856)
    assert r.batch == 32 and r.grad_allreduce_s == pytest.approx(6 * (A_INTRA + 856 * 4 / 4 / BW_INTRA))


# -- pipeline by hand ----------------------------------------------------------------------


def test_balanced_stages():
    cost = np.array([4.0, 1, 1, 1, 1, 4])
    assert balanced_stages(cost, 2).tolist() == [0, 3]  # 6 | 6
    assert balanced_stages(cost, 3).tolist() == [0, 1, 5]  # 4 | 4 | 4
    assert balanced_stages(cost, 6).tolist() == [0, 1, 2, 3, 4, 5]
    with pytest.raises(ValueError, match="non-empty stages"):
        balanced_stages(cost, 7)


def dense_chain(n: int = 4):
    """n dense 8->8 layers, no bias: 4·64 FLOPs for the first (no dL/dx), 6·64
    for the others; the measured time gives 1 µs per FLOP."""
    b = GraphBuilder("chain", (8,))
    x = b.input
    for i in range(n):
        x = b.dense(f"d{i}", x, 8, bias=False)
    return b.build(measured_time_per_sample_s=(256 + 384 * (n - 1)) * 1e-6)


def test_pipeline_by_hand():
    """p = 2, B = 8, S = 4: stages [d0 d1 | d2 d3] (640 vs 768 µs per sample
    beats the other cuts); compute (p+S-1)·(B/S)·768 µs; 2(p+S-2) sends of
    the 8-element boundary at B/S = 2 samples inside one node; memory
    2δ(B(|x|+|y|) + |w|) of a stage; weight update of the heavier stage."""
    r = run(dense_chain(), ["pipeline"], [2], 8, segments=4).row("pipeline", 2)
    assert r.compute_s == pytest.approx(5 * 2 * 768e-6)
    assert r.pipeline_p2p_s == pytest.approx(2 * 4 * (A_INTRA + 2 * 8 * 4 / BW_INTRA))
    assert r.memory_bytes_per_device == 2 * 4 * (8 * 2 * (8 + 8) + 2 * 64)
    assert r.weight_update_s == pytest.approx(3 * 4 * 128 / 1e11)
    assert r.segments == 4 and r.batch == 8 and r.feasible
    assert r.tier_of("pipeline_p2p") == "intra"


def test_pipeline_boundary_carries_skip_connections():
    """A boundary carries every tensor that crosses it: with a residual add
    after c, the cut between c and the add sends both a's and c's outputs."""
    b = GraphBuilder("skip", (8,))
    a = b.dense("a", b.input, 8, bias=False)
    c = b.dense("c", a, 8, bias=False)
    s = b.add("s", [a, c])
    b.dense("d", s, 8, bias=False)
    L = oracle_layers(b.build(measured_time_per_sample_s=1e-3))
    assert L.last_consumer.tolist() == [2, 2, 3, -1]
    starts = np.array([0, 2])
    ctx = oracle_context(L, hardware_from_dict(TINY_HW))
    assert boundary_elements(ctx, starts).tolist() == [16.0]
    assert boundary_elements(oracle_context(L, hardware_from_dict(TINY_HW), compat=True), starts).tolist() == [8.0]


def test_pipeline_across_nodes():
    """8 stages on 2 nodes of 4: the boundary between devices 3 and 4 crosses
    nodes, and the slowest boundary sets every step: 2(p+S-2)(α + (B/S)|y|δβ)."""
    r = run(dense_chain(8), ["pipeline"], [8], 8, segments=8).row("pipeline", 8)
    assert r.pipeline_p2p_s == pytest.approx(2 * 14 * (A_INTER + 1 * 8 * 4 / BW_INTER))
    assert r.tier_of("pipeline_p2p") == "inter"
    assert r.compute_s == pytest.approx(15 * 1 * 384e-6)  # (p+S-1)·(B/S)·max stage


def test_pipeline_limits():
    r = run(dense_chain(), ["pipeline"], [2, 8], 4, segments=8)
    assert "S ≤ B" in r.row("pipeline", 2).limit
    assert "p ≤ G = 4" in r.row("pipeline", 8).limit


# -- limits and bottlenecks -------------------------------------------------------------------


def test_limits():
    g = tiny_graph()
    r = oracle(g, hardware_from_dict(TINY_HW), [8], ["filter", "channel", "spatial", "data"], batch=4)
    assert r.row("filter", 8).limit == "filter limit: p ≤ min F = 4 filters of a split layer"
    assert r.row("channel", 8).limit == "channel limit: p ≤ min C = 4 input channels of a split layer"
    assert r.row("spatial", 8).limit == "spatial limit: p ≤ 4 rows of the narrowest split layer"
    assert r.row("data", 8).limit == "data limit: p ≤ B = 4 samples"
    assert not any(row.feasible for row in r.rows)
    # channel on a layer fed by 2 input channels: ParaDL's masks keep it; the limit then counts it
    c = oracle(g, hardware_from_dict(TINY_HW), [4], ["channel"], batch=4, lc={"channel": [1, 0, 1, 0, 0]})
    assert "min C = 2" in c.row("channel", 4).limit


def test_bottleneck_strings():
    base = dict(strategy="data", batch=64.0, batch_per_device=64.0, data_parallel=1, model_parallel=1,
                segments=None, compute_s=0.38, act_allgather_s=0.0, act_allreduce_s=0.0, halo_s=0.0,
                pipeline_p2p_s=0.0, weight_update_s=0.0, memory_capacity_bytes=16e9, memory_checked=True,
                tiers=(("grad_allreduce", "ib-leaf"),), limit=None)
    ok = StrategyCost(devices=64, grad_allreduce_s=0.62, memory_bytes_per_device=9e9, **base)
    assert bottleneck(ok) == "gradient all-reduce over ib-leaf: 62%"
    big = StrategyCost(devices=512, grad_allreduce_s=0.62, memory_bytes_per_device=17.2e9, **base)
    rows = [ok, StrategyCost(devices=256, grad_allreduce_s=0.6, memory_bytes_per_device=15e9, **base), big]
    assert bottleneck(big, rows) == "out of memory above 256 GPUs: 17.2 GB > 16 GB"
    small = StrategyCost(devices=32, grad_allreduce_s=0.1, memory_bytes_per_device=17.2e9, **base)
    assert bottleneck(small, [small, ok]) == "out of memory below 64 GPUs: 17.2 GB > 16 GB"


@needs_models
def test_fixed_global_batch_runs_out_of_memory_below_a_device_count():
    r = oracle(RESNET, "abci-v100", [2, 4, 8, 16], ["data"], batch=256)
    assert [x.batch_per_device for x in r.rows] == [128, 64, 32, 16]
    mem = 2 * 4 * (128 * (14_971_596 + 14_819_368) + 22_734_016)  # §4.3 at b = 128: 30.69 GB
    assert r.row("data", 2).memory_bytes_per_device == pytest.approx(mem)
    assert r.row("data", 2).bottleneck == "out of memory below 4 GPUs: 30.7 GB > 16 GB"
    assert r.row("data", 4).feasible


def test_lc_parsing_errors():
    L = oracle_layers(tiny_graph())
    assert parse_lc("0 conv1 |1\n1 relu |0\n2 conv2 |1\n3 pool |0\n4 fc|0", L).tolist() == [1, 0, 1, 0, 0]
    assert parse_lc("|1\n|0\n|1\n|0\n|0", L).tolist() == [True, False, True, False, False]
    with pytest.raises(ValueError, match="2 mask lines for 5 layers"):
        parse_lc("|1\n|0", L)
    with pytest.raises(ValueError, match="names 'conv9'"):
        parse_lc("0 conv1 |1\n1 relu |0\n2 conv9 |1\n3 pool |0\n4 fc |0", L)
    with pytest.raises(ValueError, match="not 0 or 1"):
        parse_lc("|1\n|0\n|x\n|0\n|0", L)


@needs_models
def test_report_ranking_by_time_per_sample():
    r = oracle(RESNET, "abci-v100", [64], batch_per_device=64)
    ranked = r.ranking(64)
    feasible = [x for x in ranked if x.feasible]
    assert [x.time_per_sample_s for x in feasible] == sorted(x.time_per_sample_s for x in feasible)
    assert all(not x.feasible for x in ranked[len(feasible):])
    assert r.mode == "default" and r.dataset_size == 1_280_000


# -- CLI ----------------------------------------------------------------------------------------

ROW_KEYS = {"strategy", "devices", "batch", "compute_s", "comm_s", "total_s", "memory_bytes_per_device",
            "feasible", "bottleneck", "grad_allreduce_s", "act_allgather_s", "act_allreduce_s", "halo_s",
            "pipeline_p2p_s", "weight_update_s", "epoch_s", "model", "hardware", "mode"}


def test_cli_json_rows(tmp_path, capsys):
    path = tmp_path / "tiny.json"
    path.write_text(tiny_graph().to_json())
    assert main(["oracle", str(path), "--devices", "2,4", "--hardware", "abci-v100", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 14 and ROW_KEYS <= set(rows[0])
    assert {r["strategy"] for r in rows} == {"data", "spatial", "filter", "channel", "pipeline",
                                              "data+filter", "data+spatial"}


@needs_models
def test_cli_compat_and_rank(capsys):
    argv = ["oracle", str(RESNET), "--devices", "16", "--strategies", "d,df", "--batch-per-device", "64",
            "--compat", "paradl", "--lc", str(MODELS / "filter_resnet.lc"), "--json"]
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["strategy"] for r in rows] == ["data", "data+filter"]
    assert round(rows[0]["total_s"], 4) == 0.2145 and rows[0]["mode"] == "paradl"
    assert main([*argv, "--rank"]) == 0
    ranking = json.loads(capsys.readouterr().out)
    assert [r["rank"] for r in ranking] == [1, 2]


@pytest.mark.parametrize("argv, message", [
    (["--devices", "16,x"], "not a comma-separated list"),
    (["--devices", "16", "--strategies", "data,magic"], "unknown strategy 'magic'"),
    (["--devices", "16", "--batch", "8", "--batch-per-device", "8"], "not allowed with argument"),
    (["--devices", "16", "--compat", "paradl2"], "invalid choice"),
    (["--devices", "16", "--lc", "nowhere.lc"], "cannot tell which strategy"),
    (["--devices", "16", "--lc", "filter_nowhere.lc"], "cannot read"),
    (["--devices", "16", "--segments", "0"], "--segments must be a positive integer"),
])
def test_cli_errors_exit_2_with_one_line(argv, message, capsys):
    assert main(["oracle", "alexnet", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("shardplan: error: ") and message in err and err.count("\n") == 1


def test_cli_lc_length_mismatch(tmp_path, capsys):
    lc = tmp_path / "filter_x.lc"
    lc.write_text("0 CONV |1\n")
    assert main(["oracle", "alexnet", "--devices", "4", "--lc", str(lc)]) == 2
    assert "1 mask lines for" in capsys.readouterr().err


def test_cli_plot_without_matplotlib(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    assert main(["oracle", "alexnet", "--devices", "4", "--plot", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert "shardplan[plot]" in err and err.count("\n") == 1
    assert not (tmp_path / "x.png").exists()


def test_cli_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "oracle.png"
    assert main(["oracle", "alexnet", "--devices", "2,4,8,16", "--plot", str(out), "--json"]) == 0
    capsys.readouterr()
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_other_hardware_and_roofline_compute():
    """Tiers come from the hardware: DGX A100 has 8 GPUs per node on NVSwitch.
    Without a measured time, compute is the roofline at the layer's work."""
    r = oracle("vgg16", load_hardware("dgx-a100"), [8, 16], ["data"], batch_per_device=32)
    assert r.row("data", 8).tier_of("grad_allreduce") == "nvswitch"
    assert r.row("data", 16).tier_of("grad_allreduce") == "ib-hdr"
    ctx = oracle_context(oracle_layers(tiny_graph(None)), hardware_from_dict(TINY_HW))
    assert ctx.per_sample_s is None
    row = oracle_table(ctx, [1], ["data"], batch_per_device=4)[0]
    L = ctx.layers
    # roofline at efficiency 1: max(FLOPs at 1e12, 3δ(|x|+|y|)·b + 4δ|w| bytes at 1e11 B/s)
    flops_s = L.flops * 4 / 1e12
    bytes_s = (3 * 4 * (L.x_elements + L.y_elements) * 4 + 4 * 4 * L.params) / 1e11
    assert row.compute_s == pytest.approx(np.maximum(flops_s, bytes_s).sum(), rel=1e-5)
    assert default_batch_per_device(ctx) == 2 ** int(math.log2((1e9 / 4 / 2 - 856) / 1290))
