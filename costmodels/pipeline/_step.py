"""Seconds per training step of a pipelined plan: ``S`` stages on a
(pipeline, data, tensor) mesh of ``S x d x t`` devices, tensor innermost
(a node holds whole tensor groups, then data replicas, then stages:
Megatron-LM's rank order), ``m`` micro-batches per step.

A stage's *slot* is the forward and backward pass of one micro-batch
through it, with its point-to-point transfers:

``T_i = forward_i + backward_i + transfers_i``

``forward_i`` and ``backward_i`` are the stage's compute and
tensor-parallel collectives per micro-batch (input arrays: the per-layer
model's, :mod:`costmodels.pipeline._block`; the backward pass includes any
recomputed forward). ``transfers_i``: each micro-batch's activation is sent
to the next stage and its gradient back, ``v`` times per device under the
interleaved schedule (Narayanan et al. 2021, §2.2.2: interleaving
multiplies the communication by ``v``), each one ``alpha + bytes / bw`` on
the network tier the boundary crosses (ParaDL §3.1-3.2; a boundary crosses
nodes where the two stages' devices sit on different nodes). With tensor
parallelism each of the ``t`` devices sends its ``1/t`` of the activation
and the receiving group all-gathers it inside the node (Narayanan et al.
2021, Megatron-LM §4.1: the scatter/gather optimisation); sequence-parallel activations
are split already and need no gather.

The pipeline takes ``(m - 1/v) max_i T_i + (1/v) sum_i T_i``: the first
micro-batch's pass through every stage, then the slowest stage's slots;
with equal stages ``(m + (S - 1)/v) T``, the ``m + (S - 1)/v`` slots of
Megatron-LM §2.2 (Narayanan et al. 2021; GPipe and 1F1B: ``v = 1``). The form is exact
for GPipe, and for 1F1B where the stages are equal; where they differ, 1F1B
overlaps a little more than it counts (tests/test_pipeline_cost.py
simulates both).

Then once per step, after the pipeline flushes: each stage's data-parallel
gradient reduction over its ``d`` replicas (:func:`costmodels.collectives.allreduce_s`,
or a reduce-scatter of the gradients and an all-gather of the 16-bit
weights under the distributed optimizer), of which ``gradient_overlap`` of
the hardware hides behind the last micro-batch's backward pass; the
gradient of a table tied between the first and the last stage all-reduced
between the two (Megatron-LM's embedding all-reduce); and the optimizer
step, memory-bound over each device's shard of the state
(:mod:`costmodels.pipeline._memory`). The step is the pipeline plus the
slowest stage's reduction and optimizer step.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from costmodels.collectives import (
    allgather_group_s,
    allgather_s,
    allreduce_s,
    p2p_s,
    reduce_scatter_group_s,
    ring_allreduce_s,
    tier_of,
)
from costmodels.compute import HardwareArrays
from costmodels.pipeline._schedule import Schedule

__all__ = ["StageCosts", "PipelineStep", "boundary_crosses_nodes", "pipeline_step_s"]


class StageCosts(NamedTuple):
    """What each stage costs; ``[S]`` arrays padded to a bucket (``mask``)."""

    forward_s: jnp.ndarray  # [S] one micro-batch's forward pass through the stage (all its chunks), seconds
    backward_s: jnp.ndarray  # [S] its backward pass, recomputation included, seconds
    send_bytes: jnp.ndarray  # [S] bytes one device sends to the next stage per micro-batch and chunk
    gather_bytes: jnp.ndarray  # [S] bytes the receiving tensor group all-gathers (0: activations stay split)
    gradient_bytes: jnp.ndarray  # [S] gradient bytes one device reduces over data per step
    weight_bytes: jnp.ndarray  # [S] 16-bit weight bytes per device (the distributed optimizer all-gathers them)
    tied_bytes: jnp.ndarray  # [S] gradient bytes of a table tied between the first and last stage (0 elsewhere)
    optimizer_bytes: jnp.ndarray  # [S] bytes the optimizer step reads and writes per device
    mask: jnp.ndarray  # [S] 1 for real stages


class PipelineStep(NamedTuple):
    step_s: jnp.ndarray  # [] seconds per training step
    pipeline_s: jnp.ndarray  # [] the micro-batches through the pipeline, bubble included
    bubble_s: jnp.ndarray  # [] of pipeline_s, the time beyond m slots of the slowest stage
    transfer_s: jnp.ndarray  # [] of pipeline_s, the slowest stage's point-to-point transfers
    gradient_sync_s: jnp.ndarray  # [] the slowest stage's exposed data-parallel (and tied-table) reduction
    optimizer_s: jnp.ndarray  # [] the slowest stage's optimizer step
    slot_s: jnp.ndarray  # [S] each stage's slot, T_i


def boundary_crosses_nodes(stage, stage_devices, devices_per_node):
    """Whether stage ``stage``'s devices and the next stage's share no node:
    stage ``i`` holds devices ``[i n, (i + 1) n)`` (``n = d t``); device
    ``r`` sends to ``r + n``."""
    i = jnp.asarray(stage, jnp.float32)
    n = jnp.asarray(stage_devices, jnp.float32)
    g = jnp.asarray(devices_per_node, jnp.float32)
    first, last_partner = i * n, (i + 2.0) * n - 1.0
    return (n >= g) | (jnp.floor(first / g) != jnp.floor(last_partner / g))


def _transfer_s(hw: HardwareArrays, nbytes, gather_bytes, tensor, crosses):
    """One activation (or gradient) across a stage boundary: each device's
    share point to point on the tier the boundary crosses, then the tensor
    group's all-gather inside the node (Narayanan et al. 2021, Megatron-LM §4.1)."""
    a, bw = tier_of(hw.network, 2.0, crosses)
    ai, bi = tier_of(hw.network, tensor, False)
    return p2p_s(nbytes, a, bw) + allgather_s(tensor, gather_bytes / jnp.maximum(tensor, 1.0), ai, bi)


