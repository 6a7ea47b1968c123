"""shardplan's public API: plan how to shard a CNN's training over many devices."""
from planner.builder import GraphBuilder
from planner.graph import GRAPH_SCHEMA, GRAPH_VERSION, LayerArrays, LayerGraph, LayerKind, bucket_size

__all__ = ["GraphBuilder", "GRAPH_SCHEMA", "GRAPH_VERSION", "LayerArrays", "LayerGraph", "LayerKind", "bucket_size"]
