"""shardplan's public API: describe a CNN as a layer graph, plan how to
shard its training over many devices, apply the plan with JAX's own
sharding and check it against what XLA compiles.

Every name is imported here, except the five that need Flax at import time
(``extract``, ``flax_model``, ``shard``, ``validate``, ``ValidationReport``):
those load on first use, so ``import planner`` (and the command line) does
not pay for Flax unless it is used; type checkers and IDEs see them through
the ``TYPE_CHECKING`` imports below. Multi-process helpers live in
:mod:`planner.runtime.distributed` and the local launcher in :mod:`planner.launch`."""

from typing import TYPE_CHECKING, Any

from planner._version import __version__
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
from search import GradientConfig

if TYPE_CHECKING:  # imported on first use (module docstring)
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

_NEED_FLAX = {  # name -> module: imported on first use
    "extract": "planner.models.extraction",
    "flax_model": "planner.models.flax_zoo",
    "shard": "planner.runtime.sharding",
    "validate": "planner.runtime.validation",
    "ValidationReport": "planner.runtime.validation",
}


def __getattr__(name: str) -> Any:
    if name in _NEED_FLAX:
        import importlib

        return getattr(importlib.import_module(_NEED_FLAX[name]), name)
    raise AttributeError(f"module 'planner' has no attribute {name!r}")
