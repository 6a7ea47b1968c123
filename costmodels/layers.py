"""Layer arrays: the data contract between the model frontends (``planner``)
and the cost models (``costmodels``) and solvers (``search``).

A model is costed from per-layer numeric arrays (:class:`LayerArrays`, one
row per layer, padded to a bucket: :func:`bucket_size`) plus a little static
metadata (layer names and kinds, edges). :class:`LayerTable` is that data as
the cost-model functions read it; ``planner.LayerGraph`` (the layer IR, with
its builders, file formats and fingerprint) is one. Shapes are per sample,
channels first then up to three spatial dims, padded with 1 (see
``planner.ir.graph``).
"""

from __future__ import annotations

import enum
import math
from typing import Any, NamedTuple, Protocol

__all__ = [
    "ATTENTION_KINDS",
    "CHANNELWISE_KINDS",
    "LAYER_TYPES",
    "LayerArrays",
    "LayerKind",
    "LayerTable",
    "MAX_SPATIAL_DIMS",
    "MIN_BUCKET",
    "LAYER_FIELDS",
    "VECTOR_FIELDS",
    "bucket_size",
    "is_kind",
    "key_value_channels",
    "key_value_heads",
    "read_parameter_fraction",
    "token_lookups",
    "tied_output",
    "kind_name",
    "layer_type",
]

MAX_SPATIAL_DIMS = 3
MIN_BUCKET = 8

# ParaDL §5: the NAME substrings of a ParaDL .net layer, in the order they are tried.
LAYER_TYPES: tuple[str, ...] = ("CONV", "MPOOL", "APOOL", "RELU", "FC", "BNORM", "ADD", "DROPOUT")


def layer_type(name: str) -> str | None:
    """ParaDL's layer type of a layer NAME: the first of :data:`LAYER_TYPES`
    that is a substring of it, or ``None``."""
    for t in LAYER_TYPES:
        if t in name:
            return t
    return None


class LayerKind(enum.IntEnum):
    """Layer kinds; the integer code is what ``LayerArrays.kind`` stores."""

    PAD = 0  # a masked, zero-cost row added by bucketing
    CONV = 1  # 1-D / 2-D / 3-D by ``spatial_rank``
    DENSE = 2
    POOL = 3  # max or average pooling, global pooling included
    BATCH_NORM = 4
    ELEMENTWISE = 5  # activations, dropout, scaling
    ADD = 6
    CONCAT = 7
    FLATTEN = 8
    OTHER = 9  # an op with no dedicated model: replicated, cost from FLOPs
    NORM = 10  # layer / RMS normalisation over each position's channels (transformers)
    ATTENTION = 11  # self-attention of (queries, keys, values), one fused input or three; groups = query heads
    CAUSAL_ATTENTION = 12  # the same, each position attending to itself and the ones before it
    EMBED = 13  # a lookup of token ids (1 input channel) in a learned table of out_channels columns
    MULTIPLY = 14  # element-wise product of equal-shaped activations (a gated MLP's gate)


# Kinds whose strategies split the channels without a contraction over them (filter =
# channels split, no communication; costmodels.strategies' per-channel layout table).
CHANNELWISE_KINDS = (
    LayerKind.POOL, LayerKind.BATCH_NORM, LayerKind.ELEMENTWISE, LayerKind.ADD, LayerKind.MULTIPLY,
    LayerKind.ATTENTION, LayerKind.CAUSAL_ATTENTION,
)
ATTENTION_KINDS = (LayerKind.ATTENTION, LayerKind.CAUSAL_ATTENTION)


def is_kind(kind: Any, kinds: tuple[LayerKind, ...]) -> Any:
    """Elementwise ``kind in kinds`` for an array of kind codes (numpy or jax)."""
    out = kind == kinds[0]
    for k in kinds[1:]:
        out = out | (kind == k)
    return out


def key_value_channels(in_channels: Any, out_channels: Any) -> Any:
    """Channels of an attention's keys (as many as its values), elementwise:
    its fused input holds the queries (as many channels as its output), the
    keys and the values, ``(in - out) / 2`` (``GraphBuilder.attention``;
    the output's under multi-head attention, fewer under grouped-query
    attention). Meaningless on other kinds."""
    return (in_channels - out_channels) / 2.0


def key_value_heads(in_channels: Any, out_channels: Any, heads: Any) -> Any:
    """An attention's key-value heads, elementwise: its key channels over the
    head dim (``out_channels / heads``). Meaningless on other kinds."""
    return key_value_channels(in_channels, out_channels) * heads / out_channels


def tied_output(kind: Any, params: Any) -> Any:
    """Elementwise: the rows that are an output layer tied to an embedding's
    table (a dense layer that owns no parameters: the table is the
    embedding's; ``GraphBuilder.dense(tied=True)``)."""
    return (kind == LayerKind.DENSE) & (params <= 0)


def read_parameter_fraction(kind: Any, params: Any, out_elements: Any) -> Any:
    """Elementwise: the share of a layer's parameters that receives a
    gradient. An element-wise layer reads its parameters element by element
    against its output, so at most one per output element: a position table
    sliced to the sequence (``pos[:, :seq]``) gets its gradient in the rows
    read, and the slice's transpose pads the reduced sum with zeros (XLA
    reduces the rows read only: measured on the linen GPT,
    docs/validation.md). 1 on every other kind and where nothing is held."""
    elementwise = (kind == LayerKind.ELEMENTWISE) & (params > out_elements)
    read = out_elements / (params + (params <= 0))  # no 0 / 0 where nothing is held
    return 1.0 + elementwise * (read - 1.0)


