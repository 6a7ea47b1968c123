"""Step 3 of :func:`search.exact.dp.solve_dp` (its module docstring): the
exact completion where the Lagrangian bounds leave a gap, by label-setting
searches: over a chain's ``(time, backward bytes, optimizer bytes)`` labels
per workspace cap (:func:`pareto_search`, :func:`complete_caps`) and, where
plans hold runs of recomputing layers, over each interval of the largest
transient (:func:`complete_runs`, :func:`search.exact.dp_runs.search_runs`)."""

from __future__ import annotations

import time

import numpy as np

from search.exact._dp_chain import Chain, to_layers
from search.exact.dp_runs import RunPruning, lighter_runs, run_pruning, search_runs
from search.exact.pareto import label_path, nondominated
from search.problem import plan_memory, plan_time

__all__ = ["BYTE_GRIDS", "complete_caps", "complete_runs", "pareto_search"]

_TOL = 1e-9  # relative: bounds closer than this count as equal
# the completion over runs searches each interval in relaxations first: kept bytes rounded down to grids of these
# fractions of the limit (search_runs' byte_grid), so labels merge far more, each relaxation's fastest plan a lower
# bound for the next grid (ad-hoc probe, ResNet-50 on 4x2 ABCI V100s, levers only: proven with 6 M labels where the
# exact labels outgrew 30 M)
BYTE_GRIDS = (2.0 ** -14, 2.0 ** -18, 2.0 ** -22)
# the completion's steps above an interval's bound, relative: the first, each next sqrt(2) times the last, and the
# last before it searches up to the best plan (the labels grow fast with the upper bound)
_FIRST_STEP, _LAST_STEP = 1e-4, 1e-4 * 2.0 ** 15.5
# the labels a search above the first step may use: this many, or _SEARCH_GROWTH times its interval's last
# finished search (ad-hoc probe, ResNet-152 with runs on 4x2 ABCI V100s at its tight limit: the labels grew
# about fourfold a step); one cut there halves the interval's step
_SEARCH_LABELS, _SEARCH_GROWTH = 100_000, 4


def pareto_search(ch: Chain, time: np.ndarray, budget_a: float, budget_q: float, upper: float, lam: float,
                  mu: float, max_labels: int):
    """Exact min-time path with ``sum persistent <= budget_a`` and ``sum
    optimizer <= budget_q`` on one capped chain (``time`` inf outside the
    cap), only looking for paths faster than ``upper``; ``lam`` and ``mu``
    are Lagrange multipliers (seconds per byte) of the two constraints, used
    only to prune. Returns ``(path or None, labels used, completed)``."""
    n, S = time.shape
    inside = np.isfinite(time)
    A = np.where(inside, ch.persistent, np.inf)
    Q = np.where(inside, ch.optimizer, np.inf)

    def rest(x):  # [n]: least bytes still to add after position i
        return np.r_[np.cumsum(np.min(x, axis=1)[::-1])[::-1][1:], 0.0]

    a_to_go, q_to_go = rest(A), rest(Q)
    # A label whose optimizer bytes cannot break its budget whatever follows is as good
    # as any other such label on that phase: dominance compares max(q, safe[i]), which
    # is the same for all of them (without it, a phase far from its limit keeps labels
    # apart that differ only there, and the search runs out of labels).
    q_most = np.where(inside, Q, -np.inf).max(axis=1)  # [n] most optimizer bytes a position adds
    safe = budget_q - np.r_[np.cumsum(q_most[::-1])[::-1][1:], 0.0]  # [n]

    def to_go(wa, wq):  # least weighted cost of layers after i, given state s at i
        h = np.zeros((n, S))
        for i in range(n - 2, -1, -1):
            nxt = time[i + 1] + wa * ch.persistent[i + 1] + wq * ch.optimizer[i + 1] + h[i + 1]
            h[i] = np.min(ch.pair[i + 1] + nxt[None, :], axis=1)
        return h

    h_time = to_go(0.0, 0.0)
    use_mult = (lam > 0 or mu > 0) and np.isfinite(budget_a) and np.isfinite(budget_q)
    h_mult = to_go(lam, mu) if use_mult else h_time
    shift = lam * budget_a + mu * budget_q if use_mult else 0.0
    limit_t = upper * (1.0 - _TOL)

    def keep(i, tau, a, q, s):
        ok = (a + a_to_go[i] <= budget_a) & (q + q_to_go[i] <= budget_q) & (tau + h_time[i, s] < limit_t)
        if use_mult:  # weak duality on the rest of the chain
            ok &= tau + lam * a + mu * q + h_mult[i, s] - shift < limit_t
        return ok

    empty = (np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64))
    # labels[i][s] = (tau, a, q, parent_state, parent_index)
    labels = []
    layer = []
    used = 0
    for s in range(S):
        if not inside[0, s]:
            layer.append(empty)
            continue
        tau, a, q = np.array([time[0, s]]), np.array([A[0, s]]), np.array([Q[0, s]])
        ok = keep(0, tau, a, q, s)
        z = np.zeros(int(ok.sum()), np.int64)
        layer.append((tau[ok], a[ok], q[ok], z, z))
        used += int(ok.sum())
    labels.append(layer)
    for i in range(1, n):
        prev = labels[-1]
        layer = []
        for t in range(S):
            if not inside[i, t]:
                layer.append(empty)
                continue
            parts = [(prev[s][0] + ch.pair[i][s, t] + time[i, t], prev[s][1] + A[i, t], prev[s][2] + Q[i, t],
                      np.full(prev[s][0].size, s, np.int64), np.arange(prev[s][0].size))
                     for s in range(S) if prev[s][0].size]
            if not parts:
                layer.append(empty)
                continue
            tau, a, q, ps, pi = (np.concatenate(x) for x in zip(*parts))
            ok = keep(i, tau, a, q, t)
            tau, a, q, ps, pi = tau[ok], a[ok], q[ok], ps[ok], pi[ok]
            if tau.size:  # Pareto filter over (time, backward bytes, optimizer bytes)
                f = nondominated(tau, a, np.maximum(q, safe[i]))
                tau, a, q, ps, pi = tau[f], a[f], q[f], ps[f], pi[f]
            used += tau.size
            layer.append((tau, a, q, ps, pi))
        labels.append(layer)
        if used > max_labels:
            return None, used, False
    finals = [(float(labels[-1][s][0].min()), s, int(np.argmin(labels[-1][s][0])))
              for s in range(S) if labels[-1][s][0].size]
    if not finals:
        return None, used, True
    _, s, j = min(finals)
    return label_path(labels, s, j, 3, 4), used, True


