"""Re-planning a plan's memory levers exactly with its strategies fixed: the
refinement's largest neighbourhood where plans may hold runs of recomputing
layers.

The local moves of :mod:`search.local.refinement` change one layer, an edge's two
layers or a chain segment priced layer by layer; none of them moves the
boundaries of several runs at once, which the fastest plan under a tight
limit often does (VGG16 on 256 V100s at its levers-only limit: the gradient
method's plan 3.4% slower than the DP's, with the same strategy on every
layer). :func:`relevel` keeps each layer to the strategies a few good plans
give it (the refinement's local optima: mostly one, two on the layers where
they differ) and lets the exact label search over runs
(:func:`search.exact.dp.solve_dp`, :mod:`search.exact.dp_runs`) choose everything else:
which of those strategies, ZeRO stages, keeping or recomputing, where runs
start and end. A layer then has few options (about 6 of 60 per strategy on
VGG16), so the search is small.

On a graph with skip edges (a residual network) the search runs over
:func:`search.exact.layer_chain.layer_order_chain`'s ``"upper"`` problem, whose
plans are no faster than on the graph and exactly as large: its plan's time
there bounds its time on the graph, which is the time compared.
"""

from __future__ import annotations

import numpy as np

from search.exact import layer_order_chain, run_chain, solve_dp
from search.options import with_strategies_of
from search.problem import DiscreteProblem, has_runs, plan_memory, plan_time

__all__ = ["relevel"]


def relevel(p: DiscreteProblem, choice, memory_limit: float, time_limit_s: float | None = None,
            others=None) -> np.ndarray:
    """The fastest plan within ``memory_limit`` that gives every layer the
    strategy ``choice`` [n] or one of ``others`` [k, n] (plans) gives it,
    or ``choice`` where it fits and is no slower (module docstring); the
    DP's Lagrangian ascent after its first turn and its completion over
    runs within ``time_limit_s`` (where it stops unproven, its best plan so
    far competes). Only where
    plans with these strategies may hold runs
    (:func:`search.problem.has_runs`) on a graph in layer order; elsewhere
    ``choice`` as given (the local moves price every other lever exactly)."""
    c = np.asarray(choice, dtype=np.int64)
    if not has_runs(p) or np.any(p.edge_src >= p.edge_dst):
        return c
    plans = c if others is None else np.vstack([c, np.asarray(others, dtype=np.int64).reshape(-1, c.size)])
    q = layer_order_chain(with_strategies_of(p, plans), "upper")
    if not has_runs(q) or run_chain(q) is None:  # no runs with these strategies (or more skip edges open
        return c  # over one layer than the labels' masks hold)
    try:
        r = solve_dp(q, memory_limit, time_limit_s=time_limit_s)
    except RuntimeError:  # its smallest memory past the label budget: no plan to offer
        return c
    if not r.feasible or plan_memory(p, r.choice) > memory_limit:
        return c
    if plan_memory(p, c) > memory_limit or plan_time(p, r.choice) < plan_time(p, c):
        return r.choice
    return c
