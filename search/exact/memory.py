"""The exact smallest memory any plan of a problem without runs of
recomputing layers needs (:func:`minimum_memory`): memory has no edge
terms, so it adds up layer by layer, searched over workspace caps in the
order of their lower bounds (:func:`memory_by_workspace_cap`). Where plans
may hold runs (:func:`search.problem.has_runs`) the memory is no such sum:
:func:`search.exact.smallest_memory` takes any problem.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from search.problem import DiscreteProblem, has_runs, plan_memory

__all__ = ["MinimumMemory", "memory_by_workspace_cap", "minimum_memory", "phase_minimum_by_cap"]


class MinimumMemory(NamedTuple):
    """The smallest peak memory per device any plan needs, and one such plan."""

    memory_bytes: float
    choice: np.ndarray  # [n] int: a plan reaching it (ties: the faster layer strategy)
    workspace_cap_bytes: float  # its largest workspace
    exact: bool = True  # False: the smallest memory found within a time limit, not proven smallest


def memory_by_workspace_cap(p: DiscreteProblem) -> tuple[np.ndarray, np.ndarray]:
    """For every workspace cap ``w`` worth trying (every distinct workspace
    value at which each layer has an option within the cap), a lower bound
    on ``max(w + sum_l persistent[l, c_l], sum_l optimizer[l, c_l])`` over
    the plans ``c`` whose every workspace is at most ``w`` (the memory with
    the workspace term taken as ``w``, what the DP bounds at that cap; at a
    plan's own largest workspace, its memory): each phase at its own
    per-layer minimum, ``max(w + sum_l min{persistent[l, o] : workspace[l, o]
    <= w}, sum_l min{optimizer[l, o] : workspace[l, o] <= w})``. Exact where
    one plan reaches both minima (the usual case: sharding a layer more
    lowers both phases); :func:`minimum_memory` finds the exact smallest
    memory.

    Returns ``(caps, memory)``, both ascending in ``caps``. Separable over
    layers because memory does not depend on edges: each layer's best bytes
    of a phase is a step function of the cap, and the sum of step functions
    is accumulated from sorted events."""
    n = p.num_layers
    if n == 0:
        return np.zeros(1), np.zeros(1)
    W = p.workspace_bytes
    caps = np.unique(W[np.isfinite(W)])  # every cap that changes which options are allowed
    backward, covered = phase_minimum_by_cap(W, p.persistent_bytes, caps)
    optimizer, _ = phase_minimum_by_cap(W, p.optimizer_bytes, caps)
    ok = covered == n
    caps = caps[ok]
    return caps, np.maximum(caps + backward[ok], optimizer[ok])


def phase_minimum_by_cap(W: np.ndarray, X: np.ndarray, caps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``sum_l min{X[l, o] : W[l, o] <= cap}`` at every cap, and how many
    layers have an option within it."""
    n = W.shape[0]
    order = np.argsort(W, axis=1, kind="stable")  # infeasible (inf) last
    Ws = np.take_along_axis(W, order, axis=1)
    Xs = np.take_along_axis(X, order, axis=1)
    best = np.minimum.accumulate(Xs, axis=1)
    prev = np.concatenate([np.full((n, 1), np.inf), best[:, :-1]], axis=1)
    changed = (best < prev) & np.isfinite(Ws)
    first = changed & np.isinf(prev)
    delta = np.where(first, best, best - np.where(np.isinf(prev), 0.0, prev))
    ev_w, ev_delta, ev_first = Ws[changed], delta[changed], first[changed].astype(np.int64)
    idx = np.argsort(ev_w, kind="stable")
    ev_w, ev_delta, ev_first = ev_w[idx], ev_delta[idx], ev_first[idx]
    total, covered = np.cumsum(ev_delta), np.cumsum(ev_first)
    at = np.searchsorted(ev_w, caps, side="right") - 1  # the last event at or below each cap
    safe = np.maximum(at, 0)
    return np.where(at >= 0, total[safe], np.inf), np.where(at >= 0, covered[safe], 0)


def _minimum_within_cap(p: DiscreteProblem, cap: float, upper: float, max_labels: int = 200_000):
    """The smallest ``max(cap + sum persistent, sum optimizer)`` over plans
    whose every workspace is at most ``cap``, with such a plan, or ``None``
    when no plan is below ``upper``. Exact: a Pareto search over the two
    phases' partial sums, layer by layer (memory has no edge terms, so the
    layers' order is free), pruned by each phase's minimum still to add and
    by ``upper``. Ties between options of the same memory: the faster one."""
    n = p.num_layers
    within = p.feasible & (p.workspace_bytes <= cap)
    P = np.where(within, p.persistent_bytes, np.inf)
    Q = np.where(within, p.optimizer_bytes, np.inf)
    T = np.where(within, p.layer_time_s, np.inf)
    # each layer's Pareto options over (persistent, optimizer), the faster of equals
    fronts = []
    for i in range(n):
        o = np.flatnonzero(within[i])
        o = o[np.lexsort((T[i, o], Q[i, o], P[i, o]))]
        keep = np.r_[True, Q[i, o[1:]] < np.minimum.accumulate(Q[i, o])[:-1]] if o.size else np.zeros(0, bool)
        fronts.append(o[keep])
    p_rest = np.r_[np.cumsum([P[i, f].min() for i, f in enumerate(fronts)][::-1])[::-1], 0.0]
    q_rest = np.r_[np.cumsum([Q[i, f].min() for i, f in enumerate(fronts)][::-1])[::-1], 0.0]
    lab_p, lab_q = np.zeros(1), np.zeros(1)
    parents: list[tuple[np.ndarray, np.ndarray]] = []  # per layer: (label it extends, option)
    for i, f in enumerate(fronts):
        cand_p = (lab_p[:, None] + P[i, f][None, :]).ravel()
        cand_q = (lab_q[:, None] + Q[i, f][None, :]).ravel()
        parent = np.repeat(np.arange(lab_p.size), f.size)
        option = np.tile(f, lab_p.size)
        ok = np.maximum(cap + cand_p + p_rest[i + 1], cand_q + q_rest[i + 1]) < upper
        cand_p, cand_q, parent, option = cand_p[ok], cand_q[ok], parent[ok], option[ok]
        if cand_p.size == 0:
            return None
        o = np.lexsort((cand_q, cand_p))
        cand_p, cand_q, parent, option = cand_p[o], cand_q[o], parent[o], option[o]
        front = np.r_[True, cand_q[1:] < np.minimum.accumulate(cand_q)[:-1]]
        lab_p, lab_q = cand_p[front], cand_q[front]
        parents.append((parent[front], option[front]))
        if lab_p.size > max_labels:
            raise RuntimeError(f"the smallest memory needs over {max_labels} Pareto labels at one layer")
    memory = np.maximum(cap + lab_p, lab_q)
    j = int(np.argmin(memory))
    choice = np.zeros(n, dtype=np.int64)
    for i in range(n - 1, -1, -1):
        parent, option = parents[i]
        choice[i] = option[j]
        j = int(parent[j])
    return float(memory.min()), choice


def minimum_memory(p: DiscreteProblem) -> MinimumMemory:
    """The exact smallest peak memory per device over all plans (for any
    graph: memory has no edge terms), with a plan that reaches it. Caps are
    tried in the order of their lower bound (:func:`memory_by_workspace_cap`)
    until the next bound is no better than the best plan found. Not for a
    problem with runs of recomputing layers (:func:`has_runs`), whose memory
    has edge terms: :func:`search.exact.smallest_memory` takes any problem."""
    if p.num_layers == 0:
        return MinimumMemory(0.0, np.zeros(0, dtype=np.int64), 0.0)
    if has_runs(p):
        raise ValueError("minimum_memory adds memory up layer by layer, which runs of recomputed layers break; "
                         "use search.smallest_memory")
    caps, bound = memory_by_workspace_cap(p)
    best, choice = np.inf, None
    for k in np.argsort(bound, kind="stable"):
        if bound[k] >= best:
            break
        found = _minimum_within_cap(p, float(caps[k]), best)
        if found is not None:
            best, choice = found
    return MinimumMemory(plan_memory(p, choice), choice, float(p.workspace_bytes[np.arange(p.num_layers), choice].max()))
