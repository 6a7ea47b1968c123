"""The PartitionSpecs a plan gives each layer: its parameters' and its
activations', on the ``("data", "model")`` mesh, and those of a Flax
model's parameter state under a plan (:func:`partition_specs`). These are what
:mod:`planner.runtime.export` applies to a Flax model and what the plan file records
per layer (``input_spec``, ``output_spec``, ``param_specs``).

Arrays are batch-first and channels-last (Flax's convention): an activation
of a layer with ``r`` spatial dims has rank ``r + 2``. A spec is written as
a tuple with one entry per leading dim: ``None`` (not split), an axis name,
or a tuple of axis names (split over both); trailing dims not named are not
split. ``None`` in place of a whole spec means XLA decides (the partial sums
a channel-parallel layer produces).

=============  ==========================  =============================================
strategy       conv / dense kernel          activations
=============  ==========================  =============================================
data           replicated                   batch over ("data", "model")
filter         last dim (out) over model    in: batch over data; out: channels over model
channel        2nd-last (in) over model     in: channels over model; out: partial sums
spatial        replicated                   batch over data, first spatial dim over model
replicated     replicated                   batch over data
=============  ==========================  =============================================

1-D parameters (biases, batch-norm scale, shift and statistics) follow the
output channels: split over ``model`` under ``filter``, not split otherwise.
The layouts per strategy are the cost model's own tables
(:func:`costmodels.strategies.io_layout_names`), so what is costed is what
is applied.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from jax.sharding import PartitionSpec as P

from costmodels import AXIS_NAMES, DATA_AXIS, MODEL_AXIS, STRATEGY_NAMES, io_layout_names
from planner.ir.graph import layer_path

__all__ = [
    "BATCH_AXES",
    "CHANNELWISE_GRADIENT_LAYOUTS",
    "CHANNELWISE_LAYOUTS",
    "PARAM_GRADIENT_LAYOUTS",
    "PARAM_LAYOUTS",
    "Spec",
    "LayerSpecs",
    "param_spec_entries",
    "zero_group_axes",
    "zero_spec_entries",
    "activation_spec",
    "activation_spec_entries",
    "check_strategy",
    "fsdp_layers",
    "layer_specs",
    "layer_specs_from_kinds",
    "head_projection",
    "param_spec",
    "partition_specs",
    "shardings",
    "to_partition_spec",
]

Entry = None | str | tuple[str, ...]
Spec = tuple[Entry, ...]  # one entry per leading dim; see the module docstring

BATCH_AXES = AXIS_NAMES  # the batch of a data-parallel layer splits over every device
PARAM_LAYOUTS = io_layout_names(param_layer=True)  # conv / dense
CHANNELWISE_LAYOUTS = io_layout_names(param_layer=False)  # batch norm and the other per-channel layers
# (input gradient produced, output gradient needed): they differ from the forward layouts only
# where those are partial sums (a channel layer's output, a filter layer's input gradient).
PARAM_GRADIENT_LAYOUTS = io_layout_names(param_layer=True, gradients=True)
CHANNELWISE_GRADIENT_LAYOUTS = io_layout_names(param_layer=False, gradients=True)
# The parameters Flax gives each layer kind (nnx and linen share the names).
_PARAM_NAMES = {"conv": ("kernel", "bias"), "dense": ("kernel", "bias"), "embed": ("embedding",),
                "batch_norm": ("scale", "bias", "mean", "var"), "norm": ("scale", "bias")}  # RMSNorm: scale only


def check_strategy(strategy: str) -> str:
    """``strategy`` if it is one of the menu's names (exactly), else a ValueError naming them."""
    if strategy not in STRATEGY_NAMES:
        raise ValueError(f"unknown strategy {strategy!r}; choose from {', '.join(STRATEGY_NAMES)}")
    return strategy


def param_spec_entries(strategy: str, ndim: int) -> Spec:
    """Spec of a parameter of rank ``ndim`` in a layer run under ``strategy``."""
    check_strategy(strategy)
    if ndim == 0:
        return ()
    if ndim == 1:
        return (MODEL_AXIS,) if strategy == "filter" else ()
    if strategy == "filter":
        return (*([None] * (ndim - 1)), MODEL_AXIS)
    if strategy == "channel":
        return (*([None] * (ndim - 2)), MODEL_AXIS, None)
    return ()


