"""Exact label search over chains whose plans hold runs of recomputing
layers (``remat+join``: :func:`costmodels.recomputed_runs`,
:func:`search.problem.run_terms`), for :func:`search.dp.solve_dp` and the
smallest memory (:func:`minimum_memory_runs`).

On a chain in layer order (every edge joins layer ``i - 1`` to layer
``i``), what a run changes is local:

* the checkpoint that edge ``i - 1 -> i`` frees is a *pair* term:
  ``checkpoint_credit[e, c_i]`` where layer ``i - 1`` recomputes (its
  option joins the run only where layer ``i``'s does: the table's credit is
  zero otherwise), so the backward phase's kept bytes are additive over
  layers and edges;
* layer ``i``'s transient grows by the run's recomputed activations before
  it: a running sum ``r`` over the run, which starts again at every layer
  that does not join (the first layer never joins).

So a plan's backward phase is ``a + peak`` with ``a`` additive and
``peak = max_i (workspace_i + T_i)`` the largest transient, ``T_i`` the
run's sum before ``i``; its optimizer phase ``q`` is additive. The search
carries labels ``(tau, a, q, r, peak)`` per ``(position, option)``, Pareto
filtered (smaller is better in each: a smaller ``r`` only lowers later
transients; :func:`search.pareto.nondominated_grouped`), as
:func:`search.dp._pareto_search` does without runs, and is exact up to its
label budget.

Workspace caps (:mod:`search.dp`) stay: at cap ``w`` every layer's
workspace is at most ``w`` and ``peak`` starts at ``w`` (a floor: the plan
is then counted at ``a + max(w, peak)``, exactly its memory at the cap of
its own largest workspace, and no less elsewhere), so most labels' peaks
sit at the floor and compare equal. Likewise a label's ``r`` compares as
``max(r, floor - G_i)``, ``G_i`` the most any continuation of the run can
add to a later layer's transient (within the cap): below that ``r`` never
raises the peak above the floor.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np

from search.pareto import label_path, nondominated_grouped
from search.problem import (
    DiscreteProblem,
    MinimumMemory,
    _restricted,
    chain_order,
    memory_by_workspace_cap,
    plan_memory,
)

__all__ = ["RunChain", "run_chain", "run_cap_bounds", "search_runs", "minimum_memory_runs", "lighter_runs"]

_TOL = 1e-9  # relative: bounds closer than this count as equal


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


def run_chain(p: DiscreteProblem) -> RunChain | None:
    """``p``'s :class:`RunChain`, or None where ``p`` is no chain in layer
    order (runs follow the layers' order, :func:`search.problem.run_terms`)."""
    n, O = p.num_layers, p.num_options
    order = chain_order(p)
    if order is None or not np.array_equal(order, np.arange(n)):
        return None
    pair = np.zeros((n, O, O))
    credit = np.zeros((n, O, O))
    pair[p.edge_dst] = p.reshard_s  # edges join i - 1 to i: one per position
    credit[p.edge_dst] = p.option_recomputes[None, :, None] * p.checkpoint_credit[:, None, :]
    joins = np.broadcast_to(p.option_joins, (n, O)) & (np.arange(n) > 0)[:, None]
    return RunChain(time=p.layer_time_s, persistent=p.persistent_bytes, optimizer=p.optimizer_bytes,
                    workspace=p.workspace_bytes, recompute=p.recompute_bytes, joins=joins, pair=pair, credit=credit)


def run_cap_bounds(p: DiscreteProblem, rc: RunChain) -> tuple[np.ndarray, np.ndarray]:
    """:func:`search.problem.memory_by_workspace_cap` with each layer's kept
    bytes lowered by the most its input edge can free: a lower bound per cap
    on every plan whose workspaces are all within it, runs included."""
    freed = np.max(np.where(p.feasible[np.maximum(np.arange(p.num_layers) - 1, 0)][:, :, None], rc.credit, 0.0),
                   axis=1)  # [n, O]
    return memory_by_workspace_cap(p._replace(persistent_bytes=p.persistent_bytes - freed))


def _to_go(rc: RunChain, inside: np.ndarray, unary: np.ndarray, pair: np.ndarray) -> np.ndarray:
    """``[n, O]``: the least sum of ``unary`` and ``pair`` over the positions
    after ``i``, given option ``s`` at ``i`` (``unary`` inf outside)."""
    n, O = unary.shape
    h = np.zeros((n, O))
    for i in range(n - 2, -1, -1):
        nxt = np.where(inside[i + 1], unary[i + 1] + h[i + 1], np.inf)
        h[i] = np.min(pair[i + 1] + nxt[None, :], axis=1)
    return h


def search_runs(rc: RunChain, cap: float, limit: float, upper: float, *, minimize: str = "time",
                lam: float = 0.0, mu: float = 0.0, max_labels: int = 2_000_000, deadline: float = np.inf):
    """The exact best path at workspace cap ``cap``: ``minimize="time"``, the
    fastest with ``a + max(cap, peak) <= limit`` and ``q <= limit``, only
    looking for paths faster than ``upper`` (``lam``, ``mu``: Lagrange
    multipliers of the two phases in seconds per byte, used only to prune);
    ``minimize="memory"``, the least ``max(a + max(cap, peak), q)`` below
    ``upper`` bytes (``limit`` unused). Stops, not completed, past
    ``max_labels`` labels or the ``time.perf_counter()`` value ``deadline``.
    Returns ``(path or None, labels used, completed)``."""
    by_time = minimize == "time"
    n, O = rc.time.shape
    inside = np.isfinite(rc.time) & (rc.workspace <= cap)
    T = np.where(inside, rc.time, np.inf)
    A = np.where(inside, rc.persistent, np.inf)
    Q = np.where(inside, rc.optimizer, np.inf)
    W = np.where(inside, rc.workspace, 0.0)
    R = np.where(inside, rc.recompute, 0.0)
    J = rc.joins
    a_go = _to_go(rc, inside, A, -rc.credit)  # [n, O] least backward bytes still to add
    q_go = np.r_[np.cumsum(np.min(Q, axis=1)[::-1])[::-1][1:], 0.0]  # [n]
    # G[i]: the most a continuation of the run after i adds to a later transient (all options within the cap)
    G = np.full(n, -np.inf)
    for i in range(n - 2, -1, -1):
        G[i] = max(np.max(np.where(inside[i + 1] & J[i + 1], W[i + 1], -np.inf)),
                   np.max(np.where(inside[i + 1] & J[i + 1], R[i + 1], -np.inf)) + G[i + 1])
    r_floor = cap - G  # [n] a run's sum below this never lifts the peak over the cap
    if by_time:
        h_time = _to_go(rc, inside, T, rc.pair)
        use_mult = (lam > 0 or mu > 0) and np.isfinite(limit)
        weighted = T + lam * np.where(inside, rc.persistent, 0.0) + mu * np.where(inside, rc.optimizer, 0.0)
        h_mult = _to_go(rc, inside, weighted, rc.pair - lam * rc.credit) if use_mult else h_time
        q_most = np.where(inside, Q, -np.inf).max(axis=1)
        q_floor = limit - np.r_[np.cumsum(q_most[::-1])[::-1][1:], 0.0]  # [n] (search.dp._pareto_search)
        limit_t = upper * (1.0 - _TOL)
    else:
        limit_m = upper * (1.0 - _TOL)

    def keep(i, t, tau, a, q, pk):
        if not by_time:
            return np.maximum(a + a_go[i, t] + pk, q + q_go[i]) < limit_m
        ok = (a + a_go[i, t] + pk <= limit) & (q + q_go[i] <= limit) & (tau + h_time[i, t] < limit_t)
        if use_mult:  # weak duality: every completion keeps a <= limit - peak, peak >= pk
            ok &= tau + lam * a + mu * q + h_mult[i, t] - lam * (limit - pk) - mu * limit < limit_t
        return ok

    # a label set: (tau, a, q, r, peak, parent option, parent label)
    empty = tuple(np.zeros(0) for _ in range(5)) + (np.zeros(0, np.int64), np.zeros(0, np.int64))
    labels: list[list[tuple]] = []
    layer = []
    used = 0
    for t in range(O):
        if not inside[0, t]:
            layer.append(empty)
            continue
        lab = (np.array([T[0, t]]), np.array([A[0, t]]), np.array([Q[0, t]]), np.array([R[0, t]]),
               np.array([float(cap)]), np.zeros(1, np.int64), np.zeros(1, np.int64))
        ok = keep(0, t, lab[0], lab[1], lab[2], lab[4])
        layer.append(tuple(x[ok] for x in lab))
        used += int(ok.sum())
    labels.append(layer)
    for i in range(1, n):
        prev = labels[-1]
        live = [s for s in range(O) if prev[s][0].size]
        layer = []
        for t in range(O):
            if not inside[i, t] or not live:
                layer.append(empty)
                continue
            tau = np.concatenate([prev[s][0] + rc.pair[i, s, t] for s in live]) + T[i, t]
            a = np.concatenate([prev[s][1] - rc.credit[i, s, t] for s in live]) + A[i, t]
            q = np.concatenate([prev[s][2] for s in live]) + Q[i, t]
            run = np.concatenate([prev[s][3] for s in live]) if J[i, t] else np.zeros(tau.size)  # T_i
            pk = np.maximum(np.concatenate([prev[s][4] for s in live]), W[i, t] + run)
            r = run + R[i, t]
            ps = np.concatenate([np.full(prev[s][0].size, s, np.int64) for s in live])
            pi = np.concatenate([np.arange(prev[s][0].size) for s in live])
            ok = keep(i, t, tau, a, q, pk)
            lab = tuple(x[ok] for x in (tau, a, q, r, pk, ps, pi))
            if lab[0].size:
                cmp_t = lab[0] if by_time else np.zeros(lab[0].size)
                cmp_q = np.maximum(lab[2], q_floor[i]) if by_time else lab[2]
                f = nondominated_grouped(cmp_t, lab[1], cmp_q, np.maximum(lab[3], r_floor[i]), lab[4])
                lab = tuple(x[f] for x in lab)
            used += lab[0].size
            layer.append(lab)
        labels.append(layer)
        if used > max_labels or time.perf_counter() > deadline:
            return None, used, False
    finals = []
    for s in range(O):
        tau, a, q, _, pk = labels[-1][s][:5]
        if tau.size:
            score = tau if by_time else np.maximum(a + pk, q)
            j = int(np.argmin(score))
            finals.append((float(score[j]), s, j))
    if not finals:
        return None, used, True
    _, s, j = min(finals)
    return label_path(labels, s, j, 5, 6), used, True


def minimum_memory_runs(p: DiscreteProblem, rc: RunChain | None = None, *,
                        max_labels: int = 2_000_000) -> MinimumMemory:
    """The exact smallest memory of a chain problem in layer order whose
    plans may hold runs (:func:`search.problem.minimum_memory`'s answer where
    runs break its layer-by-layer sums): :func:`search_runs` by memory at
    each workspace cap, in the order of the caps' lower bounds
    (:func:`run_cap_bounds`) until the next bound is no better than the best
    plan found. Raises ``ValueError`` where ``p`` is no chain in layer order,
    ``RuntimeError`` where a cap needs more than ``max_labels`` labels."""
    n = p.num_layers
    if n == 0:
        return MinimumMemory(0.0, np.zeros(0, dtype=np.int64), 0.0)
    rc = run_chain(p) if rc is None else rc
    if rc is None:
        raise ValueError("minimum_memory_runs needs a chain graph in layer order (every layer feeds the next)")
    caps, bound = run_cap_bounds(p, rc)
    best, choice = np.inf, None
    for k in np.argsort(bound, kind="stable"):
        if bound[k] >= best * (1 - _TOL):
            break
        path, used, done = search_runs(rc, float(caps[k]), np.inf, best, minimize="memory", max_labels=max_labels)
        if not done:
            raise RuntimeError(f"the smallest memory with runs needs over {max_labels} labels at one workspace cap")
        if path is not None and plan_memory(p, path) < best:
            best, choice = plan_memory(p, path), path
    return MinimumMemory(best, choice, float(p.workspace_bytes[np.arange(n), choice].max()))


def lighter_runs(p: DiscreteProblem, choice: np.ndarray) -> np.ndarray:
    """A plan no slower per layer than ``choice`` [n] with the least memory:
    each layer may take any option of its strategy (so the same
    resharding) whose layer time is no larger (another way to cut or join
    the plan's runs, or to keep instead of recomputing),
    :func:`minimum_memory_runs` over those few options. The DP's upper
    bounds: the Lagrangian's plans leave the runs' transients out and
    often break the limit only by them."""
    c = np.asarray(choice, dtype=np.int64)
    rows = np.arange(p.num_layers)
    same = (p.option_strategy[None, :] == p.option_strategy[c][:, None]) & p.feasible
    allowed = same & (p.layer_time_s <= p.layer_time_s[rows, c][:, None])
    allowed[rows, c] = True
    return minimum_memory_runs(_restricted(p, allowed)).choice
