"""The kernel-by-kernel compute model (costmodels/compute.py): each mechanism
against numbers computed by hand, gradients against finite differences, and
one compilation per bucket."""

from __future__ import annotations

import copy
import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from costmodels import (
    CostSettings,
    cost_table,
    hardware_arrays,
    hardware_from_dict,
    load_hardware,
)
from costmodels.compute import kernel_s
from costmodels.strategies import Strategy
from planner import GraphBuilder

H200 = load_hardware("h200")


def _hw(**kernel):
    """A made-up device: 100 TFLOP/s fp32, 400 TF32, 800 bf16, 1 TB/s, efficiencies 1."""
    d = {
        "schema": "shardplan/hardware", "version": 1, "name": "toy",
        "device": {"peak_flops_per_s": {"float32": 100e12, "tf32": 400e12, "bfloat16": 800e12},
                   "memory_bandwidth_bytes_per_s": 1e12, "memory_bytes": 16e9,
                   "kernel": kernel},
        "devices_per_node": 8,
        "tiers": [{"name": "net", "max_ranks": None, "intra_node": False, "latency_s": 1e-6,
                   "bandwidth_bytes_per_s": 10e9}],
    }
    return hardware_from_dict(d)


def _conv_graph(c=64, f=64, hw_=16):
    b = GraphBuilder("one-conv", (c, hw_, hw_))
    x = b.elementwise("identity", b.input)  # so the conv computes its input gradient too
    b.conv("conv", x, f, 3, bias=False)
    return b.build()


def test_float32_runs_as_tf32_at_jax_default_precision():
    hw = _hw()
    assert float(hardware_arrays(hw, "float32").peak_flops_per_s) == pytest.approx(400e12)  # TF32 tensor cores
    assert float(hardware_arrays(hw, "bfloat16").peak_flops_per_s) == pytest.approx(800e12)
    highest = dataclasses.replace(hw, device=dataclasses.replace(hw.device, matmul_precision="highest"))
    assert float(hardware_arrays(highest, "float32").peak_flops_per_s) == pytest.approx(100e12)  # true float32
    assert float(hardware_arrays(hw, "float32").vector_peak_flops_per_s) == pytest.approx(100e12)  # element-wise stays fp32
    # per-math-mode efficiency: tf32 falls back to the float32 entry, then to 1
    d = copy.deepcopy(hw.to_dict())
    d["device"]["efficiency"] = {"conv": {"float32": 0.3}}
    assert float(hardware_arrays(hardware_from_dict(d), "float32").efficiency[0]) == pytest.approx(0.3)
    assert float(hardware_arrays(hardware_from_dict(d), "bfloat16").efficiency[0]) == 1.0


def test_one_kernel_by_hand():
    """2 GFLOP GEMM of 1000 x 40 outputs, K = 20, 10 MB moved, tiles 64 / 8,
    saturation 1e5 output elements, p = 2, 5 us launch."""
    hw = hardware_arrays(_hw(launch_s=5e-6, channel_tile=64, reduction_tile=8,
                             saturation_output_elements=1e5, compute_memory_exponent=2.0))
    n_pad, k_pad = 64 / 40, 24 / 20
    out = 1000 * 64
    sat = out / (out + 1e5)
    tc = 2e9 * n_pad * k_pad / (400e12 * sat)
    tm = 10e6 / 1e12
    want = 5e-6 + math.sqrt(tc**2 + tm**2)
    got = kernel_s(hw, jnp.float32(2e9), 1000.0, 40.0, 20.0, 10e6, hw.peak_flops_per_s, 1.0)
    assert float(got) == pytest.approx(want, rel=1e-5)
    # p = 1 adds; p = null is the max; no FLOPs and no bytes is no kernel at all
    add = hardware_arrays(_hw(compute_memory_exponent=1.0))
    mx = hardware_arrays(_hw())
    tc0 = 2e9 / 400e12
    assert float(kernel_s(add, 2e9, 1000.0, 40.0, 20.0, 10e6, add.peak_flops_per_s, 1.0)) == pytest.approx(tc0 + tm, rel=1e-5)
    assert float(kernel_s(mx, 2e9, 1000.0, 40.0, 20.0, 10e6, mx.peak_flops_per_s, 1.0)) == pytest.approx(max(tc0, tm), rel=1e-5)
    assert float(kernel_s(hw, 0.0, 0.0, 0.0, 0.0, 0.0, hw.peak_flops_per_s, 1.0)) == 0.0


