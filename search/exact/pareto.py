"""Label sets of the DP's label-setting searches (:mod:`search.exact.dp`,
:mod:`search.exact.dp_runs`): the Pareto filters (which labels no other label
matches or beats in every coordinate; smaller is better in all) and the
path back from a last label."""

from __future__ import annotations

from bisect import bisect_left, bisect_right

import numpy as np

__all__ = ["nondominated", "nondominated_rows", "label_path"]

_PAIRWISE_MAX = 1024  # label sets up to this size are filtered by an all-pairs comparison
_HEAD_ROUNDS = 64  # rounds of nondominated_rows' vectorised sweep before the long fronts' own


def nondominated(tau: np.ndarray, a: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Indices of the labels ``(tau, a, q)`` that no other label matches or
    beats in all three (of equal labels, the first is kept). Exact: in the
    order of ``(a, q, tau)`` (stable) only an earlier label can dominate a
    later one, so a label goes iff an earlier one has ``q`` and ``tau`` no
    larger; that is an all-pairs test for small sets and a sweep keeping the
    ``(q, tau)`` staircase of the labels so far for large ones (``O(m log m)``
    searches)."""
    o = np.lexsort((tau, q, a))
    t_o, q_o = tau[o], q[o]
    m = o.size
    if m <= _PAIRWISE_MAX:
        earlier = np.tri(m, m, -1, dtype=bool).T  # [i, j]: i before j
        dominated = np.any(earlier & (q_o[:, None] <= q_o[None, :]) & (t_o[:, None] <= t_o[None, :]), axis=0)
        return o[~dominated]
    keep = np.zeros(m, dtype=bool)
    stair_q: list[float] = []  # q ascending, tau descending: the labels so far no other beats in (q, tau)
    stair_t: list[float] = []
    for j, (qj, tj) in enumerate(zip(q_o.tolist(), t_o.tolist())):
        k = bisect_right(stair_q, qj)
        if k and stair_t[k - 1] <= tj:  # the fastest label with q <= qj is no slower
            continue
        keep[j] = True
        s = bisect_left(stair_q, qj)
        e = s
        while e < len(stair_t) and stair_t[e] >= tj:  # staircase points the new label now beats
            e += 1
        stair_q[s:e] = [qj]
        stair_t[s:e] = [tj]
    return o[keep]


def nondominated_rows(points: np.ndarray, group: np.ndarray | None = None) -> np.ndarray:
    """Indices (ascending) of the rows of ``points`` ``[m, d]`` (``d >= 3``)
    that no other row of the same ``group`` ``[m]`` (default: one group)
    matches or beats in all ``d`` coordinates (of equal rows, the first is
    kept). Exact: in the lexicographic order of ``(group, columns)``
    (stable) a row can be matched or beaten only by a row before it, so the
    first row of each group survives, and so does the first row left after
    removing every row the survivors before it match or beat (a row beaten
    by a removed row is beaten by what removed that row). Each round takes
    the next row of every group at once and removes what it matches or beats
    (vectorised over all groups); after :data:`_HEAD_ROUNDS` rounds the rows
    left, which no survivor beats, are filtered among themselves by
    :func:`_sweep` (fronts longer than that, as the DP's by-time label sets
    have)."""
    x = np.asarray(points, dtype=float)
    m, d = x.shape
    g = np.zeros(m, dtype=np.int64) if group is None else np.asarray(group, dtype=np.int64)
    order = np.lexsort(tuple(x[:, k] for k in range(d - 1, -1, -1)) + (g,))
    cols = [x[order, k] for k in range(d)]  # [d][rows left] (contiguous columns compare fastest)
    g, idx = g[order], order
    kept = [np.zeros(0, dtype=np.int64)]
    for _ in range(_HEAD_ROUNDS):
        if idx.size == 0:
            break
        first = np.r_[True, g[1:] != g[:-1]]  # [rows left] the next survivor of each group
        head = np.maximum.accumulate(np.where(first, np.arange(idx.size), 0))
        kept.append(idx[first])
        beaten = cols[0] >= cols[0][head]  # (a head matches itself)
        for c in cols[1:]:
            beaten &= c >= c[head]
        live = np.flatnonzero(~beaten)
        cols, g, idx = [c[live] for c in cols], g[live], idx[live]
    if idx.size:  # by group, each in the original order (of equal rows the first stays)
        back = np.lexsort((idx, g))
        x, g, idx = np.stack(cols, axis=1)[back], g[back], idx[back]
        for rows in np.split(np.arange(idx.size), np.flatnonzero(g[1:] != g[:-1]) + 1):
            kept.append(idx[rows[_sweep(x[rows])]])
    return np.sort(np.concatenate(kept))


def _sweep(x: np.ndarray) -> np.ndarray:
    """:func:`nondominated_rows` for one group of many rows whose columns
    after the third take few distinct values: the rows are grouped by those
    columns; in the lexicographic order of the groups, a group can be
    matched or beaten only by groups before it that are no larger in all of
    them, so each group's rows go through :func:`nondominated` with the
    survivors of those groups placed first (which win ties)."""
    keys, which = np.unique(x[:, 3:], axis=0, return_inverse=True)
    which = which.reshape(-1)
    if keys.shape[0] == 1:
        return nondominated(x[:, 0], x[:, 1], x[:, 2])
    members = [np.flatnonzero(which == k) for k in range(keys.shape[0])]  # keys ascend lexicographically
    survivors: list[np.ndarray] = []
    for k in range(keys.shape[0]):
        below = [survivors[h] for h in range(k) if np.all(keys[h] <= keys[k])]
        prior = np.concatenate(below) if below else np.zeros(0, dtype=np.int64)
        cand = np.concatenate([prior, members[k]])
        f = nondominated(x[cand, 0], x[cand, 1], x[cand, 2])
        survivors.append(cand[f[f >= prior.size]])
    return np.sort(np.concatenate(survivors))


def label_path(labels: list, state: int, index: int, parent_state: int, parent_index: int) -> np.ndarray:
    """``[n]``: the options along the path ending at label ``index`` of
    option ``state`` at the last position; ``labels[i][s]`` is a tuple of
    arrays whose fields ``parent_state`` and ``parent_index`` name each
    label's parent at position ``i - 1``."""
    n = len(labels)
    path = np.zeros(n, dtype=np.int64)
    s, j = int(state), int(index)
    for i in range(n - 1, -1, -1):
        path[i] = s
        s, j = int(labels[i][s][parent_state][j]), int(labels[i][s][parent_index][j])
    return path
