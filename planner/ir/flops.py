"""Per-sample FLOP counts of each layer kind, counted the way XLA counts them.

Forward counts follow what ``jax.jit(f).lower(...).compile().cost_analysis()``
reports on CPU (jax 0.10.2), probed primitive by primitive
(``../shared/reference/jax-notes.md`` §1 "FLOPs: analytic vs XLA"):

* conv: 2 FLOPs per multiply-accumulate over the taps that land inside the
  input (XLA does not count padded taps), plus 1 per output element for the
  bias: ``2 * (C_in/groups) * C_out * prod_d(valid taps_d) + |y|``.
* dense: ``2 * C_in * C_out * positions + |y|`` (exact).
* max pool: ``(window - 1)`` comparisons per output element; average pool:
  ``window`` (sums plus the division); global mean: ``|x|``.
* ReLU and other unary element-wise ops: 1 per element; add of n tensors:
  ``n - 1`` per element.
* self-attention (``jax.nn.dot_product_attention``, XLA implementation) of
  ``S`` tokens, ``D`` channels in ``H`` heads: the score and output matmuls
  ``4 S^2 D``, plus the scale, max, shift, sum and division of the softmax,
  ``5 H S^2 - H S`` (XLA counts a reduction of ``n`` values as ``n - 1``;
  the ``exp`` is a transcendental, not a FLOP); a causal mask adds its
  select, ``H S^2``, and the mask's comparison, ``S^2``.
* an embedding lookup (a gather): 0; an added position embedding: 1 per
  element; a product of two activations: 1 per element.
* batch norm in training mode: 6 per element (mean, variance, normalise,
  scale, shift; XLA: 3096 FLOPs for 512 elements, the rest is per channel).

Backward counts are the standard ones: a conv's or dense layer's
backward-data and backward-weight passes each cost its multiply-accumulates
again (the same valid taps, transposed), plus the bias reduction; a
parameter-free layer's backward pass touches each element once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

__all__ = [
    "LayerFlops",
    "NO_FLOPS",
    "valid_taps",
    "conv_flops",
    "dense_flops",
    "pool_flops",
    "global_pool_flops",
    "batch_norm_flops",
    "norm_flops",
    "attention_flops",
    "rotary_flops",
    "ROTARY_FLOPS_PER_ELEMENT",
    "embed_flops",
    "multiply_flops",
    "elementwise_flops",
    "add_flops",
]

BATCH_NORM_FWD_FLOPS_PER_ELEMENT = 6.0  # XLA CPU count, training mode (probed)
BATCH_NORM_BWD_FLOPS_PER_ELEMENT = 6.0  # d/dx of normalise + scale: same order as forward
NORM_BWD_FLOPS_PER_ELEMENT = 6.0  # LayerNorm d/dx, XLA CPU count (probed: 5.4-6.8 per element)


class LayerFlops(NamedTuple):
    forward: float  # FLOPs per sample
    backward_data: float  # FLOPs per sample for the gradient w.r.t. the input
    backward_weight: float  # FLOPs per sample for the gradient w.r.t. the parameters


NO_FLOPS = LayerFlops(0.0, 0.0, 0.0)


def valid_taps(n_in: int, n_out: int, kernel: int, stride: int, dilation: int, pad_lo: int) -> int:
    """Number of (output position, kernel tap) pairs along one dim whose input
    index ``o * stride - pad_lo + j * dilation`` falls inside ``[0, n_in)``,
    i.e. that are not padding. Counted in closed form along the shorter of
    the two axes (outputs or taps), so the work is bounded by min(n_out,
    kernel), not by the image size."""
    if n_out <= 0 or kernel <= 0:
        return 0
    if kernel <= n_out:  # per tap j: the outputs o with 0 <= o s - p + j d < n_in
        j = np.arange(kernel, dtype=np.int64)
        lo = np.maximum(0, -((j * dilation - pad_lo) // stride))  # ceil((p - j d) / s), at least 0
        hi = np.minimum(n_out - 1, (n_in - 1 + pad_lo - j * dilation) // stride)
    else:  # per output o: the taps j with 0 <= o s - p + j d < n_in
        o = np.arange(n_out, dtype=np.int64)
        lo = np.maximum(0, -((o * stride - pad_lo) // dilation))
        hi = np.minimum(kernel - 1, (n_in - 1 + pad_lo - o * stride) // dilation)
    return int(np.sum(np.maximum(0, hi - lo + 1)))


def conv_flops(
    in_channels: int,
    out_channels: int,
    in_spatial: Sequence[int],
    out_spatial: Sequence[int],
    kernel: Sequence[int],
    stride: Sequence[int],
    dilation: Sequence[int],
    pads: Sequence[tuple[int, int]],
    groups: int,
    bias: bool,
) -> LayerFlops:
    taps = math.prod(
        valid_taps(n, o, k, s, d, p[0])
        for n, o, k, s, d, p in zip(in_spatial, out_spatial, kernel, stride, dilation, pads, strict=True)
    )
    macs = float(taps) * (in_channels // groups) * out_channels
    out = float(out_channels * math.prod(out_spatial))
    b = out if bias else 0.0
    return LayerFlops(2.0 * macs + b, 2.0 * macs, 2.0 * macs + b)


def dense_flops(in_features: int, out_features: int, positions: int, bias: bool) -> LayerFlops:
    macs = float(in_features) * out_features * positions
    b = float(out_features * positions) if bias else 0.0
    return LayerFlops(2.0 * macs + b, 2.0 * macs, 2.0 * macs + b)


def pool_flops(in_elements: int, out_elements: int, window: int, op: str) -> LayerFlops:
    per_out = window - 1 if op == "max" else window
    return LayerFlops(float(per_out * out_elements), float(in_elements), 0.0)


def global_pool_flops(in_elements: int) -> LayerFlops:
    return LayerFlops(float(in_elements), float(in_elements), 0.0)


def batch_norm_flops(elements: int, affine: bool) -> LayerFlops:
    n = float(elements)
    return LayerFlops(
        BATCH_NORM_FWD_FLOPS_PER_ELEMENT * n,
        BATCH_NORM_BWD_FLOPS_PER_ELEMENT * n,
        2.0 * n if affine else 0.0,  # scale and shift gradients: one reduction each
    )


def norm_flops(elements: int, channels: int, rms: bool, scale: bool, bias: bool) -> LayerFlops:
    """Layer / RMS normalisation over each position's ``channels``. Forward as
    XLA counts it (``cost_analysis``, jax 0.10.2, probed on nnx.LayerNorm and
    nnx.RMSNorm): LayerNorm ``5 n + 5 t``, RMSNorm ``3 n + t`` (``n``
    elements, ``t = n / channels`` positions), plus ``n`` each for the scale
    and the bias. Backward w.r.t. the input: ``NORM_BWD_FLOPS_PER_ELEMENT``
    (LayerNorm; half for RMSNorm, which has no mean); w.r.t. the scale and
    bias: one multiply-reduce each (``2 n``, ``n``)."""
    n = float(elements)
    t = n / max(float(channels), 1.0)
    fwd = (3.0 * n + t if rms else 5.0 * n + 5.0 * t) + n * (float(scale) + float(bias))
    bwd = NORM_BWD_FLOPS_PER_ELEMENT * n * (0.5 if rms else 1.0)
    return LayerFlops(fwd, bwd, 2.0 * n * float(scale) + n * float(bias))


def attention_flops(tokens: int, channels: int, heads: int, causal: bool) -> LayerFlops:
    """Self-attention of ``tokens`` positions, ``channels`` split into
    ``heads`` (module docstring). Backward (w.r.t. queries, keys and values):
    the four matmuls of the gradients of the scores, values, queries and
    keys, ``8 S^2 D``, and the softmax's backward, ``7 H S^2`` (XLA's count of
    ``jax.vjp`` minus the forward it needs, probed). No parameters."""
    s, d, h = float(tokens), float(channels), float(heads)
    fwd = 4.0 * s * s * d + 5.0 * h * s * s - h * s + ((h * s * s + s * s) if causal else 0.0)
    return LayerFlops(fwd, 8.0 * s * s * d + 7.0 * h * s * s, 0.0)


ROTARY_FLOPS_PER_ELEMENT = 3.0  # a pair (x1 cos - x2 sin, x2 cos + x1 sin): 4 products, 2 sums


def rotary_flops(rotated: int, per_element: float = ROTARY_FLOPS_PER_ELEMENT) -> LayerFlops:
    """Rotary position embeddings (Su et al. 2021, RoFormer, eq. 34) on
    ``rotated`` channels x positions of queries and keys: each pair of
    channels turns by its position's angle, ``(x1 cos - x2 sin, x2 cos + x1
    sin)``, 4 products and 2 sums per pair, 3 per element, forward. Its
    gradient is the opposite rotation plus what autodiff adds around it:
    the negated cotangent of the sine term and the sums of each half's two
    cotangents, 1.5 times the forward (XLA's count of ``jax.vjp`` of the
    rotation, probed: 4.5 per element). The angles are constants of the
    positions. No parameters."""
    n = per_element * rotated
    return LayerFlops(n, 1.5 * n, 0.0)


def embed_flops(tokens: int, features: int) -> LayerFlops:
    """A lookup of ``tokens`` ids in a table of ``features`` columns: no FLOPs
    forward (a gather), none for the ids' gradient (they have none), and the
    scatter-add of the output gradient into the table, 1 per output element."""
    return LayerFlops(0.0, 0.0, float(tokens) * features)


def multiply_flops(elements: int, inputs: int) -> LayerFlops:
    """The product of ``inputs`` activations: ``inputs - 1`` per element
    forward; backward, each input's gradient is the output gradient times
    the other inputs (``inputs - 1`` products each)."""
    n = float(elements)
    return LayerFlops((inputs - 1) * n, inputs * (inputs - 1) * n, 0.0)


def elementwise_flops(elements: int, per_element: float = 1.0) -> LayerFlops:
    return LayerFlops(per_element * elements, float(elements), 0.0)


def add_flops(elements: int, inputs: int) -> LayerFlops:
    return LayerFlops(float((inputs - 1) * elements), 0.0, 0.0)
