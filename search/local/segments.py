"""The large neighbourhood of the discrete refinement: the graph cut into
chain segments, each re-planned whole by Viterbi (exact on the segment,
the rest of the plan fixed)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from search.exact import viterbi
from search.local.moves import current_state, with_overlap
from search.problem import DiscreteProblem, plan_memories, plan_memory, plan_time

__all__ = ["SegmentCandidates", "Segments", "apply_segment", "chain_segments", "segment_candidates", "segment_moves"]


class Segments(NamedTuple):
    """The graph cut into chain segments: maximal paths whose inner edges are
    the only edges of their inner layers (a layer with one consumer feeding a
    layer with one producer). Residual blocks split into their main path,
    their shortcut and the add."""

    nodes: np.ndarray  # [G, Lmax] layer at each position, -1 past the end
    inner_edge: np.ndarray  # [G, Lmax] edge from position i - 1 to i, -1 at 0 and past the end
    internal: np.ndarray  # [e] bool: the edge joins consecutive layers of one segment


def chain_segments(p: DiscreteProblem) -> Segments:
    n = p.num_layers
    out_deg = np.bincount(p.edge_src, minlength=n)
    in_deg = np.bincount(p.edge_dst, minlength=n)
    internal = (out_deg[p.edge_src] == 1) & (in_deg[p.edge_dst] == 1)
    nxt = np.full(n, -1, dtype=np.int64)
    nxt_edge = np.full(n, -1, dtype=np.int64)
    nxt[p.edge_src[internal]] = p.edge_dst[internal]
    nxt_edge[p.edge_src[internal]] = np.flatnonzero(internal)
    has_prev = np.zeros(n, dtype=bool)
    has_prev[p.edge_dst[internal]] = True
    paths, edges = [], []
    for head in np.flatnonzero(~has_prev):  # host loop over layers, once per problem
        v, path, path_edges = int(head), [], [-1]
        while v >= 0:
            path.append(v)
            path_edges.append(int(nxt_edge[v]))
            v = int(nxt[v])
        paths.append(path)
        edges.append(path_edges[:-1])
    width = max((len(x) for x in paths), default=1)
    nodes = np.full((len(paths), width), -1, dtype=np.int64)
    inner = np.full((len(paths), width), -1, dtype=np.int64)
    for g, (path, path_edges) in enumerate(zip(paths, edges, strict=True)):
        nodes[g, : len(path)] = path
        inner[g, : len(path)] = path_edges
    return Segments(nodes, inner, internal)


def _best_paths(unary: np.ndarray, pair: np.ndarray) -> np.ndarray:
    """Min-sum paths ``[K, n]`` of chains with their own ``pair [K, n, S, S]``."""
    return viterbi(unary, pair)[1]


_PRICES = np.array([0.0, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0])


class SegmentCandidates(NamedTuple):
    """Re-plans of single chain segments, with their exact time and memory."""

    segment: np.ndarray  # [K] which segment each candidate re-plans
    states: np.ndarray  # [K, Lmax] its new strategies along the segment
    time_s: np.ndarray  # [K] exact time of the whole plan after the change
    memory_bytes: np.ndarray  # [K]
    changed: np.ndarray  # [K] bool: differs from the current plan


def segment_candidates(p: DiscreteProblem, c: np.ndarray, seg: Segments) -> SegmentCandidates:
    """Re-plan each chain segment (everything else fixed) by Viterbi on
    ``time + price * memory`` for a range of memory prices, without raising
    the largest workspace; the memory priced is the per-layer bytes of the
    phase that binds in plan ``c`` (both phases where they tie: lowering the
    other phase alone saves nothing). Each candidate's time and memory are
    computed exactly from its segment alone: the segment's outer edges see
    fixed strategies, its inner edges are the Viterbi's transitions, and
    each memory phase moves by the segment's change in it."""
    n, S = p.layer_time_s.shape
    cur = current_state(p, c)
    t_now = with_overlap(p, cur.base_s, cur.grad_s, cur.bwd_s)
    m_now = cur.memory_bytes
    ext = np.zeros((n, S))
    outer = ~seg.internal
    if outer.any():
        ar = np.flatnonzero(outer)
        cs, cd = c[p.edge_src[ar]], c[p.edge_dst[ar]]
        np.add.at(ext, p.edge_src[ar], p.reshard_s[ar, :, cd])
        np.add.at(ext, p.edge_dst[ar], p.reshard_s[ar, cs, :])
    allowed = p.workspace_bytes <= cur.top_val[0]
    unary_t = np.where(allowed, p.layer_time_s + ext, np.inf)
    # infeasible options are already ruled out by unary_t's inf: 0 keeps inf * 0 out of the prices
    mem = np.where(p.feasible, p.persistent_bytes, 0.0)
    opt = np.where(p.feasible, p.optimizer_bytes, 0.0)
    valid = seg.nodes >= 0
    at = np.maximum(seg.nodes, 0)
    G, width = seg.nodes.shape
    U = np.where(valid[..., None], unary_t[at], 0.0)  # [G, W, S]
    A = np.where(valid[..., None], mem[at], 0.0)  # backward phase (its workspace term is capped: allowed)
    Q = np.where(valid[..., None], opt[at], 0.0)  # optimizer phase
    backward_now = cur.persistent_bytes + float(cur.top_val[0])
    priced = A * float(backward_now >= cur.optimizer_bytes) + Q * float(cur.optimizer_bytes >= backward_now)
    padded = np.concatenate([p.reshard_s, np.zeros((1, S, S))])  # edge -1: no edge, no cost
    pair = padded[seg.inner_edge]  # [G, W, S, S]
    prices = _PRICES * (t_now / max(m_now, 1.0))
    P = len(prices)
    unary = (U[None] + prices[:, None, None, None] * priced[None]).reshape(P * G, width, S)
    paths = _best_paths(unary, np.broadcast_to(pair[None], (P,) + pair.shape).reshape(P * G, width, S, S))
    g_of = np.tile(np.arange(G), P)
    old = np.where(valid, c[at], 0)[g_of]  # [K, W]
    new = np.where(valid[g_of], paths, old)
    gi, wi = g_of[:, None], np.arange(width)[None, :]
    # exact deltas from the segment alone
    d_time = (U[gi, wi, new] - U[gi, wi, old]).sum(axis=1)
    prev_new, prev_old = np.roll(new, 1, axis=1), np.roll(old, 1, axis=1)
    d_time += (pair[gi, wi, prev_new, new] - pair[gi, wi, prev_old, old]).sum(axis=1)
    d_mem = (A[gi, wi, new] - A[gi, wi, old]).sum(axis=1)
    d_opt = (Q[gi, wi, new] - Q[gi, wi, old]).sum(axis=1)
    Wseg = np.where(valid[..., None], p.workspace_bytes[at], 0.0)
    # the largest workspace outside each segment: the first of the top (width + 1) not in it
    k = min(n, width + 1)
    top = np.argsort(-cur.workspace, kind="stable")[:k]
    seg_of = np.full(n, -1, dtype=np.int64)
    seg_of[seg.nodes[valid]] = np.nonzero(valid)[0]
    inside = seg_of[top][None, :] == np.arange(G)[:, None]  # [G, k]
    first_out = np.argmax(~inside, axis=1)
    outside_max = np.where((~inside).any(axis=1), cur.workspace[top][first_out], 0.0)
    new_ws = np.maximum(outside_max[g_of], Wseg[gi, wi, new].max(axis=1))
    mems = np.maximum(cur.persistent_bytes + d_mem + new_ws, cur.optimizer_bytes + d_opt)
    if cur.runs:  # runs of recomputing layers: the candidate plans' exact memories
        plans = np.broadcast_to(c, (g_of.size, n)).copy()
        kk, ww = np.nonzero(valid[g_of])
        plans[kk, seg.nodes[g_of][kk, ww]] = new[kk, ww]
        mems = plan_memories(p, plans)
    if p.gradient_overlap:
        gg = np.where(valid[..., None], p.grad_sync_s[at], 0.0)
        bb = np.where(valid[..., None], p.backward_s[at], 0.0)
        d_g = (gg[gi, wi, new] - gg[gi, wi, old]).sum(axis=1)
        d_b = (bb[gi, wi, new] - bb[gi, wi, old]).sum(axis=1)
        times = with_overlap(p, cur.base_s + d_time, cur.grad_s + d_g, cur.bwd_s + d_b)
    else:
        times = cur.base_s + d_time
    return SegmentCandidates(g_of, new, times, mems, (new != old).any(axis=1))


