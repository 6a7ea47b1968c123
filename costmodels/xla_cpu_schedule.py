"""What XLA:CPU's default schedule holds at its peak: the per-device memory of
a plan compiled for the ``cpu`` platform, rule by rule.

:func:`costmodels.memory_per_device` is the solvers' memory: the state, the
saved activations and one largest transient (two phases: the backward pass
and the optimizer step). XLA:CPU's breadth-first schedule departs from it
in ways found in its buffer assignment and live ranges
(docs/validation.md, "The memory promise"; ``benchmarks/memory_models.py``
``xla-cpu-rules`` scores them on the validation grid), with the buffers of
:func:`costmodels.xla_cpu.xla_cpu_buffers`:

* it makes a copy ``C`` of every conv kernel at the step's start
  (``transpose_copy_fusion``, ``copy``), none for the first weighted layer
  nor a ZeRO-2/3 convolution whose weights the export ties to its input
  (:func:`costmodels.xla_cpu.xla_cpu_buffers`); each weight gradient later
  replaces its copy, so at the backward pass's start the copies stand
  where the gradients would. A dense kernel has no copy;
* ``ConvOperandSwapper`` swaps a convolution's operands where the window
  exceeds the input and reverses the kernel for it: one more kernel-sized
  buffer ``S`` in the forward pass (``wrapped_reverse``);
* the iotas ``I`` of every max pool (SelectAndScatterExpander) are built at
  the step's start and each lives until its own pool's backward step, and
  each pool's zero broadcast ``Z`` (its input's size) lives into the
  backward pass;
* a ZeRO-2/3 dense layer reducing its own gradient copies it whole at its
  backward step (in ``R``, below) and keeps a gradient-sized copy ``P``
  from after that step to the end: the backward pass peaks at a layer's
  step too, with the activations of the layers up to it and the copies
  ``P`` of those after it;
* on ``d > 1`` the gradient reduction holds the gradients made so far
  twice, its operands ``G`` (each layer's gradient as the backward pass
  keeps it: whole, but a ZeRO-2/3 conv's or dense layer's own shard where
  each device reduce-scatters it at the layer's backward step, where its
  whole gradient ``R`` is a transient) and its results ``H``, the
  gradients the state holds: the whole gradient of the combined
  all-reduce, a ZeRO-2/3 layer's shard;
* the optimizer step holds the gradients ``H`` and the update ``U``, both
  as the state holds them (ZeRO shards the update from stage 1);
* a recomputing layer keeps its input, a layer joining the run before it
  none, and the run is recomputed at its backward step
  (:func:`costmodels.evaluate.recomputed_runs_per_layer`: ``credit`` by
  layer and ``transient``), as in the two phases;
* a layer's backward step holds the activations of the layers up to it
  (each later layer's were freed once its own step read them) beside its
  transient, but a convolution's transient stands with every activation, as
  at the backward pass's start (live ranges: three ``nnx.MultiHeadAttention``
  blocks at batch 64 on 2x4, the first block's recomputed probabilities
  live at its step after the later blocks' activations were freed; the
  convolutions' rule chosen on the grid's development half, where the CNNs
  peak as if every activation were live).

Per device, with ``A`` the saved activations (with each max pool's index
matrix and each replicated output a reader slices, kept whole; a
recomputing layer's input, less its ``credit``), ``W`` the workspace without the
iotas (with ``R`` and its run's recomputed activations), and ``args`` the state
without ``U`` and ``H`` (weights, optimizer slots, buffers), over the
layers in execution order::

    forward  = sum C + sum S + max_{pool i} (sum_{j<=i} A_j + sum_{j>=i} I_j
                                             + sum_{j!=i} Z_j + 2 out_i)
    backward = max(sum C + sum A + sum Z + max_{conv l} W_l,
                   max_l (sum_{j<=l} (C_j + A_j + Z_j) + sum_{j>l} P_j + W_l))
    reduce   = [d > 1] max_l (sum_{j<l} (C_j + A_j + Z_j) + sum_{j>=l} (G_j + H_j + P_j))
    peak     = args + max(forward, backward, reduce, sum H + sum U)

Without levers ``H = U = G``. It is a structure chosen among a dozen
variants on the grid's plans without levers, each rule a measured mechanism
with no fitted constant; the levers' rules follow the export's ZeRO calls
and recomputed runs, measured on plans outside the grid
(``benchmarks/zero_xla.py``, ``benchmarks/remat_xla.py``) and on the
grown grid's development half (``benchmarks/memory_grid.py``), and are
scored on its held-out half (docs/validation.md).
It is not the solvers' memory: its forward peak and all-reduce are prefix
sums over the layer order, which their sums plus one largest transient
cannot express; ``planner.plan`` checks each plan against it and plans again
below the limit where it exceeds it (:mod:`planner.schedule_fit`).

Pure and jit-compiled like :func:`costmodels.memory_per_device`, over a
relaxed plan ``probs`` ``[L, O]``; at one-hot probabilities it is the
discrete plan's value.
"""

