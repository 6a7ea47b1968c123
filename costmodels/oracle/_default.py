"""The default mode: ParaDL's strategy models (ParaDL §4.1, §4.3-§4.9)
with the original code's bugs (§9) fixed. Differences from the original,
each with its reason, are listed in docs/oracle.md; in short:

* weights split p ways are divided by p once (§9.3);
* halo = C·rows·(the other spatial dims)·δ per sample for the group's
  samples, rows = (K-1)·dilation + 1 - stride along the split dim (K = 2
  gives one row at stride 1, none at stride 2), forward of x and backward
  of dL/dy, only messages with data paid (§9.4, §9.5);
* the weight update is counted (§9.2), and the optimizer state if asked;
* every layer counts in ds, and ds checks memory (§9.6);
* every collective runs in the hardware's environment (its ``environment``
  section, costmodels/transport.py): the transport of its kind (NCCL-style
  on the tiers, or MPI staged through the host), the fabric's
  over-subscription and the node's shared links, the all-reduce scheme;
  without one, ParaDL's ideal network: the tiers with GPUDirect, no
  contention (§3.2), never the original's ad hoc divisors (§9.7, §9.10);
* gradient all-reduces take the environment's scheme, by default the cheaper
  of the flat ring and the hierarchical one (§4.8); df all-reduces each
  node's filter shard (Σ|w_split|/p2) across nodes and the replicated
  weights over everyone (§9.9), or, under a leader scheme, the leader holds
  the node's shards and replicated gradients (Σ_split|w| + Σ_rest|w|);
* filter / channel exchange each layer's own tensors: all-gather of y (not
  for the model output), all-reduce of dL/dx (not for a layer fed by the
  model input), and the reverse for channel (§4.6, §4.7);
* spatial gathers the split layer's output once, forward: the backward
  "scatter" is a local slice of a replicated gradient;
* compute comes from the graph's FLOP counts (§9.8) or the roofline, a
  shard costed by :func:`costmodels.oracle._layers.shard_compute_s` (fixed
  cost per pass, narrow-shard efficiency); no ceil(D/p) rounding of
  per-iteration values (§4.3).
"""

from __future__ import annotations

import math

import numpy as np

from costmodels.oracle._cost import (
    OracleContext,
    StrategyCost,
    cost_row,
    env_allgather,
    env_allreduce,
    env_p2p,
    env_ring,
    environment,
    f,
)
from costmodels.oracle._layers import shard_compute_s, weight_update_s

__all__ = [
    "compute_s", "data", "data_filter", "data_spatial", "filter_or_channel", "halo_rows", "spatial", "spatial_halo_s",
]


def compute_s(ctx: OracleContext, samples: float, split: np.ndarray | float = 1.0, split_dim: str = "filter") -> float:
    """FW+BW seconds per iteration of one device running ``samples`` samples
    with layers split ``split`` ways along ``split_dim`` (filter, channel,
    rows): :func:`costmodels.oracle._layers.shard_compute_s`."""
    return float(shard_compute_s(ctx.layers, ctx.hardware, ctx.per_sample_s, samples, split, split_dim,
                                 ctx.bytes_per_item, ctx.calibration).sum())


def _memory(ctx: OracleContext, b: float, act_elements: float, weights: float) -> float:
    """2δ(b·Σ(|x|+|y|) + |w|) (§4.1: values and their gradients, no buffer
    reuse) plus δ per optimizer slot per local weight."""
    d = ctx.bytes_per_item
    return 2 * d * (b * act_elements + weights) + ctx.optimizer_slots * d * weights


def _acts(ctx: OracleContext, split: np.ndarray | float = 1.0) -> float:
    """Σ(|x|+|y|) per sample without the in-place ReLU / BN tensors (§4.3),
    divided by ``split`` where split."""
    L = ctx.layers
    split = np.broadcast_to(np.asarray(split, dtype=np.float64), (L.n,))
    keep = ~L.inplace
    return float(((L.x_elements + L.y_elements) / split)[keep].sum())


def _wu(ctx: OracleContext, weights: float) -> float:
    return weight_update_s(ctx.hardware, weights, ctx.optimizer_slots, ctx.bytes_per_item)



