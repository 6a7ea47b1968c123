"""The layer IR: ``LayerGraph``, a model's layers as the cost models read them
(:class:`costmodels.layers.LayerTable`: its arrays and kinds live there).

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
import hashlib
import json
import math
from typing import Any

import jax
import numpy as np

# The arrays and kinds are the cost models' contract (costmodels.layers); the graph builds them.
from costmodels import (  # noqa: F401 (re-exported: the IR's names)
    LAYER_FIELDS,
    MAX_SPATIAL_DIMS,
    MIN_BUCKET,
    VECTOR_FIELDS,
    LayerArrays,
    LayerKind,
    bucket_size,
    kind_name,
    token_lookups,
)
from planner.ir.unsupported import ON_UNSUPPORTED, check_on_unsupported
from planner.ir.graph_file import (  # the file format
    GRAPH_SCHEMA,
    GRAPH_VERSION,
    graph_fields,
)

__all__ = [
    "LayerKind",
    "LayerArrays",
    "LayerGraph",
    "GRAPH_SCHEMA",
    "GRAPH_VERSION",
    "ON_UNSUPPORTED",
    "bucket_size",
    "check_on_unsupported",
    "kind_name",
    "layer_path",
]

def layer_path(path: str, name: str) -> str:
    """``path/name``, or ``name`` under the root module (``path == ""``): how a
    layer is named inside a module. The extraction names a module's functional
    ops and the layers one module becomes (an embedding's ``attend``, an
    ``nnx.MultiHeadAttention``'s ``qkv`` and ``out``) so; the export finds them so."""
    return f"{path}/{name}" if path else name


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
    # "replicate": planner.extract kept operations it cannot map as replicated OTHER layers (its
    # on_unsupported option), so the model extracts to this graph only with that option again
    on_unsupported: str = "error"

    def __post_init__(self) -> None:
        n = len(self.names)
        rows = int(np.shape(self.arrays.mask)[0])
        if rows < n:
            raise ValueError(f"LayerGraph has {n} names but only {rows} rows")
        if len(set(self.names)) != n:
            dup = sorted({x for x in self.names if self.names.count(x) > 1})
            raise ValueError(f"LayerGraph layer names must be unique; repeated: {dup[:5]}")
        check_on_unsupported(self.on_unsupported)

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

    @property
    def reads_token_ids(self) -> bool:
        """The model input is token ids (``(batch, tokens)`` int32) that an
        embedding looks up: a language model, trained with a label per token."""
        return bool(token_lookups(self))

    @property
    def input_bytes_per_sample(self) -> float:
        """A training sample's input and labels as they are fed (float32 images
        or int32 token ids; int32 labels, one per sample or, for a language
        model, one per token)."""
        labels = self.input_shape[1] if self.reads_token_ids else 1
        return 4.0 * (math.prod(self.input_shape) + labels)

    # -- totals (exact, float64 on the host) --------------------------------
    def total(self, field: str) -> float:
        """Sum of a per-layer field over the real layers, e.g. ``total("params")``."""
        if field not in LAYER_FIELDS or field in VECTOR_FIELDS:
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
            for f in LAYER_FIELDS:
                if f == "mask":
                    continue
                v = np.asarray(getattr(a, f))[i]
                row[f] = [_num(x) for x in v] if f in VECTOR_FIELDS else _num(v)
            layers.append(row)
        out = {
            "schema": GRAPH_SCHEMA,
            "version": GRAPH_VERSION,
            "model_name": self.model_name,
            "input_shape": list(self.input_shape),
            "measured_time_per_sample_s": self.measured_time_per_sample_s,
            "layers": layers,
            "edges": [list(e) for e in self.edges],
        }
        if self.on_unsupported != "error":  # only graphs with replicated stand-ins carry the key
            out["on_unsupported"] = self.on_unsupported
        return out

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
        return cls(**graph_fields(data)).padded()

    @classmethod
    def from_json(cls, text: str, source: str = "layer-graph JSON") -> LayerGraph:
        from costmodels import parse_json

        if not isinstance(text, str):
            hint = "; for a dict, call LayerGraph.from_dict" if isinstance(text, dict) else ""
            raise ValueError(f"LayerGraph.from_json takes JSON text (a str), got {type(text).__name__}{hint}")
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
        fill = 1.0 if f in VECTOR_FIELDS or f in ("in_channels", "out_channels", "groups") else 0.0
        out[f] = np.concatenate([v, np.full(pad_shape, fill)], axis=0)
    return LayerArrays(**out)


def _flatten(g: LayerGraph):
    return (g.arrays,), (g.names, g.model_name, g.input_shape, g.measured_time_per_sample_s, g.on_unsupported)


def _unflatten(aux, children) -> LayerGraph:
    g = object.__new__(LayerGraph)  # skip validation: leaves may be tracers
    for k, v in zip(
        ("arrays", "names", "model_name", "input_shape", "measured_time_per_sample_s", "on_unsupported"),
        (children[0], *aux),
        strict=True,
    ):
        object.__setattr__(g, k, v)
    return g


# A LayerGraph is a pytree whose leaves are its arrays; the metadata is static.
# Jitted cost functions take ``graph.arrays`` so that models with different
# names but the same bucket share one compilation.
jax.tree_util.register_pytree_node(LayerGraph, _flatten, _unflatten)
