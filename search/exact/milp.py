"""Exact planning of any DAG as a mixed-integer linear program, solved by
HiGHS through :func:`scipy.optimize.milp`.

Variables: binary ``x[l, o]`` (layer ``l`` runs option ``o``, a strategy
under a lever setting, :mod:`costmodels.levers`; feasible pairs only);
continuous ``y[e, s, t] in [0, 1]`` for the product ``X[src, s] X[dst, t]``
on every edge, where ``X[l, s] = sum_{o of s} x[l, o]`` says that layer
``l`` runs strategy ``s`` (levers leave the resharding alone, so the edge
variables stay per strategy pair however many levers the menu has),
linearised by the marginal constraints ``sum_t y[e, s, t] = X[src, s]`` and
``sum_s y[e, s, t] = X[dst, t]`` (exact for binary ``x``, whatever the sign
of the costs, and the local-polytope LP relaxation); ``z``, the largest workspace, with ``z >=
sum_s W[l, s] x[l, s]`` for every layer; and, when the hardware overlaps
gradient sync with the backward pass, ``h <= sum grad x`` and ``h <= sum
backward x`` so that maximising ``overlap * h`` gives ``overlap * min(...)``.

Minimise ``sum lt x + sum reshard y - overlap h`` subject to ``sum_s x[l, s]
= 1``, ``sum A x + z <= M`` (the backward phase of memory) and ``sum Q x <=
M`` (the optimizer phase, :mod:`search.problem`). Times are scaled by the sum of each layer's
fastest strategy time and bytes by the limit, so HiGHS sees O(1) numbers.
The result is exact up to HiGHS's tolerances: a relative MIP gap of
``mip_rel_gap`` (default 1e-7; the dual bound is reported) and a primal
feasibility tolerance of about 1e-7 of the limit, which is why the plan is
re-checked with the exact memory and the limit tightened slightly if it
does not fit.

The same model minimising memory is the smallest memory of any plan where
runs of recomputing layers make memory no sum over layers
(:func:`minimum_memory_milp`); :func:`smallest_memory` answers the smallest
memory of any problem by whichever exact search suits it, this one last.
"""

from __future__ import annotations

import time as _time
from typing import NamedTuple

import numpy as np
import scipy.sparse
from scipy.optimize import Bounds, LinearConstraint, milp

from search.exact.dp_runs import minimum_memory_runs
from search.exact.layer_chain import layer_order_chain
from search.exact.memory import MinimumMemory, minimum_memory
from search.exact.milp_memory import memory_rows
from search.exact.runs import run_chain
from search.options import with_strategies_of, without_joins
from search.problem import DiscreteProblem, has_runs, plan_memory, plan_time

__all__ = ["MILPResult", "minimum_memory_milp", "smallest_memory", "solve_milp"]


class MILPResult(NamedTuple):
    choice: np.ndarray  # [n]
    time_s: float
    memory_bytes: float
    feasible: bool
    lower_bound_s: float  # HiGHS's dual bound, in seconds
    exact: bool  # solved to optimality (within mip_rel_gap)
    status: str
    seconds: float


