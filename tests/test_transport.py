"""The hardware file's ``environment`` section (costmodels/transport.py): each mechanism against numbers computed by hand from its formula
(host-staged MPI messages, all-gather and all-reduce, ChainerMN's leader
all-reduce, contention, shard compute by the device's kernel model), the schema's one-line errors,
an explicit ideal environment equal to none, compat mode ignoring the
environment, and the fidelity scorer on hand-made measurements."""

from __future__ import annotations

import copy
import dataclasses
import json

import numpy as np
import pytest
from builders import tiny_oracle_graph  # noqa: E402
from reference_files import PARADL_MODELS

from costmodels import hardware_from_dict, load_hardware
from costmodels.hardware import preset_names
from costmodels.oracle import oracle_layers
from costmodels.oracle._cost import env_allgather, env_allreduce, env_p2p
from costmodels.transport import (
    contended_bandwidth,
    host_staged_allgather_s,
    host_staged_allreduce_s,
    host_staged_p2p_s,
    leader_allreduce_s,
    pipelined_chain_s,
)
from planner.cli import main
from planner.ir.builder import GraphBuilder
from planner.paradl.fidelity import accuracy, paradl_fidelity
from planner.paradl.report import oracle

A_INTRA, BW_INTRA, A_INTER, BW_INTER = 1e-5, 1e10, 1e-4, 1e9
MSG, COPY, MSG_AR = 2e-3, 1e10, 1e-3

BASE = {
    "schema": "shardplan/hardware", "version": 1, "name": "tiny-env",
    "device": {"peak_flops_per_s": {"float32": 1e12}, "memory_bandwidth_bytes_per_s": 1e11, "memory_bytes": 1e9,
               "efficiency": {"conv": 1.0, "matmul": 1.0, "elementwise": 1.0, "memory": 1.0}},
    "devices_per_node": 4,
    "tiers": [
        {"name": "intra", "max_ranks": 4, "intra_node": True, "latency_s": A_INTRA, "bandwidth_bytes_per_s": BW_INTRA},
        {"name": "leaf", "max_ranks": 16, "intra_node": False, "latency_s": A_INTER, "bandwidth_bytes_per_s": BW_INTER},
        {"name": "spine", "max_ranks": None, "intra_node": False, "latency_s": A_INTER,
         "bandwidth_bytes_per_s": BW_INTER},
    ],
}
ENV = {
    "description": "hand-made",
    "transports": [
        {"name": "nccl", "staging": "device"},
        {"name": "host", "staging": "host", "message_latency_s": MSG, "copy_bandwidth_bytes_per_s": COPY},
        {"name": "host-ar", "staging": "host", "message_latency_s": MSG_AR, "copy_bandwidth_bytes_per_s": COPY},
    ],
    "collectives": {
        "grad_allreduce": {"transport": "nccl", "scheme": "ring"},
        "hybrid_grad_allreduce": {"transport": "host-ar", "scheme": "leader"},
        "halo": {"transport": "host"},
        "spatial_allgather": {"transport": "host"},
    },
    "contention": {"inter_node_links_per_node": 2, "tier_bandwidth_divisor": {"spine": 4.0}},
    "shard_compute": {"kernel_fixed_s": 1e-4},
}


def hw(env=ENV, **top):
    return hardware_from_dict({**copy.deepcopy(BASE), **({"environment": copy.deepcopy(env)} if env else {}), **top})


tiny_graph = tiny_oracle_graph


# -- formulas by hand ------------------------------------------------------------------------


def test_host_staged_p2p():
    """msg + 2m/copy inside a node; + α + m/bw across nodes; empty: nothing."""
    assert host_staged_p2p_s(1e6, 3e-3, 16e9) == pytest.approx(3e-3 + 2e6 / 16e9)
    assert host_staged_p2p_s(1e6, 3e-3, 16e9, 40e-6, 12.5e9) == pytest.approx(3e-3 + 1.25e-4 + 40e-6 + 8e-5)
    assert host_staged_p2p_s(0.0, 3e-3, 16e9) == 0.0


def test_host_staged_allgather():
    """4 ranks of 1 MB in a node: 1e6/16e9 in, 3 steps of 3 ms, 4e6/16e9 out = 9.3125 ms."""
    assert host_staged_allgather_s(4, 1e6, 3e-3, 16e9) == pytest.approx(9.3125e-3)
    assert host_staged_allgather_s(1, 1e6, 3e-3, 16e9) == 0.0


