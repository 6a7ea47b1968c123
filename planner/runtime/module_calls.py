"""How the export runs an nnx model's planned module calls while it traces
the training step (:func:`constrained_calls`): each call's input and output
constrained to its strategy's layouts, and where stating layouts is not
enough the calls of :mod:`planner.runtime.calls` (ZeRO's gathered weights
and reduce-scattered gradients, reduce-scattered partial sums, a recomputed
attention, a multi-head attention's projections on its heads). Linen
modules go through :func:`planner.runtime.linen.constrained_linen_calls`.

What :func:`constrained_calls` does with each call, by its arguments:

* An embedding looked up at positions rather than at the ``batch``'s
  tokens (:func:`planner.runtime.calls.looks_up_positions`) runs as
  written: its output has no batch axis to lay out.
* Where ``input_layouts`` names a module, its input is first pinned to
  that layout (its producer's), so that functional ops before it keep the
  plan's layout and the conversion happens at the module's input.
* Where ``output_layouts`` names a module (consumer -> the consumer's
  input layout, :func:`consumer_layouts`) and no consumer is a module
  call, its output is then pinned to the consumers' common input layout,
  so that the functional ops after it run in their planned layout and the
  conversion happens at the module's output.
* A module whose output layout is partial sums (``channel``), which no
  sharding can state, has its output's *cotangent* pinned to the layout
  the plan gives that gradient (replicated over ``model``): else XLA may
  compute the weight gradient from operands gathered over ``data``
  instead of all-reducing it (measured, docs/validation.md).
* Where ``scatters`` names such a module (:func:`scatter_layouts`), the
  module runs inside ``jax.shard_map`` on its shards and its partial sums
  are reduce-scattered into the layout given (``psum_scatter``), with the
  bias added once (:func:`planner.runtime.calls.reduce_scattering`):
  without it the SPMD partitioner all-reduces the whole output and slices it,
  and XLA:CPU, which has no pass turning that pair into a reduce-scatter,
  fuses the slice into the consumers and keeps the whole all-reduce
  result for the backward pass (measured, docs/validation.md).
* Where ``blocks`` names a module that holds planned layers without
  being one (a residual block), its input and output are pinned to the
  layouts given (:func:`block_layouts`; ``None``: left to XLA), so that
  the shortcut and the first layer read one value and the functional ops
  at the block's end run in their planned layout.
* An ``nnx.MultiHeadAttention`` whose attention layer (``<path>/attention``)
  is in ``remat`` recomputes its attention: the backward pass runs it
  again from the queries, keys and values it keeps (:func:`planner.runtime.calls.recomputing_attention`); the
  layers so treated are added to ``recomputed``.
* A planned module in ``fsdp`` (ZeRO stage 3: its weights stored sharded
  over its data-parallel group) gathers its weights at its call and
  again in the backward pass, instead of keeping the forward's gathered
  copy until then; a conv or dense layer in ``sharded_grads`` (ZeRO
  stage 2 or 3) under ``data``, ``filter`` or ``replicated``
  reduce-scatters its weight gradients itself
  (:func:`planner.runtime.calls.zero_call`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from flax import nnx
from jax.sharding import Mesh

from costmodels import AXIS_NAMES
from planner.ir.graph import layer_path
from planner.plans.specs import (
    CHANNELWISE_GRADIENT_LAYOUTS,
    CHANNELWISE_LAYOUTS,
    PARAM_GRADIENT_LAYOUTS,
    PARAM_LAYOUTS,
    head_projection,
)
from planner.runtime.calls import (
    LOCAL_GRADIENT_STRATEGIES,
    constrain,
    constrain_heads,
    gathering,
    looks_up_positions,
    pin_cotangent,
    recomputing_attention,
    reduce_scattering,
    zero_call,
)
from planner.runtime.head_calls import fanned_out, plain_projection, projected_to_heads

__all__ = ["constrained_calls"]

_PARAM_MODULES = (nnx.Conv, nnx.Linear, nnx.Embed, nnx.LinearGeneral)


@contextlib.contextmanager
def constrained_calls(model: nnx.Module, strategies: Mapping[str, str], mesh: Mesh,
                       last_layout: list[str] | None = None,
                       input_layouts: Mapping[str, str] | None = None,
                       output_layouts: Mapping[str, Mapping[str, str]] | None = None,
                       blocks: Mapping[str, tuple[str | None, str | None]] | None = None,
                       remat: frozenset[str] = frozenset(), recomputed: set[str] | None = None,
                       fsdp: frozenset[str] = frozenset(),
                       scatters: Mapping[str, str] | None = None,
                       sharded_grads: frozenset[str] = frozenset(), batch: int = 0) -> Iterator[None]:
    """While tracing: constrain each planned module call's input and output to
    its strategy's layouts (patched ``__call__``, restored on exit), as the
    module docstring lists. The output layout of the last planned call is
    appended to ``last_layout``."""
    input_layouts = {} if input_layouts is None else input_layouts
    output_layouts = {} if output_layouts is None else output_layouts
    blocks = {} if blocks is None else blocks
    scatters = {} if scatters is None else scatters
    paths = {id(m): "/".join(map(str, p)) for p, m in nnx.iter_modules(model)}
    module_names = set(paths.values())
    classes = {type(m) for _, m in nnx.iter_modules(model)}
    originals = {(cls, "__call__"): cls.__call__ for cls in classes}
    # an embedding's attend (a tied output layer) is a planned call of its own, "<path>/attend"
    originals.update({(cls, "attend"): cls.attend for cls in classes if issubclass(cls, nnx.Embed)})
    fanned: dict[int, Any] = {}  # id of a multi-head attention's input -> its fanned_out copies, during its call

    def wrap(cls: type, orig: Callable, method: str) -> Callable:
        def wrapper(self: Any, x: Any, *args: Any, **kwargs: Any) -> Any:
            name = paths.get(id(self))
            if method == "attend" and name is not None:
                name = layer_path(name, "attend")
            to_heads = None if name is None else head_projection(name, strategies)
            if to_heads is not None and to_heads[1] == "to":
                return _to_heads_call(orig, self, x, args, kwargs, to_heads[0], fanned.get(id(x)), mesh)
            if name is None or name not in strategies:
                if isinstance(self, nnx.MultiHeadAttention) and name is not None:
                    return _attention_call(orig, self, name, x, args, kwargs, strategies=strategies, mesh=mesh,
                                           block=blocks.get(name), remat=remat, recomputed=recomputed,
                                           zero=fsdp | sharded_grads, fanned=fanned)
                if name not in blocks:
                    return orig(self, x, *args, **kwargs)
                bin_, bout = blocks[name]  # a block of planned layers
                out = orig(self, x if bin_ is None else constrain(x, bin_, mesh), *args, **kwargs)
                return out if bout is None else constrain(out, bout, mesh)
            if method == "__call__" and isinstance(self, nnx.Embed) and looks_up_positions(x, batch):
                return orig(self, x, *args, **kwargs)
            param = isinstance(self, _PARAM_MODULES)
            lin, lout = (PARAM_LAYOUTS if param else CHANNELWISE_LAYOUTS)[strategies[name]]
            gout = (PARAM_GRADIENT_LAYOUTS if param else CHANNELWISE_GRADIENT_LAYOUTS)[strategies[name]][1]
            if last_layout is not None:
                last_layout.append(lout)
            # a multi-head attention's output projection reads (batch, tokens, heads, head_dim):
            # its channels are the heads
            pin = constrain_heads if isinstance(self, nnx.LinearGeneral) and getattr(x, "ndim", 0) == 4 \
                else constrain
            if name in input_layouts:
                x = pin(x, input_layouts[name], mesh)
            if name in scatters:
                if not isinstance(self, (nnx.Conv, nnx.Linear)):
                    raise ValueError(f"scatters names {name!r}, a {type(self).__name__}; the export reduce-scatters "
                                     "the outputs of nnx.Conv and nnx.Linear modules only")
                return reduce_scattering(orig, scatters[name], mesh)(self, pin(x, lin, mesh), *args, **kwargs)
            call = orig
            local = (name in sharded_grads and isinstance(self, (nnx.Conv, nnx.Linear))
                     and strategies[name] in LOCAL_GRADIENT_STRATEGIES)
            if local or (name in fsdp and param):  # (other stage-2 layers: the gradients' constraint, in _build)
                call = zero_call(orig, strategies[name], mesh, gather=name in fsdp, local=local)
            elif name in fsdp:
                call = gathering(orig, strategies[name], mesh)
            out = call(self, pin(x, lin, mesh), *args, **kwargs)
            if lout == "partial" and gout != "partial":
                out = pin_cotangent(out, gout, mesh)
            out = constrain(out, lout, mesh)
            consumers = output_layouts.get(name, {})
            after = set(consumers.values())
            if consumers and not module_names.intersection(consumers) and len(after) == 1:
                out = constrain(out, after.pop(), mesh)
            return out

        return wrapper

    own = {key for key in originals if key[1] in key[0].__dict__}  # else inherited: deleted again on exit
    try:
        for (cls, method), orig in originals.items():
            setattr(cls, method, wrap(cls, orig, method))
        yield
    finally:
        for (cls, method), orig in originals.items():
            if (cls, method) in own:
                setattr(cls, method, orig)
            else:
                delattr(cls, method)


def _to_heads_call(orig: Callable, projection: nnx.LinearGeneral, x: Any, args: tuple, kwargs: dict, strategy: str,
                   copies: Any, mesh: Mesh) -> Any:
    """A query, key or value projection of a fused ``qkv`` layer planned
    ``strategy``: its input is the attention module's, converted once there
    (:func:`_attention_call`); on the ``copies`` the attention fanned out
    (:func:`~planner.runtime.head_calls.fanned_out`) it runs on its heads,
    else its output is split by heads where planned."""
    plain = not args and set(kwargs) <= {"out_sharding"} and kwargs.get("out_sharding") is None
    if copies is not None and plain:
        bias = None if projection.bias is None else projection.bias[...]
        return projected_to_heads(copies, projection.kernel[...], bias, mesh,
                                  lambda t: projection.promote_dtype(t, dtype=projection.dtype), projection.precision)
    return constrain_heads(orig(projection, x, *args, **kwargs), PARAM_LAYOUTS[strategy][1], mesh)


def _attention_call(orig: Callable, attention: nnx.MultiHeadAttention, name: str, x: Any, args: tuple,
                    kwargs: dict, *, strategies: Mapping[str, str], mesh: Mesh,
                    block: tuple[str | None, str | None] | None, remat: frozenset[str],
                    recomputed: set[str] | None, zero: frozenset[str], fanned: dict[int, Any]) -> Any:
    """An ``nnx.MultiHeadAttention`` call under :func:`_constrained_calls`:
    its attention recomputed where ``remat`` names it; as a block
    (``block``: input and output layouts) its one input, which feeds three
    projections, converted once to the fused layer's input layout; where its
    heads are split (:func:`_fans_out`) the projections read
    :func:`~planner.runtime.head_calls.fanned_out` copies of that input."""
    call = orig
    mine = {r for r in remat if r.rpartition("/")[0] == name}
    if mine:
        call = recomputing_attention(orig)
        if recomputed is not None:
            recomputed.update(mine)
    if block is None:
        return call(attention, x, *args, **kwargs)
    bin_, bout = block
    fused = layer_path(name, "qkv")
    if fused in strategies:
        bin_ = PARAM_LAYOUTS[strategies[fused]][0]
    x = x if bin_ is None else constrain(x, bin_, mesh)
    if _fans_out(attention, fused, strategies, mesh, zero):
        fanned[id(x)] = fanned_out(x, mesh)
    try:
        out = call(attention, x, *args, **kwargs)
    finally:
        fanned.pop(id(x), None)
    return out if bout is None else constrain(out, bout, mesh)


def _fans_out(attention: nnx.MultiHeadAttention, fused: str, strategies: Mapping[str, str], mesh: Mesh,
              zero: frozenset[str]) -> bool:
    """Whether the export runs ``attention``'s query, key and value
    projections on :func:`~planner.runtime.head_calls.fanned_out` copies of its
    input: its fused layer's heads split (``filter``) over ``model``, which
    divides them, without ZeRO stage 2 or 3 on it, and each projection a
    plain ``LinearGeneral`` (the last axis to ``(heads, head_dim)``, no batch
    axes, ``lax.dot_general``). Else XLA's partitioner places the
    projections, and reduces their input gradients once each."""
    projections = [getattr(attention, k, None) for k in ("query", "key", "value")]
    return (strategies.get(fused) == "filter" and fused not in zero
            and all(isinstance(p, nnx.LinearGeneral)
                    and plain_projection(p.axis, p.batch_axis, p.dot_general, p.dot_general_cls)
                    and p.kernel.ndim == 3 and p.kernel.shape[1] % mesh.shape[AXIS_NAMES[1]] == 0
                    for p in projections))

