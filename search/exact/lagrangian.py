"""Candidate plans from the Lagrangian relaxation of the memory limit, where
plans may hold runs of recomputing layers: starts for the refinement that
the gradient search's relaxation does not reach.

Under a limit that only recomputation meets, the fastest plans hold long
runs in some repeated blocks and short ones in others
(``benchmarks/search_quality.py``, ResNet-152 on 8 V100s at its
levers-only limit). The relaxation's rounded plans sit well inside the
limit with one pattern in every block, and the local moves change one or
two layers at a time, so they stop short of the runs' boundaries the
fastest plans move together.

The Lagrangian dual of the limit prices each kept byte at ``lam`` seconds:
for a peak ``cap`` (every layer's transient within it), the plan with the
least ``time + lam * kept bytes`` is a min-sum path over (option, run sum)
states (:func:`search.exact.runs.bucket_viterbi`, the run sums rounded down
into buckets, the checkpoint credits as pair terms, and which open skip
edges still earn theirs, :func:`search.exact.runs.skip_moves`). Its kept bytes fall as
``lam`` grows, so a bisection on ``lam`` brackets the limit: the plan at the
upper end of the bracket fits (its memory checked exactly, with the true run
sums), the one at the lower end is just over. Both are candidates: the
refinement's repair and local search then spend or find the bytes between
them (Fisher, "The Lagrangian relaxation method for solving integer
programming problems", Management Science 27(1), 1981: the dual's
solutions as starts for a primal heuristic).
"""

from __future__ import annotations

import time as _time

import numpy as np

from search.exact.dp_runs import run_intervals
from search.exact.layer_chain import layer_order_chain
from search.exact.runs import (
    BUCKETS,
    MOST_BUCKET_OPEN_STATES,
    all_bucket_moves,
    bucket_viterbi,
    pair_groups,
    run_chain,
    skip_moves,
)
from search.problem import DiscreteProblem, has_runs, plan_memories

__all__ = ["lagrangian_plans"]

_GROWTH = 4.0  # the multiplier's steps up until its plan fits
_GROWTH_STEPS = 12  # (4 ** 12 times the time per byte of the limit: time barely counts)
_RESOLUTION = 1e-4  # the bisection stops where its bracket is this narrow, relative


def lagrangian_plans(p: DiscreteProblem, memory_limit: float, caps: int = 4, steps: int = 32,
                     deadline_s: float | None = None) -> np.ndarray:
    """Plans ``[k, n]`` near the fastest within ``memory_limit`` (module
    docstring): for ``caps`` peaks spread over the intervals
    :func:`search.solve_dp` searches (:func:`search.exact.dp_runs.run_intervals`),
    the Lagrangian plans at both ends of the multiplier's bracket after
    ``steps`` bisection steps, the one that fits and the one just over (for
    repair); none of a peak where no multiplier's plan fits. Only where plans
    may hold runs (:func:`search.problem.has_runs`) on a graph in layer order
    under a finite limit; elsewhere none (``[0, n]``). Past ``deadline_s`` (a
    ``time.perf_counter()`` reading) the multiplier's search stops with the
    brackets it has."""
    late = lambda: deadline_s is not None and _time.perf_counter() > deadline_s  # noqa: E731
    n = p.num_layers
    none = np.zeros((0, n), dtype=np.int64)
    limit = float(memory_limit)
    if n == 0 or not np.isfinite(limit) or not has_runs(p) or np.any(p.edge_src >= p.edge_dst):
        return none
    q = layer_order_chain(p, "upper")  # (no faster than on the graph, exactly as large)
    rc = run_chain(q)
    if rc is None:
        return none
    all_caps, _, _ = run_intervals(q, rc, limit)
    if all_caps.size == 0:
        return none
    cap = all_caps[np.unique(np.linspace(0, all_caps.size - 1, min(caps, all_caps.size)).round().astype(int))]
    K = cap.size
    moves = all_bucket_moves(rc, cap, BUCKETS, up=True)  # (the plans' transients no more than the cap)
    F = q.feasible
    time = np.where(F[None] & (q.workspace_bytes[None] <= cap[:, None, None]), q.layer_time_s[None], np.inf)  # [K, n, O]
    kept = np.where(F, rc.persistent, 0.0)  # [n, O] bytes (the skip edges' credits taken off: run_chain)
    neg_credit = -rc.credit  # [n, O, O] the kept bytes a run's edge frees
    skips = skip_moves(rc, MOST_BUCKET_OPEN_STATES)  # which skip credits a plan earns (else every one)
    groups = pair_groups(rc.pair, neg_credit)  # (once for every multiplier)

    def plans_at(lam: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # lam [K] s/byte -> paths [K, n], fit [K]
        _, path = bucket_viterbi(time + lam[:, None, None] * kept[None], rc.pair, moves, (neg_credit, lam), skips,
                                 groups)
        return path, plan_memories(p, path) <= limit

    path, fits = plans_at(np.zeros(K))
    if fits.all():  # the fastest plans of every peak fit: nothing to bracket
        return np.unique(path, axis=0)
    scale = float(np.sum(np.min(np.where(F, q.layer_time_s, np.inf), axis=1))) / limit  # s/byte: O(1) of the dual's
    lo, hi = np.zeros(K), np.full(K, np.nan)  # lo's plan breaks the limit, hi's fits
    lo_path, hi_path = path.copy(), np.full_like(path, -1)
    hi[fits], hi_path[fits] = 0.0, path[fits]
    lam = np.where(fits, 0.0, scale)
    for _ in range(_GROWTH_STEPS):  # upwards until each peak's plan fits (else none at this peak: no candidates)
        up = np.isnan(hi)
        if not up.any() or late():
            break
        path, fits = plans_at(np.where(up, lam, 0.0))
        ok, bad = up & fits, up & ~fits
        hi[ok], hi_path[ok] = lam[ok], path[ok]
        lo[bad], lo_path[bad] = lam[bad], path[bad]
        lam = np.where(bad, lam * _GROWTH, lam)
    for _ in range(steps):  # bisection (geometric where the bracket is above zero)
        both = ~np.isnan(hi) & (hi > lo * (1.0 + _RESOLUTION))
        if not both.any() or late():
            break
        mid = np.where(lo > 0, np.sqrt(np.maximum(lo, 1e-300) * np.where(both, hi, 1.0)), np.where(both, hi, 0.0) / 2)
        path, fits = plans_at(np.where(both, mid, 0.0))
        ok, bad = both & fits, both & ~fits
        hi[ok], hi_path[ok] = mid[ok], path[ok]
        lo[bad], lo_path[bad] = mid[bad], path[bad]
    closed = ~np.isnan(hi)  # the peaks with a bracket: the plans at both ends
    return np.unique(np.concatenate([lo_path[closed], hi_path[closed]], axis=0), axis=0)
