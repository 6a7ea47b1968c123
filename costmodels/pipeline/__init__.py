"""Pipelined training steps: stages, micro-batches, schedules and
recomputation, as jitted JAX functions over float arrays (vmappable over
configurations).

* :mod:`~costmodels.pipeline._schedule`: GPipe, 1F1B and interleaved 1F1B:
  micro-batch slots per step, bubble, micro-batches in flight per stage;
* :mod:`~costmodels.pipeline._activations`: Korthikanti et al. 2022's
  activation bytes per transformer block (tensor and sequence parallelism,
  selective and full recomputation) and of the embedding and output layers;
* :mod:`~costmodels.pipeline._memory`: model state per parameter under a
  mixed-precision optimizer (18 B with Adam; ZeRO-1 / the distributed
  optimizer over data) and memory per stage;
* :mod:`~costmodels.pipeline._step`: a pipelined step's time from its stages'
  costs: the schedule, point-to-point transfers over the network tier each
  boundary crosses, the data-parallel gradient reduction, the optimizer step;
* :mod:`~costmodels.pipeline._segments`: one micro-batch's costs per segment
  (embedding, block, output layer) from the per-layer cost table;
  :mod:`~costmodels.pipeline._megatron`: Megatron-LM's tensor-parallel
  layout as per-layer strategies;
* :mod:`~costmodels.pipeline._chain`: a chain of identical blocks in
  balanced stages: its step time and memory per device.

``__all__`` is the contract (``costmodels``' face re-exports it); names load
on first use (``_LAZY``)."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # loaded on first use (module docstring)
    from costmodels.pipeline._activations import (
        RECOMPUTE_NAMES,
        Recompute,
        first_stage_activation_bytes,
        last_stage_activation_bytes,
        layer_activation_bytes,
        parse_recompute,
    )
    from costmodels.pipeline._chain import ChainConfig, ChainCost, ChainShape, chain_cost
    from costmodels.pipeline._megatron import megatron_options
    from costmodels.pipeline._memory import StateBytes, stage_memory_bytes, state_bytes
    from costmodels.pipeline._schedule import (
        SCHEDULE_NAMES,
        Schedule,
        bubble_fraction,
        in_flight_microbatches,
        parse_schedule,
        step_slots,
    )
    from costmodels.pipeline._segments import NUM_SEGMENTS, Segment, SegmentCosts, segment_costs
    from costmodels.pipeline._step import PipelineStep, StageCosts, boundary_crosses_nodes, pipeline_step_s

__all__ = [
    "NUM_SEGMENTS",
    "RECOMPUTE_NAMES",
    "SCHEDULE_NAMES",
    "ChainConfig",
    "ChainCost",
    "ChainShape",
    "PipelineStep",
    "Recompute",
    "Schedule",
    "Segment",
    "SegmentCosts",
    "StageCosts",
    "StateBytes",
    "boundary_crosses_nodes",
    "bubble_fraction",
    "chain_cost",
    "first_stage_activation_bytes",
    "in_flight_microbatches",
    "last_stage_activation_bytes",
    "layer_activation_bytes",
    "megatron_options",
    "parse_recompute",
    "parse_schedule",
    "pipeline_step_s",
    "segment_costs",
    "stage_memory_bytes",
    "state_bytes",
    "step_slots",
]

_LAZY = {  # public name -> the module that defines it, imported on first use
    "RECOMPUTE_NAMES": "costmodels.pipeline._activations",
    "Recompute": "costmodels.pipeline._activations",
    "first_stage_activation_bytes": "costmodels.pipeline._activations",
    "last_stage_activation_bytes": "costmodels.pipeline._activations",
    "layer_activation_bytes": "costmodels.pipeline._activations",
    "parse_recompute": "costmodels.pipeline._activations",
    "ChainConfig": "costmodels.pipeline._chain",
    "ChainCost": "costmodels.pipeline._chain",
    "ChainShape": "costmodels.pipeline._chain",
    "chain_cost": "costmodels.pipeline._chain",
    "megatron_options": "costmodels.pipeline._megatron",
    "StateBytes": "costmodels.pipeline._memory",
    "stage_memory_bytes": "costmodels.pipeline._memory",
    "state_bytes": "costmodels.pipeline._memory",
    "SCHEDULE_NAMES": "costmodels.pipeline._schedule",
    "Schedule": "costmodels.pipeline._schedule",
    "bubble_fraction": "costmodels.pipeline._schedule",
    "in_flight_microbatches": "costmodels.pipeline._schedule",
    "parse_schedule": "costmodels.pipeline._schedule",
    "step_slots": "costmodels.pipeline._schedule",
    "NUM_SEGMENTS": "costmodels.pipeline._segments",
    "Segment": "costmodels.pipeline._segments",
    "SegmentCosts": "costmodels.pipeline._segments",
    "segment_costs": "costmodels.pipeline._segments",
    "PipelineStep": "costmodels.pipeline._step",
    "StageCosts": "costmodels.pipeline._step",
    "boundary_crosses_nodes": "costmodels.pipeline._step",
    "pipeline_step_s": "costmodels.pipeline._step",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'costmodels.pipeline' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