def _transfers_s(costs: StageCosts, hw: HardwareArrays, stages, data, tensor, v):
    """``[S]`` seconds of point-to-point transfers per slot of each stage: the
    activation sent on to the next stage and the gradient sent back to the
    one before (module docstring); under interleaving ``v`` of each, the
    chunks wrapping from the last device to the first."""
    net = hw.network
    i = jnp.arange(costs.mask.shape[0], dtype=jnp.float32)
    S = jnp.asarray(stages, jnp.float32)
    n = jnp.asarray(data, jnp.float32) * jnp.asarray(tensor, jnp.float32)
    crosses = boundary_crosses_nodes(i, n, net.devices_per_node)  # [S] boundary i -> i + 1
    wraps = S * n > net.devices_per_node  # the last stage's devices and the first's share no node
    # boundary i - 1 of each stage i; stage 0's is the wrap from the last stage
    shift = lambda x: jnp.roll(x, 1).at[0].set(x[(S - 1.0).astype(jnp.int32)])  # noqa: E731
    forward = _transfer_s(hw, costs.send_bytes, costs.gather_bytes, tensor, crosses)
    backward = _transfer_s(hw, shift(costs.send_bytes), shift(costs.gather_bytes), tensor,
                           jnp.roll(crosses, 1).at[0].set(wraps))
    vv = jnp.maximum(jnp.asarray(v, jnp.float32), 1.0)
    interleaved = vv > 1.0
    forward = jnp.where((i < S - 1.0) | interleaved, forward, 0.0)
    backward = jnp.where((i > 0) | interleaved, backward, 0.0)
    return jnp.where(S > 1, vv * (forward + backward), 0.0) * costs.mask


@jax.jit
def pipeline_step_s(costs: StageCosts, hw: HardwareArrays, stages, microbatches, data, tensor, schedule,
                    v=1.0, distributed_optimizer=False) -> PipelineStep:
    """Seconds per training step (module docstring). ``stages``,
    ``microbatches``, ``data``, ``tensor``, ``v`` are float arrays (``v`` is
    used under the interleaved ``schedule`` only)."""
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    m = f32(microbatches)
    vv = jnp.where(jnp.asarray(schedule) == Schedule.INTERLEAVED, jnp.maximum(f32(v), 1.0), 1.0)
    mask = costs.mask
    transfers = _transfers_s(costs, hw, stages, data, tensor, vv)
    slot = (costs.forward_s + costs.backward_s + transfers) * mask  # [S]
    slowest = jnp.max(slot)
    pipeline = (m - 1.0 / vv) * slowest + jnp.sum(slot) / vv
    bubble = pipeline - m * slowest
    net = hw.network
    d, t = f32(data), f32(tensor)
    data_per_node = jnp.clip(jnp.floor(net.devices_per_node / t), 1.0, d)  # data replicas sharing a node
    reduce = allreduce_s(net, d, data_per_node, costs.gradient_bytes)
    sharded = reduce_scatter_group_s(net, d, data_per_node, costs.gradient_bytes) + allgather_group_s(
        net, d, data_per_node, costs.weight_bytes)
    sync = jnp.where(jnp.asarray(distributed_optimizer), sharded, reduce)
    sync = jnp.where(d > 1.0, sync, 0.0)
    exposed = sync - hw.gradient_overlap * jnp.minimum(sync, costs.backward_s)
    ta, tb = tier_of(net, 2.0, f32(stages) * d * t > net.devices_per_node)  # the first and the last stage
    tied = jnp.where(costs.tied_bytes > 0, ring_allreduce_s(2.0, costs.tied_bytes, ta, tb), 0.0)
    shard = jnp.where(jnp.asarray(distributed_optimizer), d, 1.0)
    optimizer = costs.optimizer_bytes / shard / (hw.memory_bandwidth_bytes_per_s * hw.efficiency[3])
    after = (exposed + tied + optimizer) * mask
    k = jnp.argmax(after)
    return PipelineStep(
        step_s=pipeline + after[k], pipeline_s=pipeline, bubble_s=bubble,
        transfer_s=transfers[jnp.argmax(slot)], gradient_sync_s=(exposed + tied)[k], optimizer_s=optimizer[k],
        slot_s=slot,
    )