def test_host_staged_allreduce():
    """8 leaders, 8 MB, 1.5 ms per step, 40 us and 12.5 GB/s across nodes:
    2·8e6/16e9 = 1 ms of copies + 14 steps × (1.5 ms + 40 us + 1e6/12.5e9 = 80 us) = 23.68 ms."""
    assert host_staged_allreduce_s(8, 8e6, 1.5e-3, 16e9, 40e-6, 12.5e9) == pytest.approx(23.68e-3)


def test_leader_allreduce_and_chain():
    """Reduce to the leader and broadcast back on a pipelined chain of 4:
    2·(3·9 us + 91e6/50e9) plus the leaders' part."""
    chain = 3 * 9e-6 + 91e6 / 50e9
    assert pipelined_chain_s(4, 91e6, 9e-6, 50e9) == pytest.approx(chain)
    assert leader_allreduce_s(4, 91e6, 9e-6, 50e9, 0.25) == pytest.approx(2 * chain + 0.25)
    assert pipelined_chain_s(1, 91e6, 9e-6, 50e9) == 0.0


def test_contention():
    """12.5 GB/s over a 1:3 spine, 4 flows on 2 links: 12.5/3/2 GB/s; no
    link limit (None): only the over-subscription."""
    assert contended_bandwidth(12.5e9, 3.0, 4, 2) == pytest.approx(12.5e9 / 6)
    assert contended_bandwidth(12.5e9, 3.0, 1, 2) == pytest.approx(12.5e9 / 3)
    assert contended_bandwidth(12.5e9, 1.0, 8, None) == pytest.approx(12.5e9)


# -- the oracle's collectives in an environment -----------------------------------------------


def test_routes_by_kind():
    """halo and spatial all-gather host-staged (inside a node: no network);
    a kind the file does not route takes the first transport (NCCL-style)."""
    h = hw()
    t, label = env_p2p(h, "halo", False, np.array([1e4, 0.0]))
    assert t.tolist() == pytest.approx([MSG + 2e4 / COPY, 0.0]) and label == "host"
    g, label = env_allgather(h, "spatial_allgather", 4, 1e4)
    assert float(g) == pytest.approx(1e4 / COPY + 3 * MSG + 4e4 / COPY)
    g, label = env_allgather(h, "act_allgather", 4, 1e4)
    assert float(g) == pytest.approx(3 * (A_INTRA + 1e4 / BW_INTRA)) and label == "intra"


def test_ring_allreduce_over_an_oversubscribed_tier():
    """32 ranks span the spine (above 16): flat ring 2·31(α + m/32 / (bw/4));
    16 ranks stay on the leaf at full bandwidth."""
    h = hw()
    m = 3.2e7
    t, label = env_allreduce(h, "grad_allreduce", 32, 4, m)
    assert t == pytest.approx(62 * (A_INTER + m / 32 / (BW_INTER / 4))) and label == "spine"
    t, label = env_allreduce(h, "grad_allreduce", 16, 4, m)
    assert t == pytest.approx(30 * (A_INTER + m / 16 / BW_INTER)) and label == "leaf"


def test_leader_allreduce_in_the_oracle():
    """ChainerMN's hierarchical: 8 ranks = 2 nodes of 4, 4 MB: reduce and
    broadcast on the intra tier, 2(3α + m/bw); the two leaders' host-staged
    ring: 2m/copy + 2·(1 ms + α + m/2/bw) (one flow per node: no link
    limit); one node only: reduce and broadcast alone."""
    h = hw()
    m = 4e6
    chain = 3 * A_INTRA + m / BW_INTRA
    leaders = 2 * m / COPY + 2 * (MSG_AR + A_INTER + m / 2 / BW_INTER)
    t, label = env_allreduce(h, "hybrid_grad_allreduce", 8, 4, m)
    assert t == pytest.approx(2 * chain + leaders) and label == "host-ar (leaf)"
    t, _ = env_allreduce(h, "hybrid_grad_allreduce", 4, 4, m)
    assert t == pytest.approx(2 * chain)


def test_concurrent_shard_allreduces_share_the_links():
    """p2 = 4 shard rings across 2 nodes leave each node at once on 2 links:
    each ring gets half the leaf bandwidth: 2·(α + m/2 / (bw/2))."""
    env = {**ENV, "collectives": {"hybrid_grad_allreduce": {"transport": "nccl", "scheme": "cheapest"}}}
    t, _ = env_allreduce(hw(env), "hybrid_grad_allreduce", 2, 1, 1e6, concurrent=4)
    assert t == pytest.approx(2 * (A_INTER + 1e6 / 2 / (BW_INTER / 2)))


