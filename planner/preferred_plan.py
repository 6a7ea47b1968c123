"""Which plan :func:`planner.plan` returns of those found: the fastest, or
the simplest whose predicted time is within the caller's tolerance of it
(fewest layers off data parallelism, then the smallest model axis), and that
plan's optimality gap."""

from __future__ import annotations

from costmodels import Strategy
from planner.ir.graph import LayerGraph
from search import Solution

__all__ = ["TIE_RTOL", "fastest_and_simplest", "preferred_gap"]

# Plans whose predicted times differ by less than this share are equally fast (the simpler is
# returned): the exact solvers certify to a relative gap of 1e-7 (search.exact.milp's mip_rel_gap).
TIE_RTOL = 1e-6


def fastest_and_simplest(graph: LayerGraph, solutions: list[Solution], meshes, fitting: list[int], menu_size: int,
                          data_parallel, simplicity_tolerance: float) -> tuple[tuple, tuple]:
    """The fastest candidate and the simplest within ``simplicity_tolerance``
    of it, each ``(time, (layers off data parallelism, model axis), mesh
    index or None for pure data parallelism)``: the best plan of each mesh
    that fits, and ``data_parallel`` (an Evaluation, where it fits)."""
    def off_data(sol: Solution) -> int:  # layers of the graph not on plain data parallelism (no lever)
        return sum(c != int(Strategy.DATA) * menu_size for c in list(sol.choice)[: graph.num_layers])

    candidates = [(solutions[i].time_s, (off_data(solutions[i]), meshes[i][1]), i) for i in fitting]
    if data_parallel is not None:
        candidates.append((data_parallel.iteration_s, (0, 1), None))
    top = min(candidates, key=lambda c: (c[0], c[1]))  # the fastest (the simpler of equals)
    # Times within TIE_RTOL are equal: the MILP certifies its plan to a relative gap of 1e-7.
    simple = min((c for c in candidates if c[0] <= top[0] * (1.0 + max(simplicity_tolerance, TIE_RTOL))),
                 key=lambda c: (c[1], c[0]))
    return top, simple


def preferred_gap(fastest_gap: float | None, time_s: float, fastest_s: float) -> float | None:
    """The optimality gap of a plan of ``time_s`` preferred (simpler) to the
    fastest plan of ``fastest_s``, against the optimum the fastest was
    certified near (its ``fastest_gap``)."""
    return None if fastest_gap is None else (1.0 + fastest_gap) * time_s / fastest_s - 1.0
