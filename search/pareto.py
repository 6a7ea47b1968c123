"""Label sets of the DP's label-setting searches (:mod:`search.dp`,
:mod:`search.dp_runs`): the Pareto filters (which labels no other label
matches or beats in every coordinate; smaller is better in all) and the
path back from a last label."""

from __future__ import annotations

from bisect import bisect_left, bisect_right

import numpy as np

__all__ = ["nondominated", "nondominated_grouped", "label_path"]

_PAIRWISE_MAX = 1024  # label sets up to this size are filtered by an all-pairs comparison


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


def nondominated_grouped(tau: np.ndarray, a: np.ndarray, q: np.ndarray, r: np.ndarray,
                         pk: np.ndarray) -> np.ndarray:
    """Indices of the labels ``(tau, a, q, r, pk)`` that no other label
    matches or beats in all five (of equal labels, one is kept), for label
    sets whose last two coordinates take few distinct values (a run's
    recomputed bytes and the peak transient, mostly at their floors):
    labels are grouped by ``(r, pk)``; in the lexicographic order of the
    groups, a group can be dominated only by groups before it that are no
    larger in both, so each group's labels go through :func:`nondominated`
    with the survivors of those groups placed first (which win ties)."""
    m = tau.size
    if m == 0:
        return np.zeros(0, dtype=np.int64)
    keys, group = np.unique(np.stack([r, pk], axis=1), axis=0, return_inverse=True)
    group = group.reshape(-1)
    if keys.shape[0] == 1:
        return nondominated(tau, a, q)
    members = [np.flatnonzero(group == g) for g in range(keys.shape[0])]  # keys ascend lexicographically
    survivors: list[np.ndarray] = []
    for g in range(keys.shape[0]):
        below = [survivors[h] for h in range(g) if keys[h, 1] <= keys[g, 1]]  # (keys[h, 0] <= keys[g, 0] by order)
        prior = np.concatenate(below) if below else np.zeros(0, dtype=np.int64)
        cand = np.concatenate([prior, members[g]])
        f = nondominated(tau[cand], a[cand], q[cand])
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
