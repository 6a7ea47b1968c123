"""The per-layer strategy menu and the activation layouts each strategy
consumes and produces.

A plan runs on a 2-D mesh ``(data, model)`` of ``P = d * m`` devices; the
model axis lives inside a node by default (SplitBrain's groups,
SplitBrain §1.2). Along the data axis every strategy splits the batch;
the strategies differ in what they do along the model axis:

============  =====================================  =========================
strategy      per device                             ParaDL / SplitBrain name
============  =====================================  =========================
data          batch / (d m), full weights             data (ParaDL §4.3)
filter        batch / d, output channels / m          filter (§4.6), SplitBrain's sharded FC
channel       batch / d, input channels / m           channel (§4.7)
spatial       batch / d, first spatial dim / m        spatial (§4.4), ds (§4.9)
replicated    batch / d, the same work on all m       the replicated layers of §2
============  =====================================  =========================

On per-channel layers (batch norm, pooling, activations, adds, products)
``filter`` means the channels are split over the model axis, so a
filter-sharded conv can feed them without gathering. The same holds for
self-attention, whose channels are its heads: ``filter`` splits the heads
(Megatron-LM's attention, Shoeybi et al. 2019 §3), and ``spatial`` splits
the tokens (sequence parallelism), each shard gathering every shard's keys
and values (:mod:`costmodels.table`). An embedding lookup is a parameter
layer whose table's columns (the output features) ``filter`` splits.

With these layouts a transformer block on ``filter`` for its first dense
layer (column parallel) and ``channel`` for its second (row parallel)
converts ``PARTIAL -> REPLICATED`` once after the second, an all-reduce,
and the same once in the backward pass before the first: Megatron-LM's
pattern (§3, its ``f`` and ``g`` operators) comes out of the layout tables.

A *layout* is the state of an activation along the model axis: split by
batch (``BATCH``), replicated (``REPLICATED``), split by channels
(``CHANNEL``), split by the first spatial dim (``SPATIAL``), or holding
partial sums (``PARTIAL``). Resharding costs come from converting one
layout into another (:mod:`costmodels.reshard`), never from special cases.
"""

from __future__ import annotations

import enum

import jax.numpy as jnp
import numpy as np

from costmodels.layers import (
    ATTENTION_KINDS,
    CHANNELWISE_KINDS,
    LayerKind,
    is_kind,
    key_value_heads,
    tied_output,
)

__all__ = [
    "AXIS_NAMES",
    "DATA_AXIS",
    "MODEL_AXIS",
    "NUM_STRATEGIES",
    "Strategy",
    "Layout",
    "STRATEGY_NAMES",
    "strategy_layouts",
    "io_layout_names",
    "layout_split",
    "strategy_mask",
    "parse_strategy",
]

# The 2-D device mesh every plan runs on: the batch splits over "data", a layer's
# channels, features or rows over "model" (the one set of axis names).
DATA_AXIS = "data"
MODEL_AXIS = "model"
AXIS_NAMES = (DATA_AXIS, MODEL_AXIS)


class Strategy(enum.IntEnum):
    DATA = 0
    FILTER = 1
    CHANNEL = 2
    SPATIAL = 3
    REPLICATED = 4


STRATEGY_NAMES = tuple(s.name.lower() for s in Strategy)
NUM_STRATEGIES = len(Strategy)


def parse_strategy(name: str) -> Strategy:
    try:
        return Strategy[name.upper()]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; choose from {', '.join(STRATEGY_NAMES)}") from None


class Layout(enum.IntEnum):
    BATCH = 0
    REPLICATED = 1
    CHANNEL = 2
    SPATIAL = 3
    PARTIAL = 4


B, R, C, H, P = (int(x) for x in Layout)

# Per strategy: (input layout, output layout, layout of the input gradient the
# layer produces, layout of the output gradient the layer needs).
#   parameter layers (conv, dense):
_PARAM_LAYOUTS = np.array(
    [
        [B, B, B, B],  # data
        [R, C, P, C],  # filter: y = x w[:, F/m]; dx = sum over m of partial dx (ParaDL §4.6)
        [C, P, C, R],  # channel: y = sum over m of x[C/m] w[C/m]; dx split by C (ParaDL §4.7)
        [H, H, H, H],  # spatial (halo handled inside the layer, ParaDL §4.4)
        [R, R, R, R],  # replicated
    ]
)
#   per-channel layers without a channel contraction (bn, pool, activation, add):
_CHANNELWISE_LAYOUTS = np.array(
    [
        [B, B, B, B],
        [C, C, C, C],  # channels split: no communication
        [R, R, R, R],  # (masked: channel parallelism needs a contraction)
        [H, H, H, H],
        [R, R, R, R],
    ]
)


def io_layout_names(param_layer: bool, gradients: bool = False) -> dict[str, tuple[str, str]]:
    """Strategy name -> (input, output) layout names of a parameter layer
    (conv, dense) or of a per-channel layer: the tables above, for export.
    With ``gradients``: (input gradient produced, output gradient needed)."""
    table = _PARAM_LAYOUTS if param_layer else _CHANNELWISE_LAYOUTS
    i, o = (2, 3) if gradients else (0, 1)
    return {
        name: (Layout(int(row[i])).name.lower(), Layout(int(row[o])).name.lower())
        for name, row in zip(STRATEGY_NAMES, table, strict=True)
    }


