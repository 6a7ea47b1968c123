"""Discrete refinement of plans: rounding, repair to memory feasibility at
the least time cost, local search with single-layer moves, moves of the two
layers of an edge (so a layer and its neighbour change together and pay,
or save, their resharding once) and memory trades between two layers, and a
large neighbourhood that re-plans whole chain segments by Viterbi.

Every move is scored exactly, by the discrete objective of
:mod:`search.problem` (the cost model at one-hot probabilities), for all
layers and strategies at once: a pass costs ``O(n S + e S^2)`` array work.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from search.problem import DiscreteProblem, minimum_memory, plan_memory, plan_time

__all__ = [
    "MoveScores", "RefineResult", "SegmentCandidates", "Segments", "apply_segment", "chain_segments",
    "local_search", "pair_moves", "refine", "repair", "segment_candidates", "segment_moves", "single_moves",
]

_REL_TOL = 1e-10  # a move must improve the time by more than this fraction to count


class MoveScores(NamedTuple):
    """Exact time and memory of the plan after each possible move."""

    time_s: np.ndarray  # [n, S] (single) or [e, S, S] (pair)
    memory_bytes: np.ndarray


class _Current(NamedTuple):
    base_s: float  # time without the overlap term
    grad_s: float
    bwd_s: float
    persistent_bytes: float
    workspace: np.ndarray  # [n] each layer's workspace under the plan
    top_idx: np.ndarray  # [3] layers with the largest workspaces (-1 if fewer layers)
    top_val: np.ndarray  # [3]
    layer_delta_s: np.ndarray  # [n, S] base-time change of moving one layer
    edge_now_s: np.ndarray  # [e] each edge's resharding under the plan


def _current(p: DiscreteProblem, c: np.ndarray) -> _Current:
    n, e = p.num_layers, p.num_edges
    rows, ar = np.arange(n), np.arange(e)
    cs, cd = c[p.edge_src], c[p.edge_dst]
    edge_now = p.reshard_s[ar, cs, cd]
    out_d = p.reshard_s[ar, :, cd] - edge_now[:, None]  # [e, S]: source moves
    in_d = p.reshard_s[ar, cs, :] - edge_now[:, None]  # [e, S]: destination moves
    lt_now = p.layer_time_s[rows, c]
    delta = p.layer_time_s - lt_now[:, None]
    if e:
        delta = delta + p.src_incidence @ out_d + p.dst_incidence @ in_d
    ws = p.workspace_bytes[rows, c]
    k = min(3, n)
    top = np.argsort(-ws, kind="stable")[:k]
    top_idx = np.full(3, -1, dtype=np.int64)
    top_val = np.zeros(3)
    top_idx[:k], top_val[:k] = top, ws[top]
    return _Current(
        base_s=float(lt_now.sum() + edge_now.sum()),
        grad_s=float(p.grad_sync_s[rows, c].sum()),
        bwd_s=float(p.backward_s[rows, c].sum()),
        persistent_bytes=float(p.persistent_bytes[rows, c].sum()),
        workspace=ws,
        top_idx=top_idx,
        top_val=top_val,
        layer_delta_s=delta,
        edge_now_s=edge_now,
    )


def _with_overlap(p: DiscreteProblem, base, grad, bwd):
    if not p.gradient_overlap:
        return base
    return base - p.gradient_overlap * np.minimum(grad, bwd)


def single_moves(p: DiscreteProblem, c: np.ndarray, cur: _Current | None = None) -> MoveScores:
    """Time and memory ``[n, S]`` after moving layer ``l`` to strategy ``s``
    (the rest of plan ``c`` fixed)."""
    cur = _current(p, c) if cur is None else cur
    rows = np.arange(p.num_layers)
    time = _with_overlap(
        p,
        cur.base_s + cur.layer_delta_s,
        cur.grad_s + p.grad_sync_s - p.grad_sync_s[rows, c][:, None],
        cur.bwd_s + p.backward_s - p.backward_s[rows, c][:, None],
    )
    others = np.where(rows == cur.top_idx[0], cur.top_val[1], cur.top_val[0])  # largest workspace elsewhere
    memory = (
        cur.persistent_bytes
        + p.persistent_bytes
        - p.persistent_bytes[rows, c][:, None]
        + np.maximum(others[:, None], p.workspace_bytes)
    )
    return MoveScores(time, memory)


def pair_moves(p: DiscreteProblem, c: np.ndarray, cur: _Current | None = None) -> MoveScores:
    """Time and memory ``[e, S, S]`` after moving both layers of edge ``k``,
    its source to ``s`` and its destination to ``t``."""
    cur = _current(p, c) if cur is None else cur
    u, v = p.edge_src, p.edge_dst
    rows = np.arange(p.num_layers)
    ar = np.arange(p.num_edges)
    cu, cv = c[u], c[v]
    # the edge itself is counted in both single deltas; correct it to its joint value
    corr = (
        p.reshard_s
        - p.reshard_s[ar, :, cv][:, :, None]
        - p.reshard_s[ar, cu, :][:, None, :]
        + cur.edge_now_s[:, None, None]
    )
    base = cur.base_s + cur.layer_delta_s[u][:, :, None] + cur.layer_delta_s[v][:, None, :] + corr
    dg = p.grad_sync_s - p.grad_sync_s[rows, c][:, None]
    db = p.backward_s - p.backward_s[rows, c][:, None]
    time = _with_overlap(
        p,
        base,
        cur.grad_s + dg[u][:, :, None] + dg[v][:, None, :],
        cur.bwd_s + db[u][:, :, None] + db[v][:, None, :],
    )
    # largest workspace outside {u, v}: the first of the top three that is neither
    ti, tv = cur.top_idx, cur.top_val
    hit = (ti[None, :] == u[:, None]) | (ti[None, :] == v[:, None]) | (ti[None, :] < 0)
    others = np.where(~hit[:, 0], tv[0], np.where(~hit[:, 1], tv[1], np.where(~hit[:, 2], tv[2], 0.0)))
    dA = p.persistent_bytes - p.persistent_bytes[rows, c][:, None]
    ws = np.maximum(np.maximum(others[:, None, None], p.workspace_bytes[u][:, :, None]), p.workspace_bytes[v][:, None, :])
    memory = cur.persistent_bytes + dA[u][:, :, None] + dA[v][:, None, :] + ws
    return MoveScores(time, memory)


def repair(p: DiscreteProblem, choice, memory_limit: float, max_rounds: int | None = None) -> tuple[np.ndarray, bool]:
    """Moves towards ``memory <= memory_limit`` at the least added time per
    byte saved: each round takes, in order of that ratio, the best single
    move of pairwise non-adjacent layers until their savings cover the
    excess (sequential greedy, batched: the ratios of non-adjacent moves do
    not change when the others are made); when no single move saves memory,
    the best move of an edge's two layers. Returns the plan and whether it fits."""
    c = np.array(choice, dtype=np.int64)
    limit = float(memory_limit)
    max_rounds = 2 * p.num_layers + 20 if max_rounds is None else max_rounds
    for _ in range(max_rounds):
        cur = _current(p, c)
        t_now = _with_overlap(p, cur.base_s, cur.grad_s, cur.bwd_s)
        m_now = cur.persistent_bytes + float(cur.top_val[0])
        if m_now <= limit:
            return c, True
        single = single_moves(p, c, cur)
        saved = m_now - single.memory_bytes
        ok = (saved > 0) & np.isfinite(single.time_s)
        if ok.any():
            score = np.where(ok, (single.time_s - t_now) / np.where(ok, saved, 1.0), np.inf)
            best_s = np.argmin(score, axis=1)
            rows = np.arange(p.num_layers)
            best_score, best_saved = score[rows, best_s], saved[rows, best_s]
            excess = m_now - limit
            blocked = ~np.isfinite(best_score)
            covered = 0.0
            for lay in np.argsort(best_score, kind="stable"):
                if blocked[lay]:
                    continue
                c[lay] = best_s[lay]
                covered += best_saved[lay]
                if covered >= excess:
                    break
                blocked[lay] = True
                blocked[p.neighbor_idx[p.neighbor_ptr[lay]:p.neighbor_ptr[lay + 1]]] = True
            continue
        if not p.num_edges:
            break
        pair = pair_moves(p, c, cur)
        saved = m_now - pair.memory_bytes
        ok = (saved > 0) & np.isfinite(pair.time_s)
        if not ok.any():
            break
        score = np.where(ok, (pair.time_s - t_now) / np.where(ok, saved, 1.0), np.inf)
        k, s, t = np.unravel_index(int(np.argmin(score)), score.shape)
        c[p.edge_src[k]], c[p.edge_dst[k]] = s, t
    return c, plan_memory(p, c) <= limit


