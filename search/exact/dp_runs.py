"""Exact label search over graphs in layer order whose plans hold runs of
recomputing layers (``remat+join``: :func:`costmodels.recomputed_runs`,
:func:`search.problem.run_terms`), for :func:`search.exact.dp.solve_dp` and the
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

Skip edges (``src < dst - 1``, a residual network's) free their
destination's checkpoint where their source recomputes and the run reaches
from it to the destination. The chain's ``persistent`` has every such
credit taken off already (a relaxation, so the bounds to go hold); each
label carries a bit mask of the open skip edges whose source recomputed
with no run break since, cleared where a layer does not join, and adds a
credit back where its edge closes unearned. A skip edge that reshards (a
*hop*) has its least resharding over the source's options in its
destination's time (the relaxation of
:func:`search.exact.layer_chain.layer_order_chain`'s ``"lower"``); a label of the
search by time carries the class of each open hop's source option (options
whose resharding rows are alike) in a code and pays the rest where the hop
closes. Labels compare only with labels of the same option, mask and code.

So a plan's backward phase is ``a + peak`` with ``a`` additive and
``peak = max_i (workspace_i + T_i)`` the largest transient, ``T_i`` the
run's sum before ``i``; its optimizer phase ``q`` is additive. The search
carries labels ``(tau, a, q, r, peak)`` per ``(position, option)``, Pareto
filtered (smaller is better in each: a smaller ``r`` only lowers later
transients; :func:`search.exact.pareto.nondominated_rows`), as
:func:`search.exact._dp_labels.pareto_search` does without runs
(:mod:`search.exact._run_labels` propagates them), and is exact up to its
label budget.

Both the fastest plan (:func:`search.exact.dp.solve_dp`) and the smallest memory
(:func:`minimum_memory_runs`) are searched in intervals ``(f, c]`` of the
peak (:func:`run_intervals`): every transient within ``c``, the plan
counted at ``a + max(f, peak)``, exactly its memory in its own interval.
The DP's Lagrangian bounds come from a Viterbi over the options and the run
sum rounded down into buckets (:func:`search.exact.runs.bucket_viterbi`),
which never overstates a transient, so they hold; its labels are pruned by
the same bucketed bounds to go (:func:`search.exact.runs.bucket_to_go`). Most
labels' peaks sit at the floor ``f`` and compare equal. Each coordinate
compares only above where it can still change how a plan ends (``coords``
in :func:`search_runs`): a label's ``r`` as ``max(r, peak - G_i)``, ``G_i``
the most any continuation of the run can add to a later transient (below
that ``r`` never raises the peak); by time, ``q`` only above what still
fits whatever follows; by memory, ``q`` only above the least the backward
phase can end at less what the optimizer phase can add, and the peak as
``a + peak`` (beside ``a``), which is how it counts.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from search.exact._run_labels import search_labels
from search.exact.memory import MinimumMemory, minimum_memory, phase_minimum_by_cap
from search.exact.runs import (
    BUCKETS,
    MOST_BUCKET_OPEN_STATES,
    RunChain,
    bucket_to_go,
    open_skips,
    run_chain,
    skip_moves,
    skip_state,
    skip_to_go,
)
from search.options import restricted, with_strategies_of, without_joins
from search.problem import DiscreteProblem, plan_memory

__all__ = ["INTERVALS", "RunPruning", "lighter_runs", "minimum_memory_runs", "run_intervals", "run_pruning",
           "search_runs"]

_TOL = 1e-9  # relative: bounds closer than this count as equal
INTERVALS = 16  # intervals of the peak transient solve_dp searches (run_intervals)


def _least_kept(p: DiscreteProblem, rc: RunChain) -> np.ndarray:
    """``[n, O]``: each option's backward-phase bytes less the most its input
    edge can free (+inf where infeasible)."""
    rows = np.arange(p.num_layers)
    freed = np.max(np.where(p.feasible[np.maximum(rows - 1, 0)][:, :, None], rc.credit, 0.0), axis=1)
    return np.where(p.feasible, rc.persistent - freed, np.inf)  # (skip edges' credits taken off already)


def run_intervals(p: DiscreteProblem, rc: RunChain, limit: float,
                  count: int = INTERVALS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The intervals of the largest transient (the peak) that
    :func:`search.exact.dp.solve_dp` searches one by one under ``limit``: ``count``
    of equal width from the least peak any plan has (every layer's smallest
    workspace) to the most a plan that fits can have (the limit less a lower
    bound on the kept bytes), those whose lower bound on memory fits. In
    interval ``(floor, cap]`` a plan keeps every transient within ``cap`` and
    counts ``a + max(floor, peak)``, its memory where its peak is in the
    interval: the intervals cover every plan that fits, each counted
    exactly in its own. Returns ``(caps, floors, lower bounds on the
    memory of each interval's plans)``."""
    kept = _least_kept(p, rc)
    lo = float(np.max(np.min(p.workspace_bytes, axis=1)))
    hi = limit - float(np.sum(np.min(kept, axis=1)))
    if not hi >= lo:
        return np.zeros(0), np.zeros(0), np.zeros(0)
    edges = np.linspace(lo, hi, count + 1) if hi > lo else np.array([lo, lo])
    caps, floors = edges[1:], edges[:-1]
    backward, covered = phase_minimum_by_cap(p.workspace_bytes, kept, caps)
    optimizer, _ = phase_minimum_by_cap(p.workspace_bytes, p.optimizer_bytes, caps)
    bound = np.where(covered == p.num_layers, np.maximum(floors + backward, optimizer), np.inf)
    fits = bound <= limit
    return caps[fits], floors[fits], bound[fits]


