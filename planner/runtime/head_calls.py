"""A multi-head attention's query, key and value projections with its heads
split over ``model``, as the export runs them
(:func:`planner.runtime.module_calls.constrained_calls`,
:func:`planner.runtime.linen.constrained_linen_calls`): one copy of the
input per ``model`` device (:func:`fanned_out`) and each projection on its
heads inside ``jax.shard_map`` (:func:`projected_to_heads`), so that the
three partial input gradients are added on each device and all-reduced
once, as the plan's fused ``qkv`` layer counts it (docs/validation.md,
item 16)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import numpy as np

from costmodels import AXIS_NAMES
from planner.plans.specs import activation_spec

__all__ = ["fanned_out", "plain_projection", "projected_to_heads"]


def fanned_out(x: Any, mesh: Mesh) -> Any:
    """``x``, split over ``data`` and whole on every ``model`` device (the
    ``replicated`` layout), as one copy per ``model`` device: shape ``(m,
    *x.shape)``, split over ``model`` on its first axis. Nothing moves in
    the forward pass; in the backward pass the copies' gradients, each
    device's partial sums, are all-reduced over ``model`` once (Megatron-LM's
    ``f`` operator, Shoeybi et al. 2019 §3). Read by the query, key and value
    projections of a multi-head attention whose heads are split
    (:func:`projected_to_heads`), the three partial input gradients are added
    on each device and reduced once, as the plan's fused ``qkv`` layer
    counts it; projections left to XLA's partitioner reduce each of the
    three (measured, docs/validation.md item 16)."""
    spec = activation_spec("replicated", x.ndim)

    def local(v: Any) -> Any:
        return jax.lax.pcast(v, AXIS_NAMES[1], to="varying")[None]

    return jax.shard_map(local, mesh=mesh, in_specs=spec, out_specs=P(AXIS_NAMES[1], *spec))(x)


def projected_to_heads(copies: Any, kernel: Any, bias: Any, mesh: Mesh,
                       promote: Callable[[tuple], tuple], precision: Any) -> Any:
    """A query, key or value projection (``kernel``: ``(C, heads,
    head_dim)``, ``bias``: ``(heads, head_dim)`` or None) of the
    :func:`fanned_out` ``copies`` of its input, each ``model`` device
    computing its heads from its copy, as Flax's ``LinearGeneral`` /
    ``DenseGeneral`` does (``promote``: the module's dtype promotion; ``precision``:
    its ``lax.dot_general`` precision). Output ``(batch, ..., heads,
    head_dim)`` split by heads; backward: the copies' gradients stay each
    device's partial sums, the kernel's and the bias's are all-reduced over
    ``data``."""
    data, model = AXIS_NAMES
    ndim = copies.ndim - 1  # the input's rank

    def local(xs: Any, k: Any, *b: Any) -> Any:
        x, k, bias = promote((xs[0], k, b[0] if b else None))
        y = jax.lax.dot_general(x, k, (((x.ndim - 1,), (0,)), ((), ())), precision=precision)
        return y if bias is None else y + bias

    specs = (P(model, data), P(None, model, None), *((P(model, None),) if bias is not None else ()))
    out = P(data, *([None] * (ndim - 2)), model, None)
    return jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=out)(
        copies, kernel, *((bias,) if bias is not None else ()))


def plain_projection(axis: Any, batch_axes: Any, dot_general: Any, dot_general_cls: Any) -> bool:
    """Whether a projection (nnx ``LinearGeneral``, linen ``DenseGeneral``:
    its ``axis``, batch axes and ``dot_general`` settings) contracts the last
    axis only, without batch axes or a custom ``dot_general``: what
    :func:`projected_to_heads` computes. Other projections are left to XLA's
    partitioner, which reduces their input gradients on their own."""
    return tuple(np.atleast_1d(axis)) == (-1,) and not batch_axes and dot_general is None and dot_general_cls is None