def test_conv_shard_by_hand_with_tiles():
    """A 64 -> 64 3x3 conv on 16x16, batch 8, split by filter over m = 8: each
    device computes 8 output channels, padded to a 64-wide tile in the forward
    and backward-weight GEMMs (N = f), not in backward-data (N = c = 64).
    Launch 1 us, no saturation, max(compute, memory)."""
    hw = _hw(launch_s=1e-6, channel_tile=64)
    g = _conv_graph()
    t = cost_table(g.arrays, hardware_arrays(hw), 8.0, 1.0, 8.0)
    conv = list(g.names).index("conv")
    # per-sample FLOPs of each pass as the IR counts them (XLA's padding-aware count,
    # checked against XLA in test_graph/test_zoo): the shard does 8 samples x 1/8 of them
    a = g.arrays
    fwd_fl, dat_fl, wgt_fl = (float(x[conv]) for x in (a.flops_fwd, a.flops_bwd_data, a.flops_bwd_weight))
    moved = 4 * (8 * 64 * 256 + 64 * 9 * 8 + 8 * 8 * 256)  # x, w, y of the shard
    tm = moved / 1e12
    fwd = 1e-6 + max(fwd_fl * 8 / 400e12, tm)  # 8 samples x 1/8 of the FLOPs, N = 8 padded to 64: x 8
    bwd_data = 1e-6 + max(dat_fl / 400e12, tm)  # N = c = 64: no padding
    bwd_weight = 1e-6 + max(wgt_fl * 8 / 400e12, tm)  # N = f = 8 padded to 64
    assert float(t.compute_s[conv, Strategy.FILTER]) == pytest.approx(fwd + bwd_data + bwd_weight, rel=1e-5)
    assert float(t.backward_compute_s[conv, Strategy.FILTER]) == pytest.approx(bwd_data + bwd_weight, rel=1e-5)
    # data over the same 8 devices: 1 sample, all 64 channels, no padding
    moved_d = 4 * (64 * 256 + 64 * 9 * 64 + 64 * 256)
    want = sum(1e-6 + max(fl / 400e12, moved_d / 1e12) for fl in (fwd_fl, dat_fl, wgt_fl))
    t_data = cost_table(g.arrays, hardware_arrays(hw), 8.0, 8.0, 1.0)
    assert float(t_data.compute_s[conv, Strategy.DATA]) == pytest.approx(want, rel=1e-5)