def _to_go(rc: RunChain, inside: np.ndarray, unary: np.ndarray, pair: np.ndarray) -> np.ndarray:
    """``[n, O]``: the least sum of ``unary`` and ``pair`` over the positions
    after ``i``, given option ``s`` at ``i`` (``unary`` inf outside)."""
    n, O = unary.shape
    h = np.zeros((n, O))
    for i in range(n - 2, -1, -1):
        nxt = np.where(inside[i + 1], unary[i + 1] + h[i + 1], np.inf)
        h[i] = np.min(pair[i + 1] + nxt[None, :], axis=1)
    return h


class RunPruning(NamedTuple):
    """:func:`search_runs`' tables for one interval (:func:`run_pruning`):
    what prunes and compares its labels, whatever the upper bound."""
    cap: float  # bytes: every transient within it
    limit: float  # bytes
    minimize: str  # "time" or "memory"
    lam: float  # seconds per byte, the backward phase's multiplier (by time)
    mu: float  # seconds per byte, the optimizer phase's
    buckets: int  # of the run's sum, for the bounds to go
    width: float  # bytes: a bucket's
    inside: np.ndarray  # [n, O] bool: options within the cap
    T: np.ndarray  # [n, O] seconds (inf outside)
    A: np.ndarray  # [n, O] backward-phase bytes (inf outside)
    Q: np.ndarray  # [n, O] optimizer-phase bytes (inf outside)
    W: np.ndarray  # [n, O] workspace bytes (0 outside)
    R: np.ndarray  # [n, O] recomputed bytes (0 outside)
    a_go: np.ndarray | None  # [n, O] least backward bytes to add (where the skip states are not tracked)
    a_go_skip: list | None  # per position [O, states] the same by open skip state (skip_to_go)
    opened: list  # per position the open skip edges (open_skips)
    use_mult: bool  # whether the multipliers prune (by time)
    mult_states: bool  # whether h_mult is by skip state too
    q_go: np.ndarray  # [n] least optimizer bytes to add
    G: np.ndarray  # [n] bytes: the most a run's continuation adds to a later transient
    h_time: np.ndarray | None  # [n, O, B] seconds to go by the run's bucket (by time)
    h_mult: np.ndarray | None  # [n, O, B(, states)] the same with the multipliers' bytes
    q_floor: np.ndarray | None  # [n] bytes: below, the optimizer phase fits whatever follows (by time)
    d_go: np.ndarray | None  # [n, O] bytes (by memory, search_runs' coords)


