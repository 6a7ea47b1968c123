"""``CostTable``: every layer's time and memory under every strategy on one
mesh, and every edge's resharding time between every pair of strategies.
The contract between ``costmodels`` and ``search``.

:func:`cost_table` is a pure, jit-compiled function of the layer arrays, the
hardware arrays, the global batch and the mesh shape ``(d, m)``; all of them
are arrays, so it vmaps over hardware, batch sizes and mesh shapes. It has no
Python loop over layers.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from costmodels.calibration import (
    CalibrationArrays,
    ShapeCalibrationArrays,
    calibrate_compute,
)
from costmodels._layer_terms import (
    activation_workspace_bytes,
    edge_reshard_s,
    halo_s,
    loss_output_s,
    loss_workspace_bytes,
)
from costmodels.collectives import (
    allgather_group_s,
    allreduce_s,
    reduce_scatter_group_s,
    tier_of,
)
from costmodels.compute import DTYPE_BYTES, HardwareArrays, shard_compute_s
from costmodels.layers import ATTENTION_KINDS, LayerKind, is_kind, read_parameter_fraction, tied_output
from costmodels.levers import LeverInputs, lever_costs, lever_menu, option_recomputing
from costmodels.shards import row_padding, shard_shapes
from costmodels.strategies import Strategy, layout_split, strategy_layouts, strategy_mask
from costmodels.xla_cpu import XlaCpuBuffers, xla_cpu_buffers

__all__ = ["CostSettings", "CostTable", "cost_table", "OPTIMIZER_SLOTS", "PLATFORMS"]

OPTIMIZER_SLOTS = {"sgd": 0, "momentum": 1, "adam": 2}  # fp32 state tensors per parameter
PLATFORMS = ("gpu", "tpu", "cpu")  # XLA platforms; only cpu changes the memory model (XLA:CPU's own buffers)


@dataclasses.dataclass(frozen=True)
class CostSettings:
    """Static settings of the cost model (hashable: one compilation each)."""

    dtype: str = "float32"  # compute and activation dtype; bfloat16 = mixed precision, fp32 master weights
    optimizer: str = "adam"  # sgd | momentum | adam
    gradient_bucket_bytes: float = 25 * 2**20  # gradients are all-reduced in buckets (PyTorch DDP's default)
    levers: str = "none"  # memory levers on the menu: none | zero | remat | all (costmodels/levers.py)
    platform: str = "gpu"  # the XLA platform the step compiles for: gpu | tpu | cpu (cpu: XLA:CPU's own buffers)
    # recomputing offered on every layer, in runs (remat+join; costmodels/levers.py), not only where one
    # layer saves more than its input (planner.evaluation.remat_runs_offered: on models without attention).
    remat_runs: bool = False

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"unknown dtype {self.dtype!r}; choose from {', '.join(DTYPE_BYTES)}")
        if self.optimizer not in OPTIMIZER_SLOTS:
            raise ValueError(f"unknown optimizer {self.optimizer!r}; choose from {', '.join(OPTIMIZER_SLOTS)}")
        if not self.gradient_bucket_bytes > 0:
            raise ValueError("gradient_bucket_bytes must be positive")
        lever_menu(self.levers)  # raises for an unknown choice
        if self.platform not in PLATFORMS:
            raise ValueError(f"unknown platform {self.platform!r}; choose from {', '.join(PLATFORMS)}")

    @property
    def activation_bytes(self) -> float:  # bytes per activation element
        return DTYPE_BYTES[self.dtype]

    @property
    def state_bytes_per_param(self) -> float:
        """Weights, gradients and optimizer slots per parameter. fp32: 4 + 4 +
        4 per slot. Mixed precision: bf16 weights and gradients (2 + 2) plus
        fp32 master weights (4) and fp32 slots."""
        slots = 4.0 * OPTIMIZER_SLOTS[self.optimizer]
        weights_and_grads = 4.0 + 4.0 if self.dtype == "float32" else 2.0 + 2.0 + 4.0
        return weights_and_grads + slots

    @property
    def gradient_bytes_per_param(self) -> float:
        return DTYPE_BYTES[self.dtype]

    @property
    def weight_bytes_per_param(self) -> float:
        """The weights the forward pass reads: fp32, or bf16 under mixed precision."""
        return DTYPE_BYTES[self.dtype]

    @property
    def optimizer_bytes_per_param(self) -> float:
        """What ZeRO stage 1 shards (ZeRO §5): the optimizer's slots, the fp32
        master weights under mixed precision, and the optimizer's update."""
        return self.state_bytes_per_param + self.update_bytes_per_param - self.weight_bytes_per_param \
            - self.gradient_bytes_per_param

    @property
    def update_bytes_per_param(self) -> float:
        """The optimizer's update, an fp32 parameter-sized buffer that XLA keeps
        beside the gradients at the optimizer step under sgd, momentum and adam
        alike (XLA buffer assignment, measured: docs/validation.md)."""
        return 4.0


