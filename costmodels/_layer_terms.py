"""The per-layer terms of :func:`costmodels.cost_table` that follow one
mechanism each (private): the spatial strategy's exchanges inside a layer,
the resharding on edges, the sink layers' outputs to the loss, and the
activation and workspace bytes. Each returns ``[L, S]`` (edges ``[E, S,
S]``) and is traced inside the table's ``jit``."""

from __future__ import annotations

import jax.numpy as jnp

from costmodels.collectives import p2p_s
from costmodels.layers import key_value_channels
from costmodels.reshard import conversion_s
from costmodels.shards import halo_rows, row_padding
from costmodels.strategies import Layout, Strategy, layout_split

__all__ = ["activation_workspace_bytes", "edge_reshard_parts_s", "edge_reshard_s", "halo_s", "loss_output_s",
           "loss_workspace_bytes"]

LOSS_BYTES_PER_ELEMENT = 4.0  # the loss runs on fp32 logits under every dtype (planner.runtime.export)


def halo_s(a, attention, group_batch, delta, m, ma, mb, dst, emask, params):
    """The spatial strategy's exchanges inside each layer, ``[L, S]`` seconds
    (0 off ``spatial``), fwd + bwd, and what a recomputed forward exchanges
    again; with ``[L]`` the keys' elements per sample of an attention.

    Spatial halo exchange (ParaDL §4.4, sizes corrected per §9): a shard needs
    (K-1)*dilation + 1 - stride rows beyond its own along the split dim, half
    from each neighbour. Forward: rows of x. Backward: rows of dL/dy for the
    input gradient, which a layer fed by the model input never computes; and
    rows of x again for the weight gradient: XLA's SPMD partitioner
    re-exchanges the input's halo rather than keeping the forward's
    (measured, docs/validation.md).

    Sequence parallelism (spatial on an attention): every shard's queries meet
    every key, so each shard all-gathers the keys and the values (SPATIAL ->
    REPLICATED) forward, and reduce-scatters their gradients, summed over
    every shard's queries (PARTIAL -> SPATIAL), backward: the all-gather
    forward and reduce-scatter backward of Korthikanti et al. 2022 ("Reducing
    Activation Recomputation in Large Transformer Models", section 4.2.2),
    here for the keys and values as in Li et al. 2023 (sequence parallelism,
    section 3.2)."""
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    L, S = f32(a.kind).shape[0], len(Strategy)
    rows = halo_rows(a)
    lo, hi = jnp.floor(rows / 2.0), rows - jnp.floor(rows / 2.0)
    x_row = f32(a.in_channels) * f32(a.in_spatial[:, 1]) * f32(a.in_spatial[:, 2]) * group_batch * delta
    y_row = f32(a.out_channels) * f32(a.out_spatial[:, 1]) * f32(a.out_spatial[:, 2]) * group_batch * delta
    has_producer = jnp.zeros(L).at[dst].max(emask)  # [L] 0 for layers fed by the model input
    has_weights = (params > 0).astype(jnp.float32)  # [L]
    x_halo = p2p_s(lo * x_row, ma, mb) + p2p_s(hi * x_row, ma, mb)
    y_halo = p2p_s(lo * y_row, ma, mb) + p2p_s(hi * y_row, ma, mb)
    halo = x_halo + has_producer * y_halo + has_weights * x_halo  # forward + input gradient + weight gradient
    # [L] the keys (or the values) of the group, as split by rows (padded)
    kv_el = key_value_channels(f32(a.in_channels), f32(a.out_channels)) * f32(a.in_spatial[:, 0])  # [L] per sample
    kv_bytes = kv_el * group_batch * delta * row_padding(f32(a.in_spatial[:, 0]), m)
    kv = 2.0 * (conversion_s(Layout.SPATIAL, Layout.REPLICATED, kv_bytes, m, ma, mb)
                + conversion_s(Layout.PARTIAL, Layout.SPATIAL, kv_bytes, m, ma, mb))
    halo = jnp.where(attention, kv, halo)
    halo = jnp.where(jnp.arange(S) == Strategy.SPATIAL, halo[:, None], 0.0)
    forward_halo = jnp.where(attention, 2.0 * conversion_s(Layout.SPATIAL, Layout.REPLICATED, kv_bytes, m, ma, mb),
                             x_halo)  # [L] what a recomputed forward exchanges again
    forward_halo = jnp.where(jnp.arange(S) == Strategy.SPATIAL, forward_halo[:, None], 0.0)
    return halo, forward_halo, kv_el


def edge_reshard_s(edge_bytes, src_pad, lay, src, dst, emask, m, ma, mb):
    """``[E, S, S]`` seconds converting each edge's tensor (``edge_bytes``
    ``[E]``, ``src_pad`` its row-split padded share) from its producer's
    output layout to its consumer's input layout forward, and its gradient
    back, for every pair of strategies."""
    fwd, bwd = edge_reshard_parts_s(edge_bytes, src_pad, lay, src, dst, emask, m, ma, mb)
    return fwd + bwd


def edge_reshard_parts_s(edge_bytes, src_pad, lay, src, dst, emask, m, ma, mb):
    """:func:`edge_reshard_s`'s forward and backward conversions, ``[E, S, S]`` each."""
    out_lay, in_lay, gin_lay, gout_lay = lay[..., 1], lay[..., 0], lay[..., 2], lay[..., 3]
    edge_bytes = edge_bytes[:, None, None]  # [E, 1, 1]
    by_rows = lambda x, y: (x == Layout.SPATIAL) | (y == Layout.SPATIAL)  # noqa: E731 (a conversion of a row-split tensor)
    src_out, dst_in = out_lay[src][:, :, None], in_lay[dst][:, None, :]
    fwd = conversion_s(src_out, dst_in, edge_bytes * jnp.where(by_rows(src_out, dst_in), src_pad[:, None, None], 1.0),
                       m, ma, mb)
    src_gout, dst_gin = gout_lay[src][:, :, None], gin_lay[dst][:, None, :]
    bwd = conversion_s(dst_gin, src_gout,
                       edge_bytes * jnp.where(by_rows(dst_gin, src_gout), src_pad[:, None, None], 1.0), m, ma, mb)
    return fwd * emask[:, None, None], bwd * emask[:, None, None]


