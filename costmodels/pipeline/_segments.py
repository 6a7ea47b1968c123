"""What one micro-batch costs in each part of a stage, from the per-layer
model: the layers of a model are put in *segments* (a layer's segment id;
for a chain of identical blocks: the layers only the first stage runs, one
block, the layers only the last stage runs), and each segment's forward and
backward compute and tensor-parallel collectives are summed from the cost
table (:func:`costmodels.cost_table`) of one micro-batch on a tensor group
of ``t`` devices (a ``1 x t`` mesh) under each layer's option.

* compute: the table's forward and backward kernels (costmodels/compute.py);
* the tensor-parallel collectives: the conversions on the edges into the
  segment's layers, forward and backward apart (costmodels/reshard.py), so
  Megatron-LM's block pattern (``filter`` on the first projection,
  ``channel`` on the second) costs its all-reduce after each pair forward and
  before it backward (Shoeybi et al. 2019, §3, its ``f`` and ``g``), and
  sequence parallelism (``spatial`` on the norms and adds) its all-gather and
  reduce-scatter (Korthikanti et al. 2022, §4.2.2); a layer's own exchanges
  (``halo_s``: a sequence-parallel attention's keys and values) count in the
  backward part;
* with ``vocab_parallel``: an embedding (``EMBED``) holds ``1/t`` of its
  table's rows and sums its looked-up rows across the group (its output
  ``PARTIAL``: all-reduced, or reduce-scattered into a sequence-parallel
  consumer), and a sink layer split along its outputs (the output layer over
  the vocabulary) feeds a cross entropy that reduces three ``s b`` fp32
  vectors across the group (the maximum logit, the target's logit, the sum
  of exponentials) instead of gathering the logits (Shoeybi et al. 2019, §3);
* with ``dropout``, the dropout kernels the layer graph does not describe
  (:mod:`costmodels.pipeline._dropout`);
* the parameters one device holds (filter and channel split them), and
  whether every layer can run its option there
  (:func:`costmodels.strategy_mask`: divisible channels, heads, tokens).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from costmodels._layer_terms import edge_reshard_parts_s
from costmodels.collectives import ring_allreduce_s, tier_of, tree_allreduce_s
from costmodels.compute import HardwareArrays
from costmodels.evaluate import one_hot
from costmodels.layers import LayerKind
from costmodels.levers import levers_per_strategy
from costmodels.pipeline._dropout import dropout_s
from costmodels.shards import row_padding
from costmodels.strategies import Layout, Strategy, strategy_layouts
from costmodels.table import CostSettings, _local_params, cost_table

__all__ = ["NUM_SEGMENTS", "Segment", "SegmentCosts", "segment_costs"]


class Segment:
    """Segment ids of a chain of identical blocks."""

    FIRST = 0  # layers before the blocks (the embeddings): the first stage runs them
    BLOCK = 1  # one block
    LAST = 2  # layers after the blocks (the final norm, the output layer): the last stage runs them


NUM_SEGMENTS = 3


class SegmentCosts(NamedTuple):
    """One micro-batch's costs per segment ``[K]`` on one device of a tensor group."""

    forward_s: jnp.ndarray  # [K] forward compute, seconds
    backward_s: jnp.ndarray  # [K] backward compute, seconds
    forward_comm_s: jnp.ndarray  # [K] tensor-parallel collectives of the forward pass, seconds
    backward_comm_s: jnp.ndarray  # [K] ... of the backward pass, seconds
    attention_forward_s: jnp.ndarray  # [K] forward compute of the attention layers (selective recomputation)
    params: jnp.ndarray  # [K] parameters one device holds
    feasible: jnp.ndarray  # [] bool: every layer can run its option on this tensor group and micro-batch


def _cross_entropy_s(net, tokens, micro_batch, tensor):
    """Three all-reduces of ``s b`` fp32 values over the tensor group (module docstring)."""
    a, bw = tier_of(net, tensor, tensor > net.devices_per_node)
    nbytes = 4.0 * tokens * micro_batch
    one = jnp.minimum(ring_allreduce_s(tensor, nbytes, a, bw), tree_allreduce_s(tensor, nbytes, a, bw))
    return jnp.where(tensor > 1, 3.0 * one, 0.0)