def _independent_best_moves(p: DiscreteProblem, gain: np.ndarray, best_s: np.ndarray) -> list[tuple[int, int]]:
    """Improving single moves of pairwise non-adjacent layers, largest gain first."""
    cand = np.flatnonzero(gain > 0)
    cand = cand[np.argsort(-gain[cand], kind="stable")]
    blocked = np.zeros(p.num_layers, dtype=bool)
    chosen = []
    for lay in cand:
        if blocked[lay]:
            continue
        chosen.append((int(lay), int(best_s[lay])))
        blocked[lay] = True
        blocked[p.neighbor_idx[p.neighbor_ptr[lay]:p.neighbor_ptr[lay + 1]]] = True
    return chosen


def _swap(p: DiscreteProblem, c: np.ndarray, single: MoveScores, t_now: float, m_now: float, limit: float,
          tol: float, tries: int = 8) -> np.ndarray | None:
    """A trade of memory between two layers: one move that is faster but
    does not fit on its own, paid for by a move elsewhere that frees enough
    memory, with a net gain. For each gaining move the cheapest payer comes
    from a prefix minimum over payers sorted by memory change; the best
    ``tries`` trades are checked exactly and the first that improves is made."""
    dT = single.time_s - t_now
    dM = single.memory_bytes - m_now
    slack = limit - m_now
    finite = np.isfinite(dT)
    gain = finite & (dT < -tol) & (dM > slack)
    payer = finite & (dM < 0)
    if not gain.any() or not payer.any():
        return None
    pl, ps = np.nonzero(payer)
    order = np.argsort(dM[pl, ps], kind="stable")
    pl, ps = pl[order], ps[order]
    pdm, pdt = dM[pl, ps], dT[pl, ps]
    run_min = np.minimum.accumulate(pdt)
    run_arg = np.zeros(pdt.size, dtype=np.int64)  # index of the prefix minimum
    best = 0
    for j in range(1, pdt.size):  # host loop over payers (at most n S)
        if pdt[j] < pdt[best]:
            best = j
        run_arg[j] = best
    gl, gs = np.nonzero(gain)
    k = np.searchsorted(pdm, slack - dM[gl, gs], side="right") - 1
    has = k >= 0
    gl, gs, k = gl[has], gs[has], k[has]
    if not gl.size:
        return None
    net = dT[gl, gs] + run_min[k]
    good = np.flatnonzero(net < -tol)
    for j in good[np.argsort(net[good], kind="stable")][:tries]:
        b = run_arg[k[j]]
        if pl[b] == gl[j]:
            continue
        trial = c.copy()
        trial[gl[j]], trial[pl[b]] = gs[j], ps[b]
        if plan_memory(p, trial) <= limit and plan_time(p, trial) < t_now - tol:
            return trial
    return None


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