def test_conv_library_calls_and_layout_transposes_by_hand():
    """conv_call_s is paid once per convolution kernel (3 here), never by a
    dense layer; a channels-first math mode transposes x, w (forward), dx
    (backward-data) and dw (backward-weight), each a memory-bound kernel
    reading and writing its elements once; channels-last only w and dw."""
    g = _conv_graph()
    conv = list(g.names).index("conv")
    base = _hw(launch_s=1e-6)
    t0 = float(cost_table(g.arrays, hardware_arrays(base), 8.0, 1.0, 1.0).compute_s[conv, Strategy.DATA])
    called = _hw(launch_s=1e-6, conv_call_s=2e-5)
    t1 = float(cost_table(g.arrays, hardware_arrays(called), 8.0, 1.0, 1.0).compute_s[conv, Strategy.DATA])
    assert t1 - t0 == pytest.approx(3 * 2e-5, rel=1e-4)
    x_bytes, w_bytes = 4.0 * 8 * 64 * 256, 4.0 * 64 * 9 * 64  # float32 x of 8 samples, 3x3 64 -> 64 weights
    copy = lambda n: 1e-6 + 2.0 * n / 1e12  # noqa: E731  (launch + read and write at 1 TB/s)
    first = _hw(launch_s=1e-6, conv_layout={"tf32": "channels_first"})
    t2 = float(cost_table(g.arrays, hardware_arrays(first), 8.0, 1.0, 1.0).compute_s[conv, Strategy.DATA])
    assert t2 - t0 == pytest.approx(2 * copy(x_bytes) + 2 * copy(w_bytes), rel=1e-4)
    last = _hw(launch_s=1e-6, conv_layout={"tf32": "channels_last"})
    t3 = float(cost_table(g.arrays, hardware_arrays(last), 8.0, 1.0, 1.0).compute_s[conv, Strategy.DATA])
    assert t3 - t0 == pytest.approx(2 * copy(w_bytes), rel=1e-4)
    # bfloat16 is not listed: nothing converted
    t4 = cost_table(g.arrays, hardware_arrays(first, "bfloat16"), 8.0, 1.0, 1.0, CostSettings(dtype="bfloat16"))
    t5 = cost_table(g.arrays, hardware_arrays(base, "bfloat16"), 8.0, 1.0, 1.0, CostSettings(dtype="bfloat16"))
    assert float(t4.compute_s[conv, 0]) == pytest.approx(float(t5.compute_s[conv, 0]), rel=1e-6)
    # a dense layer pays neither
    d = GraphBuilder("one-dense", (256,))
    d.dense("fc", d.elementwise("identity", d.input), 128, bias=False)
    dg = d.build()
    fc = list(dg.names).index("fc")
    both = _hw(launch_s=1e-6, conv_call_s=2e-5, conv_layout={"tf32": "channels_first"})
    td = [float(cost_table(dg.arrays, hardware_arrays(h), 8.0, 1.0, 1.0).compute_s[fc, 0]) for h in (base, both)]
    assert td[0] == td[1]


def test_spatial_shard_reads_its_halo_rows():
    """Spatial over m = 4 on 16 rows: 4 output rows per device, reading 4 + 2 input rows."""
    hw = _hw()
    g = _conv_graph(c=8, f=8)
    t = cost_table(g.arrays, hardware_arrays(hw), 2.0, 1.0, 4.0)
    conv = list(g.names).index("conv")
    x, w, y = 2 * 8 * 6 * 16, 8 * 9 * 8, 2 * 8 * 4 * 16
    tm = 4 * (x + w + y) / 1e12
    # per pass: 2 samples x the 4 of 16 output rows the shard owns
    a = g.arrays
    fls = [float(x[conv]) * 2 * 4 / 16 for x in (a.flops_fwd, a.flops_bwd_data, a.flops_bwd_weight)]
    assert float(t.compute_s[conv, Strategy.SPATIAL]) == pytest.approx(sum(max(fl / 400e12, tm) for fl in fls), rel=1e-5)


def test_elementwise_layer_is_two_memory_bound_kernels():
    """ReLU over y: forward reads x and writes y, backward reads dy and x and writes dx."""
    hw = _hw(launch_s=2e-6)
    g = _conv_graph(c=8, f=8)
    t = cost_table(g.arrays, hardware_arrays(hw), 4.0, 1.0, 1.0)
    ident = list(g.names).index("identity")
    el = 4 * 8 * 16 * 16
    want = (2e-6 + 4 * 2 * el / 1e12) + (2e-6 + 4 * 3 * el / 1e12)
    assert float(t.compute_s[ident, Strategy.DATA]) == pytest.approx(want, rel=1e-5)


def test_bfloat16_moves_half_the_bytes():
    hw = _hw()
    g = _conv_graph(c=8, f=8)
    ident = list(g.names).index("identity")
    t32 = cost_table(g.arrays, hardware_arrays(hw, "float32"), 4.0, 1.0, 1.0, CostSettings(dtype="float32"))
    t16 = cost_table(g.arrays, hardware_arrays(hw, "bfloat16"), 4.0, 1.0, 1.0, CostSettings(dtype="bfloat16"))
    assert float(t16.compute_s[ident, 0]) == pytest.approx(float(t32.compute_s[ident, 0]) / 2, rel=1e-5)