def _sum(x) -> float:
    return float(np.sum(np.asarray(x, dtype=np.float64)))


def data(ctx: OracleContext, p: int, b: float) -> StrategyCost:
    """(B/p)·Σ(FW+BW) + ΣWU + all-reduce(Σ|w|δ) (§4.3)."""
    W = float(ctx.layers.params.sum())
    B = b * p
    grad, name = env_allreduce(ctx.hardware, "grad_allreduce", p, min(p, ctx.devices_per_node),
                               W * ctx.bytes_per_item)  # §4.3, §4.8
    return cost_row(ctx, "data", p, B, b, p, 1, compute_s=compute_s(ctx, b), grad_allreduce_s=grad,
                    weight_update_s=_wu(ctx, W), memory_bytes_per_device=_memory(ctx, b, _acts(ctx), W),
                    tiers=(("grad_allreduce", name),), limit=None if b >= 1 else f"data limit: p ≤ B = {B:g} samples")


def _model_comm(ctx: OracleContext, active: np.ndarray, n: int, b: float, strategy: str) -> tuple[float, float, str]:
    """(all-gather, all-reduce) seconds of filter or channel parallelism over n
    devices on b samples: filter gathers each split layer's y (not the model
    output) and all-reduces its dL/dx (not for a layer fed by the model
    input); channel all-reduces y and gathers dL/dx (§4.6, §4.7); each on
    its environment transport. Returns the tier label too."""
    L = ctx.layers
    d = ctx.bytes_per_item
    out_rows, in_rows = active & ~L.sink, active & ~L.source
    y, x = L.y_elements[out_rows] * b * d, L.x_elements[in_rows] * b * d
    hw = ctx.hardware
    gathered, reduced = (y, x) if strategy == "filter" else (x, y)
    # §4.6 filter: y = Allgather(y_i) forward, dL/dx = Allreduce(dL/dx_i) backward; §4.7 channel: the reverse
    ag, label = env_allgather(hw, "act_allgather", n, gathered / n)
    ar, _ = env_ring(hw, "act_allreduce", n, reduced)
    return _sum(ag), _sum(ar), label


def _min_channels(ctx: OracleContext, active: np.ndarray, strategy: str) -> float:
    L = ctx.layers
    ch = L.out_channels if strategy == "filter" else L.in_channels
    return float(ch[active].min()) if active.any() else math.inf


def _limit_text(strategy: str, bound: float, what: str = "p") -> str:
    noun = "filters" if strategy == "filter" else "input channels"
    sym = "F" if strategy == "filter" else "C"
    return f"{strategy} limit: {what} ≤ min {sym} = {bound:g} {noun} of a split layer"


def filter_or_channel(ctx: OracleContext, p: int, b: float, strategy: str) -> StrategyCost:
    """§4.6 / §4.7 with B = b: split layers' compute and weights / p; no
    gradient exchange (each device owns its filters or channels; the
    replicated layers compute identical gradients)."""
    L = ctx.layers
    a = ctx.masks[strategy]
    split = np.where(a, float(p), 1.0)
    weights = float((L.params / split).sum())  # |w|/p once (§4.1 Filter row; §9.3)
    ag, ar, label = _model_comm(ctx, a, p, b, strategy)
    bound = _min_channels(ctx, a, strategy)
    return cost_row(ctx, strategy, p, b, b, 1, p, compute_s=compute_s(ctx, b, split, strategy), act_allgather_s=ag,
                    act_allreduce_s=ar, weight_update_s=_wu(ctx, weights),
                    memory_bytes_per_device=_memory(ctx, b, _acts(ctx), weights),
                    tiers=(("act_allgather", label), ("act_allreduce", label)),
                    limit=None if p <= bound else _limit_text(strategy, bound))


def halo_rows(ctx: OracleContext) -> np.ndarray:
    """Rows beyond its own that a shard of the split (first spatial) dim
    needs: (K-1)·dilation + 1 - stride, at least 0 (costmodels.table's rule)."""
    L = ctx.layers
    rows = (L.kernel[:, 0] - 1.0) * L.dilation[:, 0] + 1.0 - L.stride[:, 0]
    return np.where(L.spatial_rank > 0, np.maximum(rows, 0.0), 0.0)


