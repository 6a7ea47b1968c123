"""The layer IR: ``LayerGraph``, the contract between ``planner`` and ``costmodels``.

A ``LayerGraph`` describes one CNN for training, per sample (batch size is a
parameter of every cost function, never baked in). It has two parts:

* ``arrays`` (:class:`LayerArrays`): per-layer numeric arrays, one row per
  layer, so every cost can be evaluated without a Python loop over layers.
  Counts (FLOPs, elements, parameters) are ``float64`` numpy arrays on the
  host, exact up to 2**53; under ``jit`` with x64 off they become ``float32``.
  Layer counts are padded to a bucket (:func:`bucket_size`) with masked
  zero-cost rows so that models of similar size share one compilation.
* static metadata: names, kind names, model name, input shape, and an
  optional measured per-sample time (ParaDL ``.net`` files carry one).

DAG edges (residual adds, concatenations) are arrays too (``edge_src``,
``edge_dst``), padded and masked like the layers.

Shapes are per sample, channels first then up to three spatial dims, padded
with 1: a 2-D conv on an NHWC tensor of spatial size (H, W) has
``in_spatial = (H, W, 1)``; a 3-D conv on (D, H, W) has ``(D, H, W)``; a
dense layer has ``(1, 1, 1)``. The first spatial dim is the one spatial
parallelism splits (height, or depth in 3-D).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
from typing import Any, NamedTuple

import jax
import numpy as np

__all__ = [
    "LayerKind",
    "LayerArrays",
    "LayerGraph",
    "GRAPH_SCHEMA",
    "GRAPH_VERSION",
    "bucket_size",
    "kind_name",
]

GRAPH_SCHEMA = "shardplan/layer-graph"
GRAPH_VERSION = 1
MAX_SPATIAL_DIMS = 3
MIN_BUCKET = 8


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
    groups: Any  # [L] feature groups of a conv (1 otherwise)
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


_LAYER_FIELDS = tuple(f for f in LayerArrays._fields if not f.startswith("edge_"))
_VECTOR_FIELDS = ("in_spatial", "out_spatial", "kernel", "stride", "dilation", "pad_lo", "pad_hi")


def bucket_size(n: int) -> int:
    """The padded size for ``n`` rows: the next power of two, at least 8.

    Models whose layer (and edge) counts fall in the same bucket produce
    arrays of identical shapes, so jitted cost functions compile once for all
    of them."""
    if n < 0:
        raise ValueError(f"row count must be non-negative, got {n}")
    return max(MIN_BUCKET, 1 << max(0, math.ceil(math.log2(max(n, 1)))))


@dataclasses.dataclass(frozen=True)
class LayerGraph:
    """A CNN as per-layer arrays plus static metadata.

    ``arrays`` holds ``num_layers`` real rows and ``num_edges`` real edges
    followed by padding. Build one with :func:`planner.GraphBuilder`, the
    zoo (:func:`planner.get_model`), the ParaDL importer or
    :func:`planner.extract`; never by hand-filling arrays.
    """

    arrays: LayerArrays
    names: tuple[str, ...]  # real layers only; unique
    model_name: str
    input_shape: tuple[int, ...]  # per sample, channels first: (C, H, W) or (C, D, H, W)
    measured_time_per_sample_s: float | None = None  # FW+BW time of the whole net, if measured

    def __post_init__(self) -> None:
        n = len(self.names)
        rows = int(np.shape(self.arrays.mask)[0])
        if rows < n:
            raise ValueError(f"LayerGraph has {n} names but only {rows} rows")
        if len(set(self.names)) != n:
            dup = sorted({x for x in self.names if self.names.count(x) > 1})
            raise ValueError(f"LayerGraph layer names must be unique; repeated: {dup[:5]}")

    # -- sizes -------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return len(self.names)

    @property
    def num_edges(self) -> int:
        return int(np.sum(np.asarray(self.arrays.edge_mask)))

    @property
    def edges(self) -> tuple[tuple[int, int], ...]:
        a = self.arrays
        e = self.num_edges
        return tuple(
            (int(s), int(d))
            for s, d in zip(np.asarray(a.edge_src)[:e], np.asarray(a.edge_dst)[:e], strict=True)
        )

    @property
    def kind_names(self) -> tuple[str, ...]:
        a = self.arrays
        return tuple(
            kind_name(k, r)
            for k, r in zip(
                np.asarray(a.kind)[: self.num_layers],
                np.asarray(a.spatial_rank)[: self.num_layers],
                strict=True,
            )
        )

    # -- totals (exact, float64 on the host) --------------------------------
    def total(self, field: str) -> float:
        """Sum of a per-layer field over the real layers, e.g. ``total("params")``."""
        if field not in _LAYER_FIELDS or field in _VECTOR_FIELDS:
            raise ValueError(f"no per-layer scalar field {field!r}")
        return float(np.sum(np.asarray(getattr(self.arrays, field), dtype=np.float64)))

    # -- padding -----------------------------------------------------------
    def padded(self, layers: int | None = None, edges: int | None = None) -> LayerGraph:
        """The same graph with its arrays padded to ``layers`` rows and ``edges``
        edges (default: the buckets of the real counts)."""
        layers = bucket_size(self.num_layers) if layers is None else layers
        edges = bucket_size(self.num_edges) if edges is None else edges
        if layers < self.num_layers or edges < self.num_edges:
            raise ValueError(
                f"cannot pad {self.num_layers} layers / {self.num_edges} edges "
                f"to {layers} / {edges}"
            )
        return dataclasses.replace(self, arrays=_pad_arrays(self.arrays, self.num_layers, self.num_edges, layers, edges))

    def unpadded(self) -> LayerArrays:
        """The arrays without padding rows (numpy, float64)."""
        return _pad_arrays(self.arrays, self.num_layers, self.num_edges, self.num_layers, self.num_edges)

    # -- JSON ----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        a = self.unpadded()
        layers = []
        for i, name in enumerate(self.names):
            row: dict[str, Any] = {"name": name}
            for f in _LAYER_FIELDS:
                if f == "mask":
                    continue
                v = np.asarray(getattr(a, f))[i]
                row[f] = [_num(x) for x in v] if f in _VECTOR_FIELDS else _num(v)
            layers.append(row)
        return {
            "schema": GRAPH_SCHEMA,
            "version": GRAPH_VERSION,
            "model_name": self.model_name,
            "input_shape": list(self.input_shape),
            "measured_time_per_sample_s": self.measured_time_per_sample_s,
            "layers": layers,
            "edges": [list(e) for e in self.edges],
        }

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @property
    def fingerprint(self) -> str:
        """A digest of what the plan depends on: every layer's name, kind,
        shapes, counts and the edges (not the model name, the measured time or
        the padding). Plans record it; applying a plan to a model whose graph
        has another fingerprint is an error."""
        d = self.to_dict()
        body = json.dumps({"input_shape": d["input_shape"], "layers": d["layers"], "edges": d["edges"]}, sort_keys=True)
        return "sha256:" + hashlib.sha256(body.encode()).hexdigest()[:32]

    @classmethod
    def from_dict(cls, data: Any) -> LayerGraph:
        from planner._graph_io import graph_from_dict  # local: keeps this module small

        return graph_from_dict(data)

    @classmethod
    def from_json(cls, text: str, source: str = "layer-graph JSON") -> LayerGraph:
        from costmodels.files import parse_json

        return cls.from_dict(parse_json(text, source))


def _num(x: Any) -> int | float:
    x = float(x)
    return int(x) if x.is_integer() and abs(x) < 2**53 else x


def _pad_arrays(a: LayerArrays, n: int, e: int, layers: int, edges: int) -> LayerArrays:
    out = {}
    for f in LayerArrays._fields:
        v = np.asarray(getattr(a, f), dtype=np.float64)
        real, total = (e, edges) if f.startswith("edge_") else (n, layers)
        v = v[:real]
        pad_shape = (total - real,) + v.shape[1:]
        fill = 1.0 if f in _VECTOR_FIELDS or f in ("in_channels", "out_channels", "groups") else 0.0
        out[f] = np.concatenate([v, np.full(pad_shape, fill)], axis=0)
    return LayerArrays(**out)


def _flatten(g: LayerGraph):
    return (g.arrays,), (g.names, g.model_name, g.input_shape, g.measured_time_per_sample_s)


def _unflatten(aux, children) -> LayerGraph:
    g = object.__new__(LayerGraph)  # skip validation: leaves may be tracers
    for k, v in zip(
        ("arrays", "names", "model_name", "input_shape", "measured_time_per_sample_s"),
        (children[0], *aux),
        strict=True,
    ):
        object.__setattr__(g, k, v)
    return g


# A LayerGraph is a pytree whose leaves are its arrays; the metadata is static.
# Jitted cost functions take ``graph.arrays`` so that models with different
# names but the same bucket share one compilation.
jax.tree_util.register_pytree_node(LayerGraph, _flatten, _unflatten)