def activation_spec_entries(layout: str, ndim: int) -> Spec | None:
    """Spec of a batch-first, channels-last activation of rank ``ndim`` in a
    layout (``batch``, ``replicated``, ``channel``, ``spatial``); None where
    XLA decides (``partial``)."""
    if layout == "batch":
        return (BATCH_AXES,)
    if layout == "replicated":
        return (DATA_AXIS,)
    if layout == "channel":
        return (DATA_AXIS, *([None] * (ndim - 2)), MODEL_AXIS)
    if layout == "spatial":
        if ndim < 3:
            raise ValueError(f"a spatial layout needs a spatial dim; this activation has rank {ndim}")
        return (DATA_AXIS, MODEL_AXIS)
    if layout == "partial":
        return None
    raise ValueError(f"unknown layout {layout!r}")


def to_partition_spec(spec: Spec | None) -> PartitionSpec | None:
    """The ``jax.sharding.PartitionSpec`` of a spec (None stays None)."""
    return None if spec is None else PartitionSpec(*spec)


def activation_spec(layout: str, ndim: int) -> PartitionSpec | None:
    """PartitionSpec of a batch-first, channels-last activation in a layout
    (``batch``, ``replicated``, ``channel``, ``spatial``); None where XLA
    should decide (``partial``). See :func:`activation_spec_entries`."""
    return to_partition_spec(activation_spec_entries(layout, ndim))


@dataclasses.dataclass(frozen=True)
class LayerSpecs:
    """What a plan lays out for one layer."""

    name: str
    input_spec: Spec | None  # the layer's input activation; None: XLA decides
    output_spec: Spec | None  # the layer's output activation; None: partial sums, XLA decides
    param_specs: tuple[tuple[str, Spec], ...]  # (Flax parameter name, spec), e.g. ("kernel", (None, None, None, "model"))

    def to_dict(self) -> dict[str, Any]:
        def js(spec: Spec | None) -> list[Any] | None:
            return None if spec is None else [list(e) if isinstance(e, tuple) else e for e in spec]

        return {"input_spec": js(self.input_spec), "output_spec": js(self.output_spec),
                "param_specs": {n: js(s) for n, s in self.param_specs}}


def _one(name: str, kind: str, strategy: str, in_ndim: int, out_ndim: int, fsdp: bool = False) -> LayerSpecs:
    base = "conv" if kind.startswith("conv") else kind
    table = PARAM_LAYOUTS if base in ("conv", "dense", "embed") else CHANNELWISE_LAYOUTS
    lin, lout = table[check_strategy(strategy)]
    params: list[tuple[str, Spec]] = []
    stored = zero_spec_entries if fsdp else param_spec_entries  # ZeRO stage 3 stores the weights sharded
    for p in _PARAM_NAMES.get(base, ()):
        ndim = (in_ndim if base == "conv" else 2) if p == "kernel" else 1
        params.append((p, stored(strategy, ndim)))

    def act(layout: str, ndim: int) -> Spec | None:
        # a spatial strategy on a layer without spatial dims is never chosen (masked); say so if asked
        return activation_spec_entries(layout, ndim) if (layout != "spatial" or ndim >= 3) else None

    return LayerSpecs(name, act(lin, in_ndim), act(lout, out_ndim), tuple(params))


def fsdp_layers(zero_stages: Mapping[str, int]) -> frozenset[str]:
    """The layers of ``zero_stages`` (layer -> ZeRO stage) whose weights are
    stored sharded over their data-parallel group: stage 3 (FSDP)."""
    return frozenset(n for n, z in zero_stages.items() if z >= 3)


def layer_specs(graph: Any, strategies: Sequence[str],
                zero_stages: Mapping[str, int] | None = None) -> tuple[LayerSpecs, ...]:
    """Specs of every layer of a :class:`~planner.ir.graph.LayerGraph` under one
    strategy per layer (ranks from the graph's spatial ranks); the layers
    ``zero_stages`` puts on stage 3 store their parameters sharded over
    their data-parallel group as well (:func:`zero_spec_entries`)."""
    fsdp = fsdp_layers(zero_stages or {})
    a = graph.unpadded()
    if len(strategies) != graph.num_layers:
        raise ValueError(f"{len(strategies)} strategies for {graph.num_layers} layers")
    return tuple(
        _one(name, kind, s, int(a.spatial_rank[i]) + 2, int(a.out_spatial_rank[i]) + 2, name in fsdp)
        for i, (name, kind, s) in enumerate(zip(graph.names, graph.kind_names, strategies, strict=True))
    )


