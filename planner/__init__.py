"""shardplan's public API: describe a model as a layer graph, plan how to
shard its training over many devices, apply the plan with JAX's own
sharding and check it against what XLA compiles.

Every name here loads on first use (``planner.plan`` imports the planner,
``planner.extract`` Flax), so ``import planner`` and the command line's
``--help`` do not pay for JAX, Flax or SciPy until a name that needs them is
used; type checkers and IDEs see them through the ``TYPE_CHECKING`` imports
below. Multi-process helpers live in :mod:`planner.runtime.distributed` and
the local launcher in :mod:`planner.launch`."""

from typing import TYPE_CHECKING, Any

from planner._version import __version__

if TYPE_CHECKING:  # loaded on first use (module docstring)
    from planner.automl import CostEstimate, CostFunction, cost_fn
    from planner.automl.batch import PlanBatch, PlanConfig, plan_many
    from planner.automl.parametric import (
        ArchParams,
        ParametricGraph,
        parametric_graph,
        total_forward_flops,
    )
    from planner.automl.templates import resnet_parametric, resnet_template, transformer_parametric
    from planner.calibrate.fit import HardwareFit, StepTime, fit_hardware
    from planner.calibrate.profile import Profile, profile_layers
    from planner.evaluation import Evaluation, evaluate
    from planner.ir.builder import GraphBuilder
    from planner.ir.graph import (
        GRAPH_SCHEMA,
        GRAPH_VERSION,
        LayerArrays,
        LayerGraph,
        LayerKind,
        bucket_size,
    )
    from planner.models.netfile import load_net, parse_net
    from planner.models.transformer import TransformerConfig, build_transformer
    from planner.models.zoo import MODEL_NAMES, get_model
    from planner.paradl.report import OracleReport, oracle
    from planner.planning import InfeasibleMemoryError, Plan, plan
    from planner.plot import plot_plan
    from search import GradientConfig, PipelineSpace
    from planner.models.extraction import extract
    from planner.models.flax_zoo import flax_model
    from planner.runtime.sharding import shard
    from planner.runtime.validation import ValidationReport, validate

__all__ = [
    "GRAPH_SCHEMA",
    "GRAPH_VERSION",
    "MODEL_NAMES",
    "ArchParams",
    "CostEstimate",
    "CostFunction",
    "Evaluation",
    "GradientConfig",
    "GraphBuilder",
    "HardwareFit",
    "InfeasibleMemoryError",
    "LayerArrays",
    "LayerGraph",
    "LayerKind",
    "OracleReport",
    "ParametricGraph",
    "PipelineSpace",
    "Plan",
    "PlanBatch",
    "PlanConfig",
    "Profile",
    "StepTime",
    "TransformerConfig",
    "ValidationReport",
    "__version__",
    "bucket_size",
    "build_transformer",
    "cost_fn",
    "evaluate",
    "extract",
    "fit_hardware",
    "flax_model",
    "get_model",
    "load_net",
    "oracle",
    "parametric_graph",
    "parse_net",
    "plan",
    "plan_many",
    "plot_plan",
    "profile_layers",
    "resnet_parametric",
    "resnet_template",
    "shard",
    "total_forward_flops",
    "transformer_parametric",
    "validate",
]

_LAZY = {  # public name -> the module it is defined in, imported on first use
    "CostEstimate": "planner.automl",
    "CostFunction": "planner.automl",
    "cost_fn": "planner.automl",
    "PlanBatch": "planner.automl.batch",
    "PlanConfig": "planner.automl.batch",
    "plan_many": "planner.automl.batch",
    "ArchParams": "planner.automl.parametric",
    "ParametricGraph": "planner.automl.parametric",
    "parametric_graph": "planner.automl.parametric",
    "total_forward_flops": "planner.automl.parametric",
    "resnet_parametric": "planner.automl.templates",
    "resnet_template": "planner.automl.templates",
    "transformer_parametric": "planner.automl.templates",
    "HardwareFit": "planner.calibrate.fit",
    "StepTime": "planner.calibrate.fit",
    "fit_hardware": "planner.calibrate.fit",
    "Profile": "planner.calibrate.profile",
    "profile_layers": "planner.calibrate.profile",
    "Evaluation": "planner.evaluation",
    "evaluate": "planner.evaluation",
    "GraphBuilder": "planner.ir.builder",
    "GRAPH_SCHEMA": "planner.ir.graph",
    "GRAPH_VERSION": "planner.ir.graph",
    "LayerArrays": "planner.ir.graph",
    "LayerGraph": "planner.ir.graph",
    "LayerKind": "planner.ir.graph",
    "bucket_size": "planner.ir.graph",
    "extract": "planner.models.extraction",
    "flax_model": "planner.models.flax_zoo",
    "load_net": "planner.models.netfile",
    "parse_net": "planner.models.netfile",
    "TransformerConfig": "planner.models.transformer",
    "build_transformer": "planner.models.transformer",
    "MODEL_NAMES": "planner.models.zoo",
    "get_model": "planner.models.zoo",
    "OracleReport": "planner.paradl.report",
    "oracle": "planner.paradl.report",
    "InfeasibleMemoryError": "planner.planning",
    "Plan": "planner.planning",
    "plan": "planner.planning",
    "plot_plan": "planner.plot",
    "shard": "planner.runtime.sharding",
    "ValidationReport": "planner.runtime.validation",
    "validate": "planner.runtime.validation",
    "GradientConfig": "search",
    "PipelineSpace": "search",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'planner' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