def run_pruning(rc: RunChain, cap: float, limit: float, *, minimize: str = "time", lam: float = 0.0,
                mu: float = 0.0, buckets: int = BUCKETS) -> RunPruning:
    """The tables :func:`search_runs` prunes and compares labels with in
    the interval capped at ``cap`` (the arguments as there); they do not
    depend on the upper bound, so one interval's searches share them."""
    if minimize not in ("time", "memory"):
        raise ValueError(f"minimize must be 'time' or 'memory'; got {minimize!r}")
    by_time = minimize == "time"
    width = cap / buckets
    n, O = rc.time.shape
    inside = np.isfinite(rc.time) & (rc.workspace <= cap)
    T = np.where(inside, rc.time, np.inf)
    A = np.where(inside, rc.persistent, np.inf)
    Q = np.where(inside, rc.optimizer, np.inf)
    W = np.where(inside, rc.workspace, 0.0)
    R = np.where(inside, rc.recompute, 0.0)
    J = rc.joins
    # the least backward bytes still to add, given which open skip edges still earn their credits
    # (skip_to_go); past MOST_OPEN_STATES open over a layer, [n, O] with every skip credit taken as earned
    skips = skip_moves(rc)
    a_go_skip = None if skips is None else skip_to_go(rc, inside, A, -rc.credit, skips=skips)
    a_go = _to_go(rc, inside, A, -rc.credit) if a_go_skip is None else None
    opened = open_skips(rc)
    use_mult = mult_states = False  # by time: whether the multipliers prune, and by skip state

    h_time = h_mult = q_floor = d_go = None
    q_go = np.r_[np.cumsum(np.min(Q, axis=1)[::-1])[::-1][1:], 0.0]  # [n]
    # G[i]: the most a continuation of the run after i adds to a later transient (all options within the cap)
    G = np.full(n, -np.inf)
    for i in range(n - 2, -1, -1):
        G[i] = max(np.max(np.where(inside[i + 1] & J[i + 1], W[i + 1], -np.inf)),
                   np.max(np.where(inside[i + 1] & J[i + 1], R[i + 1], -np.inf)) + G[i + 1])
    if by_time:
        use_mult = bool((lam > 0 or mu > 0) and np.isfinite(limit))
        weighted = T + lam * np.where(inside, rc.persistent, 0.0) + mu * np.where(inside, rc.optimizer, 0.0)
        h_time = bucket_to_go(rc, inside, T, rc.pair, cap, buckets)  # [n, O, B]: by the bucket of the run's sum
        # by the state of the open skip edges too, at most MOST_BUCKET_OPEN_STATES open over a layer (the
        # credits not earned cost lam)
        few = skips if skips is not None and skips.size.max() <= 1 << MOST_BUCKET_OPEN_STATES else None
        h_mult = bucket_to_go(rc, inside, weighted, rc.pair - lam * rc.credit, cap, buckets, few, lam) \
            if use_mult else h_time
        mult_states = bool(use_mult and few is not None)
        q_most = np.where(inside, Q, -np.inf).max(axis=1)
        q_floor = limit - np.r_[np.cumsum(q_most[::-1])[::-1][1:], 0.0]  # [n] (search.exact._dp_labels.pareto_search)
    else:  # [n, O] the least a completion adds to the backward phase less what it adds to the optimizer's
        gap = np.where(inside, rc.persistent, 0.0) - np.where(inside, rc.optimizer, 0.0)
        d_go = _to_go(rc, inside, np.where(inside, gap, np.inf), -rc.credit)
    return RunPruning(float(cap), float(limit), minimize, float(lam), float(mu), buckets, width, inside, T, A, Q, W, R,
                      a_go, a_go_skip, opened, use_mult, mult_states, q_go, G, h_time, h_mult, q_floor, d_go)