def _model(p: DiscreteProblem, limit: float, tighten: float, minimize_memory: bool = False):
    """The MILP's arrays. With ``minimize_memory``, the objective is the
    plan's memory instead (a variable ``P`` above both phases; ``limit`` then
    only scales the bytes)."""
    n, O = p.layer_time_s.shape
    F = p.feasible
    t0 = max(float(np.sum(np.min(p.layer_time_s, axis=1))), 1e-30)
    m0 = limit if np.isfinite(limit) else 1.0
    xi = np.full((n, O), -1, dtype=np.int64)
    nx = int(F.sum())
    xi[F] = np.arange(nx)
    src, dst = p.edge_src, p.edge_dst
    strat = p.option_strategy  # [O] each option's strategy
    S = p.strategy_reshard_s.shape[-1]
    Fs = np.stack([F[:, strat == t].any(axis=1) for t in range(S)], axis=1)  # [n, S] some option of it can run
    Fy = Fs[src][:, :, None] & Fs[dst][:, None, :]
    yi = np.full(Fy.shape, -1, dtype=np.int64)
    ny = int(Fy.sum())
    yi[Fy] = nx + np.arange(ny)
    nvar = nx + ny
    # with levers, an explicit binary X[l, s] = sum of strategy s's options: the edges read
    # it, and the branching can fix a layer's strategy before its lever
    levered = bool((p.option_lever > 0).any())
    Xi = np.full((n, S), -1, dtype=np.int64)
    if levered:
        Xi[Fs] = nvar + np.arange(int(Fs.sum()))
        nvar += int(Fs.sum())
    has_limit = np.isfinite(limit) or minimize_memory
    zi = nvar if has_limit else -1
    nvar += int(has_limit)
    hi = nvar if p.gradient_overlap and not minimize_memory else -1
    nvar += int(hi >= 0)
    pi = nvar if minimize_memory else -1
    nvar += int(minimize_memory)
    # runs of recomputing layers (search.problem.run_terms): v[e, o] <= "edge e is inside a run and its
    # destination runs joining option o" (its checkpoint credit), a[l] >= the run's recomputed bytes up to l
    runs = has_limit and has_runs(p)
    if runs:
        ve, vo = np.nonzero((p.checkpoint_credit > 0) & F[p.edge_dst] & (p.edge_src < p.edge_dst)[:, None])
        vi = nvar + np.arange(ve.size)
        nvar += ve.size
        ai = nvar + np.arange(n)
        nvar += n

    c = _objective(p, nvar, xi, yi, Fy, hi, pi, t0, minimize_memory)

    rows, cols, vals, lo, up = [], [], [], [], []
    r = 0

    def add(row_ids, col_ids, coef):
        rows.append(np.asarray(row_ids, dtype=np.int64))
        cols.append(np.asarray(col_ids, dtype=np.int64))
        vals.append(np.asarray(coef, dtype=np.float64))

    # one strategy per layer
    ll, ss = np.nonzero(F)
    add(r + ll, xi[ll, ss], np.ones(ll.size))
    lo.append(np.ones(n))
    up.append(np.ones(n))
    r += n
    # edge marginals: source side, then destination side
    for side, layer_of in ((1, src), (2, dst)):
        ee, s_ = np.nonzero(Fs[layer_of])  # one row per (edge, strategy of that end)
        row_of = np.full((len(src), S), -1, dtype=np.int64)
        row_of[ee, s_] = r + np.arange(ee.size)
        e3, a3, b3 = np.nonzero(Fy)
        k = a3 if side == 1 else b3
        add(row_of[e3, k], yi[e3, a3, b3], np.ones(e3.size))
        if levered:
            add(row_of[ee, s_], Xi[layer_of[ee], s_], -np.ones(ee.size))
        else:
            eo, o_ = np.nonzero(F[layer_of])  # every option of that end's strategy
            add(row_of[eo, strat[o_]], xi[layer_of[eo], o_], -np.ones(eo.size))
        lo.append(np.zeros(ee.size))
        up.append(np.zeros(ee.size))
        r += ee.size
    if levered:  # X[l, s] = sum of s's options at l
        lx, sx = np.nonzero(Fs)
        row_x = np.full((n, S), -1, dtype=np.int64)
        row_x[lx, sx] = r + np.arange(lx.size)
        add(row_x[lx, sx], Xi[lx, sx], np.ones(lx.size))
        add(row_x[ll, strat[ss]], xi[ll, ss], -np.ones(ll.size))
        lo.append(np.zeros(lx.size))
        up.append(np.zeros(lx.size))
        r += lx.size
    if has_limit:
        r = memory_rows(p, add, lo, up, r, xi, zi, pi, (vi, ve, vo, ai) if runs else None, minimize_memory,
                         tighten, m0)
    if hi >= 0:
        for per_layer in (p.grad_sync_s, p.backward_s):
            add(np.full(nx, r), xi[F], -per_layer[F] / t0)
            add([r], [hi], [1.0])
            lo.append([-np.inf])
            up.append([0.0])
            r += 1
    A = scipy.sparse.csr_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(r, nvar)
    )
    integrality = np.zeros(nvar)
    integrality[:nx] = 1
    if levered:
        integrality[Xi[Fs]] = 1
    lb = np.zeros(nvar)
    ub = np.ones(nvar)
    if has_limit:
        ub[zi] = np.inf
    if hi >= 0:
        ub[hi] = np.inf
    if pi >= 0:
        ub[pi] = np.inf
    if runs:
        ub[ai] = np.inf
    cons = LinearConstraint(A, np.concatenate([np.ravel(x) for x in lo]), np.concatenate([np.ravel(x) for x in up]))
    return c, cons, integrality, Bounds(lb, ub), xi, t0


