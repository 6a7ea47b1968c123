"""AutoML embedding: the cost of the best plan as a differentiable function
of architecture parameters (:func:`cost_fn`), and many configurations
planned by a few compiled calls (:func:`plan_many`).

Both rest on an exact dynamic programme over plans (:mod:`search.elimination`,
variable elimination along the layer order; exact on any DAG whose
frontier has at most four layers: chains, ResNets) instead of the host-side
search of :func:`planner.plan`:

* ``cost_fn``: per mesh shape, the soft minimum over *all plans* of the
  iteration time, ``F = -tau log sum_plans exp(-time / tau)`` (tends to the
  optimum as ``tau -> 0``), and the memory of the Gibbs distribution over
  plans (:func:`costmodels.memory_per_device` at its per-layer marginals,
  ``dF / d layer_time``); then a soft minimum over mesh shapes of
  ``F (1 + penalty relu(memory / limit - 1))``. Beside it, the exact
  discrete optimum of the rounded architecture (hard minimum, plan by
  backtracking), not differentiated.
* ``plan_many`` (:mod:`planner.automl.batch`): the
  hard DP for every (configuration, mesh shape) pair, several
  configurations per compiled call.
"""

from planner.automl.batch import PlanBatch, PlanConfig, plan_many
from planner.automl.cost_fn import CostEstimate, CostFunction, cost_fn

__all__ = ["CostEstimate", "CostFunction", "PlanBatch", "PlanConfig", "cost_fn", "plan_many"]