from __future__ import annotations

import jax.numpy as jnp

from costmodels.evaluate import recomputed_runs_per_layer
from costmodels.levers import strategy_probs
from costmodels.table import CostTable
from costmodels.xla_cpu import XlaCpuBuffers

__all__ = ["scheduled_memory_per_device"]


def scheduled_memory_per_device(table: CostTable, probs):
    """Peak bytes per device of XLA:CPU's schedule (the module docstring)
    under the relaxed plan ``probs`` ``[L, O]``; ``table`` is a
    :class:`costmodels.CostTable` built for the ``cpu`` platform."""
    x: XlaCpuBuffers = table.xla_cpu
    mask = table.layer_mask
    q = strategy_probs(probs)  # [L, S]

    def per_layer(a, p):  # [L] expected bytes of each layer
        return jnp.sum(p * a, axis=-1) * mask

    G = per_layer(x.gradient_bytes, probs)  # [L] the gradients the backward pass makes
    C = per_layer(x.kernel_copy_bytes, probs)
    S, Z = per_layer(x.reversed_kernel_bytes, q), per_layer(x.pool_input_bytes, q)
    iotas = per_layer(x.pool_iota_bytes, q)
    out = per_layer(x.pool_output_bytes, q)
    A = per_layer(table.activation_bytes, probs)  # saved activations with each max pool's index matrix
    H = per_layer(x.held_gradient_bytes, probs)  # [L] the gradients the state holds (ZeRO 2, 3: a shard)
    U = per_layer(table.update_bytes, probs)  # [L] the optimizer's update
    args = per_layer(table.state_bytes, probs) - U - H  # weights, slots, buffers
    credit, transient = recomputed_runs_per_layer(table, probs)
    A = A - credit * mask  # [L] a joining layer keeps no input
    R = per_layer(x.scattered_gradient_bytes, probs)  # [L] a tied ZeRO layer's whole gradient, at its step
    W = per_layer(table.workspace_bytes, probs) - iotas + R + transient * mask  # [L] transients at l's backward step

    pool = (x.max_pool > 0) & (mask > 0)
    made = jnp.cumsum(A)  # activations made by layer l's forward step
    to_use = jnp.cumsum(iotas[::-1])[::-1]  # iotas of the pools from l on, built at the start
    at_pool = made + to_use + jnp.sum(Z) - Z + 2.0 * out  # [L] the forward peak if at pool l
    forward = jnp.where(jnp.any(pool), jnp.sum(C) + jnp.sum(S) + jnp.max(jnp.where(pool, at_pool, 0.0)), 0.0)
    P = per_layer(x.late_copy_bytes, probs)  # [L] a ZeRO dense layer's gradient copy, after its step
    after = jnp.cumsum(P[::-1])[::-1] - P  # [L] the copies of the layers after l
    upto = jnp.cumsum(C + A + Z)  # [L] copies and activations of the layers up to l
    at_step = jnp.max(jnp.where(mask > 0, upto + after + W, 0.0))  # [] the peak at a layer's backward step
    conv_step = jnp.max(jnp.where(x.convolution > 0, W, 0.0))  # [] a convolution's transient, every activation live
    backward = jnp.maximum(jnp.sum(C) + jnp.sum(A) + jnp.sum(Z) + conv_step, at_step)
    before = upto - (C + A + Z)  # copies and activations of the layers before l
    cut = before + jnp.cumsum((G + H + P)[::-1])[::-1]  # [L] the reduction's cut before layer l
    reduce = x.reduces_gradients * jnp.max(jnp.where(mask > 0, cut, 0.0))
    step = jnp.sum(H) + jnp.sum(U)
    return jnp.sum(args) + jnp.maximum(jnp.maximum(forward, backward), jnp.maximum(reduce, step))