def spatial_halo_s(ctx: OracleContext, active: np.ndarray, n: int, b: float) -> tuple[float, str]:
    """Halo exchange of the split layers over n shards on b samples: forward
    the x rows, backward the dL/dy rows, each split lo = ⌊rows/2⌋ from one
    neighbour and hi = rows - lo from the other, one message each (§4.4,
    sizes as §10: C·rows·the other spatial dims), on the environment's halo
    transport (§8: MPI, not NCCL, in ParaDL's runs). With two shards each has
    one neighbour, so the two sides overlap. Returns the tier label too."""
    if n <= 1:
        return 0.0, ""
    L = ctx.layers
    d = ctx.bytes_per_item
    rows = halo_rows(ctx)
    lo, hi = np.floor(rows / 2), rows - np.floor(rows / 2)
    x_row = L.in_channels * L.in_spatial[:, 1:].prod(axis=-1) * b * d
    y_row = L.out_channels * L.out_spatial[:, 1:].prod(axis=-1) * b * d
    crosses = n > ctx.devices_per_node
    total, label = 0.0, ""
    for row in (x_row, y_row):
        m_lo, label = env_p2p(ctx.hardware, "halo", crosses, lo * row)
        m_hi, _ = env_p2p(ctx.hardware, "halo", crosses, hi * row)
        per_layer = np.maximum(m_lo, m_hi) if n == 2 else m_lo + m_hi
        total += float(per_layer[active].sum())
    return total, label


def _spatial_part(ctx: OracleContext, n: int, b: float) -> dict:
    """Compute, halo, all-gather, activations and limit of spatial parallelism
    over n devices of one group on b samples."""
    L = ctx.layers
    a = ctx.masks["spatial"]
    if not a.any():
        return {"limit": "no layer is spatially split (empty spatial mask)"}
    split_at = int(np.flatnonzero(a)[-1])
    split = np.where(a, float(n), 1.0)
    extent = float(np.minimum(L.in_spatial[a, 0], L.out_spatial[a, 0]).min())
    gather, gather_label = 0.0, ""  # §4.4: the split layer's output all-gathered for the replicated rest
    if n > 1 and not L.sink[split_at]:
        g, gather_label = env_allgather(ctx.hardware, "spatial_allgather", n,
                                        b * L.y_elements[split_at] * ctx.bytes_per_item / n)
        gather = f(g)
    halo, halo_label = spatial_halo_s(ctx, a, n, b)
    return {
        "compute_s": compute_s(ctx, b, split, "rows"),
        "halo_s": halo,
        "act_allgather_s": gather,
        "acts": _acts(ctx, split),
        "tier": halo_label,
        "gather_tier": gather_label,
        "limit": None if n <= extent else f"spatial limit: p ≤ {extent:g} rows of the narrowest split layer",
    }


def spatial(ctx: OracleContext, p: int, b: float) -> StrategyCost:
    """§4.4 on B = b samples shared by p devices: the masked layers split by
    rows, the rest replicated after an all-gather, gradients all-reduced."""
    W = float(ctx.layers.params.sum())
    s = _spatial_part(ctx, p, b)
    if "compute_s" not in s:
        return cost_row(ctx, "spatial", p, b, b, 1, p, limit=f"spatial limit: {s['limit']}")
    grad, name = env_allreduce(ctx.hardware, "grad_allreduce", p, min(p, ctx.devices_per_node),
                               W * ctx.bytes_per_item)
    return cost_row(ctx, "spatial", p, b, b, 1, p, compute_s=s["compute_s"], halo_s=s["halo_s"],
                    act_allgather_s=s["act_allgather_s"], grad_allreduce_s=grad, weight_update_s=_wu(ctx, W),
                    memory_bytes_per_device=_memory(ctx, b, s["acts"], W),
                    tiers=(("halo", s["tier"]), ("act_allgather", s["gather_tier"]), ("grad_allreduce", name)),
                    limit=s["limit"])


