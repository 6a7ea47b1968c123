"""The memory limit's rows of the MILP (:mod:`search.exact.milp`): the
backward phase, the optimizer phase, the largest workspace with its run's
recomputed bytes, and, where plans may hold runs of recomputing layers,
the runs' checkpoint credits and running sums (:func:`memory_rows`)."""

from __future__ import annotations

import numpy as np

from search.problem import DiscreteProblem

__all__ = ["memory_rows"]


def memory_rows(p: DiscreteProblem, add, lo: list, up: list, r: int, xi, zi: int, pi: int, run_vars,
                 minimize_memory: bool, tighten: float, m0: float) -> int:
    """The memory limit's rows from row ``r`` on (returns the next row): the
    backward phase (the persistent bytes, less the checkpoints runs free,
    plus ``z``, the largest workspace with its run's recomputed bytes) and
    the optimizer phase, each at most the limit (``m0`` bytes: 1, less
    ``tighten``), or at most ``P`` (variable ``pi``) when minimising memory;
    with ``run_vars`` ``(vi, ve, vo, ai)`` the runs' rows
    (:func:`_run_rows`)."""
    F = p.feasible
    n = F.shape[0]
    nx = int(F.sum())
    ll, ss = np.nonzero(F)
    runs = run_vars is not None
    if runs:
        vi, ve, vo, ai = run_vars
    bound = 0.0 if minimize_memory else 1.0 - tighten
    add(np.full(nx, r), xi[F], p.persistent_bytes[F] / m0)
    add([r], [zi], [1.0])
    if runs:  # the checkpoints runs free
        add(np.full(ve.size, r), vi, -p.checkpoint_credit[ve, vo] / m0)
    if minimize_memory:
        add([r], [pi], [-1.0])
    lo.append([-np.inf])
    up.append([bound])
    r += 1
    add(np.full(nx, r), xi[F], p.optimizer_bytes[F] / m0)  # the optimizer phase
    if minimize_memory:
        add([r], [pi], [-1.0])
    lo.append([-np.inf])
    up.append([bound])
    r += 1
    add(r + ll, xi[ll, ss], p.workspace_bytes[ll, ss] / m0)
    add(r + np.arange(n), np.full(n, zi), -np.ones(n))
    if runs:  # z >= W[l] + a[l] - rec[l]: the run's recomputed bytes before l
        add(r + ll, xi[ll, ss], -p.recompute_bytes[ll, ss] / m0)
        add(r + np.arange(n), ai, np.ones(n))
    lo.append(np.full(n, -np.inf))
    up.append(np.zeros(n))
    r += n
    if runs:
        r = _run_rows(p, add, lo, up, r, xi, vi, ve, vo, ai, m0)
    return r


def _run_rows(p: DiscreteProblem, add, lo: list, up: list, r: int, xi, vi, ve, vo, ai, m0: float) -> int:
    """The rows that bound a plan's runs (:func:`search.problem.run_terms`):

    * ``v[e, o] <= x[dst, o]``, ``v[e, o] <= sum of the recomputing x[src]``
      and ``v[e, o] <= sum of the joining x[j]`` for every layer ``j``
      strictly between the edge's ends: the credit goes only to an edge
      inside a run (the memory row subtracts it, so ``v`` rises to its bound);
    * ``a[l] >= rec[l]`` and ``a[l] >= rec[l] + a[l - 1] - M[l] (1 - J[l])``
      (``J[l]``: the joining options, ``M[l]`` every recomputed byte before
      ``l``): ``a[l]`` is at least the run's recomputed bytes up to ``l``
      (the workspace rows add it, so ``a`` falls to its bound).

    Returns the next row."""
    n = p.num_layers
    F = p.feasible
    recomputing = F & p.option_recomputes[None, :]
    joining = F & p.option_joins[None, :]
    src, dst = p.edge_src[ve], p.edge_dst[ve]
    m = ve.size
    add(r + np.arange(m), vi, np.ones(m))  # v <= x[dst, o]
    add(r + np.arange(m), xi[dst, vo], -np.ones(m))
    lo.append(np.full(m, -np.inf))
    up.append(np.zeros(m))
    r += m
    for k in range(m):  # v <= R[src] and v <= J[j] between
        for layer, allowed in [(src[k], recomputing)] + [(j, joining) for j in range(src[k] + 1, dst[k])]:
            o = np.flatnonzero(allowed[layer])
            add(np.full(o.size + 1, r), np.r_[vi[k], xi[layer, o]], np.r_[1.0, -np.ones(o.size)])
            lo.append([-np.inf])
            up.append([0.0])
            r += 1
    rec = np.where(F, p.recompute_bytes, 0.0) / m0
    big = np.r_[0.0, np.cumsum(rec.max(axis=1))[:-1]]  # [n] every recomputed byte before l
    ll, oo = np.nonzero(F)
    add(r + ll, xi[ll, oo], rec[ll, oo])  # rec[l] - a[l] <= 0
    add(r + np.arange(n), ai, -np.ones(n))
    lo.append(np.full(n, -np.inf))
    up.append(np.zeros(n))
    r += n
    for layer in range(1, n):  # rec[l] + a[l-1] - a[l] + M J[l] <= M
        o = np.flatnonzero(F[layer])
        jo = np.flatnonzero(joining[layer])
        add(np.full(o.size + jo.size + 2, r), np.r_[xi[layer, o], xi[layer, jo], ai[layer - 1], ai[layer]],
            np.r_[rec[layer, o], np.full(jo.size, big[layer]), 1.0, -1.0])
        lo.append([-np.inf])
        up.append([big[layer]])
        r += 1
    return r
