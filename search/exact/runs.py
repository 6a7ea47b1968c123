"""A graph's run terms by position in layer order (:class:`RunChain`, built
in :mod:`search.exact._run_chain` and passed on here), for the DP over runs
of recomputing layers (:mod:`search.exact.dp_runs`, :func:`search.exact.dp.solve_dp`),
and its run sums rounded down into buckets: the moves between them, the
Viterbi and the bounds to go over (option, bucket) states. A bucketed sum
never exceeds the true one, so what these allow is a superset of the plans
whose transients keep within a cap: their values are lower bounds."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from search.exact._run_chain import HOP_BITS, MAX_OPEN_SKIPS, RunChain, run_chain

__all__ = ["BUCKETS", "HOP_BITS", "MAX_OPEN_SKIPS", "MOST_BUCKET_OPEN_STATES", "MOST_OPEN_STATES", "BucketMoves",
           "RunChain", "SkipMoves", "all_bucket_moves", "bucket_moves", "bucket_start", "bucket_to_go",
           "bucket_viterbi", "open_skips", "pair_groups", "run_chain", "skip_added", "skip_moves", "skip_state",
           "skip_to_go"]

BUCKETS = 16  # buckets of a run's sum in the DP's bounds (bucket_moves)
MOST_OPEN_STATES = 6  # skip edges open over a position that skip_to_go tracks (2 ** this states per option)
# ... that bucket_viterbi and bucket_to_go track (their states and back pointers grow with 2 ** this beside the
# buckets; ResNets have at most 2 open)
MOST_BUCKET_OPEN_STATES = 3


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
                 buckets: int, skips: SkipMoves | None = None, weight: float = 0.0) -> np.ndarray:
    """``[n, O, B]``: the least sum of ``unary`` and ``pair`` over the
    positions after ``i``, given option ``s`` and bucket ``b`` at ``i``, over
    the continuations whose transients keep within ``cap`` as the bucketed
    run sums count them (never more than the true ones: a lower bound on
    the continuations that keep within it). With ``skips``
    (:func:`skip_moves`), ``[n, O, B, M]`` by the state of the skip edges
    open over ``i`` too (``M`` the most states of any position, those past a
    position's own unused), adding ``weight`` times each credit a
    continuation does not earn (``unary`` taking every one as earned, as
    ``rc.persistent``)."""
    n, O = unary.shape
    M = 1 if skips is None else int(skips.size.max())
    h = np.zeros((n, O, buckets, M))
    for i in range(n - 1, 0, -1):
        allowed, nxt_b = bucket_moves(rc, i, cap, buckets)  # [O(t), B]
        ok = (allowed & inside[i][:, None])[:, :, None]
        if skips is None:
            later = np.take_along_axis(h[i][:, :, 0], nxt_b, axis=1)[:, :, None]  # [t, b, 1]
            nxt = np.where(ok, unary[i][:, None, None] + later, np.inf)
        else:
            later = h[i][np.arange(O)[:, None, None], nxt_b[:, :, None], skips.nxt[i].T[:, None, :]]  # [t, b, m]
            nxt = np.where(ok, unary[i][:, None, None] + weight * skips.add[i].T[:, None, :] + later, np.inf)
        h[i - 1][:, :, :nxt.shape[2]] = np.min(pair[i][:, :, None, None] + nxt[None], axis=1)  # [s, b, m]
    return h[..., 0] if skips is None else h


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


def pair_groups(pair: np.ndarray, C: np.ndarray | None = None) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per position ``i >= 1`` (entry 0 unused), the options ``s`` whose rows
    of ``pair[i]`` (and ``C[i]``) ``[O, O]`` are alike, so that a min-sum move
    from them differs only by their values: ``(order of s by group, each
    group's first place in it, the groups' rows)``, for
    :func:`bucket_viterbi` (a caller that runs it many times on the same
    pairs computes them once)."""
    out = [(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((0, 0)))]
    for i in range(1, pair.shape[0]):
        rows = pair[i] if C is None else np.concatenate([pair[i], C[i]], axis=1)
        key, group = np.unique(rows, axis=0, return_inverse=True)
        order = np.argsort(group.reshape(-1), kind="stable")
        starts = np.flatnonzero(np.r_[True, np.diff(group.reshape(-1)[order]) != 0])
        out.append((order, starts, key))
    return out


def bucket_viterbi(unary, pair, moves: BucketMoves, weighted=None, skips: SkipMoves | None = None, groups=None):
    """Min-sum paths of ``K`` chains over the states (option, bucketed run
    sum) (:func:`bucket_moves`; chain ``k`` at ``moves``' cap ``k``), like
    :func:`search.exact.dp.viterbi` (``unary [K, n, O]``, ``pair [n, O, O]``,
    ``weighted = (C, w)``: ``pair + w[k] C`` in chain ``k``). The bucketed
    sums never exceed the true ones, so these are relaxations of the paths
    whose transients keep within each cap. With ``skips``
    (:func:`skip_moves`), the states hold which open skip edges still earn
    their credits too, and each credit a path does not earn costs ``w[k]``
    times its bytes (the unaries taking every one as earned): exact in the
    skip edges' credits. ``groups``: :func:`pair_groups` of ``pair`` and
    ``C``, where the caller has them. Returns the values ``[K]`` and the
    paths ``[K, n]``."""
    K, n, O = unary.shape
    groups = pair_groups(pair, None if weighted is None else weighted[0]) if groups is None else groups
    B = moves.allowed.shape[-1]
    kk = np.arange(K)
    w = np.zeros(K) if weighted is None else np.asarray(weighted[1], dtype=float)
    size = np.ones(n, dtype=np.int64) if skips is None else skips.size
    value = np.full((K, O, B, int(size[0])), np.inf)
    value[kk[:, None], np.arange(O)[None, :], moves.start, 0 if skips is None else skips.start[None, :]] = unary[:, 0]
    small = np.uint8 if max(O, B, int(size.max())) <= 255 else np.int32
    back = []  # per position: (s [K, B, M, O] by group, m [K, O, B, M1], b [K, O, B, M1]) of each state's best move
    bb = np.arange(B)
    for i in range(1, n):
        M, M1 = int(size[i - 1]), int(size[i])
        order, starts, key = groups[i]
        # the best option of each group of alike rows, then the best group: [K, G, B, M]
        vs = value[:, order]
        g_val = np.minimum.reduceat(vs, starts, axis=1)
        hit = vs == np.repeat(g_val, np.diff(np.r_[starts, O]), axis=1)
        first = np.maximum.reduceat(np.where(hit, -np.arange(O)[None, :, None, None], -O), starts, axis=1)
        g_arg = order[-first]  # [K, G, B, M]: the option of each group's best
        P = key[:, :O][None] + (0.0 if weighted is None else w[:, None, None] * key[:, O:][None])  # [K|1, G, O(t)]
        X = g_val.reshape(K, -1, B * M)[:, :, :, None] + P[:, :, None, :]  # [K, G, BM, t]
        xg = np.argmin(X, axis=1)  # [K, BM, t]
        xv = np.take_along_axis(X, xg[:, None], axis=1)[:, 0].reshape(K, B, M, O)
        xs = np.take_along_axis(g_arg.reshape(K, -1, B * M)[..., None], xg[:, None], axis=1)[:, 0].reshape(K, B, M, O)
        if skips is not None:
            xv = xv + w[:, None, None, None] * skips.add[i][None, None, :, :]
        xv = np.where(moves.allowed[:, i].transpose(0, 2, 1)[:, :, None, :], xv, np.inf)  # [K, b, m, t]
        # the skip states: m -> nxt[m, t], the least over the m that meet
        nm = np.zeros((M, O), dtype=np.int64) if skips is None else skips.nxt[i]
        Z = np.full((K, O, B, M1), np.inf)
        m_from = np.zeros((K, O, B, M1), dtype=np.int64)
        for j in range(M1):
            cand = np.where((nm == j)[None, None], xv, np.inf)  # [K, b, m, t]
            m_from[..., j] = np.argmin(cand, axis=2).transpose(0, 2, 1)
            Z[..., j] = np.min(cand, axis=2).transpose(0, 2, 1)
        # the buckets: a joining option shifts them by its step (the last holds every sum above), one that
        # does not join starts again (every bucket to its step)
        nb = moves.nxt[:, i]  # [K, t, b]
        step = nb[:, :, :1, None]  # [K, t, 1, 1]
        restart = np.all(nb == nb[:, :, :1], axis=2)[:, :, None, None]  # [K, t, 1, 1]
        src = bb[None, None, :, None] - step  # [K, t, b', 1]
        shifted = np.where(src >= 0, np.take_along_axis(Z, np.broadcast_to(np.maximum(src, 0), Z.shape), axis=2),
                           np.inf)
        b_from = np.broadcast_to(src, Z.shape).copy()
        top = np.where(bb[None, None, :, None] >= B - 1 - step, Z, np.inf)  # every sum that lands in the last
        shifted[:, :, B - 1] = top.min(axis=2)
        b_from[:, :, B - 1] = np.argmin(top, axis=2)
        whole = np.where(bb[None, None, :, None] == step, Z.min(axis=2, keepdims=True), np.inf)
        Zb = np.where(restart, whole, shifted)
        b_from = np.where(restart, np.argmin(Z, axis=2)[:, :, None, :], b_from)
        value = Zb + unary[:, i][:, :, None, None]
        back.append((xs.astype(small), m_from.astype(small), b_from.astype(small)))
    flat = value.reshape(K, -1)
    j = np.argmin(flat, axis=1)
    M1 = value.shape[3]
    t, b, m = j // (B * M1), (j // M1) % B, j % M1
    path = np.zeros((K, n), dtype=np.int64)
    path[:, n - 1] = t
    for i in range(n - 1, 0, -1):
        xs, m_from, b_from = back[i - 1]
        b0 = b_from[kk, t, b, m].astype(np.int64)
        m0 = m_from[kk, t, b0, m].astype(np.int64)
        t = xs[kk, b0, m0, t].astype(np.int64)
        b, m = b0, m0
        path[:, i - 1] = t
    return flat[kk, j], path


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


class SkipMoves(NamedTuple):
    """The states of the skip edges open over each position
    (:func:`open_skips`; state bit ``j`` set where edge ``j`` there is still
    earning its credit, :func:`skip_state`) and the moves between them."""

    start: np.ndarray  # [O] int: each option's state at position 0
    size: np.ndarray  # [n] int: the states at each position, 2 ** (skip edges open over it)
    nxt: list  # per position i >= 1, [size[i - 1], O] int: the state at i on option t from state m (entry 0 unused)
    add: list  # per position i >= 1, [size[i - 1], O] bytes: the credits of the edges closing at i not earned


def skip_moves(rc: RunChain, most_open: int = MOST_OPEN_STATES) -> SkipMoves | None:
    """The :class:`SkipMoves` of ``rc``: a skip edge's credit is earned
    where its source recomputes and every layer after it up to its
    destination joins the run (:mod:`search.exact.dp_runs`). None where more than
    ``most_open`` skip edges are open over a position."""
    n, O = rc.time.shape
    opened = open_skips(rc)
    if max((e.size for e in opened), default=0) > most_open:
        return None
    nxt_all, add_all = [np.zeros((1, O), dtype=np.int64)], [np.zeros((1, O))]
    for i in range(1, n):
        now, nxt_open = opened[i - 1], opened[i]
        states = np.arange(1 << now.size)
        join = rc.joins[i][None, :]  # [1, O(t)]
        add = np.zeros((states.size, O))
        nxt = np.zeros((states.size, O), dtype=np.int64)
        for j, e in enumerate(now):
            earning = (((states >> j) & 1)[:, None] > 0) & join  # [2^k, O(t)]
            if rc.skip_dst[e] == i:  # closes: its credit back unless the run reached it
                add += np.where(earning, 0.0, rc.skip_credit[e][None, :])
            else:
                nxt |= earning.astype(np.int64) << int(np.flatnonzero(nxt_open == e)[0])
        for j, e in enumerate(nxt_open):
            if rc.skip_src[e] == i:  # opens where the option recomputes
                nxt |= ((rc.skip_opens[i] >> rc.skip_bit[e]) & 1)[None, :] << j
        nxt_all.append(nxt)
        add_all.append(add)
    return SkipMoves(start=skip_state(rc, opened[0], rc.skip_opens[0]),
                     size=np.array([1 << e.size for e in opened], dtype=np.int64), nxt=nxt_all, add=add_all)


def skip_added(skips: SkipMoves, paths: np.ndarray) -> np.ndarray:
    """``[N]``: the bytes of the skip edges' credits paths ``[N, n]`` do not
    earn (those :func:`skip_moves` adds back)."""
    paths = np.asarray(paths, dtype=np.int64)
    state = skips.start[paths[:, 0]]
    out = np.zeros(paths.shape[0])
    for i in range(1, paths.shape[1]):
        t = paths[:, i]
        out += skips.add[i][state, t]
        state = skips.nxt[i][state, t]
    return out


def skip_to_go(rc: RunChain, inside: np.ndarray, unary: np.ndarray, pair: np.ndarray,
               most_open: int = MOST_OPEN_STATES, skips: SkipMoves | None = None) -> list[np.ndarray] | None:
    """Per position ``i``, ``[O, 2 ** k_i]``: the least sum of ``unary``
    (backward-phase bytes with every skip edge's credit taken off, as
    ``rc.persistent``) and ``pair`` over the positions after ``i``, given
    option ``s`` at ``i`` and which of the ``k_i`` skip edges open over
    ``i`` (:func:`open_skips`) are still earning their credits
    (:func:`skip_state`), adding back each credit a continuation does not
    earn, as the label search does (:mod:`search.exact.dp_runs`): exact in the
    skip edges' credits where ``rc.persistent`` assumes every one earned.
    None where more than ``most_open`` are open over a position. ``skips``:
    :func:`skip_moves` of ``rc``, where the caller has them."""
    n, O = unary.shape
    skips = skip_moves(rc, most_open) if skips is None else skips
    if skips is None:
        return None
    go = [np.zeros((O, int(skips.size[n - 1])))]  # from the last position back; reversed at the end
    for i in range(n - 2, -1, -1):
        later = np.take_along_axis(go[-1].T, skips.nxt[i + 1], axis=0)  # [2^k, O(t)]: i + 1's value at its state
        val = np.where(inside[i + 1][None, :], unary[i + 1][None, :] + skips.add[i + 1] + later, np.inf)
        go.append(np.min(pair[i + 1][:, None, :] + val[None, :, :], axis=2))  # [O(s), 2^k]
    return go[::-1]
