"""Exact dynamic programming over chain graphs (sequential CNNs).

On a chain (every edge joins consecutive layers, :func:`search.problem.chain_order`)
the time is a sum of per-layer terms and per-edge terms between neighbours,
so the fastest plan without a memory limit is a Viterbi shortest path over
``(layer, strategy)`` states, ``O(n S^2)``.

The memory limit ``sum_l A[l, c_l] + max_l W[l, c_l] <= M`` (A = state +
activations, W = workspace) is handled in three steps:

1. **Workspace caps.** For every cap ``w`` among the distinct workspace
   values, restrict every layer to strategies with ``W <= w``; the
   constraint becomes the additive ``sum A <= M - w``. The optimal plan is
   optimal for the cap equal to its own largest workspace, so the best over
   all caps is the optimum. Caps under which even the smallest-memory plan
   does not fit are skipped (:func:`search.problem.memory_by_workspace_cap`).
2. **Lagrangian bisection** on the additive part, for all caps at once
   (vectorised): Viterbi on ``time + lambda * A``; ``lambda`` is bisected
   (geometrically) to the smallest value whose plan fits. Every plan that fits
   gives an upper bound; every ``lambda`` gives the lower bound
   ``V(lambda) - lambda * (M - w)`` (weak duality). Each plan found is
   checked with the exact memory, workspace maximum included.
3. **Exact completion.** Where the Lagrangian leaves a duality gap (the
   limit cuts between two corners of the time-memory trade-off), a
   label-setting search over ``(time, memory)`` Pareto labels, pruned by the
   memory still needed and by the Lagrangian and time-only lower bounds to
   go, finds the optimum of that cap, up to ``max_labels`` labels.

What is exact: with ``gradient_overlap = 0`` (every preset) the result is the
global optimum of the discrete problem (float64 sums of the table's float32
values; ties broken arbitrarily) whenever ``exact`` is true, which holds
unless the label search of step 3 ran out of labels. With an overlap term
the time is ``max`` of two additive functions (``- overlap * min(G, B)``); the
DP optimises each and returns the better plan with the lower bound
``max`` of the two, so the gap is reported and may be non-zero.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from search.problem import (
    DiscreteProblem,
    chain_order,
    memory_by_workspace_cap,
    minimum_memory,
    plan_memory,
    plan_time,
)

__all__ = ["DPResult", "solve_dp", "viterbi"]

_TOL = 1e-9  # relative: bounds closer than this count as equal


class DPResult(NamedTuple):
    choice: np.ndarray  # [n] in layer order
    time_s: float
    memory_bytes: float
    feasible: bool
    lower_bound_s: float  # no plan within the limit is faster
    exact: bool  # lower bound == time (to 1e-9 relative)
    caps: int  # workspace caps searched
    labels: int  # Pareto labels created by the exact completion


def viterbi(unary, pair) -> tuple[np.ndarray, np.ndarray]:
    """Min-sum paths of a batch of chains (the one Viterbi: the chain DP and
    the refinement's segment moves both use it): ``unary [K, n, S]`` (``inf``
    = forbidden), ``pair [n, S, S]`` shared by the chains or ``[K, n, S, S]``
    one per chain (``pair[..., i, s, t]``: position ``i-1`` on ``s`` and
    position ``i`` on ``t``; position 0 unused). Returns the values ``[K]``
    and the paths ``[K, n]``."""
    K, n, S = unary.shape
    pair = np.asarray(pair)
    per_chain = pair.ndim == 4
    value = unary[:, 0]
    back = np.zeros((n, K, S), dtype=np.int64)
    for i in range(1, n):
        cand = value[:, :, None] + (pair[:, i] if per_chain else pair[i][None])
        back[i] = np.argmin(cand, axis=1)
        value = np.min(cand, axis=1) + unary[:, i]
    path = np.zeros((K, n), dtype=np.int64)
    path[:, n - 1] = np.argmin(value, axis=1)
    rows = np.arange(K)
    for i in range(n - 1, 0, -1):
        path[:, i - 1] = back[i][rows, path[:, i]]
    return np.min(value, axis=1), path


class _Chain(NamedTuple):
    order: np.ndarray  # [n] layer index at chain position i
    time: np.ndarray  # [n, S] seconds (inf = infeasible)
    persistent: np.ndarray  # [n, S] bytes (0 where infeasible)
    workspace: np.ndarray  # [n, S] bytes (inf where infeasible)
    grad: np.ndarray
    bwd: np.ndarray
    pair: np.ndarray  # [n, S, S] seconds


def _chain(p: DiscreteProblem, order: np.ndarray) -> _Chain:
    n, S = p.layer_time_s.shape
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)
    pair = np.zeros((n, S, S))
    pair[pos[p.edge_dst]] = p.reshard_s  # in-degree <= 1: one edge per position
    return _Chain(
        order=order,
        time=p.layer_time_s[order],
        persistent=np.where(p.feasible, p.persistent_bytes, 0.0)[order],
        workspace=p.workspace_bytes[order],
        grad=p.grad_sync_s[order],
        bwd=p.backward_s[order],
        pair=pair,
    )


def _to_layers(ch: _Chain, path: np.ndarray) -> np.ndarray:
    out = np.empty_like(path)
    out[..., ch.order] = path
    return out


def _pareto_search(ch: _Chain, time: np.ndarray, budget: float, upper: float, lam: float, max_labels: int):
    """Exact min-time path with ``sum persistent <= budget`` on one capped
    chain (``time`` inf outside the cap), only looking for paths faster than
    ``upper``. Returns ``(path or None, labels used, completed)``."""
    n, S = time.shape
    A = np.where(np.isfinite(time), ch.persistent, np.inf)
    a_min = np.min(A, axis=1)
    mem_to_go = np.r_[np.cumsum(a_min[::-1])[::-1][1:], 0.0]  # [n] least bytes still to add after i

    def to_go(weight):  # least weighted cost of layers after i, given state s at i
        h = np.zeros((n, S))
        for i in range(n - 2, -1, -1):
            nxt = time[i + 1] + weight * np.where(np.isfinite(A[i + 1]), A[i + 1], 0.0) + h[i + 1]
            h[i] = np.min(ch.pair[i + 1] + nxt[None, :], axis=1)
        return h

    h_time = to_go(0.0)
    h_lam = to_go(lam) if lam > 0 else h_time
    limit_t = upper * (1.0 - _TOL)

    use_lam = lam > 0 and np.isfinite(budget)

    def keep(i, tau, a, s):
        ok = (a + mem_to_go[i] <= budget) & (tau + h_time[i, s] < limit_t)
        if use_lam:
            ok &= tau + lam * a + h_lam[i, s] - lam * budget < limit_t
        return ok

    # labels[i][s] = (tau, a, parent_state, parent_index)
    labels = []
    layer = []
    used = 0
    for s in range(S):
        tau, a = np.array([time[0, s]]), np.array([A[0, s]])
        ok = np.isfinite(tau) & keep(0, tau, a, s)
        layer.append((tau[ok], a[ok], np.zeros(ok.sum(), np.int64), np.zeros(ok.sum(), np.int64)))
        used += int(ok.sum())
    labels.append(layer)
    for i in range(1, n):
        prev = labels[-1]
        layer = []
        for t in range(S):
            if not np.isfinite(time[i, t]):
                layer.append((np.zeros(0), np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64)))
                continue
            taus, avals, ps, pidx = [], [], [], []
            for s in range(S):
                tau_s, a_s = prev[s][0], prev[s][1]
                if tau_s.size == 0:
                    continue
                taus.append(tau_s + ch.pair[i][s, t] + time[i, t])
                avals.append(a_s + A[i, t])
                ps.append(np.full(tau_s.size, s, np.int64))
                pidx.append(np.arange(tau_s.size))
            if not taus:
                layer.append((np.zeros(0), np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64)))
                continue
            tau, a, ps_, pi_ = (np.concatenate(x) for x in (taus, avals, ps, pidx))
            ok = keep(i, tau, a, t)
            tau, a, ps_, pi_ = tau[ok], a[ok], ps_[ok], pi_[ok]
            if tau.size:  # Pareto filter: by memory, keep strictly faster than all lighter labels
                o = np.lexsort((tau, a))
                tau, a, ps_, pi_ = tau[o], a[o], ps_[o], pi_[o]
                best_before = np.r_[np.inf, np.minimum.accumulate(tau)[:-1]]
                front = tau < best_before
                tau, a, ps_, pi_ = tau[front], a[front], ps_[front], pi_[front]
            used += tau.size
            layer.append((tau, a, ps_, pi_))
        labels.append(layer)
        if used > max_labels:
            return None, used, False
    finals = [(float(labels[-1][s][0].min()), s, int(np.argmin(labels[-1][s][0])))
              for s in range(S) if labels[-1][s][0].size]
    if not finals:
        return None, used, True
    _, s, j = min(finals)
    path = np.zeros(n, dtype=np.int64)
    for i in range(n - 1, -1, -1):
        path[i] = s
        s, j = int(labels[i][s][2][j]), int(labels[i][s][3][j])
    return path, used, True


def solve_dp(p: DiscreteProblem, memory_limit: float = np.inf, *, max_labels: int = 200_000,
             bisection_steps: int = 48) -> DPResult:
    """The fastest plan of a chain-graph problem within ``memory_limit``
    bytes per device (see the module docstring for what is exact). Raises
    ``ValueError`` if the graph is not a chain."""
    order = chain_order(p)
    if order is None:
        raise ValueError("the DP needs a chain graph (every layer feeds only the next); "
                         "use method='milp' or 'gradient' for graphs with branches")
    n = p.num_layers
    limit = float(memory_limit)
    if n == 0:
        z = np.zeros(0, dtype=np.int64)
        return DPResult(z, 0.0, 0.0, True, 0.0, True, 0, 0)
    ch = _chain(p, order)
    if np.isfinite(limit):
        caps, cap_memory = memory_by_workspace_cap(p)
        caps = caps[cap_memory <= limit]
        if caps.size == 0:
            mm = minimum_memory(p)
            return DPResult(mm.choice, plan_time(p, mm.choice), mm.memory_bytes, False, np.inf, False, 0, 0)
    else:
        caps = np.array([np.inf])
    budgets = limit - caps  # inf when there is no limit
    variants = [ch.time]
    if p.gradient_overlap:  # time = max of these two additive functions
        variants = [ch.time - p.gradient_overlap * ch.grad, ch.time - p.gradient_overlap * ch.bwd]
    V = len(variants)
    t0 = max(float(np.sum(np.min(ch.time, axis=1))), 1e-30)
    m0 = limit if np.isfinite(limit) else 1.0
    # element k = (cap c, variant v): k = c * V + v
    cap_of = np.repeat(np.arange(caps.size), V)
    within = ch.workspace[None] <= caps[:, None, None]  # [C, n, S]
    unary_t = np.stack([np.where(within[c], variants[v], np.inf) for c, v in zip(cap_of, np.tile(np.arange(V), caps.size))])
    unary_t = unary_t / t0
    pair = ch.pair / t0
    A = ch.persistent / m0
    budget_n = budgets[cap_of] / m0  # [K]
    K = unary_t.shape[0]

    best = {"t": np.inf, "path": None}

    def run(lam, idx):  # Viterbi for elements idx at multipliers lam
        u = unary_t[idx] + lam[:, None, None] * A[None]
        val, path = viterbi(u, pair)
        used = np.sum(A[np.arange(n)[None, :], path], axis=1)
        fits = used <= budget_n[idx] * (1 + 1e-15)
        for j in np.flatnonzero(fits):
            layers = _to_layers(ch, path[j])
            t = plan_time(p, layers)
            if t < best["t"] and plan_memory(p, layers) <= limit:
                best["t"], best["path"] = t, path[j]
        with np.errstate(invalid="ignore"):
            bound = (val - np.where(lam > 0, lam * budget_n[idx], 0.0)) * t0
        return fits, bound

    lower = np.full(K, -np.inf)
    lam_best = np.zeros(K)
    all_idx = np.arange(K)
    fits0, b0 = run(np.zeros(K), all_idx)
    lower = np.maximum(lower, b0)
    active = all_idx[~fits0]
    if active.size:
        lo = np.zeros(active.size)
        hi = np.ones(active.size)
        pending = np.ones(active.size, dtype=bool)
        for _ in range(64):  # find a multiplier whose plan fits
            if not pending.any():
                break
            idx = active[pending]
            fits, b = run(hi[pending], idx)
            better = b > lower[idx]
            lam_best[idx[better]] = hi[pending][better]
            lower[idx] = np.maximum(lower[idx], b)
            sel = np.flatnonzero(pending)
            lo[sel[~fits]] = hi[sel[~fits]]
            hi[sel[~fits]] *= 4.0
            pending[sel[fits]] = False
        for _ in range(bisection_steps):
            go = (lower[active] < best["t"] * (1 - _TOL)) & (hi > lo * (1 + 1e-9))
            if not go.any():
                break
            idx = active[go]
            mid = np.where(lo[go] > 0, np.sqrt(np.maximum(lo[go], 1e-300) * hi[go]), hi[go] / 16.0)
            fits, b = run(mid, idx)
            better = b > lower[idx]
            lam_best[idx[better]] = mid[better]
            lower[idx] = np.maximum(lower[idx], b)
            sel = np.flatnonzero(go)
            hi[sel[fits]] = mid[fits]
            lo[sel[~fits]] = mid[~fits]
    cap_lower = lower.reshape(caps.size, V).max(axis=1)
    labels = 0
    if V == 1:  # exact completion where the Lagrangian left a gap
        for c in np.argsort(cap_lower, kind="stable"):
            if cap_lower[c] >= best["t"] * (1 - _TOL):
                continue
            path, used, done = _pareto_search(
                ch, unary_t[c] * t0, budgets[c], best["t"], lam_best[c] * t0 / m0, max_labels - labels
            )
            labels += used
            if not done:
                break
            if path is not None:
                t = plan_time(p, _to_layers(ch, path))
                if t < best["t"] and plan_memory(p, _to_layers(ch, path)) <= limit:
                    best["t"], best["path"] = t, path
                cap_lower[c] = t
            else:
                cap_lower[c] = best["t"]
    if best["path"] is None:  # cannot happen when a cap fits; be safe
        mm = minimum_memory(p)
        return DPResult(mm.choice, plan_time(p, mm.choice), mm.memory_bytes, mm.memory_bytes <= limit,
                        float(cap_lower.min()), False, int(caps.size), labels)
    choice = _to_layers(ch, best["path"])
    lb = float(min(cap_lower.min(), best["t"]))
    exact = lb >= best["t"] * (1 - _TOL)
    return DPResult(choice, best["t"], plan_memory(p, choice), True, lb, bool(exact), int(caps.size), labels)