def _is_param_layer(kind):
    return (kind == LayerKind.CONV) | (kind == LayerKind.DENSE) | (kind == LayerKind.EMBED)



def strategy_layouts(kind):
    """Layouts ``[L, S, 4]`` (input, output, input-gradient produced,
    output-gradient needed) for layer kinds ``[L]``."""
    param = _is_param_layer(jnp.asarray(kind))[:, None, None]
    return jnp.where(param, jnp.asarray(_PARAM_LAYOUTS), jnp.asarray(_CHANNELWISE_LAYOUTS))


def layout_split(layout, m):
    """How many ways the model axis (``m`` devices) splits a tensor in a
    layout, elementwise: 1 replicated or as partial sums, else ``m``."""
    return jnp.where((layout == Layout.REPLICATED) | (layout == Layout.PARTIAL), 1.0, m)


def strategy_mask(arrays, batch, d, m):
    """Which strategies can run each layer, ``[L, S]`` bool.

    Rules: every device gets a whole number of samples, at least one
    (``data`` needs ``d m`` to divide the batch, the others ``d``); ``filter`` needs ``m`` to
    divide the output channels (and, on a conv, no feature groups);
    ``channel`` is for convs and dense layers whose input channels ``m``
    divides; ``spatial`` needs a spatial input whose first dim, in and out,
    gives every shard at least two rows (``>= 2 m``; ``>= 1`` when
    ``m = 1``; an element-wise layer that adds positions, a class token,
    needs as many out as in); a norm (``NORM``: statistics over the
    channels) runs neither ``filter`` nor ``channel``; an attention's
    ``filter`` needs ``m`` to divide its query heads (``groups``) and its
    key-value heads (grouped-query attention); an embedding
    (``EMBED``) has one input channel, its ids, so ``channel`` never splits
    it; a tied table (a dense layer with no parameters of its own, and the
    embeddings of its graph) is split by neither ``filter`` nor ``channel``; flatten and unmodelled layers (``OTHER``) only run
    ``data`` / ``replicated`` (flatten) or ``replicated`` (other). Padding
    rows allow every strategy (they cost nothing under any)."""
    a = arrays
    kind = jnp.asarray(a.kind)
    m = jnp.asarray(m, jnp.float32)
    d = jnp.asarray(d, jnp.float32)
    batch = jnp.asarray(batch, jnp.float32)
    param = _is_param_layer(kind)
    real = jnp.asarray(a.mask) > 0
    divides = lambda x: jnp.mod(x, m) == 0  # noqa: E731
    channelwise = is_kind(kind, CHANNELWISE_KINDS)
    attention = is_kind(kind, ATTENTION_KINDS)
    # [L] a head split splits whole key-value heads too (padding rows: 1)
    kv_heads = jnp.where(attention, key_value_heads(jnp.asarray(a.in_channels),
                                                    jnp.maximum(jnp.asarray(a.out_channels), 1.0),
                                                    jnp.asarray(a.groups)), 1.0)
    # A norm's statistics run over a position's channels: split by channels they would need an
    # all-reduce the model does not count, so a norm runs data, spatial (positions split) or replicated.
    spatial_kinds = param | channelwise | (kind == LayerKind.CONCAT) | (kind == LayerKind.NORM)
    data_ok = (batch >= d * m) & (jnp.mod(batch, d * m) == 0) & (kind != LayerKind.OTHER)
    filter_ok = (param & divides(a.out_channels) & (a.groups == 1)) | (channelwise & divides(a.out_channels)
                                                                      & (~attention | (divides(a.groups)
                                                                                       & divides(kv_heads))))
    channel_ok = param & divides(a.in_channels) & (a.groups == 1)
    # A dense layer owning no parameters is an output layer tied to an embedding's table:
    # the lookup and it would need the one table in two layouts, which is not modelled, so
    # neither splits it (filter / channel) where the graph has one.
    tied = tied_output(kind, jnp.asarray(a.params)) & real
    shares_table = tied | ((kind == LayerKind.EMBED) & jnp.any(tied))
    filter_ok = filter_ok & ~shares_table
    channel_ok = channel_ok & ~shares_table
    # At least two rows per shard, in and out, once the model axis splits: where a shard
    # holds one row, XLA's partitioner gathers kernel-sized buffers for the weight
    # gradient instead of exchanging halos (VGG16-CIFAR-10 at 4x2: 113 MB of all-gathers
    # where 65 kB are predicted; XLA SPMD partitioner, measured, docs/validation.md).
    min_rows = jnp.where(m > 1, 2.0 * m, m)
    # An element-wise layer that changes the positions (a class token put in front) would
    # shift every shard's rows: spatial keeps the rows where they are.
    shifts = (kind == LayerKind.ELEMENTWISE) & (a.in_spatial[:, 0] != a.out_spatial[:, 0])
    spatial_ok = (spatial_kinds & (a.spatial_rank >= 1) & (a.in_spatial[:, 0] >= min_rows)
                  & (a.out_spatial[:, 0] >= min_rows) & ~shifts)
    model_ok = (batch >= d) & (jnp.mod(batch, d) == 0)
    mask = jnp.stack(
        [data_ok, filter_ok & model_ok, channel_ok & model_ok, spatial_ok & model_ok, model_ok & jnp.ones_like(real)],
        axis=-1,
    )
    return jnp.where(real[:, None], mask, True)