def _hybrid_split(ctx: OracleContext, p: int) -> tuple[int, int, str | None]:
    p2 = min(p, ctx.devices_per_node)
    if p % p2:
        return 1, p2, f"hybrid needs p a multiple of {p2} devices per node"
    return p // p2, p2, None


def data_filter(ctx: OracleContext, p: int, b: float) -> StrategyCost:
    """§4.8: filter over the p2 devices of a node on b samples per node, data
    over p1 nodes; each node all-reduces its filter shard (Σ|w_split|/p2)
    with the same shard on the other nodes, and the replicated layers'
    weights over all p devices (the p2 shard all-reduces leave each node at
    once). Under the environment's leader scheme (ChainerMN's hierarchical
    communicator) the node's leader gathers its shards and reduces the
    replicated gradients instead, then the leaders all-reduce
    Σ_split|w| + Σ_rest|w| (§4.8)."""
    L = ctx.layers
    hw = ctx.hardware
    p1, p2, limit = _hybrid_split(ctx, p)
    a = ctx.masks["filter"]
    split = np.where(a, float(p2), 1.0)
    d = ctx.bytes_per_item
    ag, ar, label = _model_comm(ctx, a, p2, b, "filter")
    sharded, replicated = float(L.params[a].sum()) / p2, float(L.params[~a].sum())
    if environment(hw).route("hybrid_grad_allreduce")[1] == "leader":
        g1, n1 = env_allreduce(hw, "hybrid_grad_allreduce", p, p2, (sharded * p2 + replicated) * d)
        g2, n2 = 0.0, ""
    else:  # §4.8: Allreduce of dL/dw[., F/p2, .] across nodes, p2 of them at once; replicated layers: everyone
        g1, n1 = env_allreduce(hw, "hybrid_grad_allreduce", p1, 1, sharded * d, concurrent=p2)
        g2, n2 = env_allreduce(hw, "hybrid_grad_allreduce", p, p2, replicated * d)
    bound = _min_channels(ctx, a, "filter")
    if limit is None and p2 > bound:
        limit = _limit_text("filter", bound, "p2")
    return cost_row(ctx, "data+filter", p, b * p1, b, p1, p2, compute_s=compute_s(ctx, b, split, "filter"),
                    act_allgather_s=ag, act_allreduce_s=ar, grad_allreduce_s=g1 + g2,
                    weight_update_s=_wu(ctx, sharded + replicated),
                    memory_bytes_per_device=_memory(ctx, b, _acts(ctx), sharded + replicated),
                    tiers=(("act_allgather", label), ("act_allreduce", label),
                           ("grad_allreduce", n1 if g1 >= g2 else n2)), limit=limit)


def data_spatial(ctx: OracleContext, p: int, b: float) -> StrategyCost:
    """§4.9: spatial over the p2 devices of a node on b samples per node, data
    over p1 nodes; every layer counts, memory checked; the replicated weights
    all-reduced over all p on the environment's scheme (by default
    hierarchical where cheaper, §4.8)."""
    W = float(ctx.layers.params.sum())
    p1, p2, limit = _hybrid_split(ctx, p)
    s = _spatial_part(ctx, p2, b)
    if "compute_s" not in s:
        return cost_row(ctx, "data+spatial", p, b * p1, b, p1, p2, limit=f"data+spatial limit: {s['limit']}")
    grad, name = env_allreduce(ctx.hardware, "hybrid_grad_allreduce", p, p2, W * ctx.bytes_per_item)
    if limit is None and s["limit"]:
        limit = "data+" + s["limit"].replace("p ≤", "p2 ≤")
    return cost_row(ctx, "data+spatial", p, b * p1, b, p1, p2, compute_s=s["compute_s"], halo_s=s["halo_s"],
                    act_allgather_s=s["act_allgather_s"], grad_allreduce_s=grad, weight_update_s=_wu(ctx, W),
                    memory_bytes_per_device=_memory(ctx, b, s["acts"], W),
                    tiers=(("halo", s["tier"]), ("act_allgather", s["gather_tier"]), ("grad_allreduce", name)),
                    limit=limit)
