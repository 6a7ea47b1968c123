"""What a search returns (:class:`Solution`) and what it reports on the way
(:class:`SearchEvent`, passed to the optional callback)."""

from __future__ import annotations

import dataclasses

from costmodels import NUM_STRATEGIES, STRATEGY_NAMES, Lever, menu_of

__all__ = ["HistoryEntry", "SearchEvent", "Solution"]


@dataclasses.dataclass(frozen=True)
class HistoryEntry:
    """One step of a search: a relaxed iterate or a discrete plan."""

    stage: str  # relaxed | rounded | repaired | local_search | dp | milp | minimum_memory
    time_s: float | None  # iteration time (relaxed or exact, as the stage says); None: no candidate fitted
    memory_bytes: float | None  # peak memory per device; None where the stage does not compute it
    fits: bool  # the stage's plan fits the memory limit


@dataclasses.dataclass(frozen=True)
class SearchEvent:
    """Progress, for a callback to render (library code never prints)."""

    stage: str  # start | minimum_memory | gradient | refine | dp | milp | done, or the planner's own stages
    message: str
    table: int | None = None  # which table of a batch (e.g. which mesh shape)
    time_s: float | None = None  # best iteration time so far, if any


@dataclasses.dataclass(frozen=True)
class Solution:
    """One option (a strategy, under a lever where the table has a lever
    menu: :mod:`costmodels.levers`) per real layer of a cost table, with its
    exact cost."""

    choice: tuple[int, ...]  # option code per real layer (the Strategy code on a lever-free table)
    time_s: float  # exact iteration time of the plan
    memory_bytes: float  # exact peak memory per device of the plan
    memory_limit_bytes: float
    feasible: bool  # memory_bytes <= memory_limit_bytes (else: the smallest-memory plan)
    min_memory_bytes: float | None  # the smallest memory any plan needs (exact); None where not known: a table
    #   with runs whose fastest plan without runs fits (auto, dp), or whose MILP did not prove it in its time limit
    method: str  # the method that produced the plan (gradient, dp, milp)
    seed: int
    lower_bound_s: float | None  # no plan within the limit is faster (exact methods)
    optimality_gap: float | None  # (time - bound) / bound when a bound is known; 0 = optimal
    seconds: float  # wall time of the search
    history: tuple[HistoryEntry, ...] = ()
    num_options: int = NUM_STRATEGIES  # options per layer of the table searched (strategies x levers)

    @property
    def strategies(self) -> tuple[str, ...]:
        """The strategy name of each layer's option."""
        K = len(menu_of(self.num_options))
        return tuple(STRATEGY_NAMES[s // K] for s in self.choice)

    @property
    def levers(self) -> tuple[Lever, ...]:
        """The lever of each layer's option (``Lever(0, False)``: none)."""
        menu = menu_of(self.num_options)
        return tuple(menu[s % len(menu)] for s in self.choice)