def search_runs(rc: RunChain, cap: float, floor: float, limit: float, upper: float, *, minimize: str = "time",
                lam: float = 0.0, mu: float = 0.0, max_labels: int = 2_000_000, deadline: float = np.inf,
                buckets: int = BUCKETS, byte_grid: float = 0.0, pruning: RunPruning | None = None):
    """The exact best path of the interval ``(floor, cap]`` of the peak
    (:func:`run_intervals`: every transient within ``cap``, the plan counted
    at ``a + max(floor, peak)``): ``minimize="time"``, the fastest with ``a +
    max(floor, peak) <= limit`` and ``q <= limit``, only looking for paths
    faster than ``upper`` (``lam``, ``mu``: Lagrange multipliers of the two
    phases in seconds per byte, used only to prune; the bounds to go taken
    over the bucketed run sums, :func:`search.exact.runs.bucket_to_go`,
    ``buckets``); ``minimize="memory"``, the least ``max(a + max(floor,
    peak), q)`` below ``upper`` bytes (``limit`` unused). The labels grow
    fast with ``upper``; :func:`search.exact.dp.solve_dp` raises it in steps over
    its intervals. Stops, not completed, past ``max_labels`` labels or the
    ``time.perf_counter()`` value ``deadline``. ``pruning``: the interval's
    bounds to go (:func:`run_pruning` of the same ``rc``, ``cap``,
    ``limit``, ``minimize``, ``lam``, ``mu`` and ``buckets``), which do not
    depend on ``upper``: a caller searching one interval at several upper
    bounds builds them once (most of a small search's time). With ``byte_grid > 0`` (by
    time only) it searches a relaxation: each label's kept bytes ``a``
    rounded down to a multiple of ``byte_grid`` at every position, so never
    above the true ones. Labels then merge far more, and its best path is
    the relaxation's fastest: a lower bound on the interval's fastest and
    the fastest itself where it fits (its memory may exceed ``limit`` by up
    to ``byte_grid`` per layer; check it with
    :func:`search.problem.plan_memory`). Returns ``(path or None, labels
    used, completed, lower bound proven)``: with a path, the best; without,
    where completed, nothing below ``upper`` (the bound proven, else
    ``-inf``)."""
    if byte_grid < 0 or (byte_grid > 0 and minimize != "time"):
        raise ValueError(f"byte_grid must be >= 0, and 0 by memory; got {byte_grid!r} by {minimize}")
    pr = pruning if pruning is not None else run_pruning(rc, cap, limit, minimize=minimize, lam=lam, mu=mu,
                                                         buckets=buckets)
    if (pr.cap, pr.limit, pr.minimize, pr.lam, pr.mu, pr.buckets) != (float(cap), float(limit), minimize, float(lam),
                                                                      float(mu), buckets):
        raise ValueError("pruning was built for another interval or other multipliers (run_pruning's arguments "
                         "must be search_runs')")
    by_time, fl = minimize == "time", float(floor)
    width, inside, T, A, Q, W, R = pr.width, pr.inside, pr.T, pr.A, pr.Q, pr.W, pr.R
    a_go, a_go_skip, opened, use_mult, mult_states = pr.a_go, pr.a_go_skip, pr.opened, pr.use_mult, pr.mult_states
    q_go, G, h_time, h_mult, q_floor, d_go = pr.q_go, pr.G, pr.h_time, pr.h_mult, pr.q_floor, pr.d_go
    bar = upper * (1.0 - _TOL)  # what a path must beat: the upper bound less the tolerance

    def coords(i, t, tau, a, q, r, pk):
        """The coordinates labels compare in, so that a label no larger
        than another in all five ends no worse after every completion. A
        run's sum ``r`` counts only above ``pk - G[i]``: below, it lifts no
        later transient above ``pk``. The optimizer phase ``q``: by time, it
        only has to fit, which it does below ``q_floor[i]`` whatever follows;
        by memory, it counts only where it ends above the backward phase,
        which a completion ends at least ``d_go[i, t]`` above where ``q``
        ends, so ``q`` counts only above ``a + pk + d_go``. By memory, the
        peak compares as ``a + pk`` beside ``a``: with both no larger (and
        ``r`` as above), ``a + max(pk, later transients)`` is no larger
        either, which labels with a lower peak but more kept bytes no longer
        break."""
        cmp_r = np.maximum(r, pk - G[i])
        if by_time:
            return tau, a, np.maximum(q, q_floor[i]), cmp_r, pk
        return a + pk, a, np.maximum(q, a + pk + d_go[i, t]), cmp_r, np.zeros(tau.size)

    def keep(i, t, tau, a, q, r, pk, mask):
        limit_t = limit_m = bar
        state = skip_state(rc, opened[i], mask) if a_go is None or mult_states else None
        a_rest = a_go[i, t] if a_go is not None else a_go_skip[i][t, state]
        if not by_time:
            return (np.maximum(a + a_rest + pk, q + q_go[i]) < limit_m) & (pk <= cap)
        b = np.minimum(np.floor(r / width), buckets - 1).astype(np.int64)
        ok = (a + a_rest + pk <= limit) & (q + q_go[i] <= limit) & (tau + h_time[i, t, b] < limit_t) & (pk <= cap)
        if use_mult:  # weak duality: every completion keeps a <= limit - peak, peak >= pk
            h = h_mult[i, t, b, state] if mult_states else h_mult[i, t, b]
            ok &= tau + lam * a + mu * q + h - lam * (limit - pk) - mu * limit < limit_t
        return ok

    path, used, done = search_labels(rc, inside, T, A, Q, W, R, keep, coords, by_time, fl, max_labels, deadline,
                                     byte_grid)
    return path, used, done, upper * (1 - _TOL) if done and path is None else -np.inf


