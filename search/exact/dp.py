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

Steps 1 and 2 are :mod:`search.exact._dp_bounds`, step 3
:mod:`search.exact._dp_labels`, on a chain's arrays by position
(:mod:`search.exact._dp_chain`, with the Viterbi).
"""

from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np

from search.exact._dp_bounds import DualSearch, coordinate_ascent, dual_plans, relaxation, start_duals
from search.exact._dp_chain import chain_arrays, to_layers, viterbi
from search.exact._dp_labels import BYTE_GRIDS, complete_caps, complete_runs
from search.exact.dp_runs import minimum_memory_runs
from search.exact.memory import MinimumMemory, minimum_memory
from search.exact.runs import HOP_BITS, MAX_OPEN_SKIPS, RunChain, run_chain
from search.problem import DiscreteProblem, chain_order, has_runs, plan_memory, plan_time

__all__ = ["BYTE_GRIDS", "DPResult", "dp_solves", "solve_dp", "viterbi"]

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


def dp_solves(p: DiscreteProblem) -> bool:
    """Whether the solvers' DP (:func:`search.solve`'s ``"dp"`` and ``"auto"``)
    takes ``p``: a chain graph, and, where plans may hold runs of
    recomputing layers, one in layer order. :func:`solve_dp` itself also
    takes plans with runs on graphs with branches in layer order
    (:func:`search.exact.runs.run_chain`), exactly but at a cost that grows
    with the skip edges' resharding classes."""
    return chain_order(p) is not None and (not has_runs(p) or run_chain(p) is not None)


def _layer_order(p: DiscreteProblem) -> tuple[RunChain | None, np.ndarray]:
    """The run chain of ``p`` where plans may hold runs (else None) and the
    layers by chain position; raises :func:`solve_dp`'s errors where the DP
    does not take ``p``."""
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
    return rc, order


def _take_incumbent(p: DiscreteProblem, incumbent, limit: float, order: np.ndarray, best: dict) -> None:
    """``incumbent`` (an option per layer) as ``best`` where it fits and is
    faster; raises ``ValueError`` where it is no plan of ``p``."""
    n = p.num_layers
    incumbent = np.asarray(incumbent, dtype=np.int64)
    if incumbent.shape != (n,) or not (np.all((incumbent >= 0) & (incumbent < p.num_options))
                                        and np.all(p.feasible[np.arange(n), incumbent])):
        raise ValueError(f"incumbent must be a feasible option per layer, shape ({n},); got {incumbent!r}")
    if plan_memory(p, incumbent) <= limit and plan_time(p, incumbent) < best["t"]:
        best["t"], best["path"] = plan_time(p, incumbent), incumbent[order]


def _take_smallest(p: DiscreteProblem, mm: MinimumMemory, limit: float, order: np.ndarray, best: dict) -> None:
    """The smallest-memory plan as ``best`` (an upper bound to prune with)
    where it fits and is faster."""
    if mm.memory_bytes <= limit and plan_time(p, mm.choice) < best["t"]:
        best["t"], best["path"] = plan_time(p, mm.choice), mm.choice[order]


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
    rc, order = _layer_order(p)
    n = p.num_layers
    limit = float(memory_limit)
    if n == 0:
        z = np.zeros(0, dtype=np.int64)
        return DPResult(z, 0.0, 0.0, True, 0.0, True, 0, 0)
    ch = chain_arrays(p, order)
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

    rx = relaxation(p, ch, rc, limit)  # step 1: the workspace caps (over runs, intervals of the peak)
    if rx is None:
        return infeasible(least(), 0, 0)
    if not upper_s > 0:
        raise ValueError(f"upper_s must be positive; got {upper_s!r}")
    best = {"t": float(upper_s), "path": None}
    if incumbent is not None:
        _take_incumbent(p, incumbent, limit, order, best)
    K, C = rx.unary_t.shape[0], int(rx.caps.size)
    s = DualSearch(p, ch, rc, order, limit, rx, start_duals(K), best, set())
    d = s.duals
    d.fit[:], d.dual[:], d.slope[:] = dual_plans(s, np.zeros((2, K)), np.arange(K))  # step 2
    if rx.bucketed and best["path"] is None:  # runs, the fastest plans do not fit: the smallest settles feasibility
        mm = least()  # and seeds the upper bound (the ascent over intervals costs more than it)
        if mm.exact and mm.memory_bytes > limit:
            return infeasible(mm, C, 0)
        _take_smallest(p, mm, limit, order, best)
    coordinate_ascent(s, deadline, bisection_steps)
    if best["path"] is None:  # no multiplier's plan kept both phases: does any plan?
        mm = least()
        if mm.memory_bytes > limit and mm.exact:
            return infeasible(mm, C, 0)
        _take_smallest(p, mm, limit, order, best)  # an upper bound to prune with
    cap_lower = d.lower.reshape(C, rx.variants).max(axis=1)
    labels = 0
    if rx.variants == 1 and rc is not None:  # step 3: exact completion over runs where the Lagrangian left a gap
        labels, _ = complete_runs(p, ch, rc, order, rx.caps, rx.floors, cap_lower, d.mult_best.T * rx.t0 / rx.m0,
                                  limit, best, s.repaired, max_labels, deadline)
    elif rx.variants == 1:  # step 3: exact completion where the Lagrangian left a gap
        labels = complete_caps(p, ch, rx.unary_t, rx.t0, rx.budgets, cap_lower, d.mult_best.T * rx.t0 / rx.m0,
                               limit, best, max_labels)
    if best["path"] is None:  # no plan found: none fits where every interval's labels finished (bound inf)
        return infeasible(least(), C, labels, float(cap_lower.min()))
    choice = to_layers(ch, best["path"])
    lb = float(min(cap_lower.min(), best["t"]))
    exact = lb >= best["t"] * (1 - _TOL)
    return DPResult(choice, best["t"], plan_memory(p, choice), True, lb, bool(exact), C, labels)
