"""Exact dynamic programming over chain graphs (sequential CNNs).

On a chain (every edge joins consecutive layers, :func:`search.problem.chain_order`)
the time is a sum of per-layer terms and per-edge terms between neighbours,
so the fastest plan without a memory limit is a Viterbi shortest path over
``(layer, strategy)`` states, ``O(n S^2)``.

A plan's memory is the larger of two phases (:mod:`search.problem`), so the
limit ``M`` is two constraints, both of which a plan must keep:

* the backward phase, ``sum_l A[l, c_l] + max_l W[l, c_l] <= M`` (A = state
  but the update + activations, W = workspace), and
* the optimizer phase, ``sum_l Q[l, c_l] <= M`` (Q = state with the update).

They are handled in three steps:

1. **Workspace caps.** For every cap ``w`` among the distinct workspace
   values, restrict every layer to strategies with ``W <= w``; the
   constraints become the additive ``sum A <= M - w`` and ``sum Q <= M``.
   The optimal plan is optimal for the cap equal to its own largest
   workspace, so the best over all caps is the optimum. Caps whose lower
   bound (:func:`search.exact.memory.memory_by_workspace_cap`: each phase at its
   own per-layer minimum) exceeds the limit are skipped; a cap that passes
   may still hold no plan that keeps both phases.
2. **Lagrangian ascent** on the two additive constraints, for all caps at
   once (vectorised): Viterbi on ``time + lambda * A + mu * Q``. Every
   ``(lambda, mu) >= 0`` gives the lower bound ``V(lambda, mu) - lambda *
   (M - w) - mu * M`` (weak duality); every plan that keeps both phases
   gives an upper bound, once checked with the exact memory (workspace
   maximum included). Along one multiplier the dual is concave and
   piecewise linear, its slope the phase's excess, which falls as the
   multiplier grows: its maximum there is the smallest value whose plan
   keeps the phase. That value is bracketed (fourfold steps) and found
   where the lines of the two bracketing plans cross (a cutting-plane
   step, finite; bisection where the crossing falls outside the bracket).
   ``lambda`` and ``mu`` take turns (coordinate ascent, at most
   ``_ASCENT_STAGES`` turns, each only where the other multiplier moved).
   Coordinate ascent on a non-smooth dual may stop short of its maximum:
   the bounds stay valid and step 3 closes what is left.
3. **Exact completion.** Where the Lagrangian leaves a duality gap (the
   limit cuts between two corners of the time-memory trade-off, or the two
   phases pull different ways), a label-setting search over
   ``(time, sum A, sum Q)`` Pareto labels (dominance in all three; labels
   that no completion can take over ``Q``'s budget compare equal on it), pruned
   by each phase's least bytes still to add against its budget (``M - w``,
   ``M``) and by the Lagrangian and time-only lower bounds to go, finds the
   optimum of that cap, up to ``max_labels`` labels. When the Lagrangian
   found no plan, the smallest-memory plan (:func:`search.exact.memory.minimum_memory`)
   seeds the search's upper bound, or shows that no plan fits.

Runs of recomputing layers (``remat+join``, :func:`search.problem.has_runs`)
on a graph in layer order (:mod:`search.exact.dp_runs`; on a graph with branches
the skip edges' least resharding is folded into their destinations for
steps 1 and 2, and step 3's labels pay the rest): the checkpoint credits
are pair terms of the backward phase (``weighted=`` of the Viterbis); step
1's caps become intervals of the largest transient
(:func:`search.exact.dp_runs.run_intervals`), step 2's Viterbi runs over the
options and the bucketed run sums (:func:`search.exact.runs.bucket_viterbi`, a
relaxation: the bounds hold), plans are checked with their exact memory
(one broken only by its transients repaired by
:func:`search.exact.dp_runs.lighter_runs`), the smallest-memory plan seeds the
upper bound, and step 3 is :func:`search.exact.dp_runs.search_runs`' labels,
which add each run's sum and the largest transient.

What is exact: with ``gradient_overlap = 0`` (every preset) the result is the
global optimum of the discrete problem under both phases (float64 sums of
the table's float32 values; ties broken arbitrarily) whenever ``exact`` is
true, which holds unless the label search of step 3 ran out of labels (or
time). ``feasible`` is true only for a plan within the limit; where it is
false, ``lower_bound_s`` says whether that is proven: infinite where no plan
fits (the smallest memory, proven, is above the limit, or every label search
finished without a plan), finite where the searches stopped first (over
runs, with a smallest memory not proven: ``MinimumMemory.exact``). With an
overlap term the time is ``max`` of two additive functions (``- overlap * min(G, B)``); the DP optimises each and
returns the better plan with the lower bound ``max`` of the two, so the gap
is reported and may be non-zero.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np

from search.exact.dp_runs import RunPruning, lighter_runs, minimum_memory_runs, run_intervals, run_pruning, search_runs
from search.exact.memory import MinimumMemory, memory_by_workspace_cap, minimum_memory
from search.exact.pareto import label_path, nondominated
from search.exact.runs import (
    BUCKETS,
    HOP_BITS,
    MAX_OPEN_SKIPS,
    MOST_BUCKET_OPEN_STATES,
    all_bucket_moves,
    bucket_viterbi,
    pair_groups,
    run_chain,
    skip_added,
    skip_moves,
)
from search.problem import DiscreteProblem, chain_order, has_runs, plan_memories, plan_memory, plan_time, plan_times

__all__ = ["BYTE_GRIDS", "DPResult", "dp_solves", "solve_dp", "viterbi"]

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
_ASCENT_STAGES = 6  # turns of the dual's coordinate ascent (lambda, mu, ...); more barely shrank the label search on random chains


class DPResult(NamedTuple):
    choice: np.ndarray  # [n] in layer order
    time_s: float
    memory_bytes: float
    feasible: bool
    lower_bound_s: float  # no plan within the limit is faster
    exact: bool  # lower bound == time (to 1e-9 relative)
    caps: int  # workspace caps searched
    labels: int  # Pareto labels created by the exact completion


def viterbi(unary, pair, weighted=None) -> tuple[np.ndarray, np.ndarray]:
    """Min-sum paths of a batch of chains (the one Viterbi: the chain DP and
    the refinement's segment moves both use it): ``unary [K, n, S]`` (``inf``
    = forbidden), ``pair [n, S, S]`` shared by the chains or ``[K, n, S, S]``
    one per chain (``pair[..., i, s, t]``: position ``i-1`` on ``s`` and
    position ``i`` on ``t``; position 0 unused), plus, with ``weighted =
    (C [n, S, S], w [K])``, ``w[k] C`` on chain ``k``'s pairs. Returns the
    values ``[K]`` and the paths ``[K, n]``."""
    K, n, S = unary.shape
    pair = np.asarray(pair)
    per_chain = pair.ndim == 4
    value = unary[:, 0]
    back = np.zeros((n, K, S), dtype=np.int64)
    for i in range(1, n):
        cand = value[:, :, None] + (pair[:, i] if per_chain else pair[i][None])
        if weighted is not None:
            cand = cand + weighted[1][:, None, None] * weighted[0][i][None]
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
    persistent: np.ndarray  # [n, S] backward-phase bytes (0 where infeasible)
    optimizer: np.ndarray  # [n, S] optimizer-phase bytes (0 where infeasible)
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
        optimizer=np.where(p.feasible, p.optimizer_bytes, 0.0)[order],
        workspace=p.workspace_bytes[order],
        grad=p.grad_sync_s[order],
        bwd=p.backward_s[order],
        pair=pair,
    )


def _to_layers(ch: _Chain, path: np.ndarray) -> np.ndarray:
    out = np.empty_like(path)
    out[..., ch.order] = path
    return out


def _pareto_search(ch: _Chain, time: np.ndarray, budget_a: float, budget_q: float, upper: float, lam: float,
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


def dp_solves(p: DiscreteProblem) -> bool:
    """Whether the solvers' DP (:func:`search.solve`'s ``"dp"`` and ``"auto"``)
    takes ``p``: a chain graph, and, where plans may hold runs of
    recomputing layers, one in layer order. :func:`solve_dp` itself also
    takes plans with runs on graphs with branches in layer order
    (:func:`search.exact.runs.run_chain`), exactly but at a cost that grows
    with the skip edges' resharding classes."""
    return chain_order(p) is not None and (not has_runs(p) or run_chain(p) is not None)


