"""The dropout kernels of a transformer trained with dropout (Megatron-LM's
GPT), which its layer graph does not describe: seconds per layer, forward
and backward, memory-bound (costmodels/compute.py's element-wise kernels).

* after the attention's softmax, a dropout kernel of its own over the
  probabilities (Megatron-LM's attention, Shoeybi et al. 2019, and the
  standard attention of Dao et al. 2022, §2.2): forward it reads the
  probabilities and writes the dropped ones and a one-byte mask; backward it
  reads the gradient and the mask and writes the gradient. The scores are
  ``heads / t x s x s`` per sample on a device of a tensor group (a causal
  mask leaves the matrix whole);
* before each residual add, a dropout fused with
  the bias and the add (Megatron-LM's bias-dropout-add): what it adds to the
  add's kernel is writing the one-byte mask forward and reading it backward,
  over the add's output (its shard under sequence parallelism)."""

from __future__ import annotations

import jax.numpy as jnp

from costmodels.compute import HardwareArrays, kernel_s
from costmodels.layers import ATTENTION_KINDS, LayerKind, is_kind
from costmodels.strategies import Strategy

__all__ = ["dropout_s"]

MASK_BYTES = 1.0


def dropout_s(hw: HardwareArrays, a, strategy, micro_batch, tensor, element_bytes):
    """``(forward, backward)`` seconds ``[L]`` of the dropouts of each layer
    (module docstring) for ``micro_batch`` samples on a device of ``tensor``;
    ``strategy`` [L] the layers' strategies."""
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    kind = f32(a.kind)
    b, t, delta = f32(micro_batch), f32(tensor), f32(element_bytes)
    split = jnp.where((strategy == Strategy.FILTER) | (strategy == Strategy.SPATIAL) | (strategy == Strategy.DATA),
                      t, 1.0)
    tokens = f32(a.out_spatial[:, 0])
    scores = b * f32(a.groups) * tokens * tokens / split  # [L] probabilities on one device
    zero = jnp.zeros_like(scores)
    nbytes = scores * (2.0 * delta + MASK_BYTES)
    attention = is_kind(kind, ATTENTION_KINDS) & (f32(a.mask) > 0)
    attn = jnp.where(attention, kernel_s(hw, zero, zero, zero, zero, nbytes, hw.vector_peak_flops_per_s,
                                         hw.efficiency[2]), 0.0)
    mask_s = MASK_BYTES * b * f32(a.out_elements) / split / (hw.memory_bandwidth_bytes_per_s * hw.efficiency[3])
    residual = jnp.where((kind == LayerKind.ADD) & (f32(a.mask) > 0), mask_s, 0.0)
    return attn + residual, attn + residual