class CostTable(NamedTuple):
    """Costs on one mesh. ``L`` layers, ``S`` strategies, ``O = S K`` options
    (strategies under ``K`` lever settings, :mod:`costmodels.levers`; ``O = S``
    without levers), ``E`` edges (bucketed)."""

    feasible: jnp.ndarray  # [L, O] bool, the option can run the layer
    compute_s: jnp.ndarray  # [L, O] forward + backward compute (and recompute), seconds per iteration
    backward_compute_s: jnp.ndarray  # [L, O] the backward part of compute_s
    grad_sync_s: jnp.ndarray  # [L, O] gradient all-reduce (ZeRO stages 2-3: reduce-scatter) share, seconds
    weight_gather_s: jnp.ndarray  # [L, O] ZeRO's weight all-gathers, never overlapped, seconds
    halo_s: jnp.ndarray  # [L, O] spatial exchange inside a layer (halo rows; an attention's keys and values), fwd + bwd, seconds
    output_s: jnp.ndarray  # [L, O] gathering a model output for the loss (sink layers), seconds
    state_bytes: jnp.ndarray  # [L, O] weights, gradients, optimizer state and update, buffers per device
    update_bytes: jnp.ndarray  # [L, O] the optimizer's update, part of state_bytes, live at the optimizer step only
    activation_bytes: jnp.ndarray  # [L, O] activations kept for the backward pass per device
    workspace_bytes: jnp.ndarray  # [L, O] transient input and output gradients (and levers' transients) per device
    recompute_bytes: jnp.ndarray  # [L, O] a recomputing option's activations, made again in the backward pass (0: keeps them)
    checkpoint_bytes: jnp.ndarray  # [L, O] what a recomputing option keeps instead: its input (part of activation_bytes)
    reshard_s: jnp.ndarray  # [E, S, S] converting edge src's output under s to dst's input under t, fwd + bwd
    layer_mask: jnp.ndarray  # [L] 1 for real layers
    edge_src: jnp.ndarray  # [E] int32
    edge_dst: jnp.ndarray  # [E] int32
    edge_mask: jnp.ndarray  # [E] 1 for real edges
    edge_input_share: jnp.ndarray  # [E] the edge's part of its destination's input (1 for a one-input layer)
    gradient_overlap: jnp.ndarray  # [] fraction of gradient sync hidden behind backward compute
    memory_capacity_bytes: jnp.ndarray  # [] per device
    xla_cpu: XlaCpuBuffers | None = None  # XLA:CPU's own buffers (platform cpu), for costmodels.xla_cpu

    @property
    def layer_time_s(self):  # [L, O] everything attributed to a layer except resharding
        return self.compute_s + self.grad_sync_s + self.weight_gather_s + self.halo_s + self.output_s


