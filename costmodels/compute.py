"""Hardware as arrays, and the compute-time model: one layer shard's forward
and backward time on one device, kernel by kernel.

A convolution or dense layer runs three GEMM-shaped kernels per iteration
(forward, backward-data, backward-weight; implicit GEMM for convolutions,
Chetlur et al., "cuDNN", 2014, §3); every other layer runs a memory-bound
forward kernel and a backward kernel. Each kernel costs

``launch_s + combine(t_compute, t_memory)``

* ``t_compute = padded FLOPs / (peak[math mode] * efficiency * saturation)``:
  the GEMM's output-feature dim ``N`` is padded to ``channel_tile`` (a thread
  block computes a whole tile; NVIDIA, "Matrix Multiplication Background
  User's Guide", tile quantization) and its reduction dim ``K`` to
  ``reduction_tile`` (the tensor-core k step); ``saturation = W / (W + W_half)``
  with ``W`` the kernel's padded output elements grows with the work per
  kernel: too few thread blocks leave multiprocessors idle (same guide, wave
  quantization; a saturating form of it). Float32 convolutions and matmuls
  run in the math mode the device's ``matmul_precision`` selects (TF32 on
  tensor cores at JAX's default, :meth:`costmodels.Device.math_mode`).
* ``t_memory = bytes the kernel reads and writes / memory bandwidth``;
* ``combine`` is the p-norm ``(t_c^p + t_m^p)^(1/p)``: p = 1 adds them (no
  overlap), p -> inf (``null`` in the file) is the roofline's max
  (Williams, Waterman and Patterson, "Roofline", CACM 2009).

With the defaults of :class:`costmodels.KernelSpec` (no launch cost, tiles of
1, no saturation, max) this is a roofline per kernel. The constants of the
shipped presets and their sources are in ``costmodels/presets`` and
``docs/fidelity.md``. ParaDL instead scales one measured per-sample time by
FLOP share (ParaDL §4.10); that path belongs to the oracle.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

from costmodels.collectives import Network, network_arrays
from costmodels.hardware import DTYPES, Hardware
from costmodels.layers import ATTENTION_KINDS, LayerKind, is_kind, key_value_channels
from costmodels.shards import ShardShapes

__all__ = [
    "HardwareArrays",
    "hardware_arrays",
    "roofline_s",
    "op_class_efficiency",
    "kernel_s",
    "shard_compute_s",
    "ShardCompute",
    "DTYPE_BYTES",
]

DTYPE_BYTES = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0}


class HardwareArrays(NamedTuple):
    """A :class:`Hardware` for one compute dtype, as arrays (vmappable)."""

    peak_flops_per_s: jnp.ndarray  # [] dense peak of convolutions and matmuls in the dtype's math mode
    memory_bandwidth_bytes_per_s: jnp.ndarray  # []
    memory_bytes: jnp.ndarray  # [] capacity per device
    efficiency: jnp.ndarray  # [4] conv, matmul, elementwise, memory (for the dtype's math mode)
    gradient_overlap: jnp.ndarray  # [] fraction of gradient sync hidden by backward compute
    network: Network
    vector_peak_flops_per_s: jnp.ndarray  # [] peak of element-wise work (float32 on the vector units)
    launch_s: jnp.ndarray  # [] fixed seconds per kernel
    channel_tile: jnp.ndarray  # [] output-feature padding of a GEMM, elements (0: none, cost_fn's relaxation)
    reduction_tile: jnp.ndarray  # [] reduction-dim padding of a GEMM, elements (0: none)
    saturation_output_elements: jnp.ndarray  # [] output elements at half the peak rate
    compute_memory_exponent: jnp.ndarray  # [] p of the p-norm; inf = max
    dispatch_s: jnp.ndarray  # [] host cost of one jitted call (a measured step includes one; plans leave it out)
    conv_call_s: jnp.ndarray  # [] fixed cost of one convolution library call, beyond launch_s
    conv_layout_activations: jnp.ndarray  # [] 1 where a convolution transposes x and dx (channels-first library)
    conv_layout_weights: jnp.ndarray  # [] 1 where it transposes w and dw


def hardware_arrays(hw: Hardware, dtype: str = "float32") -> HardwareArrays:
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose from {', '.join(DTYPES)}")
    dev = hw.device
    mode = dev.math_mode(dtype)
    peak = dev.peak_flops_per_s.get(mode)
    if peak is None:
        raise ValueError(f"hardware {hw.name!r} gives no peak FLOP/s for {dtype}")
    k = dev.kernel
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    return HardwareArrays(
        peak_flops_per_s=f32(peak),
        memory_bandwidth_bytes_per_s=f32(dev.memory_bandwidth_bytes_per_s),
        memory_bytes=f32(dev.memory_bytes),
        efficiency=f32([dev.efficiency_of(c, mode) for c in ("conv", "matmul", "elementwise", "memory")]),
        gradient_overlap=f32(hw.gradient_overlap),
        network=network_arrays(hw),
        vector_peak_flops_per_s=f32(dev.peak_flops_per_s["float32"]),
        launch_s=f32(k.launch_s),
        channel_tile=f32(k.channel_tile),
        reduction_tile=f32(k.reduction_tile),
        saturation_output_elements=f32(k.saturation_output_elements),
        compute_memory_exponent=f32(jnp.inf if k.compute_memory_exponent is None else k.compute_memory_exponent),
        dispatch_s=f32(k.dispatch_s),
        conv_call_s=f32(k.conv_call_s),
        conv_layout_activations=f32(k.conv_layout.get(mode) == "channels_first"),
        conv_layout_weights=f32(mode in k.conv_layout),
    )


def op_class_efficiency(hw: HardwareArrays, kind):
    """Attained fraction of peak FLOP/s for layer kinds ``[L]``: conv, matmul
    (dense) or element-wise (everything else)."""
    kind = jnp.asarray(kind)
    return jnp.where(
        kind == LayerKind.CONV, hw.efficiency[0], jnp.where(kind == LayerKind.DENSE, hw.efficiency[1], hw.efficiency[2])
    )


def roofline_s(hw: HardwareArrays, flops, nbytes, efficiency):
    """Roofline time of ``flops`` FLOPs moving ``nbytes`` bytes at ``efficiency`` of peak."""
    return jnp.maximum(
        flops / (hw.peak_flops_per_s * efficiency),
        nbytes / (hw.memory_bandwidth_bytes_per_s * hw.efficiency[3]),
    )


def _pad_factor(n, tile):
    """``ceil(n / tile) * tile / n``: the share of a tiled dim that is padding,
    plus 1 (1 for a tile of 0: no padding, a step function's smooth lower
    envelope, exact at multiples of the tile)."""
    safe = jnp.maximum(n, 1e-30)
    safe_tile = jnp.where(tile > 0, tile, 1.0)
    return jnp.where((n > 0) & (tile > 0), jnp.ceil(safe / safe_tile) * safe_tile / safe, 1.0)


def _combine(t_compute, t_memory, p):
    """``(t_c^p + t_m^p)^(1/p)``, the max where ``p`` is infinite; finite
    gradients everywhere (the ratio form never raises 0 to a negative power)."""
    hi = jnp.maximum(t_compute, t_memory)
    lo = jnp.minimum(t_compute, t_memory)
    r = lo / jnp.where(hi > 0, hi, 1.0)
    finite = jnp.isfinite(p)
    q = jnp.where(finite, p, 1.0)
    smooth = hi * (1.0 + r**q) ** (1.0 / q)
    return jnp.where(finite, smooth, hi)


def kernel_s(hw: HardwareArrays, flops, output_rows, output_features, reduction, nbytes, peak, efficiency):
    """Seconds of one GEMM-shaped kernel (element-wise kernels: ``flops`` of
    work, ``output_features = reduction = 0`` for no padding) of any shape.

    ``flops`` are the exact FLOPs; ``output_rows x output_features`` its output
    (M x N of the GEMM), ``reduction`` its K; ``nbytes`` what it reads and writes.
    A kernel with neither FLOPs nor bytes does not run (0 s)."""
    n_pad = _pad_factor(output_features, hw.channel_tile)
    k_pad = _pad_factor(reduction, hw.reduction_tile)
    out = output_rows * jnp.maximum(output_features, 1.0) * n_pad  # padded output elements
    half = hw.saturation_output_elements
    gemm = output_features > 0  # element-wise kernels neither pad nor saturate
    total = out + half
    saturation = jnp.where((half > 0) & gemm & (total > 0), out / jnp.where(total > 0, total, 1.0), 1.0)
    t_c = flops * n_pad * k_pad / (peak * efficiency * jnp.maximum(saturation, 1e-12))
    t_m = nbytes / (hw.memory_bandwidth_bytes_per_s * hw.efficiency[3])
    runs = (flops > 0) | (nbytes > 0)
    return jnp.where(runs, hw.launch_s + _combine(t_c, t_m, hw.compute_memory_exponent), 0.0)


class ShardCompute(NamedTuple):
    total_s: jnp.ndarray  # [L, S] forward + backward seconds of one device's shard
    backward_s: jnp.ndarray  # [L, S] the backward kernels' part of total_s


def shard_compute_s(hw: HardwareArrays, arrays, shapes: ShardShapes, dtype_bytes) -> ShardCompute:
    """Forward and backward seconds of every layer's shard under every
    strategy (``[L, S]``), kernel by kernel (module docstring).

    ``arrays`` is a layer-arrays pytree (per-sample FLOPs and dims),
    ``shapes`` the shards (:func:`costmodels.shards.shard_shapes`),
    ``dtype_bytes`` the activation and weight element size."""
    a = arrays
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    kind = f32(a.kind)[:, None]  # [L, 1]
    param = (kind == LayerKind.CONV) | (kind == LayerKind.DENSE)
    runs = (kind != LayerKind.PAD) & (kind != LayerKind.FLATTEN)  # flatten is a reshape: no kernel
    delta = dtype_bytes
    b = shapes.batch
    c, f = shapes.in_channels, shapes.out_channels  # [L, S]
    in_px = jnp.prod(shapes.in_spatial, axis=-1)  # [L, S] positions per sample in the shard
    out_px = jnp.prod(shapes.out_spatial, axis=-1)
    full_out_px = jnp.prod(f32(a.out_spatial), axis=-1)[:, None]
    # [L, S] the shard's part of a sample's FLOPs: its output channels and positions, and
    # (a contraction over input channels: conv, dense) its input channels
    share = (f / jnp.maximum(f32(a.out_channels)[:, None], 1.0)) * (out_px / jnp.maximum(full_out_px, 1.0)) \
        * jnp.where(param, c / jnp.maximum(f32(a.in_channels)[:, None], 1.0), 1.0)
    fwd_flops = f32(a.flops_fwd)[:, None] * b * share
    bwd_data_flops = f32(a.flops_bwd_data)[:, None] * b * share
    bwd_weight_flops = f32(a.flops_bwd_weight)[:, None] * b * share

    g = jnp.maximum(f32(a.groups), 1.0)[:, None]
    window = jnp.prod(f32(a.kernel), axis=-1)[:, None]  # kernel positions (1 for dense)
    x_el = b * c * in_px  # input elements of the shard
    y_el = b * f * out_px  # output elements
    w_el = c / g * window * f  # kernel elements held
    eff = jnp.where(kind == LayerKind.CONV, hw.efficiency[0], hw.efficiency[1])
    peak = hw.peak_flops_per_s
    # implicit GEMM (cuDNN §3): forward M = b*out_px, N = f/g, K = c/g*window; backward-data
    # M = b*in_px, N = c/g, K = f/g*window; backward-weight M = c/g*window, N = f/g, K = b*out_px.
    # Reads and writes: x, w -> y; dy, w -> dx; x, dy -> dw.
    # A kernel runs where it has FLOPs: no backward-data for a layer fed by the model input.
    moved = (x_el + w_el + y_el) * delta
    fwd = kernel_s(hw, fwd_flops, b * out_px * g, f / g, c / g * window, moved * (fwd_flops > 0), peak, eff)
    bwd_data = kernel_s(hw, bwd_data_flops, b * in_px * g, c / g, f / g * window, moved * (bwd_data_flops > 0),
                        peak, eff)
    bwd_weight = kernel_s(hw, bwd_weight_flops, c / g * window * g, f / g, b * out_px,
                          moved * (bwd_weight_flops > 0), peak, eff)
    # A convolution's three kernels are library calls (cuDNN), each with a fixed cost beyond its
    # launch; operands not in the library's layout are transposed by a memory-bound kernel that
    # reads and writes them once: x and w before the forward, dx and dw after the backward.
    conv = kind == LayerKind.CONV
    zero = jnp.zeros_like(b)
    call = jnp.where(conv, hw.conv_call_s, 0.0)
    fwd = fwd + jnp.where(fwd_flops > 0, call, 0.0)
    bwd_data = bwd_data + jnp.where(bwd_data_flops > 0, call, 0.0)
    bwd_weight = bwd_weight + jnp.where(bwd_weight_flops > 0, call, 0.0)

    def transpose(elements, where):  # one memory-bound copy kernel: read and write every element
        return jnp.where(conv & where, kernel_s(hw, zero, zero, zero, zero, 2.0 * elements * delta,
                                                 hw.vector_peak_flops_per_s, hw.efficiency[2]), 0.0)

    acts, weights = hw.conv_layout_activations > 0, hw.conv_layout_weights > 0
    fwd = fwd + transpose(x_el, acts & (fwd_flops > 0)) + transpose(w_el, weights & (fwd_flops > 0))
    bwd_data = bwd_data + transpose(x_el, acts & (bwd_data_flops > 0))
    bwd_weight = bwd_weight + transpose(w_el, weights & (bwd_weight_flops > 0))
    param_fwd, param_bwd = fwd, bwd_data + bwd_weight

    # Every other layer: a forward kernel reading x and writing y, and (where the layer
    # has a backward pass) one reading dy and x and writing dx; memory-bound on GPUs.
    has_bwd = (f32(a.flops_bwd_data)[:, None] > 0) | (f32(a.saved_elements)[:, None] > 0)
    veff = hw.efficiency[2]
    other_fwd = kernel_s(hw, fwd_flops, zero, zero, zero, (x_el + y_el) * delta, hw.vector_peak_flops_per_s, veff)
    other_bwd = jnp.where(has_bwd, kernel_s(hw, bwd_data_flops, zero, zero, zero, (2.0 * x_el + y_el) * delta,
                                            hw.vector_peak_flops_per_s, veff), 0.0)

    # Self-attention: per head, two batched GEMMs forward (scores Q K^T: M = queries,
    # N = keys, K = head dim; output P V: N = head dim, K = keys) and four backward (the
    # gradients of the scores, values, queries and keys), plus the softmax's element-wise
    # kernel each way, which reads and writes the scores (Dao et al., "FlashAttention",
    # 2022, §2.2, the standard implementation). Queries are the shard's own rows, keys
    # every row (a spatial shard gathers them, costmodels/table.py); f holds its heads.
    attention = is_kind(kind, ATTENTION_KINDS)
    head_dim = f32(a.out_channels)[:, None] / g  # [L, 1]
    heads = f / head_dim  # [L, S] heads one device holds
    queries = shapes.out_spatial[..., 0]  # [L, S]
    keys = f32(a.in_spatial[:, 0])[:, None]  # [L, 1]
    gemm_flops = 2.0 * b * queries * keys * f  # [L, S] one of the six GEMMs
    scores = b * heads * queries * keys  # [L, S] elements of the score matrix
    out_c = jnp.maximum(f32(a.out_channels), 1.0)  # [L] (padding rows: 0)
    # [L, 1] the keys' share of the queries' channels: 1, or less under GQA (other kinds: 1, so that their
    # unused attention branch stays finite and its gradient zero)
    kv_share = jnp.where(attention, (key_value_channels(f32(a.in_channels), out_c) / out_c)[:, None], 1.0)
    qkv_bytes = b * f * (queries + 2.0 * kv_share * keys) * delta

    def attn_gemm(rows, n, k):
        return kernel_s(hw, gemm_flops, rows, n, k, (scores * delta + qkv_bytes) * (gemm_flops > 0), peak,
                        hw.efficiency[1])

    by_query = b * heads * queries
    attn_fwd = attn_gemm(by_query, keys, head_dim) + attn_gemm(by_query, head_dim, keys) + kernel_s(
        hw, jnp.maximum(fwd_flops - 2.0 * gemm_flops, 0.0), zero, zero, zero, 2.0 * scores * delta,
        hw.vector_peak_flops_per_s, veff)
    by_key = b * heads * keys
    attn_bwd = (attn_gemm(by_query, keys, head_dim) + attn_gemm(by_query, head_dim, keys)  # dS, dQ
                + 2.0 * attn_gemm(by_key, head_dim, queries)) + kernel_s(  # dK, dV
        hw, jnp.maximum(bwd_data_flops - 4.0 * gemm_flops, 0.0), zero, zero, zero, 3.0 * scores * delta,
        hw.vector_peak_flops_per_s, veff)
    forward = jnp.where(param, param_fwd, jnp.where(attention, attn_fwd, other_fwd))
    backward = jnp.where(param, param_bwd, jnp.where(attention, attn_bwd, other_bwd))
    keep = runs & (f32(a.mask)[:, None] > 0)
    return ShardCompute(total_s=jnp.where(keep, forward + backward, 0.0), backward_s=jnp.where(keep, backward, 0.0))