@pytest.mark.slow
def test_gradients_match_finite_differences():
    """d time / d (FLOPs, bytes, saturation, exponent, launch) of one kernel, and of
    the whole table's total w.r.t. the hardware arrays."""
    base = hardware_arrays(_hw(launch_s=5e-6, channel_tile=64, reduction_tile=8,
                               saturation_output_elements=1e5, compute_memory_exponent=2.0))

    def f(theta):
        hw = base._replace(saturation_output_elements=theta[2], compute_memory_exponent=theta[3], launch_s=theta[4])
        return kernel_s(hw, theta[0], 1000.0, 40.0, 20.0, theta[1], hw.peak_flops_per_s, 1.0) * 1e3

    theta = jnp.asarray([2e9, 3e6, 1e5, 2.0, 5e-6], jnp.float64 if jax.config.jax_enable_x64 else jnp.float32)
    grad = np.asarray(jax.grad(f)(theta))
    for i, h in enumerate([2e7, 3e4, 1e3, 1e-2, 1e-7]):
        e = np.zeros(5)
        e[i] = h
        fd = (float(f(theta + e)) - float(f(theta - e))) / (2 * h)
        assert grad[i] == pytest.approx(fd, rel=2e-2, abs=1e-9), i
    # through the table: d total / d efficiency[conv] is finite and negative
    g = _conv_graph()
    hwa = hardware_arrays(H200)

    def total(e):
        t = cost_table(g.arrays, hwa._replace(efficiency=hwa.efficiency.at[0].set(e)), 64.0, 1.0, 8.0)
        return jnp.sum(t.compute_s)

    e0 = float(hwa.efficiency[0])
    dg = float(jax.grad(total)(e0))
    fd = (float(total(e0 + 1e-3)) - float(total(e0 - 1e-3))) / 2e-3
    assert np.isfinite(dg) and dg < 0 and dg == pytest.approx(fd, rel=2e-2)


def test_cost_table_compiles_once_per_bucket():
    """Two different graphs of one bucket size share one compilation of cost_table."""
    g1 = _conv_graph(c=16, f=32)
    g2 = _conv_graph(c=32, f=64, hw_=8)
    assert g1.arrays.mask.shape == g2.arrays.mask.shape
    hwa = hardware_arrays(H200)
    before = cost_table._cache_size()
    cost_table(g1.arrays, hwa, 64.0, 2.0, 4.0)
    mid = cost_table._cache_size()
    cost_table(g2.arrays, hwa, 32.0, 4.0, 2.0)
    assert cost_table._cache_size() == mid <= before + 1


@pytest.mark.parametrize("kernel, message", [
    ({"channel_tile": 6.5}, "whole number"),
    ({"compute_memory_exponent": 0.5}, "at least 1"),
    ({"launch_s": 5}, "implausibly large"),
    ({"tile": 64}, "unknown field"),
    ({"saturation_output_elements": -1}, "non-negative"),
    ({"conv_layout": {"tf32": "nhwc"}}, "expected one of channels_first, channels_last"),
    ({"conv_layout": ["tf32"]}, "must map math modes"),
    ({"conv_call_s": 3}, "implausibly large"),
])
def test_bad_kernel_block_rejected(kernel, message):
    with pytest.raises(ValueError, match=message):
        _hw(**kernel)


def test_bad_matmul_precision_rejected():
    d = _hw().to_dict()
    d["device"]["matmul_precision"] = "tensorfloat32"
    with pytest.raises(ValueError, match="default, high, highest"):
        hardware_from_dict(d)


def test_hardware_round_trips_with_kernel_block():
    assert hardware_from_dict(H200.to_dict()) == H200