@functools.partial(jax.jit, static_argnames=("settings",))
def cost_table(
    arrays,
    hw: HardwareArrays,
    batch,
    d,
    m,
    settings: CostSettings = CostSettings(),
    calibration: CalibrationArrays | ShapeCalibrationArrays | None = None,
) -> CostTable:
    """Build the :class:`CostTable` of ``arrays`` (a :class:`planner.LayerArrays`)
    for a global ``batch`` on a ``d x m`` (data x model) mesh. Layers that
    ``calibration`` measured take its times instead of the model's
    (:func:`costmodels.calibration.calibrate_compute`: version 3 by shard
    shape and operation trend; versions 1/2 by work, per strategy)."""
    a = arrays
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    batch, d, m = f32(batch), f32(d), f32(m)
    delta = settings.activation_bytes
    kind = f32(a.kind)
    real = f32(a.mask)
    L = kind.shape[0]
    net = hw.network
    dpn = net.devices_per_node
    S = len(Strategy)

    feasible = strategy_mask(a, batch, d, m)  # [L, S]
    lay = strategy_layouts(kind.astype(jnp.int32))  # [L, S, 4]
    in_lay, out_lay = lay[..., 0], lay[..., 1]  # a layer's input and output layouts

    group_batch = batch / d  # samples held by one model-axis group
    in_el, out_el = f32(a.in_elements), f32(a.out_elements)
    params = f32(a.params)

    # -- compute: the group's work split over m, except replicated layers ----------
    work = jnp.stack([jnp.ones(L)] * 4 + [m * jnp.ones(L)], axis=-1) * group_batch / m  # [L, S] samples per device
    local_params = _local_params(a, params, m)  # [L, S] parameters per device
    # Each device's shard, costed kernel by kernel (costmodels/compute.py).
    shapes = shard_shapes(a, batch, d, m)
    model = shard_compute_s(hw, a, shapes, delta)
    compute = model.total_s
    if calibration is not None:  # costmodels/calibration.py: v3 by shard shape, v1/v2 by work
        measured, calibrated = calibrate_compute(
            calibration, a, work, shapes, compute, lambda arr, sh: shard_compute_s(hw, arr, sh, delta).total_s)
        compute = jnp.where(measured, calibrated, compute)  # measured shard, else the operation's trend, else the model
    bwd_share = jnp.where(model.total_s > 0, model.backward_s / jnp.where(model.total_s > 0, model.total_s, 1.0), 2.0 / 3.0)
    backward = compute * bwd_share

    # -- gradient all-reduce (ParaDL §4.3, §4.8), in buckets -------------------
    tied = tied_output(kind, params)[:, None]  # [L, 1]
    read = read_parameter_fraction(kind, params, out_el)[:, None]  # [L, 1] of its parameters, a gradient
    ranks, ranks_per_node, grad_sync = _gradient_sync(net, a, d, m, local_params * read, tied, settings)
    bucket = settings.gradient_bucket_bytes

    src = jnp.asarray(a.edge_src).astype(jnp.int32)
    dst = jnp.asarray(a.edge_dst).astype(jnp.int32)
    emask = f32(a.edge_mask)

    ma, mb = tier_of(net, m, m > dpn)
    attention = is_kind(kind, ATTENTION_KINDS)  # [L]
    halo, forward_halo, kv_el = halo_s(a, attention, group_batch, delta, m, ma, mb, dst, emask, params)

    # -- resharding on edges, and the sink layers' outputs to the loss -----------------
    pad = row_padding(f32(a.out_spatial[:, 0]), m)  # [L] a row-split output's padded size
    reshard = edge_reshard_s(out_el[src] * group_batch * delta, pad[src], lay, src, dst, emask, m, ma, mb)
    output = loss_output_s(out_el * group_batch * delta, pad, lay, src, emask, real, m, ma, mb)

    # -- memory per device ----------------------------------------------------------------
    # Weights, gradients, optimizer slots and the optimizer's update per parameter held
    # (costmodels/levers.py adds them up, per lever); fp32 buffers (batch-norm
    # statistics) follow the channels, split only under filter.
    buffer_split = jnp.where(jnp.arange(S)[None, :] == Strategy.FILTER, m, 1.0)  # [1, S]
    loss = loss_workspace_bytes(out_el, lay, group_batch, src, emask, real, m)  # [L, S] a sink's loss step
    activation, workspace = activation_workspace_bytes(a, attention, kv_el, in_lay, out_lay, group_batch, delta, m,
                                                        settings.platform == "cpu", loss)

    # -- memory levers (costmodels/levers.py): ZeRO over the weights' replica group, remat --
    group = ranks  # [S] ZeRO's data-parallel group: the ranks of the gradient all-reduce
    input_bytes = delta * group_batch * in_el[:, None] / layout_split(in_lay, m)  # [L, S] what recomputing keeps
    zero_ok, recomputable, joinable = _lever_masks(a, kind, params, real, tied, group, m, feasible, activation,
                                                   input_bytes, src, dst, emask, settings.remat_runs)
    inputs = LeverInputs(
        feasible=feasible, compute_s=compute, backward_s=backward, grad_sync_s=grad_sync, halo_s=halo,
        forward_halo_s=forward_halo, output_s=output, params=local_params,
        buffer_bytes=4.0 * f32(a.buffers)[:, None] / buffer_split, activation_bytes=activation,
        input_bytes=input_bytes, workspace_bytes=workspace,
        group=group, reduce_scatter_bucket_s=reduce_scatter_group_s(net, group, ranks_per_node, bucket),
        all_gather_bucket_s=allgather_group_s(net, group, ranks_per_node, bucket), zero_ok=zero_ok,
        recomputable=recomputable, joinable=joinable,
    )
    lc = lever_costs(inputs, lever_menu(settings.levers), weight_bytes=settings.weight_bytes_per_param,
                     gradient_bytes=settings.gradient_bytes_per_param,
                     optimizer_bytes=settings.optimizer_bytes_per_param,
                     update_bytes=settings.update_bytes_per_param, bucket_bytes=bucket)

    # -- XLA:CPU's own buffers (costmodels/xla_cpu.py); ZeRO changes the gradients and kernel copies
    activation_out, workspace_out, xla_cpu = _with_xla_cpu(lc, a, lay, local_params, group_batch, d, m, delta,
                                                           group, settings)

    # each in-edge's part of its destination's input (a concatenation's inputs differ in size)
    sent = out_el[src] * emask  # [E]
    input_share = jnp.where(emask > 0, sent / jnp.maximum(jnp.zeros(L).at[dst].add(sent)[dst], 1.0), 0.0)

    keep = real[:, None]
    return CostTable(
        feasible=lc.feasible | (real == 0)[:, None],  # padding rows allow every option (they cost nothing)
        compute_s=lc.compute_s * keep, backward_compute_s=lc.backward_compute_s * keep,
        grad_sync_s=lc.grad_sync_s * keep, weight_gather_s=lc.weight_gather_s * keep, halo_s=lc.halo_s * keep,
        output_s=lc.output_s, state_bytes=lc.state_bytes * keep, update_bytes=lc.update_bytes * keep,
        activation_bytes=activation_out * keep, workspace_bytes=workspace_out * keep,
        recompute_bytes=lc.recompute_bytes * keep, checkpoint_bytes=lc.checkpoint_bytes * keep,
        reshard_s=reshard, layer_mask=real, edge_src=src, edge_dst=dst, edge_mask=emask,
        edge_input_share=input_share, gradient_overlap=hw.gradient_overlap,
        memory_capacity_bytes=hw.memory_bytes, xla_cpu=xla_cpu,
    )


