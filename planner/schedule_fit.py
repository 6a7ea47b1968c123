"""Plans for the ``cpu`` platform must fit under XLA:CPU's schedule too.

The solvers keep each plan's memory (:func:`costmodels.memory_per_device`:
two phases, sums plus one largest transient) within the budget. On the
``cpu`` platform the plan's memory is what XLA:CPU's schedule holds
(:func:`costmodels.scheduled_memory_per_device`: kernel copies, max-pool
expansions and the gradient all-reduce along the layer order, which the
solvers cannot express), and it can exceed the solvers' figure. So each
plan the search returns on a ``cpu`` table is checked against it; one that
exceeds the budget is searched again on its mesh with the budget lowered by
the excess, up to :data:`SCHEDULE_RETRIES` times; where that finds nothing
that fits, the plan needing the least of the solvers' memory is taken if it
fits both (so the smallest limit an infeasible plan's error names always
fits), and otherwise the mesh counts as not fitting. Plans with memory
levers are checked too (:mod:`costmodels.xla_cpu_schedule`: ZeRO's
gradients, recomputed runs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from costmodels import CostTable, one_hot, scheduled_memory_per_device
from search import (
    AUTO_MILP_TIME_LIMIT_S,
    SearchEvent,
    Solution,
    discrete_problem,
    plan_time,
    retry_smallest,
    smallest_memory,
)

__all__ = ["SCHEDULE_RETRIES", "choice_peak", "fit_schedule"]

SCHEDULE_RETRIES = 4  # searches again per mesh; each lowers the budget by the last plan's excess


def choice_peak(table: CostTable, choice) -> float | None:
    """The peak of the plan ``choice`` (an option code per real layer) under
    XLA:CPU's schedule, or None where it does not apply (a table not built
    for ``cpu``)."""
    if table.xla_cpu is None:
        return None
    rows = table.feasible.shape[0]
    choice = np.concatenate([np.asarray(choice, dtype=np.int64), np.zeros(rows - len(choice), dtype=np.int64)])
    return float(scheduled_memory_per_device(table, one_hot(choice, table.feasible.shape[1])))


def fit_schedule(tables: Sequence[CostTable], solutions: Sequence[Solution], budget: float,
                 solve: Callable[[CostTable, float], Solution],
                 callback: Callable[[SearchEvent], None] | None = None) -> list[Solution]:
    """``solutions`` (one per table, searched within ``budget``) with every
    fitting plan's memory its schedule's peak where that applies, each plan
    whose peak exceeds ``budget`` replaced by ``solve(table, lower_budget)``'s
    (module docstring); a mesh where none fits is returned as not fitting.
    Each search again is reported to ``callback`` (stage ``schedule``, the
    table's index)."""
    out = []
    for i, (table, sol) in enumerate(zip(tables, solutions, strict=True)):
        first = sol
        peak = choice_peak(table, sol.choice) if sol.feasible else None
        for _ in range(SCHEDULE_RETRIES):
            if peak is None or peak <= budget:
                break
            # a plan whose solvers' memory is below this one's by its excess
            lower = min(sol.memory_limit_bytes, sol.memory_bytes) - (peak - budget)
            if callback is not None:
                callback(SearchEvent("schedule", f"XLA:CPU's schedule holds {peak:,.0f} B, {peak - budget:,.0f} B "
                                                 f"over the budget; searching again within {lower:,.0f} B", table=i))
            sol = solve(table, lower)
            peak = choice_peak(table, sol.choice) if sol.feasible else None
        if peak is not None and peak <= budget:
            sol = dataclasses.replace(sol, memory_bytes=peak, memory_limit_bytes=budget)
        elif peak is not None or (not sol.feasible and first.feasible):
            sol = _smallest(table, budget, first)
        out.append(sol)
    return out


def _smallest(table: CostTable, budget: float, like: Solution) -> Solution:
    """The plan needing the least of the solvers' memory (searched as
    :func:`search.solve` does: :func:`search.retry_smallest`), with ``like``'s
    method and history, marked as not fitting where it does not fit
    ``budget`` under both (so that, as any :class:`search.Solution` that
    does not fit, it is the smallest-memory plan found)."""
    p = discrete_problem(table)
    # runs: within auto's MILP time limit, and longer where that found no plan within the budget and proved none
    mm = smallest_memory(p, AUTO_MILP_TIME_LIMIT_S)
    mm = retry_smallest(p, mm, budget) or mm
    peak = choice_peak(table, mm.choice)
    need = max(mm.memory_bytes, peak if peak is not None else 0.0)
    return dataclasses.replace(like, choice=tuple(int(c) for c in mm.choice), time_s=plan_time(p, mm.choice),
                               memory_bytes=need, memory_limit_bytes=budget, feasible=bool(need <= budget),
                               min_memory_bytes=mm.memory_bytes if mm.exact else None, lower_bound_s=None,
                               optimality_gap=None)
