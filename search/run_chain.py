"""A graph's run terms by position in layer order (:class:`RunChain`), for the DP over runs
of recomputing layers (:mod:`search.dp_runs`, :func:`search.dp.solve_dp`),
and its run sums rounded down into buckets: the moves between them, the
Viterbi and the bounds to go over (option, bucket) states. A bucketed sum
never exceeds the true one, so what these allow is a superset of the plans
whose transients keep within a cap: their values are lower bounds."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from search.layer_chain import skip_resharding
from search.problem import DiscreteProblem

__all__ = ["BUCKETS", "HOP_BITS", "MAX_OPEN_SKIPS", "MOST_OPEN_STATES", "BucketMoves", "RunChain", "all_bucket_moves",
           "bucket_moves", "bucket_start", "bucket_to_go", "bucket_viterbi", "open_skips", "run_chain", "skip_state",
           "skip_to_go"]

BUCKETS = 16  # buckets of a run's sum in the DP's bounds (bucket_moves)


class RunChain(NamedTuple):
    """A chain problem in layer order with its run terms by position."""

    time: np.ndarray  # [n, O] seconds, +inf where infeasible
    persistent: np.ndarray  # [n, O] backward-phase bytes, +inf where infeasible
    optimizer: np.ndarray  # [n, O] optimizer-phase bytes, +inf where infeasible
    workspace: np.ndarray  # [n, O] bytes, +inf where infeasible
    recompute: np.ndarray  # [n, O] bytes a recomputing option holds again in its run (0 otherwise)
    joins: np.ndarray  # [n, O] bool: the option joins the run before it (never at position 0)
    pair: np.ndarray  # [n, O, O] seconds: position i - 1 on s, i on t (position 0 unused)
    credit: np.ndarray  # [n, O, O] bytes the edge i - 1 -> i frees on (s, t) (search.problem.run_terms)
    # skip edges (src < dst - 1) that can free a checkpoint: their credits, already taken off `persistent` at the
    # destination (a relaxation); a plan earns one only where its source recomputes and the run reaches
    # the destination, else the label search adds it back (search.dp_runs)
    skip_src: np.ndarray  # [K] int
    skip_dst: np.ndarray  # [K] int
    skip_credit: np.ndarray  # [K, O] bytes, by the destination's option
    skip_bit: np.ndarray  # [K] int64: the edge's bit in a label's mask of open edges (reused once it closes)
    skip_opens: np.ndarray  # [n, O] int64: the bits of the skip edges each option opens there (it recomputes)
    # skip edges that reshard (hops): their least resharding over the source's options is folded into
    # `time` at the destination (a relaxation, search.layer_chain.layer_order_chain's "lower"); a label of
    # the search by time carries its source's class in a field of its int64 code and pays the rest there
    hop_src: np.ndarray  # [H] int
    hop_dst: np.ndarray  # [H] int
    hop_class: np.ndarray  # [H, O] int64: the class of each source option (options whose resharding is alike)
    hop_extra: np.ndarray  # [H, C, O] seconds above the least, by the source's class and the destination's option
    hop_shift: np.ndarray  # [H] int64: where the edge's class sits in a label's code (HOP_BITS wide)


MAX_OPEN_SKIPS = 62  # skip edges open at one position that a label's int64 mask holds
MOST_OPEN_STATES = 6  # skip edges open over a position that skip_to_go tracks (2 ** this states per option)
HOP_BITS = 8  # bits of a hop's class in a label's code: at most 255 classes, 7 hops open at once


def run_chain(p: DiscreteProblem) -> RunChain | None:
    """``p``'s :class:`RunChain`, or None where ``p`` is no graph in layer
    order (runs follow the layers' order, :func:`search.problem.run_terms`):
    every edge runs forward and joins consecutive layers or skips ahead, with
    at most :data:`MAX_OPEN_SKIPS` skip edges that can free a checkpoint
    and at most ``64 // HOP_BITS - 1`` that reshard (each with at most
    ``2 ** HOP_BITS - 1`` classes of source options) over any layer."""
    n, O = p.num_layers, p.num_options
    src, dst = p.edge_src, p.edge_dst
    if np.any(src >= dst):
        return None
    step = dst == src + 1
    skip = np.flatnonzero(~step)
    time = p.layer_time_s.copy()
    hop = skip[np.any(p.reshard_s[skip] != 0.0, axis=(1, 2))]
    hop_class = np.zeros((hop.size, O), dtype=np.int64)
    rows = []
    for h, e in enumerate(hop):
        feasible = np.flatnonzero(p.feasible[src[e]])
        if feasible.size == 0:  # no plan at all
            return None
        classes, which = np.unique(p.reshard_s[e][feasible], axis=0, return_inverse=True)  # [C, O(dst)]
        least = skip_resharding(p, e, "lower")
        time[dst[e]] += least  # (search.layer_chain.layer_order_chain's "lower")
        if classes.shape[0] >= 1 << HOP_BITS:
            return None
        hop_class[h, feasible] = which.reshape(-1)
        rows.append(classes - least[None, :])
    slots = _bits(src[hop], dst[hop], 64 // HOP_BITS - 1)
    if slots is None:
        return None
    hop_extra = np.zeros((hop.size, max((r.shape[0] for r in rows), default=1), O))
    for h, r in enumerate(rows):
        hop_extra[h, :r.shape[0]] = r
    can_start = p.feasible[src[skip]] & p.option_recomputes[None, :]  # [K, O]
    live = can_start.any(axis=1) & (p.checkpoint_credit[skip] > 0).any(axis=1)
    skip = skip[live]  # the others never free anything
    bits = _bits(src[skip], dst[skip], MAX_OPEN_SKIPS)
    if bits is None:
        return None
    pair = np.zeros((n, O, O))
    credit = np.zeros((n, O, O))
    pair[dst[step]] = p.reshard_s[step]  # one edge per position (parallel edges are merged)
    credit[dst[step]] = p.option_recomputes[None, :, None] * p.checkpoint_credit[step][:, None, :]
    joins = np.broadcast_to(p.option_joins, (n, O)) & (np.arange(n) > 0)[:, None]
    persistent = p.persistent_bytes.copy()
    np.subtract.at(persistent, dst[skip], p.checkpoint_credit[skip])
    opens = np.zeros((n, O), dtype=np.int64)
    np.bitwise_or.at(opens, src[skip], np.where(can_start[live], np.int64(1) << bits[:, None], 0))
    return RunChain(time=np.where(p.feasible, time, np.inf), persistent=persistent, optimizer=p.optimizer_bytes,
                    workspace=p.workspace_bytes, recompute=p.recompute_bytes, joins=joins, pair=pair, credit=credit,
                    skip_src=src[skip], skip_dst=dst[skip], skip_credit=p.checkpoint_credit[skip], skip_bit=bits,
                    skip_opens=opens, hop_src=src[hop], hop_dst=dst[hop], hop_class=hop_class, hop_extra=hop_extra,
                    hop_shift=(slots * HOP_BITS).astype(np.int64))


def _bits(src: np.ndarray, dst: np.ndarray, count: int) -> np.ndarray | None:
    """A slot per edge ``(src, dst]`` such that edges open at one position
    have different slots (interval colouring in order of sources), or None
    where more than ``count`` are open at once."""
    out = np.zeros(src.size, dtype=np.int64)
    free_at = np.full(count, -1)  # the destination of the edge holding each slot
    for k in np.argsort(src, kind="stable"):
        ok = np.flatnonzero(free_at <= src[k])
        if ok.size == 0:
            return None
        out[k] = ok[0]
        free_at[ok[0]] = dst[k]
    return out


def _round(x: np.ndarray, up: bool) -> np.ndarray:
    return (np.ceil(x) if up else np.floor(x)).astype(np.int64)


def bucket_moves(rc: RunChain, i: int, cap: float, buckets: int, up: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The moves into position ``i`` (``i >= 1``) of the bucketed run sum at
    ``cap``: a run's sum ``r`` is held as ``floor(r / d)`` buckets of ``d =
    cap / buckets`` (the last holding everything above), so it never exceeds
    the true sum; with ``up``, each layer's bytes rounded up instead, so it
    is never below it until it reaches the last bucket (which holds every
    sum above, so a run there may still grow past the cap through layers
    whose workspaces fit within a bucket: the plans these moves allow keep
    their transients within the cap where every joining workspace is
    larger than a bucket). Returns, for option ``t`` at ``i`` and bucket ``b`` at
    ``i - 1``, whether the move keeps ``t``'s transient within the cap (a
    joining ``t`` holds ``b d`` beside its workspace) and the bucket at ``i``:
    ``([O, B] bool, [O, B] int)``."""
    d = cap / buckets
    b = np.arange(buckets)[None, :]
    step = _round(np.where(np.isfinite(rc.time[i]), rc.recompute[i], 0.0) / d, up)[:, None]  # [O, 1]
    J = rc.joins[i][:, None]
    allowed = ~J | (b * d + rc.workspace[i][:, None] <= cap)
    return allowed, np.minimum(np.where(J, b + step, step), buckets - 1)


