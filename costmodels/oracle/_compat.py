"""``compat="paradl"``: the original oracle code's formulas (ParaDL §4.3,
§4.4, §4.6-§4.9), quirks included, so that its outputs (§6, §7.2) come out
again. Per iteration = the original's per-epoch number / ceil(D/B), exactly
what its "ITER TIME" lines print, ceil rounding artefacts included.

Kept on purpose (each is corrected in the default mode, docs/oracle.md):
filter/channel weights divided by p² in memory (§9.3); the pure-spatial halo
of W·⌊(K-1)/2⌋·b_max·δ (§9.4); ⌊(K-1)/2⌋ = 0 for K = 2, latency still paid
(§9.5); ds summing layers up to the split only and never checking memory
(§9.6); ds's local all-reduce on NVLink through swapped arguments (§9.7);
the FLOP formula of §4.10 (§9.8); the hybrids' full-Σ|w| inter-node
all-reduce (§9.9); the contention divisors (§9.10); no weight update (§9.2);
spatial and ds halo / all-gather over MPI without GPUDirect (§3.2).

The network values the original hard-codes beyond the hardware's tiers are
data, in :data:`PARADL_COMPAT`.
"""

from __future__ import annotations

import math

import numpy as np

from costmodels.collectives import allgather_s, ring_allreduce_s
from costmodels.oracle._cost import OracleContext, StrategyCost, Tier, cost_row, f, tier

__all__ = ["PARADL_COMPAT", "data", "data_filter", "data_spatial", "filter_or_channel", "host_tier", "spatial"]

# ParaDL §3.2: get_network_factor(GPUDIRECT=False) and the contention
# factors of analysis_hybrid_df / analysis_hybrid_ds; §2, §4.10 NODE_SPEED.
PARADL_COMPAT = {
    "bytes_per_item": 4.0,  # δ, fp32
    "node_speed_flops_per_s": 7.8e12,  # GPU_SPEED / NODE_SPEED: V100 FP64, used only without a measured time
    "no_gpudirect_tiers": (  # MPI through the host; above the last max_ranks the GPUDirect tiers apply
        {"name": "pcie-host", "max_ranks": 4, "latency_s": 3.00011e-3,  # PLX_CABLE_LAT2 + PLX_LAT
         "bandwidth_bytes_per_s": 16e9},  # PLX_BW
        {"name": "ib-leaf-host", "max_ranks": 68, "latency_s": 80.53e-6,  # 4(PLX_CABLE + PLX) + LEAF
         "bandwidth_bytes_per_s": 12.5e9},  # min(INTER_LINK_BW, PLX_BW)
    ),
    "hybrid_inter_node_divisor_per_p2": 2.0,  # df / ds inter-node all-reduce: bandwidth / (2·p2)
    "ds_halo_divisor_per_p2": 2.0,  # ds halo: PCIe bandwidth / (2·p2)
    "ds_allgather_divisor": 2.0,  # ds all-gather: PCIe bandwidth / 2
}


def host_tier(ctx: OracleContext, ranks: int) -> Tier:
    """get_network_factor(..., GPUDIRECT=False) (§3.2)."""
    for t in PARADL_COMPAT["no_gpudirect_tiers"]:
        if ranks <= t["max_ranks"]:
            return Tier(t["name"], t["latency_s"], t["bandwidth_bytes_per_s"])
    return tier(ctx.hardware, ranks)


def _div(t: Tier, by: float) -> Tier:
    return Tier(t.name, t.latency_s, t.bandwidth_bytes_per_s / by)


def _totals(ctx: OracleContext) -> tuple[float, float, float]:
    """Σ|x|, Σ|y| without ReLU / BN (summary_network2, §4.3) and Σ|w|."""
    L = ctx.layers
    keep = ~L.inplace
    return float(L.x_elements[keep].sum()), float(L.y_elements[keep].sum()), float(L.params.sum())


def _iter_samples(ctx: OracleContext, per_epoch, B: float, without_d: float) -> float:
    """Samples a device computes per printed iteration: the original's epoch
    count ceil(per_epoch(D)) divided by ceil(D/B) iterations (§4.3's ceil
    artefacts); ``without_d`` when the data-set size is unknown."""
    D = ctx.dataset_size
    return math.ceil(per_epoch(D)) / math.ceil(D / B) if D else without_d