@functools.partial(jax.jit, static_argnames=("settings", "vocab_parallel", "dropout"))
def segment_costs(arrays, hw: HardwareArrays, micro_batch, tensor, options, segment,
                  settings: CostSettings = CostSettings(dtype="float16"), vocab_parallel: bool = True,
                  dropout: bool = False) -> SegmentCosts:
    """Each segment's costs (module docstring) for ``micro_batch`` samples on
    ``tensor`` devices; ``options`` [L] the layers' option codes in the
    table of ``settings`` (without levers: the strategy), ``segment`` [L]
    their segment ids (padding rows: any; they cost nothing); ``dropout``:
    the model drops out, and its dropout kernels count
    (:mod:`costmodels.pipeline._dropout`)."""
    a = arrays
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    b, t = f32(micro_batch), f32(tensor)
    table = cost_table(a, hw, b, 1.0, t, settings)
    O = table.compute_s.shape[1]
    probs = one_hot(options, O)  # [L, O]
    strategy = jnp.asarray(options) // levers_per_strategy(O)  # [L]
    real = f32(a.mask)
    kind = jnp.asarray(a.kind).astype(jnp.int32)
    embed = (kind == LayerKind.EMBED) & vocab_parallel
    compute = jnp.sum(probs * table.compute_s, axis=-1)
    backward = jnp.sum(probs * table.backward_compute_s, axis=-1)
    halo = jnp.sum(probs * table.halo_s, axis=-1)
    if dropout:
        drop_fwd, drop_bwd = dropout_s(hw, a, strategy, b, t, settings.activation_bytes)
        compute, backward = compute + drop_fwd + drop_bwd, backward + drop_bwd

    # the edges' conversions, forward and backward (costmodels/_layer_terms.py), a vocabulary-parallel
    # embedding's output as partial sums
    lay = strategy_layouts(kind)  # [L, S, 4]
    lay = lay.at[..., 1].set(jnp.where(embed[:, None], Layout.PARTIAL, lay[..., 1]))
    src, dst = jnp.asarray(a.edge_src).astype(jnp.int32), jnp.asarray(a.edge_dst).astype(jnp.int32)
    emask = f32(a.edge_mask)
    net = hw.network
    ma, mb = tier_of(net, t, t > net.devices_per_node)
    pad = row_padding(f32(a.out_spatial[:, 0]), t)
    fwd, bwd = edge_reshard_parts_s(f32(a.out_elements)[src] * b * settings.activation_bytes, pad[src], lay, src,
                                    dst, emask, t, ma, mb)
    e = jnp.arange(src.shape[0])
    fwd_e, bwd_e = fwd[e, strategy[src], strategy[dst]], bwd[e, strategy[src], strategy[dst]]  # [E]

    has_consumer = jnp.zeros(kind.shape[0]).at[src].max(emask)
    tokens = f32(a.out_spatial[:, 0])
    vocab_split_sink = vocab_parallel & (has_consumer == 0) & (strategy == Strategy.FILTER) & (real > 0)
    loss = jnp.where(vocab_split_sink, _cross_entropy_s(net, tokens, b, t), 0.0)  # [L]

    params = jnp.take_along_axis(_local_params(a, f32(a.params), t), strategy[:, None], axis=1)[:, 0]
    params = jnp.where(embed, f32(a.params) / t, params)
    seg = jnp.where(real > 0, jnp.asarray(segment).astype(jnp.int32), NUM_SEGMENTS)  # padding: dropped
    by_segment = lambda x: jax.ops.segment_sum(x, seg, NUM_SEGMENTS + 1)[:NUM_SEGMENTS]  # noqa: E731
    attention = (kind == LayerKind.ATTENTION) | (kind == LayerKind.CAUSAL_ATTENTION)
    return SegmentCosts(
        forward_s=by_segment(compute - backward),
        backward_s=by_segment(backward),
        forward_comm_s=by_segment(jax.ops.segment_sum(fwd_e, dst, kind.shape[0]) + loss),
        backward_comm_s=by_segment(jax.ops.segment_sum(bwd_e, dst, kind.shape[0]) + halo),
        attention_forward_s=by_segment(jnp.where(attention, compute - backward, 0.0)),
        params=by_segment(params),
        feasible=jnp.all(jnp.take_along_axis(table.feasible, jnp.asarray(options)[:, None], axis=1)[:, 0]
                         | (real == 0)),
    )
