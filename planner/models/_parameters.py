"""The parameters of a model under extraction (private; used by
:func:`planner.extract`): which traced inputs are parameters that a module
owns beside its submodules (followed by the walk as values), and the check
that the layer graph holds every parameter of the model."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from planner.ir.graph import LayerGraph, layer_path
from planner.models._regions import _ModuleInfo
from planner.models._transformer_walk import _Positions
from planner.usage import InternalError


def leaf_parameters(tree: Any, parameter_keys: Callable[[tuple[str, ...]], tuple[str, ...] | None]) -> list[Any]:
    """Per leaf of the traced function's first argument, in order: its
    parameter's path (module path, then name) and size where
    ``parameter_keys`` of its dict keys says it is a parameter, else None."""
    out: list[Any] = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        keys = tuple(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey))
        found = parameter_keys(keys) if keys else None
        out.append(None if found is None else (found, math.prod(np.shape(leaf))))
    return out


def owned_values(leaves: list[Any], infos: Mapping[str, _ModuleInfo], x: Any) -> list[Any]:
    """The walk's starting values: the model input, and each parameter that a
    module owns beside its submodules' (an ``"owner"``, e.g. a root module's
    learned positions) as the values the walk follows
    (:class:`~planner.models._transformer_walk._Positions`); else None."""
    out: list[Any] = []
    for leaf in leaves:
        info = None if leaf is None else infos.get("/".join(leaf[0][:-1]))
        if info is None or info.kind != "owner":
            out.append(None)
            continue
        (keys, size) = leaf
        out.append(_Positions(layer_path(info.path, keys[-1]), info.type_name, size))
    return [*out, x]


def parameter_count(params: Any) -> int:
    """Trainable parameters: the sum over the leaves of a model's parameters
    (nnx: its ``nnx.Param`` state; linen: its ``params`` collection)."""
    return sum(math.prod(np.shape(v)) for v in jax.tree.leaves(params))


def check_parameters(graph: LayerGraph, infos: Mapping[str, _ModuleInfo], expected: int) -> None:
    """Every parameter of the model is in the graph: else a ValueError naming
    the modules whose parameters no layer holds. (A module called twice holds
    its parameters at each call: shared weights count once per use.)"""
    got = int(graph.total("params"))
    if got == expected:
        return
    layers = set(graph.names)
    held = lambda path: path in layers or any(n.startswith(path + "/") for n in layers)  # noqa: E731
    missing = [f"{i.path or '<root>'!r} ({i.type_name}, {i.direct_params:,})" for i in infos.values()
               if i.direct_params and not held(i.path) and i.kind != "attend"]
    if missing:
        raise ValueError(
            f"extract: the layer graph holds {got:,} of the model's {expected:,} parameters: no layer holds those "
            f"of module {', '.join(missing[:5])}; the planner cannot see how they are used. Use them as a layer "
            "it maps (docs/transformers.md, docs/models.md), or report the idiom")
    if got < expected:
        raise InternalError(f"extract: the layer graph holds {got:,} parameters, the model {expected:,}")
