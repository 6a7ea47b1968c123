"""The shape of the piece of a layer that one device computes under each
strategy: the shard, as ``[L, S]`` arrays.

The compute model (:mod:`costmodels.compute`) costs a shard by its own
dimensions rather than by a share of the layer's FLOPs, and calibration
(:mod:`costmodels.calibration`) keys measured times by them, so that one
measured shard teaches every layer of the same shape.

Per device, on a ``d x m`` (data x model) mesh with global batch ``B``
(:mod:`costmodels.strategies`):

========== ================ ============== =============== ============================
strategy   samples          in channels    out channels    first spatial dim
========== ================ ============== =============== ============================
data       B / (d m)        C              F               H
filter     B / d            C              F / m           H
channel    B / d            C / m          F               H
spatial    B / d            C              F               out: ceil(H_out / m);
                                                           in: out * stride + halo
replicated B / d            C              F               H
========== ================ ============== =============== ============================

A spatial shard's input holds its own rows plus the halo rows it receives,
``(K - 1) * dilation + 1 - stride`` in all (ParaDL §4.4), so a 3x3,
stride-1 conv over ``H / m`` output rows reads ``H / m + 2`` input rows.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

from costmodels.strategies import Strategy

__all__ = ["ShardShapes", "shard_shapes", "halo_rows", "row_padding"]


class ShardShapes(NamedTuple):
    """One device's shard of every layer under every strategy."""

    batch: jnp.ndarray  # [L, S] samples per device
    in_channels: jnp.ndarray  # [L, S] input channels (dense: input features) per device
    out_channels: jnp.ndarray  # [L, S] output channels (dense: output features) per device
    in_spatial: jnp.ndarray  # [L, S, 3] input spatial dims per device, halo rows included; 1 where absent
    out_spatial: jnp.ndarray  # [L, S, 3] output spatial dims per device; 1 where absent


def halo_rows(arrays):
    """Input rows beyond its own that a spatial shard needs along the split
    dim, ``[L]``: ``(K - 1) * dilation + 1 - stride``, at least 0 (ParaDL §4.4)."""
    a = arrays
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    return jnp.maximum(0.0, (f32(a.kernel[:, 0]) - 1.0) * f32(a.dilation[:, 0]) + 1.0 - f32(a.stride[:, 0]))


def row_padding(rows, m):
    """``ceil(rows / m) * m / rows``: how much larger a tensor split by rows
    over ``m`` devices is than its rows. Where ``m`` does not divide them,
    each shard still holds ``ceil(rows / m)`` rows (XLA's SPMD partitioner
    pads the split dim to a multiple of ``m``), so collectives on it move
    the padded size (measured on a 17-token ViT over 4: 20/17, docs/transformers.md)."""
    rows = jnp.maximum(jnp.asarray(rows, jnp.float32), 1.0)
    return jnp.ceil(rows / m) * m / rows


def shard_shapes(arrays, batch, d, m) -> ShardShapes:
    """The :class:`ShardShapes` of ``arrays`` (a layer-arrays pytree) for a
    global ``batch`` on a ``d x m`` mesh. Pure and jittable; ``batch``,
    ``d`` and ``m`` may be traced."""
    a = arrays
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    batch, d, m = f32(batch), f32(d), f32(m)
    S = len(Strategy)
    strat = jnp.arange(S)[None, :]  # [1, S]
    one = jnp.ones((f32(a.kind).shape[0], S))  # [L, S]
    samples = jnp.where(strat == Strategy.DATA, batch / (d * m), batch / d) * one
    cin = f32(a.in_channels)[:, None] * jnp.where(strat == Strategy.CHANNEL, 1.0 / m, 1.0) * one
    cout = f32(a.out_channels)[:, None] * jnp.where(strat == Strategy.FILTER, 1.0 / m, 1.0) * one
    out_sp = f32(a.out_spatial)  # [L, 3]
    in_sp = f32(a.in_spatial)
    own_rows = jnp.ceil(out_sp[:, 0] / m)  # [L] output rows a spatial shard computes
    in_rows = jnp.minimum(own_rows * f32(a.stride[:, 0]) + halo_rows(a), in_sp[:, 0])
    spatial = (strat == Strategy.SPATIAL)[..., None]  # [1, S, 1]
    first = jnp.arange(3)[None, None, :] == 0  # [1, 1, 3]
    out_shard = jnp.where(spatial & first, own_rows[:, None, None], out_sp[:, None, :]) * one[..., None]
    in_shard = jnp.where(spatial & first, in_rows[:, None, None], in_sp[:, None, :]) * one[..., None]
    return ShardShapes(batch=samples, in_channels=cin, out_channels=cout, in_spatial=in_shard, out_spatial=out_shard)
