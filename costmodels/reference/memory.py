"""The plain-Python reference's memory (:mod:`costmodels.reference`): peak
bytes per device of one discrete plan, layer by layer, the two phases of
:func:`costmodels.memory_per_device` written again with scalars."""

from __future__ import annotations

from collections.abc import Sequence

from costmodels.compute import DTYPE_BYTES
from costmodels.layers import ATTENTION_KINDS, LayerKind, LayerTable, key_value_channels
from costmodels.reference._plan import _B, _P, _R, _group, _layouts, _local_params, _option
from costmodels.strategies import Strategy
from costmodels.table import OPTIMIZER_SLOTS, CostSettings

__all__ = ["reference_memory"]


def reference_memory(
    graph: LayerTable, choice: Sequence[int], batch: float, d: int, m: int, settings: CostSettings = CostSettings(),
) -> float:
    """Peak bytes per device of the discrete plan ``choice`` (options, as
    :func:`reference_iteration_time`)."""
    a = graph.arrays
    delta = DTYPE_BYTES[settings.dtype]
    # fp32: weights + gradients; mixed precision: bf16 weights + bf16 gradients + fp32 master
    weights, grads = delta, delta
    master = 0.0 if settings.dtype == "float32" else 4.0
    update = 4.0  # the optimizer's fp32 update buffer (XLA buffer assignment, measured)
    optimizer = master + 4.0 * OPTIMIZER_SLOTS[settings.optimizer] + update  # what ZeRO stage 1 shards
    gb = batch / d
    state, saved_total, workspace, updates = 0.0, 0.0, 0.0, 0.0
    fed = {u for u, _ in graph.edges}  # the layers whose output another layer reads; the rest feed the loss
    read_by_saver = {u for u, v in graph.edges if float(a.saved_elements[v]) > 0}  # a reader keeps its input
    for i in range(graph.num_layers):
        s, lever = _option(settings, choice[i])
        in_l, out_l, _, _ = _layouts(int(a.kind[i]), s)
        split = lambda lay: 1 if lay in (_R, _P) else m  # noqa: E731
        in_el = float(a.in_channels[i] * a.in_spatial[i][0] * a.in_spatial[i][1] * a.in_spatial[i][2])
        out_el = float(a.out_channels[i] * a.out_spatial[i][0] * a.out_spatial[i][1] * a.out_spatial[i][2])
        local = _local_params(graph, i, s, m)
        group = _group(s, d, m, 1)[0]
        z = lever.zero_stage
        w_div = group if z >= 3 else 1.0
        g_div = group if z >= 2 else 1.0
        o_div = group if z >= 1 else 1.0
        state += local * (weights / w_div + grads / g_div + optimizer / o_div)
        updates += local * update / o_div  # live at the optimizer step, not with the activations
        if z == 1:  # stage 1's update gathered to the whole weights, at the optimizer step
            state += local * weights
            updates += local * weights
        state += 4.0 * float(a.buffers[i]) / (m if s == Strategy.FILTER else 1)  # statistics follow channels
        attention = int(a.kind[i]) in ATTENTION_KINDS
        probs = float(a.groups[i]) * float(a.out_spatial[i][0]) ** 2 * gb * delta / split(in_l) if attention else 0.0
        saved = float(a.saved_elements[i]) * gb * delta / split(in_l)
        if s == Strategy.SPATIAL and attention:
            kv_el = key_value_channels(float(a.in_channels[i]), float(a.out_channels[i])) * float(a.in_spatial[i][0])
            saved += 2.0 * kv_el * gb * delta * (1.0 - 1.0 / m)  # the gathered keys and values
        if settings.platform == "cpu":
            saved += probs  # XLA:CPU's transposed probabilities, for dV = P^T dO
        # transient: the input and output gradients (x and y are saved activations already)
        transient = delta * gb * (in_el / split(in_l) + out_el / split(out_l))
        transient += 2.0 * probs  # dP and dS, the probabilities' and the scores' gradients
        if i not in fed:  # a sink's loss step: exp(z - max z) and the logits' gradient, fp32, in the loss's layout
            transient = max(transient, 2.0 * 4.0 * out_el * gb / (m if out_l == _B else 1))
        transient += local * ((grads if z >= 2 else 0.0) + (weights if z >= 3 else 0.0))  # ZeRO's whole gradient, weights
        if lever.remat:  # keep the input; the recomputed activations are the backward step's
            saved_total += in_el * gb * delta / split(in_l)
            transient += saved
        else:
            saved_total += saved
        if settings.platform == "cpu" and int(a.kind[i]) == LayerKind.POOL and float(a.saved_elements[i]) > 0:
            # XLA:CPU's max-pool expansion: an int32 index matrix [outputs, dims] kept, iotas of the input's shape
            dims = float(a.spatial_rank[i]) + 2.0
            saved_total += 4.0 * dims * out_el * gb / split(out_l)
            transient += 4.0 * dims * float(a.saved_elements[i]) * gb / split(in_l)
        if settings.platform == "cpu" and int(a.kind[i]) == LayerKind.NORM:  # its centred input, broadcast deviation
            saved_total += 2.0 * float(a.saved_elements[i]) * gb * delta / split(in_l)
        if settings.platform == "cpu" and m > 1 and out_l == _R and i in read_by_saver:
            saved_total += delta * out_el * gb  # XLA:CPU keeps a replicated output whole where its reader slices it
        if settings.platform == "cpu" and int(a.kind[i]) == LayerKind.CONV:  # XLA:CPU's transposed output gradient
            transient += delta * out_el * gb / split(_layouts(int(a.kind[i]), s)[3])
        if settings.platform == "cpu" and m > 1 and int(a.kind[i]) == LayerKind.DENSE and s == Strategy.CHANNEL:
            transient += 2.0 * delta * out_el * gb / split(_layouts(int(a.kind[i]), s)[3])  # its gathered dy, twice more
        workspace = max(workspace, transient)
    # the larger of the backward phase and the optimizer step (the activations freed, the update live)
    return max(state - updates + saved_total + workspace, state)
