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
from costmodels.collectives import (
    allgather_group_s,
    allreduce_s,
    p2p_s,
    reduce_scatter_group_s,
    tier_of,
)
from costmodels.compute import DTYPE_BYTES, HardwareArrays, shard_compute_s
from costmodels.layers import ATTENTION_KINDS, LayerKind, is_kind, key_value_channels, tied_output
from costmodels.levers import LeverInputs, lever_costs, lever_menu
from costmodels.reshard import conversion_s
from costmodels.shards import halo_rows, row_padding, shard_shapes
from costmodels.strategies import Layout, Strategy, strategy_layouts, strategy_mask
from costmodels.xla_cpu import XlaCpuBuffers

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
    in_lay, out_lay, gin_lay, gout_lay = (lay[..., i] for i in range(4))

    def split_of(layout):  # how many ways the model axis splits a tensor in this layout
        return jnp.where((layout == Layout.REPLICATED) | (layout == Layout.PARTIAL), 1.0, m)

    group_batch = batch / d  # samples held by one model-axis group
    in_el, out_el = f32(a.in_elements), f32(a.out_elements)
    params = f32(a.params)

    # -- compute: the group's work split over m, except replicated layers ----------
    work = jnp.stack([jnp.ones(L)] * 4 + [m * jnp.ones(L)], axis=-1) * group_batch / m  # [L, S] samples per device
    # Parameters one device holds [L, S]: filter splits kernel and bias (both follow the
    # output channels, ParaDL §4.6); channel splits the kernel's input channels and
    # keeps the whole bias, added once after the partial sums are reduced (ParaDL §4.7);
    # the other strategies replicate them. kernel = prod(window) * in / groups * out.
    strat = jnp.arange(S)[None, :]
    kernel_el = jnp.minimum(
        jnp.prod(f32(a.kernel), axis=-1) * f32(a.in_channels) / jnp.maximum(f32(a.groups), 1.0) * f32(a.out_channels),
        params,
    )  # [L] kernel elements; the rest of params is the bias
    local_params = jnp.where(
        strat == Strategy.FILTER,
        params[:, None] / m,
        jnp.where(strat == Strategy.CHANNEL, (params - kernel_el * (1.0 - 1.0 / m))[:, None], params[:, None]),
    )  # [L, S] parameters per device
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
    P = d * m
    per_node_data_axis = jnp.maximum(1.0, jnp.floor(dpn / m))
    ranks = jnp.stack([P, d, d, P, d])  # [S] who holds replicas of the same weights
    ranks_per_node = jnp.stack(
        [jnp.minimum(P, dpn), per_node_data_axis, per_node_data_axis, jnp.minimum(P, dpn), per_node_data_axis]
    )
    bucket = settings.gradient_bucket_bytes
    bucket_s = allreduce_s(net, ranks, ranks_per_node, bucket)  # [S]
    # Each device reduces its own shard. An output layer tied to an embedding holds no
    # parameters but reduces its own gradient of the whole table, apart from the lookup's
    # (XLA, measured on a tied decoder: docs/transformers.md).
    tied = tied_output(kind, params)[:, None]  # [L, 1]
    table_el = f32(a.in_channels) * f32(a.out_channels)  # [L]
    grad_bytes = settings.gradient_bytes_per_param * jnp.where(tied, table_el[:, None], local_params)
    grad_sync = bucket_s[None, :] * grad_bytes / bucket

    src = jnp.asarray(a.edge_src).astype(jnp.int32)
    dst = jnp.asarray(a.edge_dst).astype(jnp.int32)
    emask = f32(a.edge_mask)

    # -- spatial halo exchange (ParaDL §4.4, sizes corrected per §9) ----------------
    # A shard needs (K-1)*dilation + 1 - stride rows beyond its own along the split
    # dim, half from each neighbour. Forward: rows of x. Backward: rows of dL/dy for the
    # input gradient, which a layer fed by the model input never computes; and rows of
    # x again for the weight gradient: XLA's SPMD partitioner re-exchanges the input's
    # halo rather than keeping the forward's (measured, docs/validation.md).
    rows = halo_rows(a)
    lo, hi = jnp.floor(rows / 2.0), rows - jnp.floor(rows / 2.0)
    x_row = f32(a.in_channels) * f32(a.in_spatial[:, 1]) * f32(a.in_spatial[:, 2]) * group_batch * delta
    y_row = f32(a.out_channels) * f32(a.out_spatial[:, 1]) * f32(a.out_spatial[:, 2]) * group_batch * delta
    ma, mb = tier_of(net, m, m > dpn)
    has_producer = jnp.zeros(L).at[dst].max(emask)  # [L] 0 for layers fed by the model input
    has_weights = (params > 0).astype(jnp.float32)  # [L]
    x_halo = p2p_s(lo * x_row, ma, mb) + p2p_s(hi * x_row, ma, mb)
    y_halo = p2p_s(lo * y_row, ma, mb) + p2p_s(hi * y_row, ma, mb)
    halo = x_halo + has_producer * y_halo + has_weights * x_halo  # forward + input gradient + weight gradient
    # Sequence parallelism (spatial on an attention): every shard's queries meet every
    # key, so each shard all-gathers the keys and the values (SPATIAL -> REPLICATED)
    # forward, and reduce-scatters their gradients, summed over every shard's queries
    # (PARTIAL -> SPATIAL), backward: the all-gather forward and reduce-scatter
    # backward of Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
    # Transformer Models", section 4.2.2), here for the keys and values as in Li et
    # al. 2023 (sequence parallelism, section 3.2).
    attention = is_kind(kind, ATTENTION_KINDS)  # [L]
    # [L] the keys (or the values) of the group, as split by rows (padded)
    kv_el = key_value_channels(f32(a.in_channels), f32(a.out_channels)) * f32(a.in_spatial[:, 0])  # [L] per sample
    kv_bytes = kv_el * group_batch * delta * row_padding(f32(a.in_spatial[:, 0]), m)
    kv = 2.0 * (conversion_s(Layout.SPATIAL, Layout.REPLICATED, kv_bytes, m, ma, mb)
                + conversion_s(Layout.PARTIAL, Layout.SPATIAL, kv_bytes, m, ma, mb))
    halo = jnp.where(attention, kv, halo)
    halo = jnp.where(jnp.arange(S) == Strategy.SPATIAL, halo[:, None], 0.0)
    forward_halo = jnp.where(attention, 2.0 * conversion_s(Layout.SPATIAL, Layout.REPLICATED, kv_bytes, m, ma, mb),
                             x_halo)  # [L] what a recomputed forward exchanges again
    forward_halo = jnp.where(jnp.arange(S) == Strategy.SPATIAL, forward_halo[:, None], 0.0)

    # -- resharding on edges -----------------------------------------------------------
    edge_bytes = (out_el[src] * group_batch * delta)[:, None, None]  # [E, 1, 1]
    pad = row_padding(f32(a.out_spatial[:, 0]), m)  # [L] a row-split output's padded size
    by_rows = lambda x, y: (x == Layout.SPATIAL) | (y == Layout.SPATIAL)  # noqa: E731 (a conversion of a row-split tensor)
    src_out, dst_in = out_lay[src][:, :, None], in_lay[dst][:, None, :]
    fwd = conversion_s(src_out, dst_in, edge_bytes * jnp.where(by_rows(src_out, dst_in), pad[src][:, None, None], 1.0),
                       m, ma, mb)
    src_gout, dst_gin = gout_lay[src][:, :, None], gin_lay[dst][:, None, :]
    bwd = conversion_s(dst_gin, src_gout,
                       edge_bytes * jnp.where(by_rows(dst_gin, src_gout), pad[src][:, None, None], 1.0), m, ma, mb)
    reshard = (fwd + bwd) * emask[:, None, None]

    # -- a sink layer's output feeds the loss: where it, computed batch-split, as is;
    # otherwise gathered to every group member (the loss gradient then needs no
    # collective: slicing a replicated tensor is free).
    has_consumer = jnp.zeros(L).at[src].max(emask)
    out_bytes = (out_el * group_batch * delta)[:, None] * jnp.where(out_lay == Layout.SPATIAL, pad[:, None], 1.0)
    loss_layout = jnp.where(out_lay == Layout.BATCH, Layout.BATCH, Layout.REPLICATED)
    to_loss = conversion_s(out_lay, loss_layout, out_bytes, m, ma, mb) + conversion_s(
        loss_layout, gout_lay, out_bytes, m, ma, mb
    )
    output = jnp.where((has_consumer == 0)[:, None] & (real > 0)[:, None], to_loss, 0.0)

    # -- memory per device ----------------------------------------------------------------
    # Weights, gradients, optimizer slots and the optimizer's update per parameter held
    # (costmodels/levers.py adds them up, per lever); fp32 buffers (batch-norm
    # statistics) follow the channels, split only under filter.
    buffer_split = jnp.where(strat == Strategy.FILTER, m, 1.0)  # [1, S]
    activation = f32(a.saved_elements)[:, None] * group_batch * delta / split_of(in_lay)
    # A sequence-parallel attention keeps the gathered keys and values, not its shard of them.
    gathered_kv = 2.0 * kv_el * group_batch * delta * (1.0 - 1.0 / m)  # [L] the other shards' rows
    activation = activation + jnp.where(attention[:, None] & (strat == Strategy.SPATIAL), gathered_kv[:, None], 0.0)
    # Transient beyond the saved activations: the layer's input and output gradients at
    # its backward step (its input and output themselves are saved activations already).
    workspace = delta * group_batch * (in_el[:, None] / split_of(in_lay) + out_el[:, None] / split_of(out_lay))
    # An attention's backward step also materialises the gradients of its probabilities and
    # of its scores, dP = dO V^T and dS = P * (dP - rowsum(dO * O)), heads x tokens^2 each
    # per sample, split as the probabilities are (Dao et al. 2022, FlashAttention, section
    # 2.2 and Algorithm 3, the standard attention's backward pass).
    scores = jnp.where(attention, f32(a.groups) * jnp.square(f32(a.out_spatial[:, 0])), 0.0)  # [L] per sample
    probs = delta * group_batch * scores[:, None] / split_of(in_lay)  # [L, S] one probability-sized buffer
    workspace = workspace + 2.0 * probs
    if settings.platform == "cpu":
        # XLA:CPU also keeps the probabilities transposed, for dV = P^T dO: its layout
        # assignment copies them in the forward pass (`copy_bitcast_fusion`: 2 probability-sized
        # buffers kept per layer, with the custom-JVP softmax the export uses; 1 where XLA:CPU
        # runs both products as one YNN fusion, which this does not tell apart:
        # docs/transformers.md). A saved activation: the remat lever recomputes it.
        activation = activation + probs

    # -- memory levers (costmodels/levers.py): ZeRO over the weights' replica group, remat --
    group = ranks  # [S] ZeRO's data-parallel group: the ranks of the gradient all-reduce
    out_local = f32(a.out_channels)[:, None] / jnp.where(strat == Strategy.FILTER, m, 1.0)  # [L, S]
    holds_state = ((kind == LayerKind.CONV) | (kind == LayerKind.DENSE) | (kind == LayerKind.EMBED)
                   | (kind == LayerKind.BATCH_NORM) | (kind == LayerKind.NORM)) & (params > 0)
    shares_table = jnp.any(tied[:, 0] & (real > 0)) & (kind == LayerKind.EMBED)  # the table a tied output reads
    zero_ok = (holds_state & ~shares_table)[:, None] & (group[None, :] > 1) & (jnp.mod(out_local, group[None, :]) == 0)
    input_bytes = delta * group_batch * in_el[:, None] / split_of(in_lay)  # [L, S] what recomputing keeps
    # recomputing one layer frees memory where it saves more than its input; in runs
    # (remat_runs), on every layer: a run crosses the layers that save nothing too (an
    # add, a flatten), and their inputs inside it need no checkpoint either
    recomputable = (activation >= 0.0) if settings.remat_runs else (activation > input_bytes)  # [L, S]
    # a run of recomputing layers can reach a layer from a producer that can recompute
    can_recompute = jnp.any(feasible & recomputable, axis=-1) & (real > 0)  # [L]
    joinable = jnp.zeros(L, bool).at[dst].max(can_recompute[src] & (emask > 0))
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

    # -- XLA:CPU's max-pool gradient: no select-and-scatter kernel; XLA's
    # SelectAndScatterExpander (cpu_compiler.cc) finds each window's argmax with int32
    # iotas of the pool input's shape, one per dimension (batch, spatial, channels), and
    # keeps an int32 index matrix [output elements, dimensions] from the forward pass for
    # the backward scatter (buffer assignment, measured: docs/validation.md "The memory
    # promise"). And a convolution's backward step holds its output gradient twice: the
    # layout assignment gives the input-gradient convolution a transposed copy of it
    # (`transpose_copy_fusion`, live-range dumps, measured on the grid). Levers leave both alone.
    activation_out, workspace_out = lc.activation_bytes, lc.workspace_bytes
    if settings.platform == "cpu":
        conv = kind == LayerKind.CONV
        max_pool = ((kind == LayerKind.POOL) & (f32(a.saved_elements) > 0))[:, None]  # average pools save nothing
        dims = f32(a.spatial_rank)[:, None] + 2.0
        pool_in = f32(a.saved_elements)[:, None] * group_batch / split_of(in_lay)  # [L, S] a max pool saves its input
        pool_out = out_el[:, None] * group_batch / split_of(out_lay)  # [L, S] elements per device
        index_bytes = jnp.where(max_pool, 4.0 * dims * pool_out, 0.0)
        iota_bytes = jnp.where(max_pool, 4.0 * dims * pool_in, 0.0)
        dy_copy = jnp.where(conv[:, None], delta * out_el[:, None] * group_batch / split_of(gout_lay),
                            0.0)  # [L, S] the transposed output gradient
        K = lc.activation_bytes.shape[-1] // S
        activation_out = activation_out + jnp.repeat(index_bytes, K, axis=-1)  # option s K + k: strategy s
        workspace_out = workspace_out + jnp.repeat(iota_bytes + dy_copy, K, axis=-1)
        # XLA:CPU's schedule (costmodels/xla_cpu.py, measured rule by rule): a copy of every
        # conv and dense kernel but the first weighted layer's and a channel dense layer's,
        # a reversed kernel where ConvOperandSwapper swaps a conv's operands (window larger
        # than the input), each max pool's zero broadcast (its input's size).
        weighted = (conv | (kind == LayerKind.DENSE)) & (params > 0) & (real > 0)
        first = weighted & (jnp.cumsum(weighted) == 1)
        gradients = settings.gradient_bytes_per_param * local_params  # [L, S] without levers
        copied = (weighted & ~first)[:, None] & ~((kind == LayerKind.DENSE)[:, None] & (strat == Strategy.CHANNEL))
        swapped = conv & (jnp.prod(f32(a.kernel), axis=-1) > jnp.prod(f32(a.in_spatial), axis=-1))
        xla_cpu = XlaCpuBuffers(
            gradient_bytes=gradients * real[:, None],
            kernel_copy_bytes=jnp.where(copied, gradients, 0.0),
            reversed_kernel_bytes=jnp.where(swapped[:, None], gradients, 0.0),
            pool_input_bytes=jnp.where(max_pool, delta * pool_in, 0.0),
            pool_iota_bytes=iota_bytes,
            pool_output_bytes=jnp.where(max_pool, delta * pool_out, 0.0),
            max_pool=f32(max_pool[:, 0]),
            reduces_gradients=f32(d > 1),
        )
    else:
        xla_cpu = None

    # each in-edge's part of its destination's input (a concatenation's inputs differ in size)
    sent = out_el[src] * emask  # [E]
    input_share = jnp.where(emask > 0, sent / jnp.maximum(jnp.zeros(L).at[dst].add(sent)[dst], 1.0), 0.0)

    keep = real[:, None]
    return CostTable(
        feasible=lc.feasible | (real == 0)[:, None],  # padding rows allow every option (they cost nothing)
        compute_s=lc.compute_s * keep,
        backward_compute_s=lc.backward_compute_s * keep,
        grad_sync_s=lc.grad_sync_s * keep,
        weight_gather_s=lc.weight_gather_s * keep,
        halo_s=lc.halo_s * keep,
        output_s=lc.output_s,
        state_bytes=lc.state_bytes * keep,
        update_bytes=lc.update_bytes * keep,
        activation_bytes=activation_out * keep,
        workspace_bytes=workspace_out * keep,
        recompute_bytes=lc.recompute_bytes * keep,
        checkpoint_bytes=lc.checkpoint_bytes * keep,
        reshard_s=reshard,
        layer_mask=real,
        edge_src=src,
        edge_dst=dst,
        edge_mask=emask,
        edge_input_share=input_share,
        gradient_overlap=hw.gradient_overlap,
        memory_capacity_bytes=hw.memory_bytes,
        xla_cpu=xla_cpu,
    )
