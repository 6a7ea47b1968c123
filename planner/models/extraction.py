"""Extract a :class:`~planner.ir.graph.LayerGraph` from a Flax model (nnx or linen).

``extract(model, example_input)`` traces one forward pass abstractly and turns
it into layers added through :class:`~planner.ir.builder.GraphBuilder`, so shapes,
parameter counts and FLOPs are computed exactly as for the zoo. No weight is
ever materialised: an abstract model (``nnx.eval_shape``) or a concrete one
both work, and linen models are initialised with ``jax.eval_shape``.

Approach (``../shared/reference/jax-notes.md`` §1, "interception +
named_scope + jaxpr walk"):

1. Every module call pushes a ``jax.named_scope`` marker that names its module
   path and call ordinal (nnx: ``__call__`` of each module class reachable
   through ``nnx.iter_modules`` is patched for the duration of the trace and
   restored in ``finally``; linen: ``flax.linen.intercept_methods``, every
   method but ``setup``).
2. ``jax.make_jaxpr`` of the forward pass; the jaxpr is walked recursively
   (``jax.extend.core.jaxprs_in_params``) through ``jit``, ``custom_jvp_call``,
   ``custom_vjp_call`` and ``checkpoint``, outer name stacks prefixed to the
   (relative) inner ones. ``cond``, ``scan`` and ``while`` are opaque.
3. Data flow decides the edges: every jaxpr variable remembers the layer that
   produced it.

What becomes a layer
--------------------
* **Module layers.** A call of ``nnx.Conv`` / ``nnx.Linear`` /
  ``nnx.BatchNorm`` / ``nnx.LayerNorm`` / ``nnx.RMSNorm`` / ``nnx.Embed``
  (linen: ``nn.Conv`` / ``nn.Dense`` / ``nn.BatchNorm`` / ``nn.LayerNorm`` /
  ``nn.RMSNorm`` / ``nn.Embed``; the norms over the last axis only, else
  opaque; an embedding of the model's ``(batch, tokens)`` integer input,
  whose graph input is then ``(1, tokens)``) is one layer named by its
  module path joined with ``/`` (nnx:
  ``features/0``, ``layer1/0/conv1``; linen: the scope path without the
  top-level class, ``Conv_0``, ``Block_0/Conv_0``). Conv attributes (kernel,
  strides, explicit padding, kernel dilation, feature groups) come from the
  ``conv_general_dilated`` primitive, bias/scale presence from the module's
  parameters; the builder's inferred output shape and parameter count are
  checked against the jaxpr. Everything inside such a call is absorbed.
  An embedding's ``attend`` (``x @ table.T``, a tied output layer) is a
  dense layer named ``<embedding path>/attend`` that owns no parameters. A
  module owning only parameters that it adds to one token sequence (learned
  positions), possibly putting one of them in front first (a class token),
  is a position-embedding layer named by its path. An
  ``nnx.MultiHeadAttention`` self-attention call (no decoding cache,
  query-key norms or dropout; the default attention function) is three
  layers: its query, key and value projections as one dense layer
  ``<path>/qkv`` grouped by head, the attention, and ``<path>/out``.
* **Functional ops** outside those modules are named
  ``GraphBuilder.auto_name(scope, op)``, ``scope`` being the path of the
  module whose ``__call__`` is running (``""`` at the root):
  ``relu`` (``jax.nn.relu`` / ``max(x, 0)``), ``max_pool``
  (``reduce_window_max``), ``avg_pool`` (``reduce_window_sum``; the division
  that follows is folded), ``global_avg_pool`` (``reduce_sum`` over every
  spatial dim), ``add`` (two activations of different producers, equal
  shapes), ``concat`` (channel axis), ``flatten`` (``reshape`` to
  ``(B, C*H*W)``), ``reshape`` (positions to one token axis, ``(B, H, W, C)``
  to ``(B, H*W, C)``: a ``flatten``-kind layer, ``GraphBuilder.tokens``),
  ``first_token`` (``x[:, 0]`` of a token sequence), ``multiply`` (two
  activations of different producers), ``attention``
  (``jax.nn.dot_product_attention`` of the queries, keys and values of one
  fused projection reshaped to ``(B, tokens, heads, 3, head_dim)``; causal
  when a mask is applied; ``(B, tokens, 3, heads, head_dim)`` is refused, as
  an equal split of its features would not split whole heads). Any other element-wise activation function applied to one
  activation is one ``elementwise`` layer, named after the element-wise
  jitted / ``custom_jvp`` function holding it (``relu``, ``silu``,
  ``leaky_relu``, ``relu6``), else the ``jax.nn`` function it was traced in
  (``gelu``), else its primitive (``tanh``; ``logistic`` for
  ``jax.nn.sigmoid``, an inlined jit). Its FLOPs per element are its number
  of element-wise primitives, its rescales by constants included (as XLA
  counts them: 8 for ``jax.nn.gelu``). An element-wise
  op of several values that all derive from one producer (``x *
  sigmoid(x)``) joins that producer's activation layer.
* **Folded, no layer**: ops that only rescale, shift, convert, copy or
  select one activation against constants (dropout in both modes, the
  ``1/n`` of a mean, casts) and reshapes/broadcasts that keep the shape.
* **Unsupported**: a module type with parameters that is not modelled
  (``nnx.LinearGeneral``, a user module owning ``nnx.Param`` s directly
  other than a position embedding, ...; a Flax attention module other than
  a plain ``nnx.MultiHeadAttention`` as a whole;
  a Conv whose input is transformed first, e.g. circular padding), or a
  primitive on activations with no mapping (``transpose``, ``gather``,
  ``pad``, ``dot_general`` of two activations, ``cond``/``scan`` on
  activations, ...). With ``on_unsupported="error"`` (default) a
  ``ValueError`` names the op or module type and its module path. With
  ``on_unsupported="replicate"`` it becomes an ``OTHER`` layer:
  **replicated, cost estimated from FLOPs** (forward FLOPs counted from its
  primitives: conv ``2*|out|*|rhs|/C_out/groups``, ``dot_general``
  ``2*M*K*N``, element-wise 1 per element, reductions 1 per input element,
  ``cond`` = max over branches, ``scan`` x length).

Training mode
-------------
nnx models are traced as they are, except that ``nnx.BatchNorm`` is traced
with its running averages on a private copy (flax's in-trace statistics
updates cost O(trace size) each, quadratic for deep nets); the layer is the
same in both modes: ``GraphBuilder.batch_norm`` models training-mode cost.
Dropout folds away in either mode. linen models are
called with ``train=True`` / ``training=True`` / ``is_training=True`` /
``deterministic=False`` / ``use_running_average=False`` when their
``__call__`` has such a parameter, with every collection mutable
(``batch_stats``) and ``params`` / ``dropout`` RNG streams.

Limitations
-----------
Module calls inside ``nnx.jit`` / ``nnx.remat`` / ``jax.jit`` functions
within the model are seen (the traced copy's modules carry their path as a
static attribute, and the markers name module paths, so jit cache hits are
harmless); but a ``jax.jit`` function that calls modules and was first traced
outside ``extract`` has no markers in its cached trace, so its modules look
like functional ops. ``BatchNorm`` with only one of scale/bias is unsupported (the
builder models affine or not). Activations must be batch-first,
channels-last. While tracing, ``__call__`` of the model's nnx module classes
is patched process-wide (restored afterwards): do not run two extractions of
models sharing classes in parallel threads.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from flax import nnx

from planner.ir.builder import GraphBuilder
from planner.ir.graph import LayerGraph, check_on_unsupported
from planner.models._jaxpr_walk import _Walker
from planner.models._parameters import check_parameters, owned_values, parameter_count
from planner.models._tracing import _graph_input_shape, _trace_linen, _trace_nnx, linen_train_kwargs
from planner.usage import InternalError
from planner.user_code import user_code

__all__ = ["extract", "linen_train_kwargs"]

def _input_spec(example_input: Any) -> jax.ShapeDtypeStruct:
    if isinstance(example_input, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct(tuple(example_input.shape), example_input.dtype)
    if hasattr(example_input, "shape") and hasattr(example_input, "dtype"):
        return jax.ShapeDtypeStruct(tuple(example_input.shape), example_input.dtype)
    arr = np.asarray(example_input)
    return jax.ShapeDtypeStruct(arr.shape, arr.dtype)


def extract(
    model: Any,
    example_input: Any,
    *,
    name: str | None = None,
    on_unsupported: str = "error",
) -> LayerGraph:
    """The :class:`LayerGraph` of a Flax model's forward pass (see the module docstring).

    ``model`` is a ``flax.nnx.Module`` (concrete, or abstract from
    ``nnx.eval_shape``) or a ``flax.linen.Module`` (unbound; initialised
    abstractly). ``example_input`` is an array or ``jax.ShapeDtypeStruct``,
    batch first, channels last: ``(B, H, W, C)``, ``(B, D, H, W, C)``,
    ``(B, L, C)`` or ``(B, features)``; the graph is per sample, channels
    first (``input_shape=(C, H, W)``). ``on_unsupported`` is ``"error"`` or
    ``"replicate"``; a graph in which it replaced something records
    ``on_unsupported="replicate"`` (and so do the plans made for it, so that
    :func:`planner.shard` and :func:`planner.validate` extract the model the
    same way).
    """
    check_on_unsupported(on_unsupported)
    x = _input_spec(example_input)
    if not 2 <= len(x.shape) <= 5:
        raise ValueError(
            f"example_input must be batch-first and channels-last with 0-3 spatial dims, "
            f"(B, features) to (B, D, H, W, C); got shape {tuple(x.shape)}"
        )
    batch = int(x.shape[0])
    input_shape = _graph_input_shape(x)
    if not isinstance(model, (nnx.Module, nn.Module)):
        raise ValueError(
            f"model must be a flax.nnx.Module or a flax.linen.Module, got {type(model).__name__}"
        )
    # the forward pass (and a linen module's setup) is the user's code: its prints go to stderr, its errors are its own
    source = f"{type(model).__module__}.{type(model).__qualname__}"
    with user_code("your model", "while shardplan traced it", source):
        if isinstance(model, nnx.Module):
            closed, infos, leaves = _trace_nnx(model, x)
            params: Any = nnx.state(model, nnx.Param)
        else:
            closed, infos, params, leaves = _trace_linen(model, x)
    builder = GraphBuilder(name or type(model).__name__, input_shape)
    walker = _Walker(builder, infos, batch, on_unsupported)
    jaxpr = closed.jaxpr
    invals = owned_values(leaves, infos, GraphBuilder.input)
    if len(invals) != len(jaxpr.invars):
        raise InternalError(f"extract: {len(jaxpr.invars)} traced inputs for {len(invals) - 1} state leaves")
    outs = walker.walk(jaxpr, invals, (), ())
    walker.close()
    for v in outs:
        if v is not None:
            walker.resolve(v)
    graph = builder.build()
    check_parameters(graph, infos, parameter_count(params))
    # a graph with stand-ins says so: the model extracts to it only with this option again
    return dataclasses.replace(graph, on_unsupported="replicate") if walker.replaced else graph
