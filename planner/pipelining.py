"""Pipelined plans of decoders: the fastest pipelined configuration of a
decoder (stages, data and tensor sizes, micro-batches, interleaving,
recomputation, sequence parallelism, ZeRO-1) that fits the memory, as a
:class:`~planner.plans.record.Plan` with a
:class:`~planner.plans.pipeline.Pipeline`.

The decoder is costed as a chain of identical blocks
(:func:`planner.models.block_chain.block_chain`): every configuration at
once by :func:`search.search_pipeline` under Megatron-LM's per-layer layout
(:func:`costmodels.megatron_options`), whose step and memory the plan
reports; the plan's ``evaluation`` is that layout evaluated on one stage's
sub-mesh for one micro-batch (:func:`planner.evaluate`). The blocks carry no
dropout masks: the planner's decoders (and their Flax twins) do not drop
out."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from costmodels import STRATEGY_NAMES, Hardware, megatron_options
from planner._format import format_bytes_up
from planner.evaluation import evaluate
from planner.infeasible import InfeasibleMemoryError
from planner.ir.graph import LayerGraph
from planner.models.transformer import TransformerConfig
from planner.plans.pipeline import PIPELINE_AXIS_NAMES, Pipeline, stage_blocks
from planner.plans.record import MeshResult, Plan
from planner.plans.specs import layer_specs
from search import PipelineSpace, SearchEvent, search_pipeline

__all__ = ["PIPELINE_CHOICES", "decoder_config", "pipelined_plan"]

PIPELINE_CHOICES = ("auto", "always", "never")  # planner.plan's pipeline= and the command line's --pipeline

# the search's space: every size that divides, ZeRO-1 (the distributed optimizer) on or off
_SPACE = PipelineSpace(distributed_optimizer=(False, True))


def decoder_config(model: Any, name: str | None = None) -> tuple[TransformerConfig, str] | None:
    """The :class:`TransformerConfig` of a decoder ``model`` (a zoo name of
    a decoder, or a decoder config) and its name; None for anything else (a
    layer graph, a CNN, a ViT)."""
    from planner.models.zoo import TRANSFORMERS

    if isinstance(model, str) and model in TRANSFORMERS:
        config, name = TRANSFORMERS[model], model
    elif isinstance(model, TransformerConfig):
        config, name = model, name or "transformer"
    else:
        return None
    return (config, name) if not config.image else None


def _stage_plan(graph: LayerGraph, sequence_parallel: bool) -> dict[str, str]:
    """Layer name -> strategy of Megatron-LM's layout (costmodels.megatron_options)."""
    codes = megatron_options(graph, sequence_parallel)[: graph.num_layers]
    return {n: STRATEGY_NAMES[int(c)] for n, c in zip(graph.names, codes, strict=True)}


def pipelined_plan(config: TransformerConfig, name: str, graph: LayerGraph, hw: Hardware, devices: int, batch: int,
                   limit: float, margin: float, *, dtype: str, optimizer: str, platform: str, seed: int,
                   started_s: float, meshes: tuple[MeshResult, ...] = (),
                   callback: Callable[[SearchEvent], None] | None = None,
                   space: PipelineSpace | None = None) -> Plan:
    """The fastest pipelined plan of the decoder ``config`` (``graph`` its
    whole layer graph, for the fingerprint and input shape) on ``devices``
    devices of ``hw`` at a global ``batch`` that fits ``limit - margin``
    bytes per device. Raises :class:`InfeasibleMemoryError` naming the
    smallest pipelined configuration's memory when none fits; ``ValueError``
    when no configuration divides. ``meshes``: the one-stage search's
    results, kept in the plan; ``started_s``: when planning started
    (``time.perf_counter``); ``space``: the configurations searched
    (default: every size that divides, 1F1B or interleaved 1F1B, ZeRO-1 on
    or off)."""
    import time

    from planner._version import __version__
    from planner.models.block_chain import block_chain

    bc = block_chain(config, dtype=dtype, optimizer=optimizer, dropout=False, name=name)
    budget = max(limit - margin, 1.0)
    found = search_pipeline(bc.graph, bc.segment, bc.chain, hw, devices, batch, memory_limit_bytes=budget,
                            space=_SPACE if space is None else space)
    if found.best is None:
        s = found.smallest
        need = s.peak_bytes + margin
        raise InfeasibleMemoryError(
            f"no pipelined plan of {name} on {devices} devices fits {format_bytes_up(limit)} per device: the "
            f"smallest of {found.candidates} configurations needs {format_bytes_up(need)} ({need:,.0f} bytes: "
            f"{s.tensor} tensor x {s.stages} stages x {s.data} data, micro-batch {s.micro_batch}, {s.recompute} "
            f"recomputation{', sequence parallel' if s.sequence_parallel else ''}"
            f"{', ZeRO-1' if s.distributed_optimizer else ''}); raise the memory limit, use more devices or a "
            "smaller batch", need)
    p = found.best
    if callback is not None:
        callback(SearchEvent("pipeline", f"{name}: pipelined plan {p.stages} stages x {p.data} data x {p.tensor} "
                                         f"model, {found.fitting} of {found.candidates} configurations fit"))
    mapping = _stage_plan(bc.graph, p.sequence_parallel)
    ev = evaluate(bc.graph, hw, p.data * p.tensor, mesh=(p.data, p.tensor), plan=mapping,
                  batch=p.micro_batch * p.data, dtype=dtype, optimizer=optimizer, platform=platform)
    pipeline = Pipeline(
        stages=p.stages, data=p.data, tensor=p.tensor, chunks=p.chunks, micro_batch=p.micro_batch,
        microbatches=p.microbatches, schedule=p.schedule, recompute=p.recompute,
        sequence_parallel=p.sequence_parallel, distributed_optimizer=p.distributed_optimizer, blocks=config.depth,
        stage_blocks=stage_blocks(config.depth, p.stages, p.chunks), step_s=p.step_s, pipeline_s=p.pipeline_s,
        bubble_s=p.bubble_s, transfer_s=p.transfer_s, gradient_sync_s=p.gradient_sync_s,
        optimizer_s=p.optimizer_s, state_bytes=p.state_bytes, activation_bytes=p.activation_bytes,
        peak_bytes=p.peak_bytes, candidates=found.candidates, fitting=found.fitting)
    return Plan(
        evaluation=ev, axis_names=PIPELINE_AXIS_NAMES, memory_limit_bytes=limit, data_parallel_iteration_s=None,
        data_parallel_memory_bytes=None, speedup_over_data_parallel=None, method="pipeline", seed=seed,
        seconds=time.perf_counter() - started_s, optimality_gap=None, meshes=meshes,
        graph_fingerprint=graph.fingerprint, input_shape=tuple(graph.input_shape),
        layer_specs=layer_specs(bc.graph, [r.strategy for r in ev.layers], ev.zero_stages), hardware_spec=hw,
        package_version=__version__, memory_margin_bytes=margin, platform=platform, levers="none",
        pipeline=pipeline)
