"""Search over per-layer shardings: relaxation, gradient search, discrete
refinement and exact solvers. Never imports flax or planner.

``solve(table, memory_limit, method="auto"|"gradient"|"dp"|"milp", seed,
callback) -> Solution`` is the entry point; ``solve_many`` plans several
same-shaped tables (mesh shapes) together. See ``docs/search.md``.

The function ``search.solve`` and its methods live in :mod:`search.solver`.
Two dynamic programmes, for two contracts: :mod:`search.dp`, the exact
solver of chain graphs under a memory limit (float64 on the host: Viterbi,
Lagrangian bounds, Pareto labels), and :mod:`search.elimination`, variable
elimination over any DAG of small frontier without a memory limit, in JAX
(jitted, vmapped over tables, with a differentiable soft minimum: what the
AutoML cost is built on)."""

from search.brute import solve_brute
from search.dp import DPResult, solve_dp
from search.gradient import GradientConfig, RelaxedResult, relaxed_search
from search.layer_chain import layer_order_chain
from search.milp import MILPResult, smallest_memory, solve_milp
from search.problem import (
    DiscreteProblem,
    MinimumMemory,
    chain_order,
    compact_options,
    discrete_problem,
    minimum_memory,
    plain_options,
    plan_memory,
    plan_time,
    run_terms,
)
from search.refine import local_search, repair
from search.relax import relaxed_probs, round_probs
from search.solution import HistoryEntry, SearchEvent, Solution
from search.solver import AUTO_MILP_TIME_LIMIT_S, METHODS, TIME_BUDGET_S, retry_smallest, solve, solve_many

__all__ = [
    "AUTO_MILP_TIME_LIMIT_S",
    "METHODS",
    "DPResult",
    "DiscreteProblem",
    "GradientConfig",
    "HistoryEntry",
    "MILPResult",
    "MinimumMemory",
    "RelaxedResult",
    "SearchEvent",
    "Solution",
    "chain_order",
    "compact_options",
    "discrete_problem",
    "layer_order_chain",
    "local_search",
    "minimum_memory",
    "smallest_memory",
    "plain_options",
    "plan_memory",
    "plan_time",
    "relaxed_probs",
    "relaxed_search",
    "repair",
    "retry_smallest",
    "round_probs",
    "run_terms",
    "solve",
    "solve_brute",
    "solve_dp",
    "solve_milp",
    "solve_many",
    "TIME_BUDGET_S",
]
