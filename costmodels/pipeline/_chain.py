"""A chain of identical transformer blocks cut into ``S`` balanced stages:
its stages' costs (:class:`costmodels.pipeline.StageCosts`), step time and
memory per device, from one block's segment costs
(:func:`costmodels.pipeline.segment_costs`) and the configuration.

Stage ``i`` runs ``L / S`` blocks; the first also the layers before the
blocks (the embedding), the last the layers after them (the final norm and
the output layer). A block's backward pass includes what recomputation
repeats: nothing, the attention's forward compute (selective; Korthikanti et
al. 2022, §5), or the block's whole forward pass with its collectives
(full). A tied output layer (GPT's) keeps its own copy of the table on the
last stage when ``S > 1`` and all-reduces the table's gradient with the
first stage's (Megatron-LM; Shoeybi et al. 2019's embedding is shared
between the input and the output); with one stage there is one table.

Activations follow Korthikanti et al. 2022 (:mod:`costmodels.pipeline._activations`),
times the micro-batches in flight under the schedule
(:mod:`costmodels.pipeline._schedule`), plus, while a block's backward pass
runs, what its recomputation rebuilt. Every input is a float array, so the
whole cost vmaps over configurations; ``max_stages`` (static) is the padded
stage count.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from costmodels.compute import HardwareArrays
from costmodels.pipeline._activations import (
    Recompute,
    first_stage_activation_bytes,
    last_stage_activation_bytes,
    layer_activation_bytes,
)
from costmodels.pipeline._memory import StateBytes, stage_memory_bytes
from costmodels.pipeline._schedule import in_flight_microbatches
from costmodels.pipeline._segments import Segment, SegmentCosts
from costmodels.pipeline._step import PipelineStep, StageCosts, pipeline_step_s

__all__ = ["ChainShape", "ChainConfig", "ChainCost", "chain_cost"]


class ChainShape(NamedTuple):
    """The model: a chain of identical blocks (float arrays)."""

    layers: jnp.ndarray  # [] blocks
    seq: jnp.ndarray  # [] tokens per sample
    hidden: jnp.ndarray  # [] residual width
    heads: jnp.ndarray  # [] attention heads
    ffn: jnp.ndarray  # [] MLP width
    vocab: jnp.ndarray  # [] vocabulary
    tied: jnp.ndarray  # [] 1: the output layer is the embedding's table
    dropout: jnp.ndarray  # [] 1: the blocks drop out (masks kept)
    element_bytes: jnp.ndarray  # [] bytes per activation element (2: 16-bit)


class ChainConfig(NamedTuple):
    """One pipelined configuration (float arrays; vmap over them)."""

    tensor: jnp.ndarray  # [] t
    stages: jnp.ndarray  # [] S
    data: jnp.ndarray  # [] d
    micro_batch: jnp.ndarray  # [] samples per micro-batch
    microbatches: jnp.ndarray  # [] m per step
    chunks: jnp.ndarray  # [] v (interleaved schedule)
    schedule: jnp.ndarray  # [] costmodels.pipeline.Schedule code
    recompute: jnp.ndarray  # [] costmodels.pipeline.Recompute code
    sequence_parallel: jnp.ndarray  # [] 0 / 1
    distributed_optimizer: jnp.ndarray  # [] 0 / 1


class ChainCost(NamedTuple):
    step: PipelineStep
    state_bytes: jnp.ndarray  # [S] weights, gradients and optimizer state per device
    activation_bytes: jnp.ndarray  # [S] activations at the stage's peak per device
    peak_bytes: jnp.ndarray  # [] the largest stage's state + activations
    feasible: jnp.ndarray  # [] bool: the layout runs (SegmentCosts.feasible)


def _stage_costs(shape: ChainShape, seg: SegmentCosts, cfg: ChainConfig, state: StateBytes, max_stages: int):
    """The stages' :class:`StageCosts` ``[max_stages]`` and parameters per device ``[max_stages]``."""
    i = jnp.arange(max_stages, dtype=jnp.float32)
    S, t = cfg.stages, cfg.tensor
    mask = (i < S).astype(jnp.float32)
    first, last = (i == 0).astype(jnp.float32), (i == S - 1.0).astype(jnp.float32)
    n = shape.layers / S  # blocks per stage
    fwd = seg.forward_s + seg.forward_comm_s  # [K]
    recompute = jnp.where(cfg.recompute == Recompute.FULL, fwd[Segment.BLOCK],
                          jnp.where(cfg.recompute == Recompute.SELECTIVE, seg.attention_forward_s[Segment.BLOCK], 0.0))
    bwd = seg.backward_s + seg.backward_comm_s
    forward = n * fwd[Segment.BLOCK] + first * fwd[Segment.FIRST] + last * fwd[Segment.LAST]
    backward = n * (bwd[Segment.BLOCK] + recompute) + first * bwd[Segment.FIRST] + last * bwd[Segment.LAST]
    table = shape.tied * shape.vocab * shape.hidden / t  # a tied table's rows on one device (vocabulary-parallel)
    shared = jnp.where(S == 1.0, table, 0.0)  # one copy where the first stage is the last
    params = (n * seg.params[Segment.BLOCK] + first * seg.params[Segment.FIRST] + last * seg.params[Segment.LAST]
              - first * shared) * mask
    tied_copy = jnp.where(S > 1.0, (first + last) * table, 0.0)
    activation = shape.seq * cfg.micro_batch * shape.hidden * shape.element_bytes  # one micro-batch's boundary tensor
    split = (cfg.sequence_parallel > 0) | (t <= 1.0)
    costs = StageCosts(
        forward_s=forward * mask, backward_s=backward * mask,
        send_bytes=activation / t * mask, gather_bytes=jnp.where(split, 0.0, activation) * mask,
        gradient_bytes=state.gradient * params, weight_bytes=state.weight * params,
        tied_bytes=state.gradient * tied_copy * mask, optimizer_bytes=state.step_bytes * params, mask=mask,
    )
    return costs, params