def minimum_memory_runs(p: DiscreteProblem, rc: RunChain | None = None, *,
                        max_labels: int = 2_000_000, deadline: float = np.inf) -> MinimumMemory:
    """The exact smallest memory of a problem in layer order whose
    plans may hold runs (:func:`search.exact.memory.minimum_memory`'s answer where
    runs break its layer-by-layer sums): :func:`search_runs` by memory in
    each interval of the peak (:func:`run_intervals` under the memory of the
    smallest plan without runs, the first upper bound), in the order of
    their lower bounds until the next is no better than the best plan
    found. Raises ``ValueError`` where :func:`search.exact.runs.run_chain` declines ``p``,
    ``RuntimeError`` where an interval needs more than ``max_labels``
    labels or the search runs past the ``time.perf_counter()`` value
    ``deadline``."""
    n = p.num_layers
    if n == 0:
        return MinimumMemory(0.0, np.zeros(0, dtype=np.int64), 0.0)
    rc = run_chain(p) if rc is None else rc
    if rc is None:
        raise ValueError("minimum_memory_runs needs a graph in layer order whose edges join consecutive layers "
                         "or skip ahead, with few skip edges over any layer (search.exact.runs.run_chain)")
    free = without_joins(p)  # its smallest plan (else each layer's least kept bytes): the first upper bound
    if free.feasible.any(axis=1).all():
        choice = minimum_memory(free).choice
    else:
        choice = np.argmin(np.where(p.feasible, p.persistent_bytes, np.inf), axis=1)
    best = plan_memory(p, choice)
    caps, floors, bound = run_intervals(p, rc, best)
    for k in np.argsort(bound, kind="stable"):
        if bound[k] >= best * (1 - _TOL):
            break
        path, used, done, _ = search_runs(rc, float(caps[k]), float(floors[k]), np.inf, best, minimize="memory",
                                          max_labels=max_labels, deadline=deadline)
        if not done:
            raise RuntimeError(f"the smallest memory with runs needs over {max_labels} labels in one interval"
                               if used > max_labels else "the smallest memory with runs ran past its deadline")
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
    allowed = with_strategies_of(p, c).feasible & (p.layer_time_s <= p.layer_time_s[rows, c][:, None])
    allowed[rows, c] = True
    return minimum_memory_runs(restricted(p, allowed)).choice