def test_data_spatial_halo_and_gather_host_staged():
    """ds on one node (p = 4), b = 8, δ = 4: the split layers' halo rows
    (test_oracle: conv1 x 512 B, y 1024 B; conv2 1024 B both; one row from
    each neighbour) each a host-staged message msg + 2m/copy; the pooled
    output (64 per sample) gathered over the host: b·64·4/4 B per rank."""
    r = oracle(tiny_graph(), hw(), [4], ["ds"], batch_per_device=8).row("ds", 4)
    msg = lambda m: MSG + 2 * m / COPY  # noqa: E731
    assert r.halo_s == pytest.approx(2 * msg(512) + 2 * msg(1024) + 2 * msg(1024) + 2 * msg(1024))
    per_rank = 8 * 64 * 4 / 4
    assert r.act_allgather_s == pytest.approx(per_rank / COPY + 3 * MSG + 4 * per_rank / COPY)
    assert r.tier_of("halo") == "host"


def test_shard_compute_fixed_cost_and_ideal_split():
    """filter over p = 2 on b = 8 with 1 ms per sample spread by FLOP share, on
    a device without a kernel block: each conv costs half of itself, the
    rest whole; plus 0.1 ms per pass: 3 passes for conv1, conv2, fc, 2 for
    relu, pool."""
    g = tiny_graph()
    L = oracle_layers(g)
    share = L.flops / L.flops.sum()
    conv = np.isin(np.asarray(L.names), ["conv1", "conv2"])
    want = 8e-3 * (0.5 * share[conv].sum() + share[~conv].sum()) + (3 * 3 + 2 * 2) * 1e-4
    assert oracle(g, hw(), [2], ["filter"], batch_per_device=8).row("filter", 2).compute_s == pytest.approx(want)


@pytest.mark.slow
def test_shard_compute_follows_the_kernel_model():
    """With a kernel block of 64-wide tiles (and memory too fast to matter), a
    64 -> 64 conv split by filter over 2 runs its forward and backward-weight
    GEMMs (N = f = 32, padded to 64) at full cost and its backward-data GEMM
    (N = c = 64) at half: (1 + 1/2 + 1) / 3 of the layer's measured time."""
    from costmodels.oracle._layers import kernel_model_fraction

    b = GraphBuilder("wide", (64, 16, 16))
    x = b.relu("pre", b.input)
    b.conv("conv", x, 64, 3)
    g = b.build()
    d = copy.deepcopy(BASE)
    d["device"]["memory_bandwidth_bytes_per_s"] = 1e18
    d["device"]["kernel"] = {"channel_tile": 64}
    L = oracle_layers(g)
    i = list(L.names).index("conv")
    a = L.arrays
    fl = [float(a.flops_fwd[i]), float(a.flops_bwd_data[i]), float(a.flops_bwd_weight[i])]
    frac = kernel_model_fraction(L, hardware_from_dict(d), 8.0, np.full(L.n, 2.0), "filter")
    assert frac[i] == pytest.approx((fl[0] + fl[1] / 2 + fl[2]) / sum(fl), rel=1e-5)
    # and the oracle uses it: filter over 2 costs the conv that share of its measured time
    per = 1e-3
    g2 = dataclasses.replace(g, measured_time_per_sample_s=per)
    share = L.flops / L.flops.sum()
    r = oracle(g2, hardware_from_dict(d), [2], ["filter"], batch_per_device=8)
    want = 8 * per * (share[i] * frac[i] + share[1 - i])
    assert r.row("filter", 2).compute_s == pytest.approx(want, rel=1e-5)


def test_explicit_ideal_environment_equals_none():
    """An environment of one NCCL-style transport, no contention and no shard
    costs is ParaDL's ideal network: every row as without the section."""
    ideal = {"transports": [{"name": "nccl", "staging": "device"}]}
    devices, kw = [1, 2, 4, 8, 16], dict(batch_per_device=8)
    a = oracle(tiny_graph(), hw(None), devices, **kw).rows
    b = oracle(tiny_graph(), hw(ideal), devices, **kw).rows
    for x, y in zip(a, b, strict=True):
        assert x.total_s == pytest.approx(y.total_s, rel=1e-6), (x.strategy, x.devices)
        assert x.bottleneck == y.bottleneck


def test_compat_ignores_the_environment():
    """Compat reproduces the original code (paradl.md §7.2): the environment
    preset gives it the same numbers as abci-v100."""
    g = tiny_graph()
    a = oracle(g, "abci-v100", [4, 8, 16], batch_per_device=8, compat="paradl").rows
    b = oracle(g, "abci-v100-chainermn", [4, 8, 16], batch_per_device=8, compat="paradl").rows
    assert [r.total_s for r in a] == [r.total_s for r in b]