def _gradient_sync(net, a, d, m, local_params, tied, settings: CostSettings):
    """Per strategy, the ranks holding replicas of the same weights ``[S]``
    and how many of them share a node ``[S]``, and each layer's gradient
    all-reduce time ``[L, S]`` seconds in buckets of
    ``settings.gradient_bucket_bytes`` (ParaDL §4.3, §4.8). Each device
    reduces its own shard; an output layer tied to an embedding (``tied``
    ``[L, 1]``) holds no parameters but reduces its own gradient of the whole
    table, apart from the lookup's (XLA, measured on a tied decoder:
    docs/transformers.md)."""
    P = d * m
    dpn = net.devices_per_node
    per_node_data_axis = jnp.maximum(1.0, jnp.floor(dpn / m))
    ranks = jnp.stack([P, d, d, P, d])  # [S] who holds replicas of the same weights
    ranks_per_node = jnp.stack(
        [jnp.minimum(P, dpn), per_node_data_axis, per_node_data_axis, jnp.minimum(P, dpn), per_node_data_axis]
    )
    bucket = settings.gradient_bucket_bytes
    bucket_s = allreduce_s(net, ranks, ranks_per_node, bucket)  # [S]
    table_el = jnp.asarray(a.in_channels, jnp.float32) * jnp.asarray(a.out_channels, jnp.float32)  # [L]
    grad_bytes = settings.gradient_bytes_per_param * jnp.where(tied, table_el[:, None], local_params)
    return ranks, ranks_per_node, bucket_s[None, :] * grad_bytes / bucket


