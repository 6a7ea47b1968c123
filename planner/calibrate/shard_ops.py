"""The standalone ops ``planner.calibrate.profile`` times: one layer's shard
under a strategy as a :class:`ShardOp` (its shapes, from the strategy menu)
and its jitted forward + backward function with arguments to run it on."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from costmodels import Strategy
from planner.ir.graph import LayerGraph, LayerKind

__all__ = ["ShardOp", "fwd_bwd", "make_arguments", "shard_op"]

_BN_EPSILON = 1e-5


@dataclasses.dataclass(frozen=True)
class ShardOp:
    """One standalone op at one shard shape (hashable: one compilation each)."""

    kind: int  # LayerKind code
    batch: int  # samples in the shard
    in_spatial: tuple[int, ...]  # the shard's input spatial dims (rank 0-3)
    inputs: tuple[int, ...]  # channels of each input (add: one entry per operand; concat: each part)
    out_channels: int
    kernel: tuple[int, ...] = ()  # conv kernel / pooling window; () for the others
    stride: tuple[int, ...] = ()
    dilation: tuple[int, ...] = ()
    padding: tuple[tuple[int, int], ...] = ()
    groups: int = 1
    bias: bool = False  # conv / dense bias; batch-norm scale and shift
    pool: str = ""  # max | avg | global (pooling only)
    input_grad: bool = True  # the backward pass computes dL/dx
    dtype: str = "float32"

    @property
    def description(self) -> str:
        """``x[4,8,8,16] -> 32`` style: input shapes (NHWC) and output channels."""
        shapes = ",".join("x[" + ",".join(str(v) for v in (self.batch, *self.in_spatial, c)) + "]" for c in self.inputs)
        return f"{shapes} -> {self.out_channels}"


def _ints(v, r: int) -> tuple[int, ...]:
    return tuple(int(x) for x in np.asarray(v)[:r])


def shard_op(graph: LayerGraph, i: int, strategy: Strategy, batch: int, m: int, in_parts: tuple[int, ...],
              input_grad: bool, dtype: str) -> ShardOp:
    """The op a device runs for layer ``i`` under ``strategy`` on ``batch``
    samples (already divided by the data axis), model axis ``m``."""
    a = graph.arrays
    kind = LayerKind(int(a.kind[i]))
    r = int(a.spatial_rank[i])
    in_sp = list(_ints(a.in_spatial[i], r))
    out_c = int(a.out_channels[i])
    k, s, dil = _ints(a.kernel[i], r), _ints(a.stride[i], r), _ints(a.dilation[i], r)
    pads = tuple(zip(_ints(a.pad_lo[i], r), _ints(a.pad_hi[i], r), strict=True))
    groups = int(a.groups[i])
    parts = list(in_parts)
    pool = ""
    if kind is LayerKind.POOL:
        pool = "global" if int(a.out_spatial_rank[i]) == 0 else ("max" if float(a.saved_elements[i]) > 0 else "avg")
    windowed = kind is LayerKind.CONV or pool in ("max", "avg")
    if strategy is Strategy.FILTER:
        if kind in (LayerKind.CONV, LayerKind.DENSE):
            out_c //= m
        else:  # channel-wise: every input and the output split by channels
            parts = [c // m for c in parts]
            out_c //= m
    elif strategy is Strategy.CHANNEL:
        parts = [c // m for c in parts]
    elif strategy is Strategy.SPATIAL and r >= 1:
        if windowed:
            rows_out = math.ceil(int(a.out_spatial[i][0]) / m)
            in_sp[0] = (rows_out - 1) * s[0] + (k[0] - 1) * dil[0] + 1  # own rows + halo (ParaDL §4.4)
            pads = ((0, 0), *pads[1:])
        else:
            in_sp[0] = math.ceil(in_sp[0] / m)
    bias = False
    if kind is LayerKind.CONV:
        c_in = int(a.in_channels[i])
        weights = math.prod(k) * (c_in // groups) * int(a.out_channels[i])
        bias = float(a.params[i]) > weights
    elif kind is LayerKind.DENSE:
        bias = float(a.params[i]) > int(a.in_channels[i]) * int(a.out_channels[i])
    elif kind is LayerKind.BATCH_NORM:
        bias = float(a.params[i]) > 0
    return ShardOp(
        kind=int(kind), batch=int(batch), in_spatial=tuple(in_sp), inputs=tuple(parts), out_channels=out_c,
        kernel=k if windowed else (), stride=s if windowed else (), dilation=dil if windowed else (),
        padding=pads if windowed else (), groups=groups if kind is LayerKind.CONV else 1, bias=bias, pool=pool,
        input_grad=input_grad, dtype=dtype,
    )


def _conv_numbers(rank: int) -> tuple[str, str, str]:
    sp = "DHW"[3 - rank:]
    return f"N{sp}C", f"{sp}IO", f"N{sp}C"


def _forward(op: ShardOp) -> Callable:
    """``f(params, xs) -> y`` for the op (xs: a tuple of inputs)."""
    kind = LayerKind(op.kind)
    r = len(op.in_spatial)
    spatial_axes = tuple(range(1, 1 + r))
    if kind is LayerKind.CONV:
        def conv(p, xs):
            y = jax.lax.conv_general_dilated(
                xs[0], p["w"], window_strides=op.stride, padding=op.padding, rhs_dilation=op.dilation,
                dimension_numbers=_conv_numbers(r), feature_group_count=op.groups,
            )
            return y + p["b"] if op.bias else y
        return conv
    if kind is LayerKind.DENSE:
        def dense(p, xs):
            y = jnp.matmul(xs[0], p["w"])
            return y + p["b"] if op.bias else y
        return dense
    if kind is LayerKind.BATCH_NORM:
        def batch_norm(p, xs):  # training mode: statistics over batch and space
            x = xs[0]
            axes = (0, *spatial_axes)
            mean = jnp.mean(x, axis=axes, keepdims=True)
            var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
            y = (x - mean) * jax.lax.rsqrt(var + _BN_EPSILON)
            return y * p["scale"] + p["b"] if op.bias else y
        return batch_norm
    if kind is LayerKind.POOL:
        if op.pool == "global":
            return lambda p, xs: jnp.mean(xs[0], axis=spatial_axes)
        window, strides = (1, *op.kernel, 1), (1, *op.stride, 1)
        pads = ((0, 0), *op.padding, (0, 0))
        if op.pool == "max":
            return lambda p, xs: jax.lax.reduce_window(
                xs[0], -jnp.inf, jax.lax.max, window, strides, pads)
        size = float(math.prod(op.kernel))
        return lambda p, xs: jax.lax.reduce_window(
            xs[0], 0.0, jax.lax.add, window, strides, pads) / size
    if kind is LayerKind.ELEMENTWISE:
        return lambda p, xs: jnp.maximum(xs[0], 0.0)
    if kind is LayerKind.ADD:
        return lambda p, xs: functools.reduce(jnp.add, xs)
    if kind is LayerKind.CONCAT:
        return lambda p, xs: jnp.concatenate(xs, axis=-1)
    raise ValueError(f"layer kind {kind.name.lower()} cannot be profiled")


def _param_shapes(op: ShardOp) -> dict[str, tuple[int, ...]]:
    kind = LayerKind(op.kind)
    if kind is LayerKind.CONV:
        out = {"w": (*op.kernel, op.inputs[0] // op.groups, op.out_channels)}
    elif kind is LayerKind.DENSE:
        out = {"w": (op.inputs[0], op.out_channels)}
    elif kind is LayerKind.BATCH_NORM and op.bias:
        return {"scale": (op.out_channels,), "b": (op.out_channels,)}
    else:
        return {}
    if op.bias:
        out["b"] = (op.out_channels,)
    return out


@functools.partial(jax.jit, static_argnames=("op",))
def fwd_bwd(op: ShardOp, params, xs, cotangent):
    """Forward and backward of one shard op; returns everything it computed
    (so XLA keeps all of it)."""
    f = _forward(op)
    if op.input_grad:
        y, pull = jax.vjp(f, params, xs)
    elif params:
        y, pull = jax.vjp(lambda p: f(p, xs), params)
    else:
        return f(params, xs), ()
    return y, pull(cotangent)


def make_arguments(op: ShardOp, seed: int = 0):
    rng = np.random.default_rng(seed)
    dt = jnp.dtype(op.dtype)

    def rand(shape):
        return jnp.asarray(rng.standard_normal(shape, dtype=np.float32), dt)

    params = {k: rand(s) for k, s in _param_shapes(op).items()}
    xs = tuple(rand((op.batch, *op.in_spatial, c)) for c in op.inputs)
    y = jax.eval_shape(_forward(op), params, xs)
    return params, xs, rand(y.shape)