def bucket_start(rc: RunChain, cap: float, buckets: int, up: bool = False) -> np.ndarray:
    """``[O]``: each option's bucket at position 0 (no run to join there)."""
    r = np.where(np.isfinite(rc.time[0]), rc.recompute[0], 0.0)
    return np.minimum(_round(r / (cap / buckets), up), buckets - 1)


def bucket_to_go(rc: RunChain, inside: np.ndarray, unary: np.ndarray, pair: np.ndarray, cap: float,
                 buckets: int) -> np.ndarray:
    """``[n, O, B]``: the least sum of ``unary`` and ``pair`` over the
    positions after ``i``, given option ``s`` and bucket ``b`` at ``i``, over
    the continuations whose transients keep within ``cap`` as the bucketed
    run sums count them (never more than the true ones: a lower bound on
    the continuations that keep within it)."""
    n, O = unary.shape
    h = np.zeros((n, O, buckets))
    for i in range(n - 1, 0, -1):
        allowed, nxt_b = bucket_moves(rc, i, cap, buckets)  # [O(t), B]
        ok = allowed & inside[i][:, None]
        nxt = np.where(ok, unary[i][:, None] + np.take_along_axis(h[i], nxt_b, axis=1), np.inf)  # [t, b]
        h[i - 1] = np.min(pair[i][:, :, None] + nxt[None, :, :], axis=1)  # [s, b]
    return h