def _objective(p: DiscreteProblem, nvar: int, xi, yi, Fy, hi: int, pi: int, t0: float,
               minimize_memory: bool) -> np.ndarray:
    """The MILP's cost vector ``[nvar]``: the plan's time in units of ``t0``
    (the layers' options ``xi``, the edges' strategy pairs ``yi``, less the
    hidden gradient sync ``hi``), or its memory (the variable ``pi``)."""
    c = np.zeros(nvar)
    if minimize_memory:
        c[pi] = 1.0
    else:
        F = p.feasible
        c[xi[F]] = p.layer_time_s[F] / t0
        c[yi[Fy]] = p.strategy_reshard_s[Fy] / t0
    if hi >= 0:
        c[hi] = -p.gradient_overlap
    return c


def smallest_memory(p: DiscreteProblem, time_limit_s: float | None = None) -> MinimumMemory:
    """The exact smallest memory of any plan of any problem: the layer-by-layer
    search (:func:`search.exact.memory.minimum_memory`); where plans may hold runs
    of recomputing layers (:func:`search.problem.has_runs`) on a graph in
    layer order, the label search over runs
    (:func:`search.exact.dp_runs.minimum_memory_runs`): on a chain, in full; on a
    graph with skip edges (a residual network), over
    :func:`search.exact.layer_chain.layer_order_chain`'s problem, whose plans and
    memory are the graph's, within ``time_limit_s`` (its labels may take
    minutes there); else, or where the label search runs out of labels or
    time, the MILP (:func:`minimum_memory_milp`, within ``time_limit_s`` of
    its own, as its incumbent is the gradient search's repair target: then
    perhaps not proven, ``exact=False``); where the labels stopped, beside
    the MILP's plan the smallest plan with the strategies of the smallest
    plan without runs (a label search over a few options per layer, seconds
    on ResNet-152, often within 2% of the smallest memory). So on a
    residual network with runs it may take twice ``time_limit_s`` and
    more."""
    if not has_runs(p):
        return minimum_memory(p)
    if np.all(p.edge_src < p.edge_dst):
        ordered = layer_order_chain(p, "lower")  # (a chain in layer order: p itself)
        rc = run_chain(ordered)
        if rc is not None:
            skips = np.any(p.edge_dst != p.edge_src + 1)  # (rc keeps only the skip edges that can free bytes)
            deadline = _time.perf_counter() + time_limit_s if skips and time_limit_s is not None else np.inf
            try:
                return minimum_memory_runs(ordered, rc, deadline=deadline)
            except RuntimeError:  # past its label budget or its time: the MILP instead, beside the smallest
                pass  # plan with the strategies of the smallest plan without runs (few options: fast)
            sub = with_strategies_of(ordered, minimum_memory(without_joins(ordered)).choice)
            sub_rc, hint = run_chain(sub), None
            if sub_rc is not None:
                try:
                    hint = minimum_memory_runs(sub, sub_rc).choice
                except RuntimeError:  # (past its label budget: the MILP alone)
                    pass
            return minimum_memory_milp(p, time_limit_s, hint)
    return minimum_memory_milp(p, time_limit_s)