def apply_segment(c: np.ndarray, seg: Segments, cand: SegmentCandidates, i: int) -> np.ndarray:
    """The plan ``c`` with candidate ``i``'s segment re-planned."""
    x = np.array(c, copy=True)
    g = cand.segment[i]
    keep = seg.nodes[g] >= 0
    x[seg.nodes[g][keep]] = cand.states[i][keep]
    return x


def segment_moves(p: DiscreteProblem, c: np.ndarray, seg: Segments, memory_limit: float,
                  tol: float, tries: int = 8) -> np.ndarray | None:
    """A large-neighbourhood move (:func:`segment_candidates`): the best
    re-planned segment that fits and improves, else the best trade of a
    faster segment plan that does not fit alone against one that frees
    memory in another segment (checked exactly). Returns the plan or ``None``."""
    cur = current_state(p, c)
    t_now = with_overlap(p, cur.base_s, cur.grad_s, cur.bwd_s)
    m_now = cur.memory_bytes
    cand = segment_candidates(p, c, seg)
    times, mems, g_of = cand.time_s, cand.memory_bytes, cand.segment
    ok = np.isfinite(times) & cand.changed
    plan_of = lambda i: apply_segment(c, seg, cand, i)  # noqa: E731
    fits = ok & (mems <= memory_limit) & (times < t_now - tol)
    if fits.any():
        return plan_of(int(np.argmin(np.where(fits, times, np.inf))))
    # trades: a gaining segment plan that does not fit, paid by a memory-freeing one elsewhere
    dT, dM = times - t_now, mems - m_now
    slack = memory_limit - m_now
    gain = np.flatnonzero(ok & (dT < -tol) & (dM > slack))
    payer = np.flatnonzero(ok & (dM < 0))
    if not gain.size or not payer.size:
        return None
    payer = payer[np.argsort(dM[payer], kind="stable")]
    best_idx = np.zeros(payer.size, dtype=np.int64)
    b = 0
    for j in range(1, payer.size):  # host loop over candidate plans
        if dT[payer[j]] < dT[payer[b]]:
            b = j
        best_idx[j] = b
    kk = np.searchsorted(dM[payer], slack - dM[gain], side="right") - 1
    has = kk >= 0
    gain, kk = gain[has], kk[has]
    if not gain.size:
        return None
    pay = payer[best_idx[kk]]
    net = dT[gain] + dT[pay]
    good = np.flatnonzero(net < -tol)
    for j in good[np.argsort(net[good], kind="stable")][:tries]:
        a, q = gain[j], pay[j]
        if g_of[a] == g_of[q]:
            continue
        trial = apply_segment(plan_of(a), seg, cand, q)
        if plan_memory(p, trial) <= memory_limit and plan_time(p, trial) < t_now - tol:
            return trial
    return None