class BucketMoves(NamedTuple):
    """:func:`bucket_moves` at every position for ``K`` caps."""

    allowed: np.ndarray  # [K, n, O, B] bool (position 0 unused)
    nxt: np.ndarray  # [K, n, O, B] int, the bucket at position i
    start: np.ndarray  # [K, O] int, each option's bucket at position 0


def all_bucket_moves(rc: RunChain, caps: np.ndarray, buckets: int, up: bool = False) -> BucketMoves:
    """:func:`bucket_moves` (and ``up``) at every position for each of ``caps``."""
    n, O = rc.time.shape
    allowed = np.ones((len(caps), n, O, buckets), dtype=bool)
    nxt = np.zeros((len(caps), n, O, buckets), dtype=np.int64)
    for k, cap in enumerate(caps):
        for i in range(1, n):
            allowed[k, i], nxt[k, i] = bucket_moves(rc, i, float(cap), buckets, up)
    return BucketMoves(allowed, nxt, np.stack([bucket_start(rc, float(c), buckets, up) for c in caps]))


def bucket_viterbi(unary: np.ndarray, pair: np.ndarray, moves: BucketMoves, weighted=None):
    """Min-sum paths of ``K`` chains over the states (option, bucketed run
    sum) (:func:`bucket_moves`; chain ``k`` at ``moves``' cap ``k``), like
    :func:`search.dp.viterbi` (``unary [K, n, O]``, ``pair [n, O, O]``,
    ``weighted = (C, w)``). The bucketed sums never exceed the true ones, so
    these are relaxations of the paths whose transients keep within each
    cap. Returns the values ``[K]`` and the paths ``[K, n]``."""
    K, n, O = unary.shape
    B = moves.allowed.shape[-1]
    kk = np.arange(K)[:, None]
    value = np.full((K, O, B), np.inf)
    value[kk, np.arange(O)[None, :], moves.start] = unary[:, 0]
    back_s = np.zeros((n, K, O, B), dtype=np.int64)
    back_b = np.zeros((n, K, O, B), dtype=np.int64)
    for i in range(1, n):
        P = pair[i][None] if weighted is None else pair[i][None] + weighted[1][:, None, None] * weighted[0][i][None]
        X = value[:, :, :, None] + P[:, :, None, :]  # [K, s, b, t]
        xs = np.argmin(X, axis=1)  # [K, b, t]
        src = np.where(moves.allowed[:, i], np.take_along_axis(X, xs[:, None], axis=1)[:, 0].transpose(0, 2, 1),
                       np.inf)  # [K, t, b]
        cand = np.where(moves.nxt[:, i][..., None] == np.arange(B), src[..., None], np.inf)  # [K, t, b, b']
        b_from = np.argmin(cand, axis=2)  # [K, t, b']
        value = np.take_along_axis(cand, b_from[:, :, None, :], axis=2)[:, :, 0, :] + unary[:, i][:, :, None]
        back_b[i] = b_from
        back_s[i] = np.take_along_axis(xs.transpose(0, 2, 1), b_from, axis=2)
    flat = value.reshape(K, -1)
    j = np.argmin(flat, axis=1)
    rows = np.arange(K)
    path = np.zeros((K, n), dtype=np.int64)
    t, b = j // B, j % B
    path[:, n - 1] = t
    for i in range(n - 1, 0, -1):
        t, b = back_s[i][rows, t, b], back_b[i][rows, t, b]
        path[:, i - 1] = t
    return flat[rows, j], path


