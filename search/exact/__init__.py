"""The exact solvers: plans proven fastest within a memory limit, bounds
where the proof stops short, and the smallest memory any plan needs.

* :mod:`search.exact.dp`: dynamic programming over chains, and over graphs in
  layer order whose plans hold runs of recomputing layers
  (:mod:`search.exact.dp_runs`, on the run terms of
  :mod:`search.exact.runs`; label sets in :mod:`search.exact.pareto`; its
  steps in the private ``_dp_*`` modules, the runs' in ``_run_*``);
* :mod:`search.exact.milp`: the mixed-integer program, any DAG, and the
  smallest memory of any problem (:func:`smallest_memory`);
* :mod:`search.exact.memory`: the smallest memory without runs, layer by
  layer;
* :mod:`search.exact.layer_chain`: a graph with branches in its layers'
  order, its skip edges' resharding folded into their destinations (bounds
  for the searches over runs);
* :mod:`search.exact.lagrangian`: the Lagrangian relaxation of the limit
  over runs, whose plans seed the refinement;
* :mod:`search.exact.brute`: every plan of a tiny graph, the tests' oracle;
* :mod:`search.exact.stage_cuts`: pipeline stage cuts over a chain of
  layers, the fastest within a memory limit (Alpa's inter-operator DP), and
  brute force over every cut set.

The plan solvers score plans by :mod:`search.problem`'s objective, in float64 on the
host. This module's ``__all__`` is what the rest of ``search`` uses.
"""

from search.exact.brute import BruteResult, solve_brute, solve_brute_limits
from search.exact.dp import DPResult, dp_solves, solve_dp, viterbi
from search.exact.lagrangian import lagrangian_plans
from search.exact.layer_chain import layer_order_chain
from search.exact.memory import MinimumMemory, memory_by_workspace_cap, minimum_memory
from search.exact.milp import MILPResult, minimum_memory_milp, smallest_memory, solve_milp
from search.exact.runs import RunChain, run_chain
from search.exact.stage_cuts import (
    StageCutProblem,
    StageCuts,
    StageCutsInfeasibleError,
    in_flight_microbatches,
    score_stage_cuts,
    solve_stage_cuts,
    solve_stage_cuts_brute,
)

__all__ = [
    "BruteResult",
    "DPResult",
    "MILPResult",
    "MinimumMemory",
    "RunChain",
    "StageCutProblem",
    "StageCuts",
    "StageCutsInfeasibleError",
    "dp_solves",
    "in_flight_microbatches",
    "lagrangian_plans",
    "layer_order_chain",
    "memory_by_workspace_cap",
    "minimum_memory",
    "minimum_memory_milp",
    "run_chain",
    "score_stage_cuts",
    "smallest_memory",
    "solve_brute",
    "solve_brute_limits",
    "solve_dp",
    "solve_milp",
    "solve_stage_cuts",
    "solve_stage_cuts_brute",
    "viterbi",
]
