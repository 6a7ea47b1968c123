"""shardplan's public API: describe a CNN as a layer graph, and (as the
project grows) plan how to shard its training over many devices.

``extract``, ``flax_model``, ``oracle``, ``plan`` and ``shard`` are
imported on first use (from ``planner.extraction``, ``planner.flax_zoo``,
``planner.oracle_report``, ``planner.planning`` and ``planner.sharding``),
so ``import planner`` stays light for the command line."""

from typing import Any

from planner.builder import GraphBuilder
from planner.graph import GRAPH_SCHEMA, GRAPH_VERSION, LayerArrays, LayerGraph, LayerKind, bucket_size
from planner.netfile import load_net, parse_net
from planner.zoo import MODEL_NAMES, get_model

__all__ = [
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
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'planner' has no attribute {name!r}")
