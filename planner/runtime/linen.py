"""Linen models on the nnx export: a ``flax.linen`` module (and its
variables) as the ``flax.nnx`` module that :func:`planner.shard` and
:func:`planner.validate` train and compile, through Flax's own bridge
(``flax.nnx.bridge.ToNNX``).

The bridged module holds the linen variables as nnx state under their linen
paths (``Conv_0/kernel``; a ``batch_stats`` collection as non-parameter
state), so the plan's layer names, which are the linen scope paths
(:func:`planner.extract`), name its parameters. It is called as extraction
calls the linen module: with ``train=True`` (``training``, ``is_training``,
``deterministic=False``, ``use_running_average=False``) where its
``__call__`` takes such a flag, and its non-parameter collections mutable,
so batch statistics update as in training. Each planned linen module call's
input and output are pinned to the plan's layouts through
``flax.linen.intercept_methods`` (:func:`constrained_linen_calls`), as the
export pins nnx module calls. Two things the nnx export does are not done
here: a ``channel`` layer's partial sums are reduced as XLA chooses (the nnx
export reduce-scatters them itself inside ``jax.shard_map``), and ZeRO
stages 2 and 3 and recomputation are refused.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

import flax
import flax.linen as nn
import jax
from flax import nnx
from flax.linen.dtypes import promote_dtype
from flax.nnx import bridge
from jax.sharding import Mesh

from costmodels import AXIS_NAMES
from planner.ir.graph import layer_path
from planner.models.extraction import linen_train_kwargs
from planner.plans.specs import (
    CHANNELWISE_GRADIENT_LAYOUTS,
    CHANNELWISE_LAYOUTS,
    PARAM_GRADIENT_LAYOUTS,
    PARAM_LAYOUTS,
    head_projection,
)
from planner.runtime.calls import (
    constrain,
    constrain_heads,
    looks_up_positions,
    pin_cotangent,
)
from planner.runtime.head_calls import fanned_out, plain_projection, projected_to_heads

__all__ = ["LinenModel", "as_nnx", "constrained_linen_calls"]

_PARAM_MODULES = (nn.Conv, nn.Dense, nn.Embed, nn.DenseGeneral)


class LinenModel(bridge.ToNNX):
    """A linen module as an nnx module, called with its training flags and
    its non-parameter collections mutable (module docstring)."""

    def __init__(self, module: nn.Module, rngs: nnx.Rngs | None, mutable: tuple[str, ...],
                 module_paths: tuple[str, ...]) -> None:
        super().__init__(module, rngs=rngs)
        self.to_nnx__train = tuple(sorted(linen_train_kwargs(module).items()))
        self.to_nnx__mutable = mutable
        self.to_nnx__modules = module_paths  # the paths of the linen module calls of a forward pass

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._pytree__state.initializing:
            return super().__call__(*args, **dict(self.to_nnx__train), **kwargs)
        mutable = list(self.to_nnx__mutable) or False
        return super().__call__(*args, mutable=mutable, **dict(self.to_nnx__train), **kwargs)


class _LinenFacts(NamedTuple):
    module_paths: tuple[str, ...]  # the paths of the linen module calls of a forward pass
    mutable: tuple[str, ...]  # its variable collections other than params (batch_stats)
    needs_rngs: bool  # whether a training call draws random numbers (dropout)


def _linen_facts(model: nn.Module, x: jax.ShapeDtypeStruct) -> _LinenFacts:
    """What the bridge needs to know of a linen model, from abstract traces
    of its initialisation and of a training call without random keys."""
    paths: set[str] = set()
    kwargs = linen_train_kwargs(model)

    def record(next_fun: Callable, args: Any, kw: Any, context: Any) -> Any:
        paths.add("/".join(map(str, context.module.path)))
        return next_fun(*args, **kw)

    def init(inp: Any) -> Any:
        with nn.intercept_methods(record):
            return model.init({"params": jax.random.key(0), "dropout": jax.random.key(1)}, inp, **kwargs)

    variables = jax.eval_shape(init, x)
    mutable = tuple(sorted(k for k in variables if k != "params"))
    try:
        jax.eval_shape(lambda v, inp: model.apply(v, inp, mutable=list(mutable) or False, **kwargs), variables, x)
        needs_rngs = False
    except flax.errors.InvalidRngError:
        needs_rngs = True
    return _LinenFacts(tuple(sorted(paths)), mutable, needs_rngs)


def as_nnx(model: Any, example: Any, variables: Mapping[str, Any] | None = None, *,
           abstract: bool = False) -> nnx.Module:
    """``model`` itself if it is an nnx module; a linen module as a
    :class:`LinenModel` holding ``variables`` (a linen variables dict,
    ``{"params": ..., "batch_stats": ...}``), or, without them, variables
    initialised from ``nnx.Rngs(0)`` (``abstract``: shapes only, nothing
    allocated) for an input like ``example``. It keeps random-number state
    only where a training call draws from it (dropout)."""
    if isinstance(model, nnx.Module):
        if variables is not None:
            raise ValueError("variables are for a flax.linen model; an nnx model holds its own")
        return model
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a flax.nnx.Module or a flax.linen.Module, got {type(model).__name__}")
    if model.scope is not None:  # bound: its own variables
        model, bound = model.unbind()
        variables = bound if variables is None else variables
    if variables is not None and not (isinstance(variables, Mapping) and isinstance(variables.get("params"), Mapping)):
        raise ValueError("variables must be a linen variables dict with a 'params' collection, "
                         "e.g. model.init(key, x)")
    shape = jax.ShapeDtypeStruct(example.shape, example.dtype)
    facts = _linen_facts(model, shape)

    def build() -> LinenModel:
        bridged = LinenModel(model, nnx.Rngs(0), facts.mutable, facts.module_paths)
        return bridged.lazy_init(jax.numpy.zeros(shape.shape, shape.dtype))

    bridged = nnx.eval_shape(build) if abstract or variables is not None else build()
    if variables is not None:  # the user's weights in place of the shapes
        nnx.update(bridged, nnx.State(bridge.variables.linen_vars_to_nnx_attrs(dict(variables))))
    bridged.to_nnx__rngs = nnx.Rngs(0) if facts.needs_rngs else None
    return bridged


@contextlib.contextmanager
def constrained_linen_calls(model: LinenModel, strategies: Mapping[str, str], mesh: Mesh, last_layout: list[str],
                            input_layouts: Mapping[str, str] | None, output_layouts: Mapping[str, Mapping[str, str]],
                            levers: frozenset[str], batch: int = 0) -> Iterator[None]:
    """While tracing a :class:`LinenModel`: each planned linen module call's
    input and output constrained to its strategy's layouts (through
    ``flax.linen.intercept_methods``), as the export pins nnx module calls:
    its input first to its producer's layout where ``input_layouts`` names
    it, its output's cotangent to the gradient's layout where the output is
    partial sums, its output to its consumers' common layout where no
    consumer is a module; an embedding looked up at positions rather than at
    the ``batch``'s tokens runs as written (:func:`looks_up_positions`). The levers (ZeRO stages 2 and 3, recomputation)
    are not applied to linen modules: a plan using them is refused."""
    if levers:
        raise ValueError(f"the plan puts {sorted(levers)[:3]} on ZeRO stage 2 or 3 or recomputes them, which the "
                         "export applies to nnx modules only; plan this linen model with levers='none'")
    input_layouts = input_layouts or {}
    output_layouts = output_layouts or {}

    def interceptor(next_fun: Callable, args: Any, kwargs: Any, context: Any) -> Any:
        name = "/".join(map(str, context.module.path))
        if context.method_name != "__call__" or not args:
            return next_fun(*args, **kwargs)
        heads = head_projection(name, strategies)
        if heads is not None and heads[1] == "to":  # a multi-head attention's query, key or value projection
            if id(args[0]) in fanned and len(args) == 1 and not kwargs and _plain(context.module):
                return _projected(context.module, fanned[id(args[0])], mesh)
            return constrain_heads(next_fun(*args, **kwargs), PARAM_LAYOUTS[heads[0]][1], mesh)
        if name not in strategies:
            fused = layer_path(name, "qkv")
            if fused in strategies and isinstance(context.module, nn.MultiHeadDotProductAttention):
                # its one input feeds three projections: converted once, to the fused layer's input layout
                x = constrain(args[0], PARAM_LAYOUTS[strategies[fused]][0], mesh)
                args = (x, *args[1:])
                if strategies[fused] == "filter" and context.module.num_heads % mesh.shape[AXIS_NAMES[1]] == 0:
                    fanned[id(x)] = fanned_out(x, mesh)  # its heads split: the input gradient reduced once
                try:
                    return next_fun(*args, **kwargs)
                finally:
                    fanned.pop(id(x), None)
            return next_fun(*args, **kwargs)
        if isinstance(context.module, nn.Embed) and looks_up_positions(args[0], batch):
            return next_fun(*args, **kwargs)
        param = isinstance(context.module, _PARAM_MODULES)
        lin, lout = (PARAM_LAYOUTS if param else CHANNELWISE_LAYOUTS)[strategies[name]]
        gout = (PARAM_GRADIENT_LAYOUTS if param else CHANNELWISE_GRADIENT_LAYOUTS)[strategies[name]][1]
        last_layout.append(lout)
        x = args[0]
        # a multi-head attention's output projection reads (batch, tokens, heads, head_dim): its channels the heads
        pin = constrain_heads if isinstance(context.module, nn.DenseGeneral) and getattr(x, "ndim", 0) == 4 \
            else constrain
        if name in input_layouts:
            x = pin(x, input_layouts[name], mesh)
        out = next_fun(pin(x, lin, mesh), *args[1:], **kwargs)
        if lout == "partial" and gout != "partial":
            out = pin_cotangent(out, gout, mesh)
        out = constrain(out, lout, mesh)
        consumers = output_layouts.get(name, {})
        after = set(consumers.values())
        if len(after) == 1 and not modules.intersection(consumers):
            out = constrain(out, after.pop(), mesh)
        return out

    modules = set(model.to_nnx__modules)
    fanned: dict[int, Any] = {}  # id of a multi-head attention's input -> its fanned_out copies, during its call
    with nn.intercept_methods(interceptor):
        yield


def _plain(dense: nn.Module) -> bool:
    """Whether a query, key or value projection is a ``DenseGeneral`` over
    the last axis, without batch dims or a custom ``dot_general``, which
    :func:`_projected` computes on its heads (else XLA's partitioner places
    it, and reduces its input gradient on its own)."""
    return isinstance(dense, nn.DenseGeneral) and plain_projection(dense.axis, dense.batch_dims, dense.dot_general,
                                                                   dense.dot_general_cls)


def _projected(dense: nn.DenseGeneral, copies: Any, mesh: Mesh) -> Any:
    """A multi-head attention's query, key or value ``DenseGeneral`` on the
    :func:`~planner.runtime.head_calls.fanned_out` copies of its input, each
    device its heads (:func:`~planner.runtime.head_calls.projected_to_heads`)."""
    kernel = dense.get_variable("params", "kernel")
    bias = dense.get_variable("params", "bias") if dense.use_bias else None
    return projected_to_heads(copies, kernel, bias, mesh, lambda t: tuple(promote_dtype(*t, dtype=dense.dtype)),
                              dense.precision)
