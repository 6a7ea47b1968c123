"""Which plan :func:`planner.plan` returns of those found: the fastest, or
the simplest whose predicted time is within the caller's tolerance of it
(fewest layers off data parallelism, then the smallest model axis), and that
plan's optimality gap."""

from __future__ import annotations

from costmodels import CostSettings, Strategy, lever_menu, option_name
from planner.evaluation import evaluation_of
from planner.ir.graph import LayerGraph
from planner.plans.specs import layer_specs
from search import Solution

__all__ = ["TIE_RTOL", "fastest_and_simplest", "preferred_gap", "preferred_plan_fields"]

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


def preferred_plan_fields(graph: LayerGraph, hw, P: int, B: int, settings: CostSettings, meshes, tables,
                          solutions: list[Solution], fitting: list[int], base, budget: float,
                          simplicity_tolerance: float) -> dict:
    """The :class:`~planner.Plan` fields of the plan :func:`planner.plan` returns among the
    meshes' fitting ``solutions``: the fastest, or the simplest within
    ``simplicity_tolerance`` of it (:func:`fastest_and_simplest`; ``base``
    the data-parallel evaluation, a candidate where it fits ``budget``), its
    evaluation, the gap to the fastest and the speed-up over data parallelism."""
    menu = lever_menu(settings.levers)
    fastest = min(fitting, key=lambda i: (solutions[i].time_s, i))
    dp_time = dp_memory = speedup = None
    if base is not None:
        dp_time, dp_memory = base.iteration_s, base.memory_bytes_per_device
    top, simple = fastest_and_simplest(graph, solutions, meshes, fitting, len(menu), base if base is not None and
                                        dp_memory <= budget else None, simplicity_tolerance)
    fastest_s = top[0]
    if simple[2] is None:  # pure data parallelism, as evaluated above
        ev, sol, strategies, history = base, solutions[fastest], ("data",) * graph.num_layers, ()
    else:
        sol = solutions[simple[2]]
        strategies, history = sol.strategies, sol.history
        mapping = {n: option_name(c, menu) for n, c in zip(graph.names, sol.choice, strict=True)}
        ev = evaluation_of(graph, hw, P, meshes[simple[2]], B, settings, tables[simple[2]], plan=mapping)
    preferred = simple[0] > fastest_s
    fastest_mesh = ((P, 1) if top[2] is None else meshes[top[2]]) if preferred else None
    gap = preferred_gap(solutions[top[2] if top[2] is not None else fastest].optimality_gap, simple[0], fastest_s) \
        if preferred else sol.optimality_gap
    if dp_time is not None and ev.iteration_s > 0:
        speedup = dp_time / ev.iteration_s
    return dict(evaluation=ev, data_parallel_iteration_s=dp_time, data_parallel_memory_bytes=dp_memory,
                speedup_over_data_parallel=speedup, method=sol.method, optimality_gap=gap,
                layer_specs=layer_specs(graph, strategies, ev.zero_stages), history=history,
                fastest_iteration_s=fastest_s if preferred else None, fastest_mesh=fastest_mesh)
