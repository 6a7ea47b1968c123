"""A graph with branches in its layers' order, with its skip edges' resharding
folded into their destinations: bounds on the fastest plan where plans
hold runs of recomputing layers (:func:`search.problem.run_terms`), which
follow the layers' order on any graph.

On a residual network in layer order most edges join consecutive layers;
the others (*skip edges*, ``src < dst - 1``) add two terms to a plan: their
resharding, ``reshard_s[e, c_src, c_dst]``, and their checkpoint credit,
``checkpoint_credit[e, c_dst]`` where ``c_src`` recomputes and every layer
after ``src`` up to ``dst`` joins the run. The exact label search over runs
(:mod:`search.exact.dp_runs`) carries both (its labels hold the class of each
open skip edge's source, :func:`search.exact.runs.run_chain`), at a cost
that grows with the classes; :func:`layer_order_chain` makes every skip
edge reshard nothing by folding its resharding into its destination's layer
time, for the Lagrangian's and relevel's chains:

* ``bound="lower"``: the least resharding over the source's options. Every
  plan is no slower than on the graph and exactly as large: the fastest
  plan within a limit is a lower bound on the graph's.
* ``bound="upper"``: the most. Every plan is no faster than on the graph
  and exactly as large.

Memory is the graph's own, so its smallest memory is the graph's; on a
graph where every skip edge's resharding is the same for all the source's
options (a chain: none) both bounds are the problem itself.
"""

from __future__ import annotations

import numpy as np

from search.problem import DiscreteProblem

__all__ = ["layer_order_chain", "skip_resharding"]


def skip_resharding(p: DiscreteProblem, e: int, bound: str) -> np.ndarray:
    """``[O]``: edge ``e``'s least (``bound="lower"``) or most (``"upper"``)
    resharding over its source's runnable options, by its destination's
    option (what :func:`layer_order_chain` folds into the destination; its
    source must have a runnable option)."""
    from_src = np.where(p.feasible[p.edge_src[e]][:, None], p.reshard_s[e], np.nan)  # [O(src), O(dst)]
    return np.nanmin(from_src, axis=0) if bound == "lower" else np.nanmax(from_src, axis=0)


def layer_order_chain(p: DiscreteProblem, bound: str) -> DiscreteProblem:
    """``p`` with its skip edges' resharding folded into their destinations'
    layer times, a relaxation (``bound="lower"``) or a restriction
    (``bound="upper"``) of its time, its memory unchanged (module
    docstring). Raises ``ValueError`` where an edge runs against the layers'
    order or ``bound`` is neither."""
    if bound not in ("lower", "upper"):
        raise ValueError(f"bound must be 'lower' or 'upper', got {bound!r}")
    if np.any(p.edge_src >= p.edge_dst):
        raise ValueError("every edge must run from an earlier layer to a later one (a topological layer order)")
    skip = np.flatnonzero(p.edge_dst != p.edge_src + 1)
    if skip.size == 0:
        return p
    time = p.layer_time_s.copy()
    for e in skip:
        time[p.edge_dst[e]] += skip_resharding(p, e, bound)
    reshard, strategy_reshard = p.reshard_s.copy(), p.strategy_reshard_s.copy()
    reshard[skip] = 0.0
    strategy_reshard[skip] = 0.0
    return p._replace(layer_time_s=np.where(p.feasible, time, np.inf), reshard_s=reshard,
                      strategy_reshard_s=strategy_reshard)