def _complete_runs(p, ch, rc, order, caps, floors, cap_lower, mults, limit, best, repaired, max_labels,
                   deadline):
    """:func:`solve_dp`'s exact completion over runs, best first: the
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
        layers = _to_layers(ch, path)
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


def solve_dp(p: DiscreteProblem, memory_limit: float = np.inf, *, max_labels: int = 2_000_000,
             bisection_steps: int = 48, time_limit_s: float | None = None,
             smallest: MinimumMemory | None = None, incumbent=None, upper_s: float = np.inf) -> DPResult:
    """The fastest plan of a chain-graph problem within ``memory_limit``
    bytes per device, both memory phases included (see the module docstring
    for what is exact). ``max_labels`` bounds the exact completion (beyond
    it the result is reported not exact; the 1,000-layer chain of
    ``benchmarks/search_quality.py`` at its tight limit on 8 DGX A100s needs
    645,369 labels, 1.6 s, so the default is 2,000,000, about 80 MB);
    ``bisection_steps`` bounds the steps of each multiplier's search after
    its bracket; ``time_limit_s`` the Lagrangian ascent after its first
    turn (which always completes: it finds the first plans that fit) and
    the exact completion over runs (where the labels grow most);
    ``smallest``: the smallest memory (:func:`search.exact.milp.smallest_memory`)
    where the caller has it; ``incumbent``: a plan (an option per layer) to
    beat where it fits, the search's first upper bound (the exact
    completion searches each interval up to the best plan found, so a good
    one prunes most of it; the result is this plan where none is faster);
    ``upper_s``: only plans faster than this many seconds are searched (a
    time the caller has from elsewhere, another mesh's plan say): where none
    is, the result holds no plan (``feasible`` False, the smallest-memory
    plan as where none fits) and its lower bound, where the search
    completed, is at least ``upper_s``.
    Raises ``ValueError`` if the graph is not a chain and plans hold no runs
    or ``incumbent`` is no plan of ``p``,
    ``NotImplementedError`` if plans may hold runs of recomputing layers
    (:func:`search.problem.has_runs`) on a graph that
    :func:`search.exact.runs.run_chain` declines (an edge against the
    layers' order, which runs follow, or too many skip edges over a layer).

    Runs of recomputing layers (:mod:`search.exact.dp_runs`): their checkpoint
    credits are pair terms of the backward phase (the Viterbi and the
    Lagrangian bounds carry them; the transients they grow are left out
    there, which only loosens the bounds, and every plan is checked with its
    exact memory), and the exact completion and the smallest memory are
    :func:`search.exact.dp_runs.search_runs`'s labels, which add the run's sum."""
    deadline = np.inf if time_limit_s is None else time.perf_counter() + float(time_limit_s)
    rc = run_chain(p) if has_runs(p) else None
    if has_runs(p) and rc is None:
        raise NotImplementedError(
            "the DP searches runs of recomputed layers (remat+join) only in layer order (every edge from an "
            f"earlier layer to a later one), with at most {MAX_OPEN_SKIPS} skip edges that free a checkpoint and "
            f"{64 // HOP_BITS - 1} that reshard open over any layer (search.exact.runs.run_chain); "
            "use method='milp' or 'gradient'")
    order = chain_order(p) if rc is None else np.arange(p.num_layers)
    if order is None:
        raise ValueError("the DP needs a chain graph (every layer feeds only the next); "
                         "use method='milp' or 'gradient' for graphs with branches")
    n = p.num_layers
    limit = float(memory_limit)
    if n == 0:
        z = np.zeros(0, dtype=np.int64)
        return DPResult(z, 0.0, 0.0, True, 0.0, True, 0, 0)
    ch = _chain(p, order)
    if rc is not None:  # the chain's own pairs, the skip edges' credits taken off and their least resharding
        # folded into their destinations (search.exact.runs: relaxations for the bounds, the labels pay the rest)
        ch = ch._replace(time=rc.time, pair=rc.pair, persistent=np.where(p.feasible, rc.persistent, 0.0))

    found: list[MinimumMemory] = [] if smallest is None else [smallest]

    def least() -> MinimumMemory:  # the smallest-memory plan, searched once (over runs: seconds)
        if not found:
            found.append(minimum_memory(p) if rc is None else minimum_memory_runs(p, rc))
        return found[0]

    def infeasible(mm, caps_searched, labels_used, lower_s=np.inf):  # no plan found: the smallest-memory plan,
        # as the other solvers (lower_s: inf where no plan fits, proven; else the bound where the search stopped)
        return DPResult(mm.choice, plan_time(p, mm.choice), mm.memory_bytes, False, lower_s, False,
                        caps_searched, labels_used)

    bucketed = rc is not None and np.isfinite(limit)  # runs under a limit: intervals of the peak, not caps
    skips = None
    if bucketed:
        caps, floors, _ = run_intervals(p, rc, limit)
        if caps.size == 0:
            return infeasible(least(), 0, 0)
        moves = all_bucket_moves(rc, caps, BUCKETS)
        # which open skip edges still earn their credits, their bytes scaled as the phases' below (m0 = limit);
        # past MOST_BUCKET_OPEN_STATES open over a layer, none: every credit taken as earned
        skips = skip_moves(rc, MOST_BUCKET_OPEN_STATES)
        if skips is not None:
            skips = skips._replace(add=[a / limit for a in skips.add])
    elif np.isfinite(limit):
        caps, cap_memory = memory_by_workspace_cap(p)
        caps = caps[cap_memory <= limit]  # a lower bound per cap: skipping above the limit loses no plan
        if caps.size == 0:
            return infeasible(least(), 0, 0)
        floors = caps
    else:
        caps = floors = np.array([np.inf])
    budgets = limit - floors if np.isfinite(limit) else np.array([np.inf])  # backward phase's budget per cap
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
    use = np.stack([ch.persistent, ch.optimizer]) / m0  # [2, n, S]: the two phases' additive bytes
    K = unary_t.shape[0]
    budget_n = np.stack([budgets[cap_of], np.full(K, limit)]) / m0  # [2, K]
    rows = np.arange(n)[None, :]
    credit = None if rc is None else -rc.credit / m0  # [n, S, S] backward-phase pair terms (scaled), runs only
    groups = pair_groups(pair, credit) if bucketed else None  # (bucket_viterbi's, once for every multiplier)

    if not upper_s > 0:
        raise ValueError(f"upper_s must be positive; got {upper_s!r}")
    best = {"t": float(upper_s), "path": None}
    if incumbent is not None:
        incumbent = np.asarray(incumbent, dtype=np.int64)
        if incumbent.shape != (n,) or not (np.all((incumbent >= 0) & (incumbent < p.num_options))
                                            and np.all(p.feasible[np.arange(n), incumbent])):
            raise ValueError(f"incumbent must be a feasible option per layer, shape ({n},); got {incumbent!r}")
        if plan_memory(p, incumbent) <= limit and plan_time(p, incumbent) < best["t"]:
            best["t"], best["path"] = plan_time(p, incumbent), incumbent[order]
    repaired: set[tuple] = set()  # the plans lighter_runs has repaired
    lower = np.full(K, -np.inf)  # seconds: the best Lagrangian bound of each element
    mult = np.zeros((2, K))  # current (lambda, mu) per element, in scaled units
    mult_best = np.zeros((2, K))  # the multipliers of the best lower bound
    # the plan at ``mult``: whether it keeps each phase, its dual value and the dual's slopes (scaled units)
    fit = np.zeros((2, K), dtype=bool)
    dual = np.zeros(K)
    slope = np.zeros((2, K))

    def run(m, idx):
        """Viterbi for elements ``idx`` at multipliers ``m [2, k]``: records
        the plans that keep both phases (exact check) and the bounds; returns
        whether each plan keeps each phase [2, k], the dual value
        ``V - m . budget`` [k] and its slopes ``used - budget`` [2, k]."""
        u = unary_t[idx] + m[0][:, None, None] * use[0][None] + m[1][:, None, None] * use[1][None]
        weighted = None if credit is None else (credit, m[0])
        if bucketed:
            val, path = bucket_viterbi(u, pair, moves._replace(allowed=moves.allowed[cap_of[idx]],
                                                               nxt=moves.nxt[cap_of[idx]],
                                                               start=moves.start[cap_of[idx]]), weighted, skips,
                                       groups)
        else:
            val, path = viterbi(u, pair, weighted)
        used = np.stack([np.sum(use[r][rows, path], axis=1) for r in range(2)])
        if credit is not None:  # the checkpoints freed inside runs, along each path
            used[0] += np.sum(credit[rows[:, 1:], path[:, :-1], path[:, 1:]], axis=1)
        if skips is not None:  # the skip edges' credits the paths do not earn
            used[0] += skip_added(skips, path)
        fits = used <= budget_n[:, idx] * (1 + 1e-15)
        both = np.flatnonzero(fits.all(axis=0))
        if both.size:  # upper bounds: exact time and memory of the plans that keep both phases
            layers = _to_layers(ch, path[both])
            mem, t = plan_memories(p, layers), plan_times(p, layers)
            j = int(np.argmin(np.where(mem <= limit, t, np.inf)))
            if mem[j] <= limit and t[j] < best["t"]:
                best["t"], best["path"] = float(t[j]), path[both[j]]
            if rc is not None:  # runs: the fastest plan broken only by the runs' transients, repaired
                j = int(np.argmin(np.where(mem > limit, t, np.inf)))
                if mem[j] > limit and t[j] < best["t"] and tuple(path[both[j]]) not in repaired:
                    repaired.add(tuple(path[both[j]]))
                    fixed = lighter_runs(p, layers[j])
                    if plan_memory(p, fixed) <= limit and plan_time(p, fixed) < best["t"]:
                        best["t"], best["path"] = plan_time(p, fixed), fixed[order]
        with np.errstate(invalid="ignore"):  # a zero multiplier drops its (maybe infinite) budget
            g = val - np.sum(np.where(m > 0, m * budget_n[:, idx], 0.0), axis=0)
            excess = used - budget_n[:, idx]
        better = g * t0 > lower[idx]
        lower[idx[better]] = g[better] * t0
        mult_best[:, idx[better]] = m[:, better]
        return fits, g, excess

    def ascend(r, idx, until):
        """Move multiplier ``r`` of elements ``idx`` to the maximum of the dual
        along ``r``, the other multiplier fixed: the smallest value whose plan
        keeps phase ``r`` (the dual is concave and piecewise linear along
        ``r``, its slope the phase's excess, which falls as the multiplier
        grows). The maximum is bracketed by ``lo`` (plan breaks the phase)
        and ``hi`` (plan keeps it): upward by fourfold steps where the plan
        at the current value breaks the phase, downward from zero where it
        keeps it. Each step tries where the two bracketing plans' lines
        cross (the maximum if no third plan is lower there, which ends the
        search) and falls back to bisection when that is not inside the
        bracket. Returns the elements for which no multiplier kept the phase."""
        k = idx.size
        up = ~fit[r, idx]
        lo, hi = np.where(up, mult[r, idx], np.nan), np.where(up, np.nan, mult[r, idx])
        g_lo, g_hi = np.where(up, dual[idx], np.nan), np.where(up, np.nan, dual[idx])
        s_lo, s_hi = np.where(up, slope[r, idx], np.nan), np.where(up, np.nan, slope[r, idx])
        done = np.zeros(k, dtype=bool)
        for _ in range(64 + bisection_steps):
            if time.perf_counter() > until:
                break
            go = ~done & (lower[idx] < best["t"] * (1 - _TOL))
            if not go.any():
                break
            sel = np.flatnonzero(go)
            l, h = lo[sel], hi[sel]
            both = ~np.isnan(l) & ~np.isnan(h)
            with np.errstate(invalid="ignore", divide="ignore"):
                cross = (g_hi[sel] - h * s_hi[sel] - g_lo[sel] + l * s_lo[sel]) / (s_lo[sel] - s_hi[sel])
                inside_ = both & (cross > l) & (cross < h)
                halve = np.where(l > 0, np.sqrt(np.maximum(l, 1e-300) * h), h / 16.0)
                probe = np.where(inside_, cross, np.where(both, halve, np.where(np.isnan(h),
                                 np.where(l > 0, 4.0 * l, 1.0), 0.0)))
            m = mult[:, idx[sel]].copy()
            m[r] = probe
            fits, g, excess = run(m, idx[sel])
            ok = fits[r]
            with np.errstate(invalid="ignore"):  # the crossing lines' value there; the dual is below both
                touched = inside_ & (g >= g_lo[sel] + (probe - l) * s_lo[sel] - 1e-12 * (1 + np.abs(g)))
            for a, b, c, d in ((lo, g_lo, s_lo, ~ok), (hi, g_hi, s_hi, ok)):
                a[sel[d]], b[sel[d]], c[sel[d]] = probe[d], g[d], excess[r, d]
            # the plan now at the multiplier's resting place (hi, or the maximum where the lines touch)
            rest = ok | touched
            fit[:, idx[sel[rest]]] = fits[:, rest]
            dual[idx[sel[rest]]] = g[rest]
            slope[:, idx[sel[rest]]] = excess[:, rest]
            mult[r, idx[sel[rest]]] = probe[rest]
            done[sel] = touched | (ok & (probe == 0)) | (both & (h <= l * (1 + 1e-9)))
        return idx[np.isnan(hi)]

    fit[:], dual[:], slope[:] = run(np.zeros((2, K)), np.arange(K))
    if bucketed and best["path"] is None:  # runs, the fastest plans do not fit: the smallest settles feasibility
        mm = least()  # and seeds the upper bound (the ascent over intervals costs more than it)
        if mm.exact and mm.memory_bytes > limit:
            return infeasible(mm, int(caps.size), 0)
        if mm.memory_bytes <= limit and plan_time(p, mm.choice) < best["t"]:
            best["t"], best["path"] = plan_time(p, mm.choice), mm.choice[order]
    stuck = np.zeros(K, dtype=bool)
    stale = np.ones((2, K), dtype=bool)  # the multiplier may be off its maximum along its axis
    for stage in range(_ASCENT_STAGES):  # coordinate ascent: lambda, mu, lambda, ...
        if stage and time.perf_counter() > deadline:  # the first turn always (it finds the first plans that fit)
            break
        r = stage % 2
        # at zero with the phase kept, the slope along r is <= 0: already the maximum there
        idx = np.flatnonzero(stale[r] & ~stuck & (lower < best["t"] * (1 - _TOL)) & (~fit[r] | (mult[r] > 0)))
        if idx.size:
            was = mult[r, idx].copy()
            stuck[ascend(r, idx, np.inf if stage == 0 else deadline)] = True
            stale[1 - r, idx[mult[r, idx] != was]] = True  # the other axis's maximum moves with this one
        stale[r] = False
        if not np.any(stale & ~stuck & (lower < best["t"] * (1 - _TOL))):
            break
    if best["path"] is None:  # no multiplier's plan kept both phases: does any plan?
        mm = least()
        if mm.memory_bytes > limit and mm.exact:
            return infeasible(mm, int(caps.size), 0)
        if mm.memory_bytes <= limit and plan_time(p, mm.choice) < best["t"]:  # an upper bound to prune with
            best["t"], best["path"] = plan_time(p, mm.choice), mm.choice[order]
    cap_lower = lower.reshape(caps.size, V).max(axis=1)
    labels = 0
    if V == 1 and rc is not None:  # exact completion over runs where the Lagrangian left a gap
        labels, _ = _complete_runs(p, ch, rc, order, caps, floors, cap_lower, mult_best.T * t0 / m0, limit, best,
                                   repaired, max_labels, deadline)
    elif V == 1:  # exact completion where the Lagrangian left a gap
        for c in np.argsort(cap_lower, kind="stable"):
            if cap_lower[c] >= best["t"] * (1 - _TOL):
                continue
            lam, mu = mult_best[0, c] * t0 / m0, mult_best[1, c] * t0 / m0
            path, used, done = _pareto_search(ch, unary_t[c] * t0, budgets[c], limit, best["t"], lam, mu,
                                              max_labels - labels)
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
    if best["path"] is None:  # no plan found: none fits where every interval's labels finished (bound inf)
        return infeasible(least(), int(caps.size), labels, float(cap_lower.min()))
    choice = _to_layers(ch, best["path"])
    lb = float(min(cap_lower.min(), best["t"]))
    exact = lb >= best["t"] * (1 - _TOL)
    return DPResult(choice, best["t"], plan_memory(p, choice), True, lb, bool(exact), int(caps.size), labels)
