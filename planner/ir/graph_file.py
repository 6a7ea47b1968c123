"""The layer-graph file: its schema and version, and reading its JSON form
back into the fields of a ``LayerGraph`` with messages that name the
offending field (the writer is ``LayerGraph.to_dict``; ``LayerGraph.from_dict``
builds the graph from what :func:`graph_fields` returns)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from costmodels import LAYER_FIELDS, MAX_SPATIAL_DIMS, VECTOR_FIELDS, LayerArrays, LayerKind
from planner.ir._layer_checks import check_layer_counts, check_layer_shapes

GRAPH_SCHEMA = "shardplan/layer-graph"
GRAPH_VERSION = 1

# Shape fields are whole numbers: padding may be 0, every other size at least 1.
_MAY_BE_ZERO = ("pad_lo", "pad_hi")
_INTEGER_FIELDS: dict[str, tuple[int, float]] = {  # field -> (min, max)
    "kind": (0, math.inf),  # checked against LayerKind below
    "spatial_rank": (0, MAX_SPATIAL_DIMS),
    "out_spatial_rank": (0, MAX_SPATIAL_DIMS),
    "in_channels": (1, math.inf),
    "out_channels": (1, math.inf),
    "groups": (1, math.inf),
}


def _number(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{where} must be a number, got {v!r}")
    if not math.isfinite(v):
        raise ValueError(f"{where} must be finite, got {v!r}")
    return float(v)


def graph_fields(data: Any) -> dict[str, Any]:
    """The ``LayerGraph`` fields (unpadded arrays, names, model name, input
    shape, measured time) of a layer-graph JSON object; ``ValueError`` naming
    the field or layer where it is not one."""
    if not isinstance(data, dict):
        raise ValueError("layer-graph JSON must be an object")
    schema, version = data.get("schema"), data.get("version")
    if schema != GRAPH_SCHEMA:
        raise ValueError(f'not a layer graph: "schema" is {schema!r}, expected {GRAPH_SCHEMA!r}')
    if not isinstance(version, int) or isinstance(version, bool):
        raise ValueError(f'layer graph "version" must be an integer, got {version!r}')
    if version > GRAPH_VERSION:
        raise ValueError(
            f"layer graph version {version} is newer than this shardplan understands "
            f"({GRAPH_VERSION}); upgrade shardplan"
        )
    if version < 1:
        raise ValueError(f"layer graph version {version} is not valid")
    for key in ("model_name", "input_shape", "layers", "edges"):
        if key not in data:
            raise ValueError(f'layer graph is missing "{key}"')
    layers = data["layers"]
    if not isinstance(layers, list) or not layers:
        raise ValueError('layer graph "layers" must be a non-empty list')
    names: list[str] = []
    cols: dict[str, list[Any]] = {f: [] for f in LAYER_FIELDS}
    for i, row in enumerate(layers):
        if not isinstance(row, dict):
            raise ValueError(f"layers[{i}] must be an object")
        name = row.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f'layers[{i}] needs a non-empty string "name"')
        names.append(name)
        for f in LAYER_FIELDS:
            if f == "mask":
                cols[f].append(1.0)
                continue
            if f not in row:
                raise ValueError(f'layers[{i}] ({name}) is missing "{f}"')
            v = row[f]
            where = f"layers[{i}] ({name}).{f}"
            if f in VECTOR_FIELDS:
                sign = "non-negative" if f in _MAY_BE_ZERO else "positive"
                if not isinstance(v, list) or len(v) != MAX_SPATIAL_DIMS:
                    raise ValueError(f"{where} must be a list of {MAX_SPATIAL_DIMS} {sign} integers, got {v!r}")
                xs = [_number(x, where) for x in v]
                if not all(x.is_integer() and (x >= 0 if f in _MAY_BE_ZERO else x >= 1) for x in xs):
                    raise ValueError(f"{where} must be a list of {MAX_SPATIAL_DIMS} {sign} integers, got {v!r}")
                cols[f].append(xs)
            else:
                x = _number(v, where)
                if f in _INTEGER_FIELDS:
                    low, high = _INTEGER_FIELDS[f]
                    if not (x.is_integer() and low <= x <= high):
                        span = f"from {low} to {high:g}" if math.isfinite(high) else f">= {low}"
                        what = "a positive integer" if low == 1 and not math.isfinite(high) else f"an integer {span}"
                        raise ValueError(f"{where} must be {what}, got {v!r}")
                elif x < 0:
                    raise ValueError(f"{where} must be non-negative, got {v!r}")
                cols[f].append(x)
        try:
            kind = LayerKind(int(cols["kind"][-1]))
        except ValueError:
            raise ValueError(f"layers[{i}] ({name}).kind {row['kind']!r} is not a known layer kind") from None
        if kind is LayerKind.PAD:
            raise ValueError(f"layers[{i}] ({name}) has the padding kind 0, which real layers cannot have")
    edges = data["edges"]
    if not isinstance(edges, list):
        raise ValueError('layer graph "edges" must be a list of [src, dst] pairs')
    src, dst = [], []
    for j, e in enumerate(edges):
        if not (isinstance(e, list) and len(e) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in e)):
            raise ValueError(f"edges[{j}] must be a pair of layer indices, got {e!r}")
        s, d = e
        if not (0 <= s < d < len(layers)):
            raise ValueError(
                f"edges[{j}] = {e} must go from an earlier to a later layer (indices 0..{len(layers) - 1})"
            )
        src.append(s)
        dst.append(d)
    shape = data["input_shape"]
    if not (isinstance(shape, list) and 1 <= len(shape) <= 1 + MAX_SPATIAL_DIMS
            and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in shape)):
        raise ValueError(f'"input_shape" must be a list of 1-4 positive integers, got {shape!r}')
    t = data.get("measured_time_per_sample_s")
    if t is not None:
        t = _number(t, "measured_time_per_sample_s")
        if t <= 0:
            raise ValueError(f"measured_time_per_sample_s must be positive, got {t}")
    model_name = data["model_name"]
    if not isinstance(model_name, str):
        raise ValueError('"model_name" must be a string')
    arrays = {f: np.asarray(v, dtype=np.float64) for f, v in cols.items()}
    arrays["edge_src"] = np.asarray(src, dtype=np.float64)
    arrays["edge_dst"] = np.asarray(dst, dtype=np.float64)
    arrays["edge_mask"] = np.ones(len(src))
    _check_consistent(arrays, names, src, dst, shape)
    return {"arrays": LayerArrays(**arrays), "names": tuple(names), "model_name": model_name,
            "input_shape": tuple(shape), "measured_time_per_sample_s": t,
            "on_unsupported": data.get("on_unsupported", "error")}  # checked by LayerGraph


def _check_consistent(a: dict[str, np.ndarray], names: list[str], src: list[int], dst: list[int],
                      input_shape: list[int]) -> None:
    """One line naming the layer where the file's layers do not fit together:
    a layer reads its producer's output shape (channels and spatial dims; a
    concat only the spatial dims), a layer fed by the model input reads the
    input's shape, a conv's groups divide its channels, a window (dilated) fits
    in its padded input, and the spatial rank matches the dims given; then each
    layer on its own (:mod:`planner.ir._layer_checks`: output shape, parameters
    and FLOPs from the shapes)."""
    def shape(i: int, side: str) -> str:
        c = int(a[f"{side}_channels"][i])
        sp = [int(x) for x in a[f"{side}_spatial"][i]]
        return f"({c}, {', '.join(map(str, sp))})"

    for i in range(len(names)):
        kind = int(a["kind"][i])
        rank = int(a["spatial_rank"][i])
        if any(int(x) != 1 for x in a["in_spatial"][i][rank:]):
            raise ValueError(f"layer {names[i]!r} has spatial_rank {rank} but input spatial dims "
                             f"{[int(x) for x in a['in_spatial'][i]]} (dims past the rank must be 1)")
        if kind == LayerKind.CONV:
            g = int(a["groups"][i])
            if a["in_channels"][i] % g or a["out_channels"][i] % g:
                raise ValueError(f"layer {names[i]!r}: groups {g} must divide its {int(a['in_channels'][i])} input "
                                 f"and {int(a['out_channels'][i])} output channels")
        if kind in (LayerKind.CONV, LayerKind.POOL):
            window = (a["kernel"][i] - 1) * a["dilation"][i] + 1
            room = a["in_spatial"][i] + a["pad_lo"][i] + a["pad_hi"][i]
            if np.any(window > room):
                raise ValueError(f"layer {names[i]!r}: its window {[int(x) for x in window]} (dilation included) "
                                 f"is larger than its padded input {[int(x) for x in room]}")
    check_layer_shapes(a, names)
    fed = set(dst)
    for s, d in zip(src, dst, strict=True):
        same_spatial = np.array_equal(a["in_spatial"][d], a["out_spatial"][s])
        same_channels = a["in_channels"][d] == a["out_channels"][s] or int(a["kind"][d]) == LayerKind.CONCAT
        if not (same_spatial and same_channels):
            raise ValueError(f"layer {names[d]!r} reads {shape(d, 'in')} but its input {names[s]!r} gives "
                             f"{shape(s, 'out')} (channels, spatial dims); the layers do not fit together")
    c, *sp = input_shape
    for i in range(len(names)):
        if i not in fed and (a["in_channels"][i] != c or [int(x) for x in a["in_spatial"][i][:len(sp)]] != sp):
            raise ValueError(f"layer {names[i]!r} reads {shape(i, 'in')} from the model input, which is "
                             f"{tuple(input_shape)}; the layers do not fit the input_shape")
    check_layer_counts(a, names, dst)
