"""shardplan's public API: describe a CNN as a layer graph, plan how to
shard its training over many devices, apply the plan with JAX's own
sharding and check it against what XLA compiles.

Everything but the layer-graph basics is imported on first use (see
``_LAZY``), so ``import planner`` stays light for the command line; flax,
optax and matplotlib load only when a name that needs them is used.
Multi-process helpers live in :mod:`planner.distributed` and the local
launcher in :mod:`planner.launch`."""

from typing import Any

from planner._version import __version__
from planner.builder import GraphBuilder
from planner.graph import GRAPH_SCHEMA, GRAPH_VERSION, LayerArrays, LayerGraph, LayerKind, bucket_size
from planner.netfile import load_net, parse_net
from planner.zoo import MODEL_NAMES, get_model

__all__ = [
    "__version__",
    "ArchParams",
    "CostEstimate",
    "CostFunction",
    "HardwareFit",
    "ParametricGraph",
    "PlanBatch",
    "PlanConfig",
    "Profile",
    "StepTime",
    "ValidationReport",
    "cost_fn",
    "fit_hardware",
    "parametric_graph",
    "plan_many",
    "plot_plan",
    "profile_layers",
    "resnet_parametric",
    "resnet_template",
    "total_forward_flops",
    "validate",
    "GRAPH_SCHEMA",
    "GRAPH_VERSION",
    "MODEL_NAMES",
    "OracleReport",
    "Plan",
    "GraphBuilder",
    "LayerArrays",
    "LayerGraph",
    "LayerKind",
    "bucket_size",
    "extract",
    "flax_model",
    "get_model",
    "load_net",
    "oracle",
    "parse_net",
    "plan",
    "shard",
]

# Imported on first use: flax is heavy, and the oracle imports costmodels,
# which itself imports planner.graph (importing it here would be circular).
_LAZY = {
    "extract": ("planner.extraction", "extract"),
    "flax_model": ("planner.flax_zoo", "flax_model"),
    "oracle": ("planner.oracle_report", "oracle"),
    "OracleReport": ("planner.oracle_report", "OracleReport"),
    "plan": ("planner.planning", "plan"),
    "Plan": ("planner.planning", "Plan"),
    "shard": ("planner.sharding", "shard"),
    "validate": ("planner.validation", "validate"),
    "ValidationReport": ("planner.validation", "ValidationReport"),
    "profile_layers": ("planner.profile", "profile_layers"),
    "Profile": ("planner.profile", "Profile"),
    "fit_hardware": ("planner.fit", "fit_hardware"),
    "StepTime": ("planner.fit", "StepTime"),
    "HardwareFit": ("planner.fit", "HardwareFit"),
    "cost_fn": ("planner.automl", "cost_fn"),
    "plan_many": ("planner.batch_planning", "plan_many"),
    "PlanConfig": ("planner.batch_planning", "PlanConfig"),
    "PlanBatch": ("planner.batch_planning", "PlanBatch"),
    "CostEstimate": ("planner.automl", "CostEstimate"),
    "CostFunction": ("planner.automl", "CostFunction"),
    "ArchParams": ("planner.parametric", "ArchParams"),
    "ParametricGraph": ("planner.parametric", "ParametricGraph"),
    "parametric_graph": ("planner.parametric", "parametric_graph"),
    "resnet_parametric": ("planner.parametric", "resnet_parametric"),
    "resnet_template": ("planner.parametric", "resnet_template"),
    "total_forward_flops": ("planner.parametric", "total_forward_flops"),
    "plot_plan": ("planner.plot", "plot_plan"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'planner' has no attribute {name!r}")