def _viterbi_batched(unary: np.ndarray, pair: np.ndarray) -> np.ndarray:
    """Min-sum paths ``[K, n]`` of chains with their own ``pair [K, n, S, S]``."""
    K, n, S = unary.shape
    value = unary[:, 0]
    back = np.zeros((n, K, S), dtype=np.int64)
    for i in range(1, n):  # over segment positions (at most the longest segment)
        cand = value[:, :, None] + pair[:, i]
        back[i] = np.argmin(cand, axis=1)
        value = np.min(cand, axis=1) + unary[:, i]
    path = np.zeros((K, n), dtype=np.int64)
    path[:, -1] = np.argmin(value, axis=1)
    rows = np.arange(K)
    for i in range(n - 1, 0, -1):
        path[:, i - 1] = back[i][rows, path[:, i]]
    return path


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
    the largest workspace. Each candidate's time and memory are computed
    exactly from its segment alone: the segment's outer edges see fixed
    strategies and its inner edges are the Viterbi's transitions."""
    n, S = p.layer_time_s.shape
    cur = _current(p, c)
    t_now = _with_overlap(p, cur.base_s, cur.grad_s, cur.bwd_s)
    m_now = cur.persistent_bytes + float(cur.top_val[0])
    ext = np.zeros((n, S))
    outer = ~seg.internal
    if outer.any():
        ar = np.flatnonzero(outer)
        cs, cd = c[p.edge_src[ar]], c[p.edge_dst[ar]]
        np.add.at(ext, p.edge_src[ar], p.reshard_s[ar, :, cd])
        np.add.at(ext, p.edge_dst[ar], p.reshard_s[ar, cs, :])
    allowed = p.workspace_bytes <= cur.top_val[0]
    unary_t = np.where(allowed, p.layer_time_s + ext, np.inf)
    mem = np.where(p.feasible, p.persistent_bytes, 0.0)
    valid = seg.nodes >= 0
    at = np.maximum(seg.nodes, 0)
    G, width = seg.nodes.shape
    U = np.where(valid[..., None], unary_t[at], 0.0)  # [G, W, S]
    A = np.where(valid[..., None], mem[at], 0.0)
    padded = np.concatenate([p.reshard_s, np.zeros((1, S, S))])  # edge -1: no edge, no cost
    pair = padded[seg.inner_edge]  # [G, W, S, S]
    prices = _PRICES * (t_now / max(m_now, 1.0))
    P = len(prices)
    unary = (U[None] + prices[:, None, None, None] * A[None]).reshape(P * G, width, S)
    paths = _viterbi_batched(unary, np.broadcast_to(pair[None], (P,) + pair.shape).reshape(P * G, width, S, S))
    g_of = np.tile(np.arange(G), P)
    old = np.where(valid, c[at], 0)[g_of]  # [K, W]
    new = np.where(valid[g_of], paths, old)
    gi, wi = g_of[:, None], np.arange(width)[None, :]
    # exact deltas from the segment alone
    d_time = (U[gi, wi, new] - U[gi, wi, old]).sum(axis=1)
    prev_new, prev_old = np.roll(new, 1, axis=1), np.roll(old, 1, axis=1)
    d_time += (pair[gi, wi, prev_new, new] - pair[gi, wi, prev_old, old]).sum(axis=1)
    d_mem = (A[gi, wi, new] - A[gi, wi, old]).sum(axis=1)
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
    mems = cur.persistent_bytes + d_mem + new_ws
    if p.gradient_overlap:
        gg = np.where(valid[..., None], p.grad_sync_s[at], 0.0)
        bb = np.where(valid[..., None], p.backward_s[at], 0.0)
        d_g = (gg[gi, wi, new] - gg[gi, wi, old]).sum(axis=1)
        d_b = (bb[gi, wi, new] - bb[gi, wi, old]).sum(axis=1)
        times = _with_overlap(p, cur.base_s + d_time, cur.grad_s + d_g, cur.bwd_s + d_b)
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
    cur = _current(p, c)
    t_now = _with_overlap(p, cur.base_s, cur.grad_s, cur.bwd_s)
    m_now = cur.persistent_bytes + float(cur.top_val[0])
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