def complete_caps(p, ch: Chain, unary: np.ndarray, t0: float, budgets: np.ndarray, cap_lower: np.ndarray,
                  mults: np.ndarray, limit: float, best: dict, max_labels: int) -> int:
    """:func:`search.exact.dp.solve_dp`'s exact completion without runs, one
    workspace cap after another in the order of their bounds ``cap_lower``
    [C] (raised in place to each cap's fastest, or to the best plan where
    none there beats it), each cap's :func:`pareto_search` on its times
    ``unary[c] * t0`` under the backward phase's ``budgets[c]`` and
    ``limit``, pruned by its multipliers ``mults [C, 2]`` (seconds per
    byte), until the labels outgrow ``max_labels``. ``best``: the best
    plan's time and path, updated. Returns the labels used."""
    labels = 0
    for c in np.argsort(cap_lower, kind="stable"):
        if cap_lower[c] >= best["t"] * (1 - _TOL):
            continue
        lam, mu = mults[c, 0], mults[c, 1]
        path, used, done = pareto_search(ch, unary[c] * t0, budgets[c], limit, best["t"], lam, mu,
                                         max_labels - labels)
        labels += used
        if not done:
            break
        if path is not None:
            t = plan_time(p, to_layers(ch, path))
            if t < best["t"] and plan_memory(p, to_layers(ch, path)) <= limit:
                best["t"], best["path"] = t, path
            cap_lower[c] = t
        else:
            cap_lower[c] = best["t"]
    return labels