def data(ctx: OracleContext, p: int, b: float) -> StrategyCost:
    """analysis_data (§4.3)."""
    X, Y, W = _totals(ctx)
    d = ctx.bytes_per_item
    B = b * p
    T = float(ctx.per_sample_s.sum())
    comp = _iter_samples(ctx, lambda D: D / p, B, b) * T  # ceil(D/p)·t / ceil(D/B): 0.1950 at p ≥ 512 (§4.3)
    t = tier(ctx.hardware, p)
    grad = f(ring_allreduce_s(p, W * d, t.latency_s, t.bandwidth_bytes_per_s))  # 2(p-1)(α + Σ|w|δβ/p)
    limit = None if b >= 1 else f"data limit: p ≤ B = {B:g} samples"
    return cost_row(ctx, "data", p, B, b, p, 1, compute_s=comp, grad_allreduce_s=grad,
                    memory_bytes_per_device=2 * d * (b * (X + Y) + W),  # §4.3
                    tiers=(("grad_allreduce", t.name),), limit=limit)


def _filter_comm(ctx: OracleContext, active: np.ndarray, n: int, b: float, t: Tier) -> tuple[float, float]:
    """core_analysis_filter: (n-1)(α·G_a + b·Σ|y|δβ/n) all-gather and twice
    that all-reduce, over the active layers, the last one left out if active (§4.6)."""
    L = ctx.layers
    a = active.copy()
    a[-1] = False  # activeLayer_totalOutExceptLast and activeLayer_count - 1
    y = L.y_elements[a]
    per_layer = allgather_s(float(n), b * y * ctx.bytes_per_item / n, t.latency_s, t.bandwidth_bytes_per_s)
    ag = f(np.sum(np.asarray(per_layer, np.float64)))
    return ag, 2.0 * ag


def _split_weights_comp(ctx: OracleContext, active: np.ndarray, n: int) -> tuple[float, float]:
    L = ctx.layers
    w = float(L.params[active].sum() / n + L.params[~active].sum())
    c = float(ctx.per_sample_s[active].sum() / n + ctx.per_sample_s[~active].sum())
    return w, c


def filter_or_channel(ctx: OracleContext, p: int, b: float, strategy: str) -> StrategyCost:
    """core_analysis_filter / core_analysis_channel, case filter3 / chan3:
    B = b fixed (§4.6, §4.7); memory divides the weights by p twice (§9.3)."""
    L = ctx.layers
    X, Y, _ = _totals(ctx)
    d = ctx.bytes_per_item
    a = ctx.masks["filter" if strategy == "filter" else "channel"]
    B = b
    w_split, comp = _split_weights_comp(ctx, a, p)
    t = tier(ctx.hardware, p)
    ag, ar = _filter_comm(ctx, a, p, b, t)
    if strategy == "filter":
        bound = L.out_channels[a].min() if a.any() else math.inf  # minFilter
        limit = None if p <= bound else f"filter limit: p ≤ min F = {bound:g} filters of a split layer"
    else:
        first = a.copy()
        first[0] = False  # minChannel skips layer 0 (§4.7)
        bound = L.in_channels[first].min() if first.any() else math.inf
        limit = None if p <= bound else f"channel limit: p ≤ min C = {bound:g} channels of a split layer"
    return cost_row(ctx, strategy, p, B, b, 1, p, compute_s=b * comp, act_allgather_s=ag, act_allreduce_s=ar,
                    memory_bytes_per_device=2 * d * (B * (X + Y) + w_split / p),  # Σw'/p: p² (§9.3)
                    tiers=(("act_allgather", t.name), ("act_allreduce", t.name)), limit=limit)