def _lever_masks(a, kind, params, real, tied, group, m, feasible, activation, input_bytes, src, dst, emask,
                 remat_runs: bool):
    """Where the memory levers apply (costmodels/levers.py): ZeRO ``[L, S]``
    on a layer holding weights or optimizer state (not the table a tied
    output reads) over a data-parallel ``group`` of more than one device
    that divides the output channels it holds; recomputing ``[L, S]`` where
    a layer saves more than its input (in runs, ``remat_runs``, on every
    layer: a run crosses the layers that save nothing too, an add, a
    flatten, and their inputs inside it need no checkpoint either); joining
    a run ``[L]`` where a producer can recompute."""
    S = len(Strategy)
    strat = jnp.arange(S)[None, :]
    out_local = jnp.asarray(a.out_channels, jnp.float32)[:, None] / jnp.where(strat == Strategy.FILTER, m, 1.0)
    holds_state = ((kind == LayerKind.CONV) | (kind == LayerKind.DENSE) | (kind == LayerKind.EMBED)
                   | (kind == LayerKind.BATCH_NORM) | (kind == LayerKind.NORM)) & (params > 0)
    shares_table = jnp.any(tied[:, 0] & (real > 0)) & (kind == LayerKind.EMBED)  # the table a tied output reads
    zero_ok = (holds_state & ~shares_table)[:, None] & (group[None, :] > 1) & (jnp.mod(out_local, group[None, :]) == 0)
    recomputable = (activation >= 0.0) if remat_runs else (activation > input_bytes)  # [L, S]
    can_recompute = jnp.any(feasible & recomputable, axis=-1) & (real > 0)  # [L]
    joinable = jnp.zeros(kind.shape[0], bool).at[dst].max(can_recompute[src] & (emask > 0))
    return zero_ok, recomputable, joinable


def _with_xla_cpu(lc, a, lay, local_params, group_batch, d, m, delta, group, settings: CostSettings):
    """The options' activation and workspace bytes ``[L, O]`` with XLA:CPU's
    own buffers added where the platform is ``cpu`` (costmodels/xla_cpu.py;
    the same under every lever), and those buffers (None elsewhere);
    ``group`` ``[S]`` is ZeRO's replica group per strategy."""
    if settings.platform != "cpu":
        return lc.activation_bytes, lc.workspace_bytes, None
    menu = lever_menu(settings.levers)
    K = len(menu)
    stages = jnp.asarray([lever.zero_stage for lever in menu] * len(Strategy))  # [O] option s K + k: strategy s
    shards = jnp.where(stages >= 2, jnp.repeat(jnp.asarray(group, jnp.float32), K), 1.0)  # [O] ZeRO 2, 3 shard gradients
    recomputes = jnp.asarray(option_recomputing(K * len(Strategy))[0])  # [O]
    extra_activation, extra_workspace, xla_cpu = xla_cpu_buffers(
        a, lay, local_params, group_batch, d, m, delta, settings.gradient_bytes_per_param, shards, stages, recomputes)
    # option s K + k: strategy s
    return (lc.activation_bytes + jnp.repeat(extra_activation, K, axis=-1),
            lc.workspace_bytes + jnp.repeat(extra_workspace, K, axis=-1), xla_cpu)


def _local_params(a, params, m):
    """The parameters one device holds ``[L, S]``: filter splits kernel and
    bias (both follow the output channels, ParaDL §4.6); channel splits the
    kernel's input channels and keeps the whole bias, added once after the
    partial sums are reduced (ParaDL §4.7); the other strategies replicate
    them. kernel = prod(window) * in / groups * out."""
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    strat = jnp.arange(len(Strategy))[None, :]
    kernel_el = jnp.minimum(
        jnp.prod(f32(a.kernel), axis=-1) * f32(a.in_channels) / jnp.maximum(f32(a.groups), 1.0) * f32(a.out_channels),
        params,
    )  # [L] kernel elements; the rest of params is the bias
    return jnp.where(
        strat == Strategy.FILTER,
        params[:, None] / m,
        jnp.where(strat == Strategy.CHANNEL, (params - kernel_el * (1.0 - 1.0 / m))[:, None], params[:, None]),
    )