def complete_runs(p, ch, rc, order, caps, floors, cap_lower, mults, limit, best, repaired, max_labels,
                   deadline):
    """:func:`search.exact.dp.solve_dp`'s exact completion over runs, best first: the
    interval with the lowest bound is searched below a little more than its
    bound (:func:`search.exact.dp_runs.search_runs`, relative steps from
    ``_FIRST_STEP``, each :math:`\\sqrt 2` times the last; past
    ``_LAST_STEP``, up to the best plan), on the
    coarsest kept-byte grid of :data:`BYTE_GRIDS` it has not outgrown, then
    exactly. A search that finds nothing raises the interval's bound to
    where it searched, so a search stopped by its time or label limit has
    raised the lowest bound, the solver's, as far as it could. A path found
    is the relaxation's fastest: a lower bound on its interval (raised in
    ``cap_lower``), and the interval's fastest where it fits; where it does
    not, the interval moves to the next grid, and
    :func:`search.exact.dp_runs.lighter_runs` repairs the path for an upper bound,
    once per plan (``repaired``: the plans repaired already, shared with the
    Lagrangian's). A search above the first step has its own label budget
    (``_SEARCH_LABELS``, or ``_SEARCH_GROWTH`` times its interval's last
    finished search, whichever is more); cut there, it halves its
    interval's step and the completion goes on, and a search that took over
    a quarter of its budget keeps the step as it was. Each interval's bounds
    to go (:func:`search.exact.dp_runs.run_pruning`) are built once, at its first
    search. ``best``: the best plan's time and path, updated; ``mults
    [C, 2]``: each interval's multipliers in seconds per byte.
    Returns ``(labels used, completed)``."""
    grids = (*BYTE_GRIDS, 0.0)
    used = 0
    level = np.zeros(caps.size, dtype=np.int64)  # each interval's grid, an index into grids
    step = np.full(caps.size, _FIRST_STEP)  # each interval's next step above its bound, relative
    last = np.zeros(caps.size, dtype=np.int64)  # the labels of each interval's last finished search
    pruning: dict[int, RunPruning] = {}  # each interval's bounds to go, built at its first search (ResNet-152: 21 MB)
    settled = np.zeros(caps.size, dtype=bool)  # the interval's fastest is known (or none beats the best)
    while True:
        open_ = ~settled & (cap_lower < best["t"] * (1 - _TOL))
        if not open_.any():
            return used, True
        c = int(np.flatnonzero(open_)[np.argmin(cap_lower[open_])])
        bound = best["t"] if cap_lower[c] <= 0 or step[c] > _LAST_STEP else \
            min(best["t"], float(cap_lower[c]) * (1.0 + step[c]))  # past the last step: up to the best plan
        # the search's own labels (not max_labels': the same searches whatever it is, until it stops them)
        budget = np.inf if step[c] <= _FIRST_STEP else max(_SEARCH_LABELS, _SEARCH_GROWTH * int(last[c]))
        rest = max_labels - used
        lam, mu = float(mults[c, 0]), float(mults[c, 1])
        if c not in pruning:
            pruning[c] = run_pruning(rc, float(caps[c]), limit, lam=lam, mu=mu)
        path, u, done, proven = search_runs(rc, float(caps[c]), float(floors[c]), limit, bound, lam=lam, mu=mu,
                                            max_labels=int(min(rest, budget)), deadline=deadline,
                                            byte_grid=grids[level[c]] * limit, pruning=pruning[c])
        used += u
        if not done:
            if budget >= rest or time.perf_counter() > deadline:  # the solver's labels or time ran out
                return used, False
            step[c] = max(step[c] / 2.0, _FIRST_STEP)  # cut by its own budget: a smaller step, then (at the
            continue  # first step) the labels left
        last[c] = u
        if path is None:  # none below the bound, even in the relaxation
            cap_lower[c] = max(cap_lower[c], proven)
            if 4 * u <= budget:  # the next step a little longer, unless this one took over a quarter of its budget
                step[c] *= np.sqrt(2.0)
            if bound >= best["t"]:
                cap_lower[c], settled[c] = best["t"], True
            continue
        layers = to_layers(ch, path)
        t = plan_time(p, layers)
        cap_lower[c] = max(cap_lower[c], t)  # the relaxation's fastest: none in the interval is faster
        if plan_memory(p, layers) <= limit:  # and it fits: the interval's fastest
            settled[c] = True
            if t < best["t"]:
                best["t"], best["path"] = t, path
            continue
        if level[c] == len(grids) - 1:  # exact labels keep the limit: over it only by rounding, the bound stands
            settled[c] = True
        else:
            level[c], step[c] = level[c] + 1, _FIRST_STEP  # a finer grid, from the relaxation's fastest
        if tuple(path) in repaired:
            continue
        repaired.add(tuple(path))
        fixed = lighter_runs(p, layers)  # breaks the limit: its lightest repair, an upper bound
        if plan_memory(p, fixed) <= limit and plan_time(p, fixed) < best["t"]:
            best["t"], best["path"] = plan_time(p, fixed), fixed[order]
