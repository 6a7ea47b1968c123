"""How one planned layer's call runs under the export
(:func:`planner.runtime.export.shard_training`): its layouts stated
(:func:`constrain`, :func:`pin_cotangent`), and where stating layouts is not
enough, ZeRO's gathered weights and reduce-scattered gradients, a ``channel``
layer's reduce-scattered partial sums, a recomputed attention. Each is a
module ``__call__`` wrapper: a ``jax.custom_vjp`` or a ``jax.shard_map`` on
the layer's shards, whose collectives are the plan's
(``costmodels.plan_collectives``); why each exists, measured on XLA:CPU, is
in docs/validation.md (item 14) and docs/levers.md."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from costmodels import AXIS_NAMES, STRATEGY_NAMES
from costmodels import LOCAL_GRADIENT_STRATEGIES as _LOCAL_GRADIENT_CODES
from planner.plans.specs import (
    PARAM_GRADIENT_LAYOUTS,
    PARAM_LAYOUTS,
    activation_spec,
    param_spec,
    zero_group_axes,
    zero_spec_entries,
)

__all__ = [
    "LOCAL_GRADIENT_STRATEGIES",
    "SCATTER_DIMS",
    "constrain",
    "constrain_heads",
    "gathering",
    "looks_up_positions",
    "pin_cotangent",
    "recomputing_attention",
    "reduce_scattering",
    "zero_call",
]


# a layer's weight gradient from its own shards, by strategy name
LOCAL_GRADIENT_STRATEGIES = tuple(STRATEGY_NAMES[s] for s in _LOCAL_GRADIENT_CODES)


def looks_up_positions(ids: Any, batch: int) -> bool:
    """Whether an embedding's indices ``ids`` lack the step's batch axis: a
    table looked up at constant positions (``wpe(jnp.arange(T))``, or
    ``arange(T)[None]``), not at the batch's tokens. Its output has no batch
    to lay out, so the export leaves it as written: pinning ``T`` as if it
    were the batch makes XLA compute the lookup split over the devices and
    all-gather it, with the transpose reduce-scattered in the backward pass,
    collectives a replicated lookup does not have (measured on the nanoGPT of
    tests/user_models.py, docs/validation.md)."""
    shape = tuple(getattr(ids, "shape", ()))
    return len(shape) < 2 or shape[0] != batch


def constrain(x: Any, layout: str, mesh: Mesh) -> Any:
    """``x`` constrained to a layout's sharding on ``mesh`` (an array of another rank, or a layout with
    no spec there, unchanged)."""
    if not isinstance(x, jax.Array) and not hasattr(x, "aval"):
        return x
    spec = activation_spec(layout, x.ndim) if (layout != "spatial" or x.ndim >= 3) else None
    return x if spec is None else jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


def constrain_heads(x: Any, layout: str, mesh: Mesh) -> Any:
    """:func:`constrain` for ``(batch, tokens, heads, head_dim)``: split by
    channels is split by heads."""
    if layout == "channel":
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(AXIS_NAMES[0], None, AXIS_NAMES[1], None)))
    return constrain(x, layout, mesh)


def pin_cotangent(x: Any, layout: str, mesh: Mesh) -> Any:
    """``x`` unchanged; in the backward pass its cotangent constrained to ``layout``."""

    @jax.custom_vjp
    def pin(v: Any) -> Any:
        return v

    def fwd(v: Any) -> tuple[Any, None]:
        return v, None

    def bwd(_: None, g: Any) -> tuple[Any]:
        return (constrain(g, layout, mesh),)

    pin.defvjp(fwd, bwd)
    return pin(x) if (isinstance(x, jax.Array) or hasattr(x, "aval")) else x


def zero_call(orig: Callable, strategy: str, mesh: Mesh, *, gather: bool, local: bool) -> Callable:
    """A planned module's ``__call__`` for ZeRO stage 2 or 3: a
    ``jax.custom_vjp`` whose backward reduce-scatters the weight gradients
    over the layer's data-parallel group (:func:`zero_group_axes`).

    * ``gather`` (stage 3, FSDP): the weights, stored sharded, are gathered to
      the strategy's own layout for the call and gathered again for the
      backward pass, which keeps only the sharded weights and the layer's
      input (ZeRO §7.2.2: gathered before the forward and before the
      backward use, freed after each).
    * ``local`` (an ``nnx.Conv`` or ``nnx.Linear`` under ``data``, ``filter``
      or ``replicated``): the weight gradient is computed inside
      ``jax.shard_map`` from each device's shards and reduced with
      ``psum_scatter``, a reduce-scatter on every platform. Otherwise a
      sharding constraint on the gradient asks XLA's partitioner for it,
      which XLA:CPU compiles as an all-reduce of the whole gradient and a
      slice, and combines every layer's into one all-reduce at the end of
      the backward pass: all the whole gradients live at once (measured,
      docs/levers.md).

    The weights the call uses are tied to its input (forward) and to its
    output's cotangent (backward), ``w + 0``, the zero computed on each
    device from its own shard of that activation (:func:`_local_zero`), on
    the shards before a stage-3 gather: so XLA can neither compute a layer's
    kernel copies (its transposed and reversed kernels) and gathers at the
    step's start, which XLA:CPU's breadth-first schedule does with every
    parameter-only value (stage 2 held 1.68x its predicted memory on
    VGG16-CIFAR-10, stage 3 2.38x; with the ties 1.08x and 1.05x,
    benchmarks/zero_xla.py), nor merge the two gathers of stage 3 into one
    kept from the forward to the backward pass. An ``optimization_barrier``
    does neither: XLA:CPU expands it before scheduling.

    The reduce-scattered weight gradients are tied to the layer's input
    gradient the same way (``local``): the updated weights, written over
    the donated ones, then depend on every backward read of the weights, so
    XLA's copy insertion keeps no ``copy`` of the weights from the step's
    start to the layer's backward step (the ResNet of benchmarks/zero_xla.py
    at stage 2: 164.1 MB compiled, 55 MB of such copies live at its peak;
    151.4 MB with the tie). A layer fed by the model input then computes its
    input gradient too, which XLA would otherwise drop."""

    def call(self: Any, x: Any, *args: Any, **kwargs: Any) -> Any:
        graphdef, state = nnx.split(self)

        def weights(state: Any) -> Any:
            if not gather:
                return state
            return jax.tree.map(
                lambda v: jax.lax.with_sharding_constraint(v, NamedSharding(mesh, param_spec(strategy, v.ndim))), state)

        def apply(x: Any, weights: Any) -> Any:
            return orig(nnx.merge(graphdef, weights), x, *args, **kwargs)

        @jax.custom_vjp
        def layer(x: Any, state: Any) -> Any:
            return apply(x, weights(state))

        def tie(state: Any, z: Any) -> Any:
            if not gather:
                return jax.tree.map(lambda v: v + z.astype(v.dtype), state)
            # on the shards, before the gather (else XLA gathers first and adds after)
            return jax.tree.map(lambda v: jax.lax.with_sharding_constraint(
                v + z.astype(v.dtype), NamedSharding(mesh, P(*zero_spec_entries(strategy, v.ndim)))), state)

        def fwd(x: Any, state: Any) -> tuple[Any, Any]:
            z = _local_zero(x, PARAM_LAYOUTS[strategy][0], mesh)
            return apply(x, weights(tie(state, z))), (x, state)

        def bwd(res: Any, dy: Any) -> tuple[Any, Any]:
            x, state = res
            w = weights(tie(state, _local_zero(dy, PARAM_GRADIENT_LAYOUTS[strategy][1], mesh)))
            if not local:
                _, vjp = jax.vjp(apply, x, w)
                dx, dw = vjp(dy)
                return dx, _scatter(dw, strategy, mesh)
            _, vjp = jax.vjp(lambda x: apply(x, w), x)
            (dx,) = vjp(dy)
            dw = _local_scattered_gradients(apply, x, w, dy, strategy, mesh)
            zx = _local_zero(dx, PARAM_GRADIENT_LAYOUTS[strategy][0], mesh)  # (the docstring: no weight copies)
            return dx, jax.tree.map(lambda g: g + zx.astype(g.dtype), dw)

        layer.defvjp(fwd, bwd)
        return layer(x, state)

    return call


def _local_zero(t: Any, layout: str, mesh: Mesh) -> Any:
    """A scalar 0, computed on each device from the first element of its own
    shard of ``t`` (in ``layout``), so it depends on ``t`` without any
    communication (0 x a finite value; XLA does not fold a float product
    with 0, which is NaN for an infinite one). Replicated as it is equal on
    every device, which the unchecked ``shard_map`` states."""
    return jax.shard_map(lambda a: jax.numpy.ravel(a)[0] * 0.0, mesh=mesh,
                         in_specs=(activation_spec(layout, t.ndim),), out_specs=P(), check_vma=False)(t)


def gathering(orig: Callable, strategy: str, mesh: Mesh) -> Callable:
    """The ``__call__`` of a per-channel layer (batch norm, a norm) at ZeRO
    stage 3: its parameters, stored sharded, constrained to the strategy's
    own layout (XLA gathers them) on the module itself, which then runs and
    updates its statistics as usual. Its weights are a few vectors, so
    unlike :func:`zero_call` it does not re-gather them for the backward
    pass, which would run the layer's forward, statistics all-reduce
    included, a second time."""

    def call(self: Any, x: Any, *args: Any, **kwargs: Any) -> Any:
        nnx.update(self, jax.tree.map(
            lambda v: jax.lax.with_sharding_constraint(v, NamedSharding(mesh, param_spec(strategy, v.ndim))),
            nnx.state(self, nnx.Param)))
        return orig(self, x, *args, **kwargs)

    return call


def _local_scattered_gradients(apply: Callable, x: Any, weights: Any, dy: Any, strategy: str, mesh: Mesh) -> Any:
    """The weight gradients of ``apply(x, weights)`` for the output gradient
    ``dy``, reduce-scattered over the layer's data-parallel group: inside
    ``jax.shard_map`` each device differentiates its shard of the layer
    (input in the strategy's layout, output gradient in the one it needs)
    with respect to its own copy of the weights (cast to varying over the
    group, so JAX's transpose adds no all-reduce) and ``psum_scatter``
    reduces each gradient along its last dim into the ZeRO shards
    (:func:`planner.plans.specs.zero_spec_entries`)."""
    group = zero_group_axes(strategy)
    lin = PARAM_LAYOUTS[strategy][0]
    gout = PARAM_GRADIENT_LAYOUTS[strategy][1]
    leaves, treedef = jax.tree.flatten(weights)

    def local(x: Any, dy: Any, *leaves: Any) -> tuple[Any, ...]:
        own = [jax.lax.pcast(v, group, to="varying") for v in leaves]
        _, vjp = jax.vjp(lambda *ws: apply(x, jax.tree.unflatten(treedef, list(ws))), *own)
        return tuple(jax.lax.psum_scatter(g, group, scatter_dimension=g.ndim - 1, tiled=True) for g in vjp(dy))

    grads = jax.shard_map(local, mesh=mesh,
                          in_specs=(activation_spec(lin, x.ndim), activation_spec(gout, dy.ndim),
                                    *[param_spec(strategy, v.ndim) for v in leaves]),
                          out_specs=tuple(P(*zero_spec_entries(strategy, v.ndim)) for v in leaves))(x, dy, *leaves)
    return jax.tree.unflatten(treedef, list(grads))


def _scatter(grads: Any, strategy: str, mesh: Mesh) -> Any:
    """A ZeRO layer's weight gradients constrained to their shards over the
    layer's data-parallel group: XLA reduce-scatters them there."""
    return jax.tree.map(lambda g: jax.lax.with_sharding_constraint(
        g, NamedSharding(mesh, P(*zero_spec_entries(strategy, g.ndim)))), grads)


SCATTER_DIMS = {"batch": 0, "spatial": 1, "channel": -1}  # the dim a layout splits over the model axis


def reduce_scattering(orig: Callable, layout: str, mesh: Mesh) -> Callable:
    """A ``channel`` conv's or dense layer's ``__call__`` whose partial sums
    are reduce-scattered into ``layout`` (``batch``, ``channel`` or
    ``spatial``): inside ``jax.shard_map`` each device convolves its input
    channels with its rows of the kernel, and :func:`_scattered_sum` reduces
    the partial outputs over ``model``, each device keeping its split of the
    batch, channels or rows (ParaDL §4.7's channel exchange, the bias added
    once). Backward: the output gradient all-gathered over ``model``, the
    input gradient local, the kernel's and the bias's gradients all-reduced
    over ``data``: the plan's collectives (``costmodels.plan_collectives``)."""
    dim = SCATTER_DIMS[layout]
    m = mesh.shape[AXIS_NAMES[1]]

    def call(self: Any, x: Any, *args: Any, **kwargs: Any) -> Any:
        graphdef, state = nnx.split(self)
        leaves, treedef = jax.tree.flatten(state)
        with_bias = getattr(self, "bias", None) is not None
        if len(leaves) != 1 + with_bias:
            raise ValueError(f"cannot reduce-scatter a {type(self).__name__} that holds state beside its kernel "
                             "and bias")
        # the kernel's input channels split over model (the plan's channel spec); the bias whole
        specs = [P() if leaf.ndim == 1 else param_spec("channel", leaf.ndim) for leaf in leaves]

        def local(x: Any, *leaves: Any) -> Any:
            # each device's partial sums, without the bias, which the reduction adds once
            y = orig(nnx.merge(graphdef, jax.tree.unflatten(
                treedef, [jax.numpy.zeros_like(v) if v.ndim == 1 else v for v in leaves])), x, *args, **kwargs)
            if y.shape[dim] % m:
                raise ValueError(f"cannot reduce-scatter {type(self).__name__}'s output of local shape {y.shape} "
                                 f"over {m} devices along dim {dim % y.ndim}: {m} does not divide it")
            bias = next((v for v in leaves if v.ndim == 1), None) if with_bias else None
            return _scattered_sum(dim % y.ndim)(y, jax.numpy.zeros(y.shape[-1], y.dtype) if bias is None
                                                   else bias.astype(y.dtype))

        return jax.shard_map(local, mesh=mesh, in_specs=(activation_spec("channel", x.ndim), *specs),
                             out_specs=activation_spec(layout, x.ndim))(x, *leaves)

    return call


def _scattered_sum(dim: int) -> Callable[[Any, Any], Any]:
    """Inside ``shard_map``: ``(partial sums y, bias b) -> psum_scatter(y + b)``
    over ``model`` along ``dim``, the bias added on one ``model`` device,
    with a ``custom_vjp`` whose backward all-gathers the output gradient as
    a value every ``model`` device holds
    alike (``to="invarying"``), so that the bias gradient, summed from it,
    is all-reduced over ``data`` only, as the plan counts it. Autodiff's own
    transpose types the gathered gradient as varying and adds an all-reduce
    over ``model`` (or XLA gathers the bias's shards: measured)."""
    model, data = AXIS_NAMES[1], AXIS_NAMES[0]

    @jax.custom_vjp
    def scattered(y: Any, b: Any) -> Any:
        # the bias joins one device's partial sums, so the sum holds it once, exactly
        once = jax.numpy.where(jax.lax.axis_index(model) == 0, b, jax.numpy.zeros_like(b))
        return jax.lax.psum_scatter(y + once, model, scatter_dimension=dim, tiled=True)

    def fwd(y: Any, b: Any) -> tuple[Any, None]:
        return scattered(y, b), None

    def bwd(_: None, g: Any) -> tuple[Any, Any]:
        full = jax.lax.all_gather(g, model, axis=dim, tiled=True, to="invarying")
        db = jax.lax.psum(full.sum(axis=tuple(range(full.ndim - 1))), data)
        return jax.lax.pcast(full, model, to="varying"), db

    scattered.defvjp(fwd, bwd)
    return scattered


def recomputing_attention(orig: Callable) -> Callable:
    """``nnx.MultiHeadAttention.__call__`` with its ``attention_fn``
    recomputed (restored after): a ``jax.custom_vjp`` whose residuals are
    the queries, keys and values and whose backward runs the attention
    again, tied to the cotangent, then differentiates it, so the scores and
    probabilities are recomputed in the backward pass, as
    ``costmodels.levers`` costs it (``jax.checkpoint``'s semantics, which
    XLA:CPU undoes: docs/levers.md)."""

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        fn = self.attention_fn

        def recomputed(query: Any, key: Any, value: Any, *, mask: Any = None, dropout_rng: Any = None,
                       **options: Any) -> Any:
            def attend(q: Any, k: Any, v: Any) -> Any:
                return fn(q, k, v, mask=mask, dropout_rng=dropout_rng, **options)

            @jax.custom_vjp
            def layer(q: Any, k: Any, v: Any) -> Any:
                return attend(q, k, v)

            def fwd(q: Any, k: Any, v: Any) -> tuple[Any, Any]:
                return attend(q, k, v), (q, k, v)  # the residuals: the queries, keys and values

            def bwd(res: Any, dy: Any) -> tuple[Any, Any, Any]:
                if any(r.shape != dy.shape for r in res):
                    raise ValueError(f"recomputing an attention whose output {dy.shape} is not shaped like its "
                                     f"queries, keys and values {[r.shape for r in res]} is not supported")
                # The recomputation reads the cotangent (x + 0 dy: the same values, as long as dy is
                # finite), so XLA can neither merge it, nor a sequence-parallel attention's gathers of
                # the keys and values, with the forward pass, nor run it before the backward step:
                # XLA:CPU drops the optimization barrier of jax.checkpoint and merges the two
                # (docs/levers.md). dy is split as the queries are, so the tie moves nothing.
                _, vjp = jax.vjp(attend, *(r + 0.0 * dy for r in res))
                return vjp(dy)

            layer.defvjp(fwd, bwd)
            return layer(query, key, value)

        self.attention_fn = recomputed
        try:
            return orig(self, *args, **kwargs)
        finally:
            self.attention_fn = fn

    return call
