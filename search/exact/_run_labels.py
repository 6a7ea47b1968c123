"""The label propagation of the exact search over runs of recomputing
layers (:func:`search.exact.dp_runs.search_runs`, whose module docstring
says what a label holds and how labels compare) at one upper bound."""

from __future__ import annotations

import time

import numpy as np

from search.exact.pareto import nondominated_rows
from search.exact.runs import HOP_BITS, RunChain

__all__ = ["search_labels"]

_CHUNK = 1 << 20  # candidate labels search_labels builds at a time


def search_labels(rc: RunChain, inside, T, A, Q, W, R, keep, coords, by_time: bool, peak_floor: float,
                   max_labels: int, deadline: float, byte_grid: float = 0.0):
    """:func:`search.exact.dp_runs.search_runs`' label propagation at one upper bound (``keep``
    prunes, labels compare in ``coords``; kept bytes rounded down to
    multiples of ``byte_grid`` where it is positive): ``(path or None,
    labels used, completed)``. Each position extends every label of the one
    before to every option at once (in chunks of about :data:`_CHUNK`
    candidates) and filters them by option and mask in one pass."""

    def grid(a):  # never above the true kept bytes: floor(floor(a) + x) <= a + x by induction
        return np.floor(a / byte_grid) * byte_grid if byte_grid > 0 else a

    n = rc.time.shape[0]
    J = rc.joins
    opens = rc.skip_opens  # [n, O] the bits of the skip edges each option opens
    closing = [np.flatnonzero(rc.skip_dst == i) for i in range(n)]  # the skip edges closing at each position
    hops = by_time and rc.hop_src.size > 0  # by memory, resharding does not count
    hop_opening = [np.flatnonzero(rc.hop_src == i) if hops else () for i in range(n)]
    hop_closing = [np.flatnonzero(rc.hop_dst == i) if hops else () for i in range(n)]
    field = np.int64((1 << HOP_BITS) - 1)

    def held(code, i, t):  # the code with the classes of the hops opening at position i on option t
        for h in hop_opening[i]:
            code = code | (rc.hop_class[h, t] << rc.hop_shift[h])
        return code

    # a position's labels, flat: (tau, a, q, r, peak, option, parent label at the position before, mask of
    # open skip edges the run still reaches, code of the open hops' source classes)
    t0 = np.flatnonzero(inside[0])
    first = (T[0, t0], grid(A[0, t0]), Q[0, t0], R[0, t0], np.maximum(peak_floor, W[0, t0]), t0,
             np.zeros(t0.size, np.int64), opens[0, t0], held(np.zeros(t0.size, np.int64), 0, t0))
    ok = keep(0, t0, *first[:5], first[7])
    labels = [tuple(x[ok] for x in first)]
    used = int(ok.sum())
    for i in range(1, n):
        tau0, a0, q0, r0, pk0, s0, _, m0, h0 = labels[-1]
        size = tau0.size
        targets = np.flatnonzero(inside[i])
        if size == 0 or targets.size == 0:
            return None, used, True
        parts = []
        per = max(1, _CHUNK // size)
        for c in range(0, targets.size, per):
            tt = targets[c:c + per]
            k = tt.size
            t = np.tile(tt, size)  # [size * k] the option, per candidate
            par = np.repeat(np.arange(size), k)  # its parent label
            tau = (tau0[:, None] + rc.pair[i][np.ix_(s0, tt)] + T[i, tt]).ravel()
            a = (a0[:, None] - rc.credit[i][np.ix_(s0, tt)] + A[i, tt]).ravel()
            q = (q0[:, None] + Q[i, tt]).ravel()
            join = J[i, t]
            run = np.where(join, r0[par], 0.0)  # T_i
            pk = np.maximum(pk0[par], W[i, t] + run)
            r = run + R[i, t]
            mask = np.where(join, m0[par], 0)
            for e in closing[i]:  # a skip edge the run does not reach from a recomputing source: credit back
                bit = np.int64(1) << rc.skip_bit[e]
                a = a + np.where(mask & bit, 0.0, rc.skip_credit[e, t])
                mask = mask & ~bit
            mask = mask | opens[i, t]
            a = grid(a)
            code = h0[par]
            for h in hop_closing[i]:  # a hop's resharding above the least, by its source's class
                tau = tau + rc.hop_extra[h, (code >> rc.hop_shift[h]) & field, t]
                code = code & ~(field << rc.hop_shift[h])
            code = held(code, i, t)
            ok = np.flatnonzero(keep(i, t, tau, a, q, r, pk, mask))
            tau, a, q, r, pk, t, par, mask, code = (x[ok] for x in (tau, a, q, r, pk, t, par, mask, code))
            if tau.size:
                which = _group(mask)
                if hops:
                    held_as = _group(code)
                    which = which * (held_as.max() + 1) + held_as
                f = nondominated_rows(np.stack(coords(i, t, tau, a, q, r, pk), axis=1),
                                      t * (which.max() + 1) + which)  # (by option, then mask and code)
                parts.append(tuple(x[f] for x in (tau, a, q, r, pk, t, par, mask, code)))
        if parts:
            labels.append(tuple(np.concatenate(x) for x in zip(*parts)))
        else:
            labels.append(tuple(x[:0] for x in labels[-1]))
        used += labels[-1][0].size
        if used > max_labels or time.perf_counter() > deadline:
            return None, used, False
    tau, a, q, _, pk, _, _, _, _ = labels[-1]
    if tau.size == 0:
        return None, used, True
    j = int(np.argmin(tau if by_time else np.maximum(a + pk, q)))
    path = np.zeros(n, dtype=np.int64)
    for i in range(n - 1, -1, -1):
        path[i] = labels[i][5][j]
        j = int(labels[i][6][j])
    return path, used, True


def _group(x: np.ndarray) -> np.ndarray:
    """Each value's index among the distinct values of ``x`` [N]."""
    return np.unique(x, return_inverse=True)[1].reshape(-1)
