"""Which layer each equation of a traced nnx forward pass belongs to.

The export recomputes *runs* of layers (a ``remat`` layer and the
``remat+join`` layers after it, :mod:`costmodels.levers`) that cross
functional ops (the ReLUs, pools and residual adds between modules), so it
cuts the forward pass's jaxpr by layer. The cut is :func:`planner.extract`'s
own: while the export traces its forward pass, :func:`marked_module_calls`
makes every module call push the extraction's ``named_scope`` markers, and
:func:`equation_layers` walks that jaxpr with the extraction's walker
(:mod:`planner.models._jaxpr_walk`), recording for each top-level equation
the layer whose value it computes. Whatever the export adds around a call (a
sharding constraint, a ``custom_vjp``) belongs to the layer it wraps or is
free. The walk must give the plan's layers by name (checked by the caller).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import jax.extend.core as jex
from flax import nnx

from planner.ir.builder import GraphBuilder
from planner.models._jaxpr_walk import _Walker
from planner.models._parameters import leaf_parameters, owned_values
from planner.models._tracing import (
    _PATH_ATTR,
    _CallTracker,
    _graph_input_shape,
    _nnx_infos,
    _patched_nnx_calls,
)
from planner.usage import InternalError

__all__ = ["EquationLayers", "equation_layers", "marked_module_calls"]


class EquationLayers(NamedTuple):
    names: tuple[str, ...]  # [L] the layers the walk found, in its order (the extraction's)
    layers: tuple[str | None, ...]  # [E] per top-level equation: its layer, None where no activation


@contextmanager
def marked_module_calls(model: nnx.Module) -> Iterator[Callable[[nnx.Module], None]]:
    """While tracing: every call of a module class of ``model`` pushes the
    extraction's marker of its module path (patched ``__call__``, restored on
    exit). Enter it *outside* other patches of the same classes, so that
    those run around the marked call. Yields ``tag(copy)``, to call on every
    copy of ``model`` the traced function merges, before calling it."""

    def tag(copy: nnx.Module) -> None:
        for path, module in nnx.iter_modules(copy):
            object.__setattr__(module, _PATH_ATTR, "/".join(map(str, path)))

    with _patched_nnx_calls({type(m) for _, m in nnx.iter_modules(model)}, _CallTracker()):
        yield tag


def equation_layers(model: nnx.Module, closed: jex.ClosedJaxpr, state: Any, batch: int,
                    on_unsupported: str = "error") -> EquationLayers:
    """The layers of ``closed`` (a forward pass of ``model`` traced under
    :func:`marked_module_calls`, whose inputs are the leaves of ``state``,
    then the model's input of batch size ``batch``) and the layer of each of
    its top-level equations. The parameters in ``state`` that a module owns
    beside its submodules' (a root module's learned positions) are followed
    as the extraction follows them (:func:`owned_values`)."""
    jaxpr = closed.jaxpr
    builder = GraphBuilder("runs", _graph_input_shape(jaxpr.invars[-1].aval))
    infos = _nnx_infos(model)
    walker = _Walker(builder, infos, batch, on_unsupported)
    params = {tuple(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    invals = owned_values(leaf_parameters(state, lambda keys: keys if keys in params else None), infos,
                          GraphBuilder.input)
    if len(invals) != len(jaxpr.invars):
        raise InternalError(f"equation_layers: {len(jaxpr.invars)} traced inputs for {len(invals) - 1} state leaves")
    record: list[list[Any]] = []
    outs = walker.walk(jaxpr, invals, (), (), record)
    walker.close()
    for v in outs:
        if v is not None:
            walker.resolve(v)
    names = tuple(walker.names)
    layers = []
    for values in record:
        node = walker.layer_of(values)
        layers.append(None if node is None or node == GraphBuilder.input else names[node])
    return EquationLayers(names, tuple(layers))