def open_skips(rc: RunChain) -> list[np.ndarray]:
    """Per position ``i``: the skip edges (indices into ``rc.skip_*``) open
    over it, ``src <= i < dst``, in the order of their bits in
    :func:`skip_state`."""
    return [np.flatnonzero((rc.skip_src <= i) & (rc.skip_dst > i)) for i in range(rc.time.shape[0])]


def skip_state(rc: RunChain, edges: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The labels' masks ``[N]`` (bits ``rc.skip_bit``) as indices over
    ``edges`` (:func:`open_skips` at one position): bit ``j`` set where
    edge ``edges[j]`` is still earning its credit."""
    out = np.zeros(np.shape(mask), dtype=np.int64)
    for j, e in enumerate(edges):
        out |= ((mask >> rc.skip_bit[e]) & 1) << j
    return out


def skip_to_go(rc: RunChain, inside: np.ndarray, unary: np.ndarray, pair: np.ndarray,
               most_open: int = MOST_OPEN_STATES) -> list[np.ndarray] | None:
    """Per position ``i``, ``[O, 2 ** k_i]``: the least sum of ``unary``
    (backward-phase bytes with every skip edge's credit taken off, as
    ``rc.persistent``) and ``pair`` over the positions after ``i``, given
    option ``s`` at ``i`` and which of the ``k_i`` skip edges open over
    ``i`` (:func:`open_skips`) are still earning their credits
    (:func:`skip_state`), adding back each credit a continuation does not
    earn, as the label search does (:mod:`search.dp_runs`): exact in the
    skip edges' credits where ``rc.persistent`` assumes every one earned.
    None where more than ``most_open`` are open over a position."""
    n, O = unary.shape
    opened = open_skips(rc)
    if max((e.size for e in opened), default=0) > most_open:
        return None
    go = [np.zeros((O, 1 << opened[n - 1].size))]  # from the last position back; reversed at the end
    for i in range(n - 2, -1, -1):
        now, nxt_open = opened[i], opened[i + 1]
        states = np.arange(1 << now.size)
        join = rc.joins[i + 1][None, :]  # [1, O(t)]
        add = np.zeros((states.size, O))
        nxt = np.zeros((states.size, O), dtype=np.int64)
        for j, e in enumerate(now):
            earning = (((states >> j) & 1)[:, None] > 0) & join  # [2^k, O(t)]
            if rc.skip_dst[e] == i + 1:  # closes: its credit back unless the run reached it
                add += np.where(earning, 0.0, rc.skip_credit[e][None, :])
            else:
                nxt |= earning.astype(np.int64) << int(np.flatnonzero(nxt_open == e)[0])
        for j, e in enumerate(nxt_open):
            if rc.skip_src[e] == i + 1:  # opens where the option recomputes
                nxt |= ((rc.skip_opens[i + 1] >> rc.skip_bit[e]) & 1)[None, :] << j
        later = np.take_along_axis(go[-1].T, nxt, axis=0)  # [2^k, O(t)]: position i + 1's value at its state
        val = np.where(inside[i + 1][None, :], unary[i + 1][None, :] + add + later, np.inf)  # [2^k, O(t)]
        go.append(np.min(pair[i + 1][:, None, :] + val[None, :, :], axis=2))  # [O(s), 2^k]
    return go[::-1]
