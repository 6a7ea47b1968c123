"""XLA:CPU's own buffers: what a plan compiled for the ``cpu`` platform
holds beside the cost model's state, saved activations and workspace, per
layer and option (:func:`xla_cpu_buffers`, built into a ``cpu``
:class:`costmodels.CostTable`). :mod:`costmodels.xla_cpu_schedule` adds
them up along XLA:CPU's schedule (:func:`costmodels.scheduled_memory_per_device`).

The buffers, and the ``cpu`` platform's memory margin the search keeps free,
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
from costmodels.strategies import Layout, Strategy, layout_split

LOCAL_GRADIENT_STRATEGIES = (Strategy.DATA, Strategy.FILTER, Strategy.REPLICATED)  # ZeRO's gradient from own shards

__all__ = ["LOCAL_GRADIENT_STRATEGIES", "MEASURED_JAXLIB", "XlaCpuBuffers", "schedule_note", "xla_cpu_buffers"]

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

    gradient_bytes: jnp.ndarray  # [L, O] the weight gradients per device as the backward pass makes them (G)
    held_gradient_bytes: jnp.ndarray  # [L, O] the gradients the option's state holds (ZeRO 2, 3: its shard)
    kernel_copy_bytes: jnp.ndarray  # [L, O] the kernel copy made at the step's start (C)
    scattered_gradient_bytes: jnp.ndarray  # [L, O] what a ZeRO layer scattering its gradient holds at its step (R)
    late_copy_bytes: jnp.ndarray  # [L, O] a ZeRO dense layer's gradient copy, from after its step to the end (P)
    reversed_kernel_bytes: jnp.ndarray  # [L, S] ConvOperandSwapper's reversed kernel, forward only (S)
    pool_input_bytes: jnp.ndarray  # [L, S] a max pool's zero broadcast, its input's size (Z)
    pool_iota_bytes: jnp.ndarray  # [L, S] a max pool's int32 iotas, one per dimension (I)
    pool_output_bytes: jnp.ndarray  # [L, S] a max pool's output
    max_pool: jnp.ndarray  # [L] 1 for a max pool
    convolution: jnp.ndarray  # [L] 1 for a convolution
    reduces_gradients: jnp.ndarray  # [] 1 where d > 1: the gradients are all-reduced


@jax.jit
def xla_cpu_buffers(a, lay, local_params, group_batch, d, m, delta, gradient_bytes_per_param, gradient_shards,
                    zero_stages, recomputes):
    """XLA:CPU's own buffers per layer and strategy (``costmodels.cost_table``
    on the ``cpu`` platform): what it adds to the saved activations and to the
    workspace, ``[L, S]`` bytes each, and its schedule's buffers
    (:class:`XlaCpuBuffers`). Memory levers leave them alone, but for the
    gradients and the kernel copies of ZeRO's tied layers (below).

    XLA:CPU's max-pool gradient has no select-and-scatter kernel: XLA's
    SelectAndScatterExpander (cpu_compiler.cc) finds each window's argmax with
    int32 iotas of the pool input's shape, one per dimension (batch, spatial,
    channels), and keeps an int32 index matrix [output elements, dimensions]
    from the forward pass for the backward scatter (buffer assignment,
    measured: docs/validation.md "The memory promise"). A convolution's
    backward step holds its output gradient twice: the layout assignment
    gives the input-gradient convolution a transposed copy of it
    (``transpose_copy_fusion``, live-range dumps, measured on the grid); a
    ``channel`` dense layer's, gathered over ``model``, three times: copied
    into the operand layouts of the two products that read it
    (``copy_bitcast_fusion``, ``wrapped_copy``; measured on nanoGPT at 1x8
    and vit-tiny at 2x4, docs/validation.md). And
    XLA:CPU's schedule (:mod:`costmodels.xla_cpu_schedule`, measured rule by rule): a copy of
    every conv kernel but the first weighted layer's (a dense kernel has
    none: XLA:CPU's dot takes its transposed operand as it is; live ranges
    of nanoGPT, the Llama-style model, vit-tiny and VGG16's classifier), a
    reversed kernel where ConvOperandSwapper swaps a conv's operands (window
    larger than the input), each max pool's zero broadcast (its input's
    size). A layer or RMS norm keeps, beside its input, its centred input
    and its inverse deviation broadcast to the input's shape for the
    backward pass (``bitcast_broadcast_fusion``, ``wrapped_broadcast``:
    two more input-sized buffers per norm in the live ranges of nanoGPT
    and the ViT with ``nnx.MultiHeadAttention``).

    ``gradient_shards`` ``[O]``: per option, the devices its state's
    gradients are sharded over (ZeRO stages 2 and 3: the replica group;
    else 1); ``zero_stages`` ``[O]`` its ZeRO stage, ``recomputes`` ``[O]``
    whether it recomputes; ``O`` is a multiple of the strategies, option
    ``s K + k`` strategy ``s`` (:mod:`costmodels.levers`). A replicated
    output a reader slices is kept whole (:func:`_kept_whole`); ZeRO's
    tied layers make their own gradient shard and no kernel copy
    (:func:`_zero_tied`)."""
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
    out_per_device = out_el[:, None] * group_batch / split_of(out_lay)  # [L, S] output elements per device
    index_bytes = jnp.where(max_pool, 4.0 * dims * out_per_device, 0.0)
    iota_bytes = jnp.where(max_pool, 4.0 * dims * pool_in, 0.0)
    dy = delta * out_el[:, None] * group_batch / split_of(gout_lay)  # [L, S] its output gradient per device
    gathered = (kind == LayerKind.DENSE)[:, None] & (strat == Strategy.CHANNEL) & (m > 1)
    dy_copy = jnp.where(conv[:, None], dy, jnp.where(gathered, 2.0 * dy, 0.0))  # [L, S] its copies
    weighted = (conv | (kind == LayerKind.DENSE)) & (params > 0) & (real > 0)
    first = weighted & (jnp.cumsum(weighted) == 1)
    gradients = gradient_bytes_per_param * local_params  # [L, S] whole: as XLA:CPU makes them under every lever
    copied = weighted & ~first & conv  # [L] conv kernels only
    swapped = conv & (jnp.prod(f32(a.kernel), axis=-1) > jnp.prod(f32(a.in_spatial), axis=-1))
    K = gradient_shards.shape[0] // len(Strategy)
    per_option = lambda x: jnp.repeat(x, K, axis=-1)  # noqa: E731  [L, S] -> [L, O]
    whole = per_option(gradients * real[:, None])  # [L, O]
    held = whole / f32(gradient_shards)[None, :]  # [L, O]
    scattered, tied = _zero_tied(weighted, conv, zero_stages, recomputes, K)
    dense_copy = scattered & ~conv[:, None]  # [L, O] a ZeRO dense layer copies its whole gradient (_zero_tied)
    buffers = XlaCpuBuffers(
        gradient_bytes=jnp.where(scattered, held, whole),
        held_gradient_bytes=held,
        kernel_copy_bytes=jnp.where(tied, 0.0, per_option(jnp.where(copied[:, None], gradients, 0.0))),
        scattered_gradient_bytes=jnp.where(scattered, whole, 0.0) + jnp.where(dense_copy, whole, 0.0),
        late_copy_bytes=jnp.where(dense_copy, whole, 0.0),
        reversed_kernel_bytes=jnp.where(swapped[:, None], gradients, 0.0),
        pool_input_bytes=jnp.where(max_pool, delta * pool_in, 0.0),
        pool_iota_bytes=iota_bytes,
        pool_output_bytes=jnp.where(max_pool, delta * out_per_device, 0.0),
        max_pool=f32(max_pool[:, 0]),
        convolution=f32(conv & (real > 0)),
        reduces_gradients=f32(d > 1),
    )
    kept_whole = _kept_whole(a, out_lay, m, delta * out_per_device)
    norm_kept = jnp.where((kind == LayerKind.NORM)[:, None], 2.0 * delta * f32(a.saved_elements)[:, None]
                          * group_batch / split_of(in_lay), 0.0)  # [L, S] centred input, broadcast deviation
    return index_bytes + kept_whole + norm_kept, iota_bytes + dy_copy, buffers


def _kept_whole(a, out_lay, m, out_bytes):
    """``[L, S]`` bytes: a layer's output replicated over the model axis
    (``m > 1``; ``out_bytes`` ``[L, S]`` per device) and read by a layer that
    keeps its input is kept whole for the backward pass. The reader's layout
    conversion from ``REPLICATED`` is a local slice
    (:mod:`costmodels.reshard`), which XLA fuses into the reader's own
    kernels, so the tensor the reader's backward step reads again is the
    replicated one, not the slice (nanoGPT at batch 16 on 1x8, its residual
    adds and attention's q, k, v split replicated: the buffer assignment
    keeps them whole; 9.6 MB predicted without the rule, 20.1 MB with it,
    21.7 MB compiled: docs/validation.md). Counted on the replicated layer,
    as its activation."""
    src, dst = jnp.asarray(a.edge_src, jnp.int32), jnp.asarray(a.edge_dst, jnp.int32)
    saves = (jnp.asarray(a.saved_elements) > 0) & (jnp.asarray(a.mask) > 0)  # [L] keeps (part of) its input
    read_by_saver = jnp.zeros(saves.shape[0], bool).at[src].max((jnp.asarray(a.edge_mask) > 0) & saves[dst])  # [L]
    return jnp.where(read_by_saver[:, None] & (out_lay == Layout.REPLICATED) & (m > 1), out_bytes, 0.0)


def _zero_tied(weighted, conv, zero_stages, recomputes, K: int):
    """Where ZeRO's tied layers change XLA:CPU's buffers, ``([L, O], [L, O])``
    bool: the backward pass makes the gradient shard the state holds, and no
    kernel copy is made at the step's start.

    Under ZeRO stages 2 and 3 the export computes a conv's or dense layer's
    weight gradient from the device's own shards under ``data``, ``filter``
    and ``replicated`` and reduce-scatters it at the layer's backward step,
    tied to the layer's input gradient (``planner.runtime.calls.zero_call``):
    the whole gradient lives at the layer's backward step only, the shard
    after it, and a convolution's kernel copy is not made at the step's
    start
    (VGG16-CIFAR-10, every layer ``data``, ``benchmarks/zero_xla.py``). A
    dense layer's backward step copies the whole gradient for the
    reduce-scatter, a transient beside it, and a gradient-sized copy lives
    from after the step to the end of the step function
    (``wrapped_copy``: vit-tiny at stage 2 on 2x4, every layer ``data``;
    VGG16-CIFAR-10-SplitBrain's ``filter`` classifier at 4x2). Under
    ``channel`` the gradient is all-reduced whole (XLA's partitioner) and
    the weights are copied at the step's start, as without ZeRO. In a
    recomputed run the export ties the run's inputs, weights included, to
    the cotangent (``planner.runtime.runs``): its layers keep their copies
    and whole gradients. ``weighted``, ``conv`` ``[L]``; ``zero_stages``,
    ``recomputes`` ``[O]``, ``K`` options per strategy."""
    local = jnp.repeat(jnp.isin(jnp.arange(len(Strategy)), jnp.asarray(LOCAL_GRADIENT_STRATEGIES)), K)  # [O]
    scattered = weighted[:, None] & ((zero_stages >= 2) & ~recomputes & local)[None, :]
    return scattered, scattered & conv[:, None]