def local_search(p: DiscreteProblem, choice, memory_limit: float, max_moves: int | None = None,
                 segments: Segments | None = None) -> np.ndarray:
    """Improve a plan that fits ``memory_limit`` until no single-layer move,
    no move of an edge's two layers and no memory trade between two layers
    (:func:`_swap`) lowers the time while still fitting. Improving moves of
    non-adjacent layers are applied together when their combination still
    fits and improves (their time gains add up exactly, overlap aside, which
    the combined check covers). With ``segments``, a chain segment may also
    be re-planned as a whole (:func:`segment_moves`) when nothing smaller helps."""
    c = np.array(choice, dtype=np.int64)
    limit = float(memory_limit)
    max_moves = 10 * p.num_layers + 100 if max_moves is None else max_moves
    for _ in range(max_moves):
        cur = _current(p, c)
        t_now = _with_overlap(p, cur.base_s, cur.grad_s, cur.bwd_s)
        m_now = cur.persistent_bytes + float(cur.top_val[0])
        tol = _REL_TOL * abs(t_now)
        single = single_moves(p, c, cur)
        ok = (single.memory_bytes <= limit) & (single.time_s < t_now - tol)
        if ok.any():
            masked = np.where(ok, single.time_s, np.inf)
            best_s = np.argmin(masked, axis=1)
            gain = t_now - masked[np.arange(p.num_layers), best_s]
            moves = _independent_best_moves(p, np.where(np.isfinite(gain), gain, 0.0), best_s)
            if len(moves) > 1:
                trial = c.copy()
                for lay, s in moves:
                    trial[lay] = s
                if plan_memory(p, trial) <= limit and plan_time(p, trial) < t_now - tol:
                    c = trial
                    continue
            lay, s = moves[0]
            c[lay] = s
            continue
        if p.num_edges:
            pair = pair_moves(p, c, cur)
            ok = (pair.memory_bytes <= limit) & (pair.time_s < t_now - tol)
            if ok.any():
                k, s, t = np.unravel_index(int(np.argmin(np.where(ok, pair.time_s, np.inf))), pair.time_s.shape)
                c[p.edge_src[k]], c[p.edge_dst[k]] = s, t
                continue
        if np.isfinite(limit):
            trial = _swap(p, c, single, t_now, m_now, limit, tol)
            if trial is not None:
                c = trial
                continue
        if segments is not None:
            trial = segment_moves(p, c, segments, limit, tol)
            if trial is not None:
                c = trial
                continue
        break
    return c