def layer_specs_from_kinds(names: Sequence[str], kinds: Sequence[str], strategies: Sequence[str],
                           input_rank: int) -> tuple[LayerSpecs, ...]:
    """Specs when only the layer kinds are known (upgrading a version-1 plan
    file, which has no graph): ranks follow the kinds in file (topological)
    order. ``convNd`` takes and gives rank N + 2, ``dense`` and ``flatten``'s
    output rank 2, a ``pool`` directly before a ``dense`` is a global pool
    (output rank 2), every other layer keeps the rank of the layer before."""
    rank = input_rank
    out = []
    for i, (name, kind, s) in enumerate(zip(names, kinds, strategies, strict=True)):
        nxt = kinds[i + 1] if i + 1 < len(kinds) else ""
        if kind.startswith("conv") and kind[4:-1].isdigit():
            r_in = r_out = int(kind[4:-1]) + 2
        elif kind == "dense":
            r_in = r_out = 2
        elif kind == "flatten" or (kind == "pool" and nxt == "dense"):
            r_in, r_out = rank, 2
        else:
            r_in = r_out = rank
        out.append(_one(name, kind, s, r_in, r_out))
        rank = r_out
    return tuple(out)


# -- a model's parameter state --------------------------------------------------------


def param_spec(strategy: str, ndim: int) -> P:
    """PartitionSpec of a parameter of rank ``ndim`` in a layer run under ``strategy``
    (:func:`param_spec_entries`, what the plan file records)."""
    return P(*param_spec_entries(strategy, ndim))


def _path_key(path: tuple[Any, ...]) -> tuple[str, str]:
    """(layer name, parameter name) of an nnx State leaf path (DictKeys only)."""
    keys = [str(getattr(k, "key", getattr(k, "name", k))) for k in path if isinstance(k, jax.tree_util.DictKey)]
    if not keys:
        keys = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
    return "/".join(keys[:-1]), keys[-1]


# nnx.MultiHeadAttention's projections to heads, which the extractor fuses into one layer
# "<path>/qkv"; its "<path>/out" projects from the heads.
_TO_HEADS = ("query", "key", "value")


def head_projection(layer: str, strategies: Mapping[str, str]) -> tuple[str, str] | None:
    """``(strategy, "to" | "from")`` where ``layer`` is a projection of a
    multi-head attention module to or from its heads (kernels ``(C, heads,
    head_dim)`` and ``(heads, head_dim, F)``), else None."""
    head, _, tail = layer.rpartition("/")
    fused = layer_path(head, "qkv")
    if fused not in strategies or layer == fused:
        return None
    if tail in _TO_HEADS and layer not in strategies:
        return strategies[fused], "to"
    if tail == "out" and layer in strategies:
        return strategies[layer], "from"
    return None


def _with_zero_group(spec: P, strategy: str, ndim: int) -> P:
    """``spec`` with its last dim also split over the layer's data-parallel
    group, as :func:`zero_spec_entries` splits a plain layer's: a head
    projection's head_dim (to) or output features (from)."""
    if ndim == 0:
        return spec
    entries = list(spec) + [None] * (ndim - len(spec))
    last, group = entries[-1], zero_group_axes(strategy)
    entries[-1] = group if last is None else ((last,) if isinstance(last, str) else tuple(last)) + group
    return P(*(e[0] if isinstance(e, tuple) and len(e) == 1 else e for e in entries))


def _head_param_spec(strategy: str, direction: str, ndim: int) -> P:
    """A head projection's kernel or bias: ``filter`` splits the heads (to) or
    the output features (from), ``channel`` the input features (to) or the
    heads (from); the kernel's heads axis is 1 (to) or 0 (from)."""
    if strategy == "filter":
        if direction == "to":  # kernel (C, heads, head_dim), bias (heads, head_dim)
            return P(None, MODEL_AXIS, None) if ndim == 3 else P(MODEL_AXIS, None)
        return P(None, None, MODEL_AXIS) if ndim == 3 else P(MODEL_AXIS)  # kernel (heads, head_dim, F), bias (F,)
    if strategy == "channel" and ndim == 3:
        return P(MODEL_AXIS, None, None)  # input features (to) or heads (from); biases whole
    return P()


