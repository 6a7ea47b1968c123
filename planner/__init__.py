"""shardplan's public API: describe a CNN as a layer graph, and (as the
project grows) plan how to shard its training over many devices.

``planner.extract``, ``planner.flax_model`` and ``planner.oracle`` are
imported on first use, so ``import planner`` stays light for the command
line."""

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
]

# Imported on first use: flax is heavy, and the oracle imports costmodels,
# which itself imports planner.graph (importing it here would be circular).
_LAZY = {
    "extract": ("planner.extract", "extract"),
    "flax_model": ("planner.flax_zoo", "flax_model"),
    "oracle": ("planner.oracle_report", "oracle"),
    "OracleReport": ("planner.oracle_report", "OracleReport"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'planner' has no attribute {name!r}")