def minimum_memory_milp(p: DiscreteProblem, time_limit_s: float | None = None,
                        hint: np.ndarray | None = None) -> MinimumMemory:
    """The exact smallest memory of any plan, as a MILP: what
    :func:`search.exact.memory.minimum_memory` answers for problems with runs of
    recomputing layers (:func:`search.problem.has_runs`), whose memory its
    layer-by-layer search cannot add up; the same value elsewhere. Stopped
    at ``time_limit_s``, it returns the smaller of its best plan and
    ``hint`` (a plan [n], where the caller has one), else the smallest plan
    without runs (:func:`search.options.without_joins`), with
    ``exact=False``."""
    n = p.num_layers
    if n == 0:
        return MinimumMemory(0.0, np.zeros(0, dtype=np.int64), 0.0)
    rows = np.arange(n)
    scale = float(np.sum(np.min(np.where(p.feasible, p.optimizer_bytes, np.inf), axis=1))) or 1.0
    options = {"disp": False, "mip_rel_gap": 1e-9, "presolve": True}
    if time_limit_s is not None:
        options["time_limit"] = float(time_limit_s)
    c, cons, integrality, bounds, xi, _ = _model(p, scale, 0.0, minimize_memory=True)
    res = milp(c, constraints=cons, integrality=integrality, bounds=bounds, options=options)
    if res.status == 0:
        choice = np.argmax(np.where(xi >= 0, res.x[np.maximum(xi, 0)], -1.0), axis=1)
        return MinimumMemory(plan_memory(p, choice), choice, float(np.max(p.workspace_bytes[rows, choice])))
    if time_limit_s is None or res.status != 1:  # (1: the time limit)
        raise RuntimeError(f"the smallest-memory MILP found no plan: {res.message}")
    # a plan without runs (the sums of minimum_memory), or the hint (smallest_memory's is no larger: its
    # options hold that plan's)
    found = [minimum_memory(without_joins(p)).choice if hint is None else np.asarray(hint, dtype=np.int64)]
    if res.x is not None:
        found.append(np.argmax(np.where(xi >= 0, res.x[np.maximum(xi, 0)], -1.0), axis=1))
    choice = min(found, key=lambda ch: plan_memory(p, ch))
    return MinimumMemory(plan_memory(p, choice), choice, float(np.max(p.workspace_bytes[rows, choice])), False)


def solve_milp(p: DiscreteProblem, memory_limit: float = np.inf, *, time_limit_s: float | None = None,
               mip_rel_gap: float = 1e-7, smallest: MinimumMemory | None = None) -> MILPResult:
    """The fastest plan within ``memory_limit`` bytes per device, for any DAG.
    ``smallest``: :func:`smallest_memory`'s answer, where the caller has it."""
    start = _time.perf_counter()
    limit = float(memory_limit)
    n = p.num_layers
    mm = smallest_memory(p, time_limit_s) if smallest is None else smallest
    if mm.memory_bytes > limit and mm.exact:
        return MILPResult(mm.choice, plan_time(p, mm.choice), mm.memory_bytes, False, np.inf, False,
                          "infeasible: no plan fits the memory limit", _time.perf_counter() - start)
    if n == 0:
        return MILPResult(np.zeros(0, np.int64), 0.0, 0.0, True, 0.0, True, "optimal", 0.0)
    options = {"disp": False, "mip_rel_gap": mip_rel_gap, "presolve": True}
    if time_limit_s is not None:
        options["time_limit"] = float(time_limit_s)
    for tighten in (0.0, 1e-7, 1e-6, 1e-5):
        c, cons, integrality, bounds, xi, t0 = _model(p, limit, tighten)
        res = milp(c, constraints=cons, integrality=integrality, bounds=bounds, options=options)
        if res.x is None:
            break
        xv = np.where(xi >= 0, res.x[np.maximum(xi, 0)], -1.0)
        choice = np.argmax(xv, axis=1)
        mem = plan_memory(p, choice)
        if mem <= limit:
            t = plan_time(p, choice)
            bound = getattr(res, "mip_dual_bound", None)
            lb = t if bound is None or not np.isfinite(bound) else min(t, float(bound) * t0)
            exact = res.status == 0
            return MILPResult(choice, t, mem, True, lb, bool(exact), str(res.message), _time.perf_counter() - start)
    # no solution within the time limit (or tolerance trouble): the smallest-memory plan, which
    # fits unless the smallest memory was not proven in time either
    bound = getattr(res, "mip_dual_bound", None)
    lb = float(bound) * t0 if bound is not None and np.isfinite(bound) else 0.0
    fits = mm.memory_bytes <= limit
    return MILPResult(mm.choice, plan_time(p, mm.choice), mm.memory_bytes, fits, lb if fits else np.inf, False,
                      str(res.message), _time.perf_counter() - start)