def _is_linen_variables(state: Any) -> bool:
    """Whether ``state`` is a linen variables dict (collections at the top,
    ``model.init``'s result), not one collection or an nnx ``State``."""
    return (isinstance(state, Mapping) and not hasattr(state, "flat_state")
            and isinstance(state.get("params"), Mapping) and all(isinstance(v, Mapping) for v in state.values()))


def zero_group_axes(strategy: str) -> tuple[str, ...]:
    """The mesh axes of a layer's data-parallel group, over which ZeRO shards
    its state (``costmodels.levers``): the devices holding replicas of its
    weights, both axes under ``data`` and ``spatial``, ``data`` otherwise."""
    return AXIS_NAMES if check_strategy(strategy) in ("data", "spatial") else (DATA_AXIS,)


def zero_spec_entries(strategy: str, ndim: int) -> Spec:
    """Spec of a parameter of rank ``ndim`` (or of its gradient or optimizer
    state) that ZeRO shards: :func:`param_spec_entries`, with the last dim
    (the output channels: a kernel's, a bias's, an embedding's features) also
    split over the layer's data-parallel group (:func:`zero_group_axes`)."""
    if ndim == 0:
        return ()
    base = list(param_spec_entries(strategy, ndim)) + [None] * ndim
    last = base[ndim - 1]
    group = zero_group_axes(strategy)
    base[ndim - 1] = group if last is None else (last, *group)
    return tuple(e if not (isinstance(e, tuple) and len(e) == 1) else e[0] for e in base[:ndim])


def partition_specs(state: Any, strategies: Mapping[str, str], zero: frozenset[str] = frozenset()) -> Any:
    """A pytree of PartitionSpecs matching ``state`` (an nnx ``State``, a
    linen params collection or a whole linen variables dict), from each
    parameter's layer strategy; parameters of
    layers the mapping does not name are replicated, and those of the layers
    in ``zero`` are sharded by ZeRO as well (:func:`zero_spec_entries`). The
    projections of an ``nnx.MultiHeadAttention`` follow the fused layer
    ``<path>/qkv`` and ``<path>/out``, split along their heads axis."""

    if _is_linen_variables(state):  # {"params": ..., "batch_stats": ...}: each collection by its paths
        return {col: partition_specs(tree, strategies, zero if col == "params" else frozenset())
                for col, tree in state.items()}

    def spec(path: tuple[Any, ...], leaf: Any) -> P:
        layer, name = _path_key(path)
        ndim = len(getattr(leaf, "shape", ()))
        heads = head_projection(layer, strategies)
        # a projection from heads has a rank-3 kernel; an nnx.Linear "out" beside a fused qkv is a dense layer
        if heads is not None and (heads[1] == "to" or ndim == 3):
            fused = layer if heads[1] == "from" else layer_path(layer.rpartition("/")[0], "qkv")
            spec = _head_param_spec(*heads, ndim)
            return _with_zero_group(spec, heads[0], ndim) if fused in zero else spec
        # a parameter a module owns beside its submodules' (a root's learned positions) is a layer of its own
        strategy = strategies.get(layer) or strategies.get(layer_path(layer, name), "replicated")
        return P(*zero_spec_entries(strategy, ndim)) if layer in zero else param_spec(strategy, ndim)

    return jax.tree_util.tree_map_with_path(spec, state)


def shardings(state: Any, strategies: Mapping[str, str], mesh: Mesh, zero: frozenset[str] = frozenset()) -> Any:
    """NamedShardings for ``state`` on ``mesh`` (see :func:`partition_specs`).
    A ZeRO-sharded dimension the group's size does not divide is an error
    naming the parameter."""
    specs = partition_specs(state, strategies, zero)

    def named(path: tuple[Any, ...], leaf: Any, spec: P) -> NamedSharding:
        shape = getattr(leaf, "shape", ())
        for dim, entry in zip(shape, spec, strict=False):
            axes = (entry,) if isinstance(entry, str) else (entry or ())
            size = int(np.prod([mesh.shape[a] for a in axes])) if axes else 1
            if dim % size:
                layer, name = _path_key(path)
                raise ValueError(f"parameter {name!r} of layer {layer!r} has a dimension of {dim}, which its "
                                 f"sharding over {'+'.join(axes)} ({size} devices) does not divide")
        return NamedSharding(mesh, spec)

    return jax.tree_util.tree_map_with_path(named, state, specs)