def loss_output_s(out_bytes, pad, lay, src, emask, real, m, ma, mb):
    """``[L, S]`` seconds: a sink layer's output feeds the loss: where it,
    computed batch-split, as is; otherwise gathered to every group member (the
    loss gradient then needs no collective: slicing a replicated tensor is
    free)."""
    out_lay, gout_lay = lay[..., 1], lay[..., 3]
    has_consumer = jnp.zeros(out_bytes.shape[0]).at[src].max(emask)
    out_bytes = out_bytes[:, None] * jnp.where(out_lay == Layout.SPATIAL, pad[:, None], 1.0)
    loss_layout = jnp.where(out_lay == Layout.BATCH, Layout.BATCH, Layout.REPLICATED)
    to_loss = conversion_s(out_lay, loss_layout, out_bytes, m, ma, mb) + conversion_s(
        loss_layout, gout_lay, out_bytes, m, ma, mb
    )
    return jnp.where((has_consumer == 0)[:, None] & (real > 0)[:, None], to_loss, 0.0)


def loss_workspace_bytes(out_el, lay, group_batch, src, emask, real, m):
    """``[L, S]`` bytes per device a sink layer's loss step holds beyond the
    saved activations: the softmax cross-entropy (optax's
    ``softmax_cross_entropy_with_integer_labels``, the export's loss) keeps
    two logits-sized fp32 buffers in the loss's layout, ``exp(z - max z)``
    and the logits' gradient ``softmax(z) - onehot(y)``, both live at once
    at the backward pass's start (XLA:CPU's live ranges, jaxlib 0.10.2:
    ``subtract_exponential_fusion`` and ``broadcast_multiply_fusion`` at the
    peak; docs/validation.md, "The loss step"). The loss's layout is
    :func:`loss_output_s`'s: the sink's batch split where it is batch-split,
    else its output gathered over the model axis (a ``filter`` output layer's
    logits whole on every member of its model group)."""
    out_lay = lay[..., 1]
    has_consumer = jnp.zeros(out_el.shape[0]).at[src].max(emask)
    loss_layout = jnp.where(out_lay == Layout.BATCH, Layout.BATCH, Layout.REPLICATED)
    logits = LOSS_BYTES_PER_ELEMENT * group_batch * out_el[:, None] / layout_split(loss_layout, m)  # [L, S] one buffer
    return jnp.where((has_consumer == 0)[:, None] & (real > 0)[:, None], 2.0 * logits, 0.0)


def activation_workspace_bytes(a, attention, kv_el, in_lay, out_lay, group_batch, delta, m, cpu: bool,
                               loss_bytes=0.0):
    """``[L, S]`` bytes per device a layer keeps for the backward pass, and
    its transient workspace beyond them at its backward step; ``loss_bytes``
    ``[L, S]`` is a sink layer's loss step (:func:`loss_workspace_bytes`),
    its workspace where larger."""
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    split_of = lambda layout: layout_split(layout, m)  # noqa: E731
    strat = jnp.arange(len(Strategy))[None, :]
    in_el, out_el = f32(a.in_elements), f32(a.out_elements)
    activation = f32(a.saved_elements)[:, None] * group_batch * delta / split_of(in_lay)
    # A sequence-parallel attention keeps the gathered keys and values, not its shard of them.
    gathered_kv = 2.0 * kv_el * group_batch * delta * (1.0 - 1.0 / m)  # [L] the other shards' rows
    activation = activation + jnp.where(attention[:, None] & (strat == Strategy.SPATIAL), gathered_kv[:, None], 0.0)
    # Transient beyond the saved activations: the layer's input and output gradients at
    # its backward step (its input and output themselves are saved activations already).
    workspace = delta * group_batch * (in_el[:, None] / split_of(in_lay) + out_el[:, None] / split_of(out_lay))
    # An attention's backward step also materialises the gradients of its probabilities and
    # of its scores, dP = dO V^T and dS = P * (dP - rowsum(dO * O)), heads x tokens^2 each
    # per sample, split as the probabilities are (Dao et al. 2022, FlashAttention, section
    # 2.2 and Algorithm 3, the standard attention's backward pass).
    scores = jnp.where(attention, f32(a.groups) * jnp.square(f32(a.out_spatial[:, 0])), 0.0)  # [L] per sample
    probs = delta * group_batch * scores[:, None] / split_of(in_lay)  # [L, S] one probability-sized buffer
    workspace = workspace + 2.0 * probs
    if cpu:
        # XLA:CPU also keeps the probabilities transposed, for dV = P^T dO: its layout
        # assignment copies them in the forward pass (`copy_bitcast_fusion`: 2 probability-sized
        # buffers kept per layer, with the custom-JVP softmax the export uses; 1 where XLA:CPU
        # runs both products as one YNN fusion, which this does not tell apart:
        # docs/transformers.md). A saved activation: the remat lever recomputes it.
        activation = activation + probs
    # A sink layer's loss step comes right before its backward step, with the same saved
    # activations live: the layer's transient is the larger of the two.
    workspace = jnp.maximum(workspace, loss_bytes)
    return activation, workspace