def token_lookups(table: LayerTable) -> tuple[int, ...]:
    """The layers that read the model input as token ids: embeddings no edge
    feeds. A model with one is a language model, trained with a label per
    token (the loss's labels, the input batch's bytes)."""
    fed = {v for _, v in table.edges}
    kinds = table.unpadded().kind
    return tuple(i for i in range(table.num_layers) if int(kinds[i]) == LayerKind.EMBED and i not in fed)


def kind_name(kind: int, spatial_rank: int) -> str:
    """Display name of a layer kind: ``conv2d``, ``dense``, ``pool``, ..."""
    kind = LayerKind(int(kind))
    if kind is LayerKind.CONV:
        return f"conv{int(spatial_rank)}d"
    return {
        LayerKind.PAD: "pad",
        LayerKind.DENSE: "dense",
        LayerKind.POOL: "pool",
        LayerKind.BATCH_NORM: "batch_norm",
        LayerKind.ELEMENTWISE: "elementwise",
        LayerKind.ADD: "add",
        LayerKind.CONCAT: "concat",
        LayerKind.FLATTEN: "flatten",
        LayerKind.OTHER: "other",
        LayerKind.NORM: "norm",
        LayerKind.ATTENTION: "attention",
        LayerKind.CAUSAL_ATTENTION: "causal_attention",
        LayerKind.EMBED: "embed",
        LayerKind.MULTIPLY: "multiply",
    }[kind]


class LayerArrays(NamedTuple):
    """Per-layer arrays of a model (a pytree). ``L`` is the bucketed layer count,
    ``E`` the bucketed edge count. All counts are per sample."""

    mask: Any  # [L] 1.0 for a real layer, 0.0 for a padding row
    kind: Any  # [L] LayerKind code (float, exact small integers)
    spatial_rank: Any  # [L] spatial dims of the input: 0 (dense/flat), 1, 2 or 3
    out_spatial_rank: Any  # [L] spatial dims of the output (0 after flatten or a global pool)
    in_channels: Any  # [L] channels of the (first) input
    in_spatial: Any  # [L, 3] spatial dims of the input, padded with 1
    out_channels: Any  # [L] output channels
    out_spatial: Any  # [L, 3] spatial dims of the output, padded with 1
    kernel: Any  # [L, 3] kernel / pooling window, 1 where absent
    stride: Any  # [L, 3]
    dilation: Any  # [L, 3] kernel dilation
    pad_lo: Any  # [L, 3] padding before, elements
    pad_hi: Any  # [L, 3] padding after, elements
    groups: Any  # [L] feature groups of a conv, heads of an attention (1 otherwise)
    params: Any  # [L] trainable parameter count (weights + biases + BN scale/shift)
    buffers: Any  # [L] non-trainable state elements (BN running statistics)
    flops_fwd: Any  # [L] forward FLOPs per sample (padding-aware, XLA's counting)
    flops_bwd_data: Any  # [L] backward FLOPs w.r.t. the layer input, per sample
    flops_bwd_weight: Any  # [L] backward FLOPs w.r.t. the parameters, per sample
    saved_elements: Any  # [L] activation elements kept for the backward pass, per sample
    edge_src: Any  # [E] producing layer of each edge (int-valued)
    edge_dst: Any  # [E] consuming layer of each edge (int-valued)
    edge_mask: Any  # [E] 1.0 for a real edge, 0.0 for padding

    @property
    def in_elements(self) -> Any:  # [L] input elements per sample
        return self.in_channels * self.in_spatial.prod(axis=-1)

    @property
    def out_elements(self) -> Any:  # [L] output elements per sample
        return self.out_channels * self.out_spatial.prod(axis=-1)

    @property
    def flops_total(self) -> Any:  # [L] forward + backward FLOPs per sample
        return self.flops_fwd + self.flops_bwd_data + self.flops_bwd_weight


LAYER_FIELDS = tuple(f for f in LayerArrays._fields if not f.startswith("edge_"))  # one value per layer
VECTOR_FIELDS = ("in_spatial", "out_spatial", "kernel", "stride", "dilation", "pad_lo", "pad_hi")  # [L, 3]


def bucket_size(n: int) -> int:
    """The padded size for ``n`` rows: the next power of two, at least 8.

    Models whose layer (and edge) counts fall in the same bucket produce
    arrays of identical shapes, so jitted cost functions compile once for all
    of them."""
    if n < 0:
        raise ValueError(f"row count must be non-negative, got {n}")
    return max(MIN_BUCKET, 1 << max(0, math.ceil(math.log2(max(n, 1)))))


class LayerTable(Protocol):
    """A model's layers as the cost models read them (``planner.LayerGraph``
    is one): real layers first in ``arrays``, then padding rows."""

    arrays: LayerArrays  # [L] rows, [E] edges, padded
    names: tuple[str, ...]  # the real layers' names, unique
    model_name: str
    measured_time_per_sample_s: float | None  # forward + backward time of the whole net, if measured

    @property
    def num_layers(self) -> int: ...

    @property
    def edges(self) -> tuple[tuple[int, int], ...]: ...

    @property
    def kind_names(self) -> tuple[str, ...]: ...

    def unpadded(self) -> LayerArrays: ...