class RefineResult(NamedTuple):
    choice: np.ndarray  # [n] the best plan found
    time_s: float
    memory_bytes: float
    feasible: bool
    rounded_time_s: float  # the best candidate as given (before repair and local search)
    repaired_time_s: float  # the best candidate after repair, before local search
    candidates: int  # distinct candidates refined


def refine(p: DiscreteProblem, candidates, memory_limit: float, max_candidates: int = 4,
           segment_window: float = 0.03) -> RefineResult:
    """Repair and locally improve each distinct candidate plan ``[k, n]``
    (the best ``max_candidates`` after repair get the local search, and
    each distinct local optimum within ``segment_window`` of the best then
    the segment moves), and return the best
    plan that fits. If none can be repaired, the search
    restarts from the exact smallest-memory plan, which fits whenever any
    plan does."""
    limit = float(memory_limit)
    cands = np.unique(np.asarray(candidates, dtype=np.int64).reshape(-1, p.num_layers), axis=0)
    times = np.array([plan_time(p, x) for x in cands])
    fits = np.array([plan_memory(p, x) <= limit for x in cands])
    rounded = float(np.min(np.where(fits, times, np.inf))) if cands.size else np.inf
    repaired = []
    for x in cands:
        y, ok = repair(p, x, limit)
        if ok:
            repaired.append(y)
    if not repaired:
        y, ok = repair(p, minimum_memory(p).choice, limit)
        if not ok:  # nothing fits
            mm = minimum_memory(p).choice
            return RefineResult(mm, plan_time(p, mm), plan_memory(p, mm), False, rounded, np.inf, len(cands))
        repaired.append(y)
    repaired = np.unique(np.asarray(repaired), axis=0)
    rtimes = np.array([plan_time(p, y) for y in repaired])
    order = np.argsort(rtimes, kind="stable")[:max_candidates]
    local = np.unique(np.asarray([local_search(p, repaired[i], limit) for i in order]), axis=0)
    # then the large neighbourhood (whole chain segments) from each distinct local
    # optimum within segment_window of the best one
    ltimes = np.array([plan_time(p, z) for z in local])
    local = local[np.argsort(ltimes, kind="stable")][: int(np.sum(ltimes <= ltimes.min() * (1 + segment_window)))]
    seg = chain_segments(p)
    best, best_t = None, np.inf
    for z in local:
        z = local_search(p, z, limit, segments=seg)
        tz = plan_time(p, z)
        if tz < best_t:
            best, best_t = z, tz
    return RefineResult(best, best_t, plan_memory(p, best), True, rounded, float(rtimes.min()), len(cands))
