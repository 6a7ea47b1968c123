"""Layer (pipeline) parallelism, GPipe schedule (ParaDL §4.1 "Layer
(pipeline)" row and §4.5; TR eqs. 12-14).

The p devices hold p contiguous groups of layers G_1..G_p, chosen to
balance compute: the partition minimising the slowest stage's per-sample
FW+BW time (exact, by binary search over the candidate stage sums). The
mini-batch B is split into S micro-batches; one iteration takes p + S - 1
pipeline steps of the slowest stage on B/S samples, and 2(p + S - 2) steps
of boundary send/receive, each the slowest boundary's
α + (B/S)·|y_{G_i}|·δ·β (forward activations, backward gradients):

    T_comp = (p + S - 1)/S · B · max_i Σ_{l∈G_i} (FW_l + BW_l) + max_i WU_{G_i}
    T_comm = 2 (p + S - 2) · max_{i<p} (α + (B/S)|y_{G_i}| δ β)
    memory = 2δ max_i Σ_{l∈G_i} (B(|x_l| + |y_l|) + |w_l|)
    limits: p ≤ G, S ≤ B

The original code's pipeline is dead (§4.5), so there is no output to
reproduce: the compat mode uses these formulas with the compat compute
shares, |y_{G_i}| = the stage's last layer's output, and no weight update;
the default mode sends every tensor that crosses the boundary (skip
connections included) and adds the slowest stage's weight update.
"""

from __future__ import annotations

import numpy as np

from costmodels.oracle._cost import OracleContext, StrategyCost, cost_row
from costmodels.oracle._layers import layer_compute_s, weight_update_s

__all__ = ["balanced_stages", "boundary_elements", "pipeline"]


def balanced_stages(cost: np.ndarray, p: int) -> np.ndarray:
    """First layer of each of ``p`` contiguous, non-empty stages that minimise
    the largest stage sum of ``cost`` (needs ``p <= len(cost)``)."""
    cost = np.asarray(cost, dtype=np.float64)
    n = cost.size
    if not 1 <= p <= n:
        raise ValueError(f"cannot cut {n} layers into {p} non-empty stages; need 1 ≤ p ≤ {n}")
    prefix = np.concatenate([[0.0], np.cumsum(cost)])
    sums = np.subtract.outer(prefix, prefix)
    candidates = np.unique(sums[sums >= 0])
    candidates = candidates[candidates >= cost.max()]

    def starts_within(cap: float) -> list[int] | None:
        starts, acc = [0], 0.0
        for i, c in enumerate(cost):
            if acc + c > cap * (1 + 1e-12) and i > starts[-1]:
                starts.append(i)
                acc = 0.0
            acc += c
        return starts if len(starts) <= p else None

    lo, hi = 0, candidates.size - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if starts_within(candidates[mid]) is not None:
            hi = mid
        else:
            lo = mid + 1
    starts = starts_within(candidates[lo])
    # Fewer stages than devices: split stages further (never raises the max).
    while len(starts) < p:
        ends = starts[1:] + [n]
        sizes = [e - s for s, e in zip(starts, ends, strict=True)]
        k = int(np.argmax(sizes))
        starts.insert(k + 1, ends[k] - 1)
    return np.asarray(starts, dtype=int)


def boundary_elements(ctx: OracleContext, starts: np.ndarray) -> np.ndarray:
    """Elements per sample sent from stage i to stage i+1, for i < p-1:
    compat, the last layer's |y| (the TR's |y_{G_i}|); default, every output
    produced at or before the cut and read after it."""
    L = ctx.layers
    ends = np.asarray(starts[1:]) - 1  # last layer of stages 0..p-2
    if ctx.compat:
        return L.y_elements[ends]
    idx = np.arange(L.n)
    crossing = (idx[None, :] <= ends[:, None]) & (L.last_consumer[None, :] > ends[:, None])
    return (crossing * L.y_elements[None, :]).sum(axis=1)


def _stage_sums(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    return np.add.reduceat(np.asarray(values, dtype=np.float64), starts)


def pipeline(ctx: OracleContext, p: int, b: float, segments: int | None) -> StrategyCost:
    """GPipe over p devices on B = b samples in S micro-batches (default S =
    min(p, B), the original's dead code's S = p kept to whole samples)."""
    L = ctx.layers
    hw = ctx.hardware
    d = ctx.bytes_per_item
    B = b
    S = int(segments) if segments else max(1, min(p, int(B)))
    limit = None
    if p > L.n:
        limit = f"pipeline limit: p ≤ G = {L.n} layers"
    elif S > B:
        limit = f"pipeline limit: S ≤ B ({S} micro-batches of a {B:g}-sample batch)"
    base = dict(strategy="pipeline", p=p, B=B, b=b, p1=1, p2=p, segments=S, limit=limit)
    if p > L.n:
        return cost_row(ctx, **base)
    micro = B / S
    per_sample = layer_compute_s(L, hw, ctx.per_sample_s, micro, 1.0, d, ctx.calibration) / micro
    starts = balanced_stages(per_sample, p)
    stage_c = _stage_sums(per_sample, starts)
    comp = (p + S - 1) * micro * float(stage_c.max())  # (p+S-1)/S · B · max_i FWBW(G_i)
    acts = np.where(L.inplace, 0.0, L.x_elements + L.y_elements)
    stage_w = _stage_sums(L.params, starts)
    mem = 2 * d * (B * _stage_sums(acts, starts) + stage_w)
    wu = 0.0
    if not ctx.compat:
        mem = mem + ctx.optimizer_slots * d * stage_w
        wu = max(weight_update_s(hw, float(w), ctx.optimizer_slots, d) for w in stage_w)
    comm, name = 0.0, ""
    if p > 1:
        y = boundary_elements(ctx, starts)
        worst = -1.0
        for i, elems in enumerate(y):
            crosses = i // hw.devices_per_node != (i + 1) // hw.devices_per_node
            t = hw.tier_for(2, crosses_nodes=crosses)
            step = t.latency_s + micro * elems * d / t.bandwidth_bytes_per_s  # α + (B/S)|y|δβ
            if step > worst:
                worst, name = step, t.name
        comm = 2 * (p + S - 2) * float(worst)
    return cost_row(ctx, **base, compute_s=comp, pipeline_p2p_s=comm, weight_update_s=wu,
                    memory_bytes_per_device=float(mem.max()), tiers=(("pipeline_p2p", name),) if name else ())