# -- schema ------------------------------------------------------------------------------------


@pytest.mark.parametrize("patch, message", [
    ({"transports": []}, "transports must be a non-empty list"),
    ({"transports": [{"name": "h", "staging": "host"}]}, "needs copy_bandwidth_bytes_per_s"),
    ({"transports": [{"name": "d", "staging": "device", "copy_bandwidth_bytes_per_s": 1e10}]},
     "only for staging"),
    ({"transports": [{"name": "d", "staging": "gpu"}]}, "staging must be one of device, host"),
    ({"transports": [{"name": "d", "staging": "device"}, {"name": "d", "staging": "device"}]}, "given twice"),
    ({"transports": [{"name": "d", "staging": "device", "latency_us": 3}]}, "unknown field(s) latency_us"),
    ({"transports": [{"name": "d", "staging": "device", "message_latency_s": 3}]}, "message_latency_s = 3"),
    ({"collectives": {"halo": {"transport": "mpi"}}}, "'mpi' is not a transport of this file"),
    ({"collectives": {"gradients": {"transport": "nccl"}}}, "unknown kind 'gradients'"),
    ({"collectives": {"grad_allreduce": {"transport": "nccl", "scheme": "tree"}}}, "scheme must be one of"),
    ({"collectives": {"halo": {"transport": "nccl", "scheme": "ring"}}}, "unknown field(s) scheme"),
    ({"contention": {"tier_bandwidth_divisor": {"core": 3}}}, "names tier 'core'"),
    ({"contention": {"tier_bandwidth_divisor": {"spine": 0.5}}}, "spine = 0.5 is outside [1, inf]"),
    ({"contention": {"inter_node_links_per_node": 1.5}}, "must be a positive integer or null"),
    ({"shard_compute": {"kernel_fixed_s": 60}}, "kernel_fixed_s = 60"),
    ({"shard_compute": {"half_efficiency_channels": 4}}, "unknown field"),
    ({"network": {}}, "unknown field(s) network"),
])
def test_environment_errors_are_one_line(patch, message):
    env = {**copy.deepcopy(ENV), **patch}
    with pytest.raises(ValueError) as e:
        hw(env)
    assert message in str(e.value) and "\n" not in str(e.value)
    assert str(e.value).startswith("hardware: environment")


def test_environment_round_trips_and_is_optional():
    h = hw()
    assert hardware_from_dict(json.loads(json.dumps(h.to_dict()))) == h
    assert hw(None).environment is None and "environment" not in hw(None).to_dict()


def test_chainermn_preset_is_listed_and_sourced(capsys):
    assert "abci-v100-chainermn" in preset_names()
    h = load_hardware("abci-v100-chainermn")
    assert h.tiers == load_hardware("abci-v100").tiers  # the same machine (paradl.md §3.2), plus its environment
    assert h.environment.route("halo")[0].staging == "host"
    assert any("FITTED" in s for s in h.sources)
    assert main(["hardware", "--json"]) == 0
    assert "abci-v100-chainermn" in capsys.readouterr().out


# -- fidelity scoring --------------------------------------------------------------------------


def test_accuracy_is_symmetric():
    assert accuracy([0.5, 2.0, 1.0], [1.0, 1.0, 1.0]).tolist() == [0.5, 0.5, 1.0]
    with pytest.raises(ValueError, match="one per point"):
        accuracy([1.0], [1.0, 2.0])


def test_fidelity_on_hand_made_measurements():
    """A made-up series of ResNet-50 data parallelism: the original's
    accuracy from the given numbers by hand; compat mode reproduces §6's
    0.2145 s at p = 16 (paradl.md §6)."""
    if not (PARADL_MODELS / "RESNET50_ImageNet_profall.net_sc").is_file():
        pytest.skip(f"ParaDL model files not found under {PARADL_MODELS}")
    data = {"series": [{"model": "resnet50", "net": "RESNET50_ImageNet_profall.net_sc", "strategy": "data",
                        "per_unit": 64, "devices": [16, 32], "emp": [0.25, 0.2],
                        "original_oracle_pred": [0.2, 0.25]}]}
    r = paradl_fidelity(data, models_dir=PARADL_MODELS)
    (s,) = r.series
    assert s.accuracy("original") == pytest.approx(0.8)  # (0.2/0.25 + 0.2/0.25) / 2
    assert round(s.compat_s[0], 4) == 0.2145
    assert r.mean("original", model="resnet50") == pytest.approx(0.8)
    assert set(r.to_dict()["mean"]["resnet50"]) == {"default", "compat", "original"}
    with pytest.raises(ValueError, match="models_dir"):
        paradl_fidelity(data)
