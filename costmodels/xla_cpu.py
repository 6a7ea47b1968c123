"""What XLA:CPU's default schedule holds at its peak: the per-device memory of
a plan compiled for the ``cpu`` platform, rule by rule.

:func:`costmodels.memory_per_device` is the solvers' memory: the state, the
saved activations and one largest transient (two phases: the backward pass
and the optimizer step). XLA:CPU's breadth-first schedule departs from it
in ways found in its buffer assignment and live ranges
(docs/validation.md, "The memory promise"; ``benchmarks/memory_models.py``
``xla-cpu-rules`` scores them on the validation grid):

* it makes a copy ``C`` of every conv and dense kernel at the step's start
  (``transpose_copy_fusion``, ``copy``), none for the first weighted layer
  nor a ``channel`` dense layer; each weight gradient later replaces its
  copy, so at the backward pass's start the copies stand where the
  gradients would;
* ``ConvOperandSwapper`` swaps a convolution's operands where the window
  exceeds the input and reverses the kernel for it: one more kernel-sized
  buffer ``S`` in the forward pass (``wrapped_reverse``);
* the iotas ``I`` of every max pool (SelectAndScatterExpander) are built at
  the step's start and each lives until its own pool's backward step, and
  each pool's zero broadcast ``Z`` (its input's size) lives into the
  backward pass;
* on ``d > 1`` the combined gradient all-reduce holds the gradients made so
  far twice, its operands and its result tuple.

Per device, with ``A`` the saved activations (with each max pool's index
matrix), ``W`` the workspace without the iotas, ``G`` the gradients and
``args`` the state without gradients and update (weights, optimizer slots,
buffers), over the layers in execution order::

    forward  = sum C + sum S + max_{pool i} (sum_{j<=i} A_j + sum_{j>=i} I_j
                                             + sum_{j!=i} Z_j + 2 out_i)
    backward = sum C + sum A + sum Z + max_l W_l
    reduce   = [d > 1] max_l (sum_{j<l} (C_j + A_j + Z_j) + 2 sum_{j>=l} G_j)
    peak     = args + max(forward, backward, reduce, 2 sum G)

(``2 sum G``: the optimizer step's gradients and update.) It is a structure
chosen among a dozen variants on the grid's 96 plans, each rule a measured
mechanism with no fitted constant; it was measured on plans without memory
levers, and :func:`planner.evaluate` applies it to those only. It is not the
solvers' memory: its forward peak and all-reduce are prefix sums over the
layer order, which their sums plus one largest transient cannot express;
``planner.plan`` checks each plan against it and plans again below the limit
where it exceeds it.

Pure and jit-compiled like :func:`costmodels.memory_per_device`, over a
relaxed plan ``probs`` ``[L, O]``; at one-hot probabilities it is the
discrete plan's value.

The rules, and the ``cpu`` platform's memory margin the search keeps free,
were measured on jaxlib :data:`MEASURED_JAXLIB`'s XLA; another XLA schedules
differently (docs/validation.md, "The memory promise"). :func:`schedule_note` says so where the installed jaxlib is of
another minor release, and ``planner.plan``/``planner.validate`` pass it on.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import jaxlib

from costmodels.layers import LayerKind
from costmodels.levers import strategy_probs
from costmodels.strategies import Strategy, layout_split

__all__ = ["MEASURED_JAXLIB", "XlaCpuBuffers", "schedule_note", "scheduled_memory_per_device", "xla_cpu_buffers"]

MEASURED_JAXLIB = "0.10.2"  # the jaxlib whose XLA:CPU the rules were measured on (docs/validation.md)


def schedule_note(jaxlib_version: str | None = None) -> str:
    """"" where XLA:CPU's schedule is modelled as measured, ``jaxlib_version``
    (default: the installed jaxlib) being of :data:`MEASURED_JAXLIB`'s minor
    release; otherwise a sentence naming the version the model describes."""
    version = jaxlib.__version__ if jaxlib_version is None else jaxlib_version
    if version.split(".")[:2] == MEASURED_JAXLIB.split(".")[:2]:
        return ""
    return (f"XLA:CPU's memory schedule (costmodels.xla_cpu) and the cpu memory margin are modelled on jaxlib "
            f"{MEASURED_JAXLIB}; this is jaxlib {version}, whose XLA may schedule more memory than predicted")


class XlaCpuBuffers(NamedTuple):
    """XLA:CPU's own buffers per layer and strategy, beside a ``cpu`` cost
    table's state, activations and workspace (:func:`costmodels.cost_table`
    builds them for ``CostSettings(platform="cpu")``)."""

    gradient_bytes: jnp.ndarray  # [L, S] the layer's weight gradients per device, without levers
    kernel_copy_bytes: jnp.ndarray  # [L, S] the kernel copy made at the step's start (C)
    reversed_kernel_bytes: jnp.ndarray  # [L, S] ConvOperandSwapper's reversed kernel, forward only (S)
    pool_input_bytes: jnp.ndarray  # [L, S] a max pool's zero broadcast, its input's size (Z)
    pool_iota_bytes: jnp.ndarray  # [L, S] a max pool's int32 iotas, one per dimension (I)
    pool_output_bytes: jnp.ndarray  # [L, S] a max pool's output
    max_pool: jnp.ndarray  # [L] 1 for a max pool
    reduces_gradients: jnp.ndarray  # [] 1 where d > 1: the gradients are all-reduced


@jax.jit
def xla_cpu_buffers(a, lay, local_params, group_batch, d, m, delta, gradient_bytes_per_param):
    """XLA:CPU's own buffers per layer and strategy (``costmodels.cost_table``
    on the ``cpu`` platform): what it adds to the saved activations and to the
    workspace, ``[L, S]`` bytes each, and its schedule's buffers
    (:class:`XlaCpuBuffers`). Memory levers leave them alone.

    XLA:CPU's max-pool gradient has no select-and-scatter kernel: XLA's
    SelectAndScatterExpander (cpu_compiler.cc) finds each window's argmax with
    int32 iotas of the pool input's shape, one per dimension (batch, spatial,
    channels), and keeps an int32 index matrix [output elements, dimensions]
    from the forward pass for the backward scatter (buffer assignment,
    measured: docs/validation.md "The memory promise"). A convolution's
    backward step holds its output gradient twice: the layout assignment
    gives the input-gradient convolution a transposed copy of it
    (``transpose_copy_fusion``, live-range dumps, measured on the grid). And
    XLA:CPU's schedule (module docstring, measured rule by rule): a copy of
    every conv and dense kernel but the first weighted layer's and a channel
    dense layer's, a reversed kernel where ConvOperandSwapper swaps a conv's
    operands (window larger than the input), each max pool's zero broadcast
    (its input's size)."""
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    kind, real, params = f32(a.kind), f32(a.mask), f32(a.params)
    in_lay, out_lay, gout_lay = lay[..., 0], lay[..., 1], lay[..., 3]
    strat = jnp.arange(len(Strategy))[None, :]
    split_of = lambda layout: layout_split(layout, m)  # noqa: E731
    out_el = f32(a.out_elements)
    conv = kind == LayerKind.CONV
    max_pool = ((kind == LayerKind.POOL) & (f32(a.saved_elements) > 0))[:, None]  # average pools save nothing
    dims = f32(a.spatial_rank)[:, None] + 2.0
    pool_in = f32(a.saved_elements)[:, None] * group_batch / split_of(in_lay)  # [L, S] a max pool saves its input
    pool_out = out_el[:, None] * group_batch / split_of(out_lay)  # [L, S] elements per device
    index_bytes = jnp.where(max_pool, 4.0 * dims * pool_out, 0.0)
    iota_bytes = jnp.where(max_pool, 4.0 * dims * pool_in, 0.0)
    dy_copy = jnp.where(conv[:, None], delta * out_el[:, None] * group_batch / split_of(gout_lay),
                        0.0)  # [L, S] the transposed output gradient
    weighted = (conv | (kind == LayerKind.DENSE)) & (params > 0) & (real > 0)
    first = weighted & (jnp.cumsum(weighted) == 1)
    gradients = gradient_bytes_per_param * local_params  # [L, S] without levers
    copied = (weighted & ~first)[:, None] & ~((kind == LayerKind.DENSE)[:, None] & (strat == Strategy.CHANNEL))
    swapped = conv & (jnp.prod(f32(a.kernel), axis=-1) > jnp.prod(f32(a.in_spatial), axis=-1))
    buffers = XlaCpuBuffers(
        gradient_bytes=gradients * real[:, None],
        kernel_copy_bytes=jnp.where(copied, gradients, 0.0),
        reversed_kernel_bytes=jnp.where(swapped[:, None], gradients, 0.0),
        pool_input_bytes=jnp.where(max_pool, delta * pool_in, 0.0),
        pool_iota_bytes=iota_bytes,
        pool_output_bytes=jnp.where(max_pool, delta * pool_out, 0.0),
        max_pool=f32(max_pool[:, 0]),
        reduces_gradients=f32(d > 1),
    )
    return index_bytes, iota_bytes + dy_copy, buffers


def scheduled_memory_per_device(table, probs):
    """Peak bytes per device of XLA:CPU's schedule (the module docstring)
    under the relaxed plan ``probs`` ``[L, O]``; ``table`` is a
    :class:`costmodels.CostTable` built for the ``cpu`` platform."""
    x: XlaCpuBuffers = table.xla_cpu
    mask = table.layer_mask
    q = strategy_probs(probs)  # [L, S]

    def per_layer(a, p):  # [L] expected bytes of each layer
        return jnp.sum(p * a, axis=-1) * mask

    G = per_layer(x.gradient_bytes, q)
    C, S, Z = per_layer(x.kernel_copy_bytes, q), per_layer(x.reversed_kernel_bytes, q), per_layer(x.pool_input_bytes, q)
    iotas = per_layer(x.pool_iota_bytes, q)
    out = per_layer(x.pool_output_bytes, q)
    A = per_layer(table.activation_bytes, probs)  # saved activations with each max pool's index matrix
    args = per_layer(table.state_bytes - table.update_bytes, probs) - G  # weights, slots, buffers
    W = per_layer(table.workspace_bytes, probs) - iotas  # [L] transients at the layer's backward step

    pool = (x.max_pool > 0) & (mask > 0)
    made = jnp.cumsum(A)  # activations made by layer l's forward step
    to_use = jnp.cumsum(iotas[::-1])[::-1]  # iotas of the pools from l on, built at the start
    at_pool = made + to_use + jnp.sum(Z) - Z + 2.0 * out  # [L] the forward peak if at pool l
    forward = jnp.where(jnp.any(pool), jnp.sum(C) + jnp.sum(S) + jnp.max(jnp.where(pool, at_pool, 0.0)), 0.0)
    backward = jnp.sum(C) + jnp.sum(A) + jnp.sum(Z) + jnp.max(W)
    before = jnp.cumsum(C + A + Z) - (C + A + Z)  # copies and activations of the layers before l
    cut = before + 2.0 * jnp.cumsum(G[::-1])[::-1]  # [L] the all-reduce cut before layer l
    reduce = x.reduces_gradients * jnp.max(jnp.where(mask > 0, cut, 0.0))
    return jnp.sum(args) + jnp.maximum(jnp.maximum(forward, backward), jnp.maximum(reduce, 2.0 * jnp.sum(G)))