def _spatial_sums(ctx: OracleContext, active: np.ndarray, n: int, upto: int) -> tuple[float, float, float]:
    """Σ over layers 0..upto, ReLU / BN included, of ceil(|x|/n) (active) or |x|,
    same for |y|, and the per-sample compute with active layers / n (§4.4, §4.9)."""
    L = ctx.layers
    sl = slice(0, upto + 1)
    a = active[sl]
    x = np.where(a, np.ceil(L.x_elements[sl] / n), L.x_elements[sl]).sum()
    y = np.where(a, np.ceil(L.y_elements[sl] / n), L.y_elements[sl]).sum()
    c = np.where(a, ctx.per_sample_s[sl] / n, ctx.per_sample_s[sl]).sum()
    return float(x), float(y), float(c)


def _width_limit(ctx: OracleContext, active: np.ndarray) -> tuple[float, int]:
    xw, yw = ctx.layers.width()
    if not active.any():
        return 0.0, -1
    return float(min(xw[active].min(), yw[active].min())), int(np.flatnonzero(active)[-1])


def spatial(ctx: OracleContext, p: int, b: float) -> StrategyCost:
    """analysis_spatial (§4.4): W split, halo W·⌊(K-1)/2⌋·b_max·δ (§9.4),
    GPUDIRECT=False for halo, all-gather and all-reduce alike."""
    L = ctx.layers
    d = ctx.bytes_per_item
    W = float(L.params.sum())
    a = ctx.masks["spatial"]
    min_w, split = _width_limit(ctx, a)
    B = b
    if split < 0:
        return cost_row(ctx, "spatial", p, B, b, 1, p, limit="spatial limit: no layer is spatially split")
    x_sum, y_sum, comp = _spatial_sums(ctx, a, p, L.n - 1)
    b_max = (ctx.capacity_bytes / d / 2 - W) / (x_sum + y_sum)  # maxSamplePerNode, unrounded
    t = host_tier(ctx, p)
    kw = ctx.layers.kernel_w()
    xw, yw = L.width()
    rows = np.floor((kw - 1) / 2)
    halo_layers = (np.arange(L.n) <= split) & (kw > 1) & a
    per_layer = 2 * (t.latency_s + yw * rows * b_max * d / t.bandwidth_bytes_per_s) + 2 * (
        t.latency_s + xw * rows * b_max * d / t.bandwidth_bytes_per_s)  # halo(y) + halo(dL/dx), §4.4
    halo = float(per_layer[halo_layers].sum())
    D = ctx.dataset_size
    ag = 2 * f(allgather_s(float(p), B * L.y_elements[split] * d / p, t.latency_s, t.bandwidth_bytes_per_s))
    ratio = (D / B) / math.ceil(D / B) if D else 1.0  # its all-reduce uses D/B, not ceil(D/B)
    ar = ratio * f(ring_allreduce_s(float(p), W * d, t.latency_s, t.bandwidth_bytes_per_s))
    limit = None if p <= min_w else f"spatial limit: p ≤ {min_w:g} columns of the narrowest split layer"
    if limit is None and b_max < 1:
        limit = "spatial: not enough memory for one sample"
    return cost_row(ctx, "spatial", p, B, b, 1, p, compute_s=_iter_samples(ctx, lambda D: D, B, B) * comp,
                    halo_s=halo, act_allgather_s=ag, grad_allreduce_s=ar, memory_checked=False,
                    memory_bytes_per_device=2 * d * (B * (x_sum + y_sum) + W),
                    tiers=(("halo", t.name), ("act_allgather", t.name), ("grad_allreduce", t.name)), limit=limit)


def _hybrid_split(ctx: OracleContext, p: int) -> tuple[int, int, str | None]:
    p2 = min(p, ctx.devices_per_node)
    limit = None if p % p2 == 0 else f"hybrid needs p a multiple of {p2} devices per node"
    return p // p2 if p % p2 == 0 else p / p2, p2, limit


