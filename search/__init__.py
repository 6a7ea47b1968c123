"""Search over per-layer shardings: relaxation, gradient search, discrete
refinement and exact solvers. Never imports flax or planner.

``solve(table, memory_limit, method="auto"|"gradient"|"dp"|"milp", seed,
callback) -> Solution`` is the entry point; ``solve_many`` plans several
same-shaped tables (mesh shapes) together. See ``docs/search.md``.

At the top: the entry (:mod:`search.solver`), what it returns
(:mod:`search.solution`), the discrete problem of a cost table and the exact
cost of a plan (:mod:`search.problem`) and its options
(:mod:`search.options`). The methods, each a package whose ``__init__`` is
its contract: :mod:`search.exact`, the exact solvers (dynamic programming,
the MILP, brute force), the smallest memory and pipeline stage cuts;
:mod:`search.local`, the local search that refines plans;
:mod:`search.gradient`, the relaxed plan and its gradient search. Two dynamic programmes, for two contracts:
:mod:`search.exact.dp`, the exact solver of chain graphs under a memory
limit (float64 on the host: Viterbi, Lagrangian bounds, Pareto labels), and
:mod:`search.elimination`, variable elimination over any DAG of small
frontier without a memory limit, in JAX (jitted, vmapped over tables, with
a differentiable soft minimum: what the AutoML cost is built on).

``__all__`` is the contract: ``planner`` imports every name it uses from
here, never from the modules inside. Each name loads its module on first
use (``_LAZY`` says which), so ``import search`` pays for neither JAX nor
SciPy; type checkers and IDEs see the names through the ``TYPE_CHECKING``
imports below."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # loaded on first use (module docstring)
    from search.problem import DiscreteProblem, chain_order, discrete_problem, plan_memory, plan_time, run_terms
    from search.options import compact_options, plain_options
    from search.solution import HistoryEntry, SearchEvent, Solution
    from search.solver import AUTO_MILP_TIME_LIMIT_S, METHODS, TIME_BUDGET_S, retry_smallest, solve, solve_many
    from search.exact.brute import solve_brute
    from search.exact.dp import DPResult, solve_dp
    from search.exact.layer_chain import layer_order_chain
    from search.exact.memory import MinimumMemory, minimum_memory
    from search.exact.milp import MILPResult, smallest_memory, solve_milp
    from search.exact.stage_cuts import (StageCutProblem, StageCuts, StageCutsInfeasibleError, score_stage_cuts,
                                         solve_stage_cuts)
    from search.local._repair import repair
    from search.local.refinement import local_search
    from search.gradient.descent import GradientConfig, RelaxedResult, relaxed_search
    from search.gradient.relax import relaxed_probs, round_probs
    from search.pipeline import (
        Candidates,
        PipelinePlan,
        PipelineSearch,
        PipelineSpace,
        TransformerChain,
        candidates,
        evaluate_candidates,
        search_pipeline,
    )
    from search.elimination import INFEASIBLE_S, DPSchedule, best_plans, dp_schedule, pad_schedule, soft_min_lanes

__all__ = [
    "AUTO_MILP_TIME_LIMIT_S",
    "INFEASIBLE_S",
    "METHODS",
    "DPResult",
    "DPSchedule",
    "DiscreteProblem",
    "GradientConfig",
    "HistoryEntry",
    "MILPResult",
    "MinimumMemory",
    "RelaxedResult",
    "SearchEvent",
    "Solution",
    "StageCutProblem",
    "StageCuts",
    "StageCutsInfeasibleError",
    "best_plans",
    "chain_order",
    "compact_options",
    "discrete_problem",
    "dp_schedule",
    "layer_order_chain",
    "local_search",
    "minimum_memory",
    "pad_schedule",
    "plain_options",
    "plan_memory",
    "plan_time",
    "relaxed_probs",
    "relaxed_search",
    "repair",
    "retry_smallest",
    "round_probs",
    "run_terms",
    "score_stage_cuts",
    "smallest_memory",
    "soft_min_lanes",
    "solve",
    "solve_brute",
    "solve_dp",
    "solve_many",
    "solve_milp",
    "solve_stage_cuts",
    "Candidates",
    "PipelinePlan",
    "PipelineSearch",
    "PipelineSpace",
    "TransformerChain",
    "candidates",
    "evaluate_candidates",
    "search_pipeline",
    "TIME_BUDGET_S",
]

_LAZY = {  # public name -> the module that defines it, imported on first use
    "DiscreteProblem": "search.problem",
    "chain_order": "search.problem",
    "discrete_problem": "search.problem",
    "plan_memory": "search.problem",
    "plan_time": "search.problem",
    "run_terms": "search.problem",
    "compact_options": "search.options",
    "plain_options": "search.options",
    "HistoryEntry": "search.solution",
    "SearchEvent": "search.solution",
    "Solution": "search.solution",
    "AUTO_MILP_TIME_LIMIT_S": "search.solver",
    "TIME_BUDGET_S": "search.solver",
    "METHODS": "search.solver",
    "retry_smallest": "search.solver",
    "solve": "search.solver",
    "solve_many": "search.solver",
    "solve_brute": "search.exact.brute",
    "DPResult": "search.exact.dp",
    "solve_dp": "search.exact.dp",
    "layer_order_chain": "search.exact.layer_chain",
    "MinimumMemory": "search.exact.memory",
    "minimum_memory": "search.exact.memory",
    "MILPResult": "search.exact.milp",
    "smallest_memory": "search.exact.milp",
    "solve_milp": "search.exact.milp",
    "StageCutProblem": "search.exact.stage_cuts",
    "StageCuts": "search.exact.stage_cuts",
    "StageCutsInfeasibleError": "search.exact.stage_cuts",
    "score_stage_cuts": "search.exact.stage_cuts",
    "solve_stage_cuts": "search.exact.stage_cuts",
    "local_search": "search.local.refinement",
    "repair": "search.local._repair",
    "GradientConfig": "search.gradient.descent",
    "RelaxedResult": "search.gradient.descent",
    "relaxed_search": "search.gradient.descent",
    "relaxed_probs": "search.gradient.relax",
    "round_probs": "search.gradient.relax",
    "Candidates": "search.pipeline",
    "PipelinePlan": "search.pipeline",
    "PipelineSearch": "search.pipeline",
    "PipelineSpace": "search.pipeline",
    "TransformerChain": "search.pipeline",
    "candidates": "search.pipeline",
    "evaluate_candidates": "search.pipeline",
    "search_pipeline": "search.pipeline",
    "INFEASIBLE_S": "search.elimination",
    "DPSchedule": "search.elimination",
    "best_plans": "search.elimination",
    "dp_schedule": "search.elimination",
    "pad_schedule": "search.elimination",
    "soft_min_lanes": "search.elimination",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'search' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