@functools.partial(jax.jit, static_argnames=("state", "max_stages"))
def chain_cost(shape: ChainShape, seg: SegmentCosts, cfg: ChainConfig, hw: HardwareArrays, state: StateBytes,
               max_stages: int) -> ChainCost:
    """Step time and memory per device of ``cfg`` (module docstring);
    ``seg`` the segment costs of its tensor size, micro-batch size and
    layouts."""
    costs, params = _stage_costs(shape, seg, cfg, state, max_stages)
    step = pipeline_step_s(costs, hw, cfg.stages, cfg.microbatches, cfg.data, cfg.tensor, cfg.schedule, cfg.chunks,
                           cfg.distributed_optimizer > 0)
    i = jnp.arange(max_stages, dtype=jnp.float32)
    S, t, b, sp = cfg.stages, cfg.tensor, cfg.micro_batch, cfg.sequence_parallel
    layer = functools.partial(layer_activation_bytes, shape.seq, b, shape.hidden, shape.heads, shape.ffn, t, sp,
                              element_bytes=shape.element_bytes, dropout=shape.dropout > 0)
    kept = layer(cfg.recompute)
    rebuilt = layer(Recompute.NONE) - kept  # what a recomputing block's backward step rebuilds
    first = jnp.where(i == 0, first_stage_activation_bytes(shape.seq, b, shape.hidden, t, sp, shape.dropout > 0), 0.0)
    last = jnp.where(i == S - 1.0, last_stage_activation_bytes(shape.seq, b, shape.hidden, shape.vocab, t, sp,
                                                              shape.element_bytes), 0.0)
    in_flight = in_flight_microbatches(cfg.schedule, S, cfg.microbatches, cfg.chunks, i)
    state_total, activations = stage_memory_bytes(params, shape.layers / S * kept, in_flight, first + last, cfg.data,
                                                  state, cfg.distributed_optimizer > 0, rebuilt)
    activations = activations * costs.mask
    return ChainCost(step=step, state_bytes=state_total, activation_bytes=activations,
                     peak_bytes=jnp.max(state_total + activations), feasible=seg.feasible)