def data_filter(ctx: OracleContext, p: int, b: float) -> StrategyCost:
    """analysis_hybrid_df (§4.8): filter over the p2 GPUs of a node on b
    samples per node, data over p1 nodes; the data all-reduce sends the full
    Σ|w| (§9.9) at bandwidth / (2·p2) (§9.10)."""
    L = ctx.layers
    X, Y, W = _totals(ctx)
    d = ctx.bytes_per_item
    p1, p2, limit = _hybrid_split(ctx, p)
    a = ctx.masks["filter"]
    B = b * p1
    w_split, comp = _split_weights_comp(ctx, a, p2)
    t1 = tier(ctx.hardware, p2)
    ag, ar = _filter_comm(ctx, a, p2, b, t1)
    t2 = _div(tier(ctx.hardware, p), PARADL_COMPAT["hybrid_inter_node_divisor_per_p2"] * p2)
    grad = f(ring_allreduce_s(float(p1), W * d, t2.latency_s, t2.bandwidth_bytes_per_s))
    bound = L.out_channels[a].min() if a.any() else math.inf
    if limit is None and p2 > bound:
        limit = f"data+filter limit: p2 ≤ min F = {bound:g} filters of a split layer"
    return cost_row(ctx, "data+filter", p, B, b, p1, p2, compute_s=b * comp, act_allgather_s=ag, act_allreduce_s=ar,
                    grad_allreduce_s=grad, memory_bytes_per_device=2 * d * (b * (X + Y) + w_split),
                    tiers=(("act_allgather", t1.name), ("act_allreduce", t1.name), ("grad_allreduce", t2.name)),
                    limit=limit)


def data_spatial(ctx: OracleContext, p: int, b: float) -> StrategyCost:
    """analysis_hybrid_ds (§4.9): spatial over the p2 GPUs of a node on b
    samples per node (layers 0..split only, §9.6), halo C·⌊(K-1)/2⌋·H at
    PCIe / (2·p2), all-gather at PCIe / 2, local all-reduce on NVLink (§9.7)
    then a leaders' all-reduce of the full Σ|w| at bandwidth / (2·p2).
    Memory is not checked (§9.6)."""
    L = ctx.layers
    d = ctx.bytes_per_item
    W = float(L.params.sum())
    p1, p2, limit = _hybrid_split(ctx, p)
    a = ctx.masks["spatial"]
    min_w, split = _width_limit(ctx, a)
    B = b * p1
    if split < 0:
        return cost_row(ctx, "data+spatial", p, B, b, p1, p2, limit="data+spatial limit: no layer is spatially split")
    x_sum, y_sum, comp = _spatial_sums(ctx, a, p2, split)
    th = _div(host_tier(ctx, p2), PARADL_COMPAT["ds_halo_divisor_per_p2"] * p2)
    kw = L.kernel_w()
    other = L.in_spatial.prod(axis=-1) / L.width()[0]  # ∏ x[2:]: the spatial dims but W
    col = L.in_channels * np.floor((kw - 1) / 2) * other
    halo_layers = (np.arange(L.n) <= split) & (kw > 1) & a
    halo = float((4 * (th.latency_s + b * col * d / th.bandwidth_bytes_per_s))[halo_layers].sum())
    tg = _div(host_tier(ctx, p2), PARADL_COMPAT["ds_allgather_divisor"])
    ag = 2 * f(allgather_s(float(p2), b * L.y_elements[split] * d / p2, tg.latency_s, tg.bandwidth_bytes_per_s))
    tl = tier(ctx.hardware, p2)  # GPUDIRECT=1 through the swapped arguments (§9.7)
    local = f(ring_allreduce_s(float(p2), W * d, tl.latency_s, tl.bandwidth_bytes_per_s))
    tw = _div(tier(ctx.hardware, p), PARADL_COMPAT["hybrid_inter_node_divisor_per_p2"] * p2)
    glob = f(ring_allreduce_s(float(p1), W * d, tw.latency_s, tw.bandwidth_bytes_per_s))
    comp_iter = _iter_samples(ctx, lambda D: D / p1, B, b) * comp  # ceil(D/p1)·comp / ceil(D/B)
    if limit is None and p2 > min_w:
        limit = f"data+spatial limit: p2 ≤ {min_w:g} columns of the narrowest split layer"
    return cost_row(ctx, "data+spatial", p, B, b, p1, p2, compute_s=comp_iter, halo_s=halo, act_allgather_s=ag,
                    grad_allreduce_s=local + glob, memory_checked=False,
                    memory_bytes_per_device=2 * d * (B * (x_sum + y_sum) / p1 + W),
                    tiers=(("halo", th.name), ("act_allgather", tg.name),
                           ("grad_allreduce", tw.name if p1 > 1 else tl.name)), limit=limit)
