"""The plain-Python reference's iteration time (:mod:`costmodels.reference`):
compute, communication and resharding of one discrete plan, layer by layer,
:func:`costmodels.cost_table` + :func:`costmodels.iteration_time` written
again with scalar ``math`` and loops."""

from __future__ import annotations

import math
from collections.abc import Sequence

from costmodels.calibration import Calibration
from costmodels.compute import DTYPE_BYTES
from costmodels.hardware import Hardware
from costmodels.layers import ATTENTION_KINDS, LayerKind, LayerTable, key_value_channels
from costmodels.reference._plan import _B, _H, _P, _R, _group, _layouts, _local_params, _option
from costmodels.strategies import STRATEGY_NAMES, Strategy
from costmodels.table import CostSettings

__all__ = ["reference_iteration_time"]


def _tier(hw: Hardware, ranks: float, crosses: bool) -> tuple[float, float]:
    t = hw.tier_for(max(1, math.ceil(ranks)), crosses)
    return t.latency_s, t.bandwidth_bytes_per_s


def _ring(n, nbytes, a, bw):
    return 2 * (n - 1) * (a + nbytes / n / bw) if n > 1 else 0.0


def _tree(n, nbytes, a, bw):
    return 2 * math.ceil(math.log2(n)) * a + 2 * nbytes / bw if n > 1 else 0.0


def _allreduce(hw: Hardware, n: float, per_node: float, nbytes: float) -> float:
    g = min(max(per_node, 1.0), n)
    a, bw = _tier(hw, n, n > g)
    best = min(_ring(n, nbytes, a, bw), _tree(n, nbytes, a, bw))
    if n > g and g > 1:
        ai, bi = _tier(hw, g, False)
        k = n / g
        ao, bo = _tier(hw, k, True)
        hier = ((g - 1) * (ai + nbytes / g / bi)
                + min(_ring(k, nbytes / g, ao, bo), _tree(k, nbytes / g, ao, bo))
                + (g - 1) * (ai + nbytes / g / bi))
        best = min(best, hier)
    return best


def _hierarchical(hw: Hardware, n: float, per_node: float, nbytes: float, gather: bool) -> float:
    """A reduce-scatter (or, with ``gather``, an all-gather) of an ``nbytes``
    buffer over ``n`` ranks: a flat ring, or inside the node then across nodes."""
    g = min(max(per_node, 1.0), n)
    a, bw = _tier(hw, n, n > g)
    best = (n - 1) * (a + nbytes / n / bw) if n > 1 else 0.0
    if n > g and g > 1:
        ai, bi = _tier(hw, g, False)
        k = n / g
        ao, bo = _tier(hw, k, True)
        inside = (g - 1) * (ai + nbytes / g / bi)  # each of g ranks moves 1/g of the buffer
        across = (k - 1) * (ao + nbytes / g / k / bo)  # each node's 1/g split over k nodes
        best = min(best, inside + across)
    return best


def _convert(src: int, dst: int, group_bytes: float, m: float, a: float, bw: float) -> float:
    if m <= 1 or src == dst or src == _R:
        return 0.0
    per = group_bytes / m
    if src == _P:
        if dst == _R:
            return min(_ring(m, group_bytes, a, bw), _tree(m, group_bytes, a, bw))
        return (m - 1) * (a + group_bytes / m / bw)  # reduce-scatter
    if dst == _R:
        return (m - 1) * (a + per / bw)  # all-gather
    return (m - 1) * (a + per / m / bw)  # all-to-all


def _row_padding(rows: float, m: float) -> float:
    """A tensor split by ``rows`` over ``m`` shards holds ``ceil(rows / m)`` rows
    on each (XLA pads the split dim): its size over its rows."""
    rows = max(rows, 1.0)
    return math.ceil(rows / m) * m / rows


def _measured_seconds(calibration: Calibration, name: str, strategy: int, work: float) -> float | None:
    """A layer's calibrated seconds at ``work``: the strategy's own points, else
    the layer's work-only points, else None (the roofline). Log-log linear
    between points, the end segment beyond them, proportional with one point."""
    pts = calibration.strategies.get(name, {}).get(STRATEGY_NAMES[strategy]) or calibration.layers.get(name)
    if not pts:
        return None
    if len(pts) == 1:
        return pts[0][1] * work / pts[0][0]
    j = 1
    while j < len(pts) - 1 and pts[j][0] < work:
        j += 1
    (w0, s0), (w1, s1) = pts[j - 1], pts[j]
    slope = (math.log(s1) - math.log(s0)) / (math.log(w1) - math.log(w0))
    return math.exp(math.log(s0) + slope * (math.log(work) - math.log(w0)))


def _kernel_seconds(hw: Hardware, flops: float, rows: float, features: float, reduction: float,
                    nbytes: float, peak: float, eff: float) -> float:
    """One kernel, written out: launch + p-norm of padded compute and memory time."""
    if flops <= 0 and nbytes <= 0:
        return 0.0
    k, dev = hw.device.kernel, hw.device
    if features > 0:  # a GEMM: pad N and K to the tiles, saturate on the padded output
        n_pad = math.ceil(features / k.channel_tile) * k.channel_tile / features
        k_pad = math.ceil(reduction / k.reduction_tile) * k.reduction_tile / reduction if reduction > 0 else 1.0
        out = rows * features * n_pad
        sat = out / (out + k.saturation_output_elements) if k.saturation_output_elements > 0 else 1.0
    else:
        n_pad = k_pad = sat = 1.0
    tc = flops * n_pad * k_pad / (peak * eff * sat)
    tm = nbytes / (dev.memory_bandwidth_bytes_per_s * dev.efficiency_of("memory", "float32"))
    p = k.compute_memory_exponent
    both = max(tc, tm) if p is None else (tc**p + tm**p) ** (1.0 / p)
    return k.launch_s + both


def _shard_seconds(graph: LayerTable, i: int, s: int, hw: Hardware, dtype: str, gb: float, m: int
                   ) -> tuple[float, float]:
    """(forward + backward, backward) seconds of layer ``i``'s shard under strategy ``s``."""
    a = graph.arrays
    kind = int(a.kind[i])
    if kind in (LayerKind.PAD, LayerKind.FLATTEN):
        return 0.0, 0.0
    delta = DTYPE_BYTES[dtype]
    dev = hw.device
    C, F = float(a.in_channels[i]), float(a.out_channels[i])
    b = gb / m if s == Strategy.DATA else gb
    c = C / m if s == Strategy.CHANNEL else C
    f = F / m if s == Strategy.FILTER else F
    in_sp = [float(x) for x in a.in_spatial[i]]
    out_sp = [float(x) for x in a.out_spatial[i]]
    full_out = out_sp[0] * out_sp[1] * out_sp[2]
    if s == Strategy.SPATIAL:  # own output rows, and the input rows they read (halo included)
        rows = math.ceil(out_sp[0] / m)
        halo = max(0.0, (float(a.kernel[i][0]) - 1) * float(a.dilation[i][0]) + 1 - float(a.stride[i][0]))
        in_sp[0] = min(rows * float(a.stride[i][0]) + halo, in_sp[0])
        out_sp[0] = rows
    in_px, out_px = in_sp[0] * in_sp[1] * in_sp[2], out_sp[0] * out_sp[1] * out_sp[2]
    share = f / F * out_px / full_out * (c / C if kind in (LayerKind.CONV, LayerKind.DENSE) else 1.0)
    fl = [float(x) * b * share for x in (a.flops_fwd[i], a.flops_bwd_data[i], a.flops_bwd_weight[i])]
    x_el, y_el = b * c * in_px, b * f * out_px
    if kind in (LayerKind.CONV, LayerKind.DENSE):
        mode = dev.math_mode(dtype)
        peak = dev.peak_flops_per_s[mode]
        eff = dev.efficiency_of("conv" if kind == LayerKind.CONV else "matmul", mode)
        g = max(float(a.groups[i]), 1.0)
        win = float(a.kernel[i][0] * a.kernel[i][1] * a.kernel[i][2])
        moved = (x_el + c / g * win * f + y_el) * delta
        shapes = [(b * out_px * g, f / g, c / g * win), (b * in_px * g, c / g, f / g * win), (c * win, f / g, b * out_px)]
        t = [_kernel_seconds(hw, fl[j], *shapes[j], moved if fl[j] > 0 else 0.0, peak, eff) for j in range(3)]
        if kind == LayerKind.CONV:  # library calls, and transposes of operands not in the library's layout
            k, layout = dev.kernel, dev.kernel.conv_layout.get(mode)
            copy = lambda n: _kernel_seconds(hw, 0.0, 0.0, 0.0, 0.0, 2.0 * n * delta,  # noqa: E731
                                             dev.peak_flops_per_s["float32"], dev.efficiency_of("elementwise", "float32"))
            x_copy = copy(x_el) if layout == "channels_first" else 0.0
            w_copy = copy(c / g * win * f) if layout is not None else 0.0
            extra = [x_copy + w_copy, x_copy, w_copy]
            t = [t[j] + (k.conv_call_s + extra[j] if fl[j] > 0 else 0.0) for j in range(3)]
        return t[0] + t[1] + t[2], t[1] + t[2]
    peak, eff = dev.peak_flops_per_s["float32"], dev.efficiency_of("elementwise", "float32")
    if kind in ATTENTION_KINDS:
        # per head: scores = q k^T and out = p v forward; d(scores), dq, dk, dv backward;
        # the softmax an element-wise kernel each way over the scores
        mode = dev.math_mode(dtype)
        hd = F / float(a.groups[i])
        heads, queries, keys = f / hd, out_sp[0], float(a.in_spatial[i][0])
        gemm = 2.0 * b * queries * keys * f
        sc = b * heads * queries * keys
        # the keys' share of the queries' channels: 1, or less under grouped-query attention
        kv_share = key_value_channels(float(a.in_channels[i]), float(a.out_channels[i])) / F
        moved = (sc + b * f * (queries + 2.0 * kv_share * keys)) * delta
        mm_peak, mm_eff = dev.peak_flops_per_s[mode], dev.efficiency_of("matmul", mode)

        def mm(rows: float, n: float, k: float) -> float:
            return _kernel_seconds(hw, gemm, rows, n, k, moved, mm_peak, mm_eff)

        q_rows, k_rows = b * heads * queries, b * heads * keys
        fwd = mm(q_rows, keys, hd) + mm(q_rows, hd, keys) + _kernel_seconds(
            hw, max(fl[0] - 2.0 * gemm, 0.0), 0.0, 0.0, 0.0, 2.0 * sc * delta, peak, eff)
        bwd = mm(q_rows, keys, hd) + mm(q_rows, hd, keys) + 2.0 * mm(k_rows, hd, queries) + _kernel_seconds(
            hw, max(fl[1] - 4.0 * gemm, 0.0), 0.0, 0.0, 0.0, 3.0 * sc * delta, peak, eff)
        return fwd + bwd, bwd
    fwd = _kernel_seconds(hw, fl[0], 0.0, 0.0, 0.0, (x_el + y_el) * delta, peak, eff)
    has_bwd = float(a.flops_bwd_data[i]) > 0 or float(a.saved_elements[i]) > 0
    bwd = _kernel_seconds(hw, fl[1], 0.0, 0.0, 0.0, (2 * x_el + y_el) * delta, peak, eff) if has_bwd else 0.0
    return fwd + bwd, bwd


def reference_iteration_time(
    graph: LayerTable, choice: Sequence[int], hw: Hardware, batch: float, d: int, m: int,
    settings: CostSettings = CostSettings(), calibration: Calibration | None = None,
) -> float:
    """Seconds per iteration of the discrete plan ``choice`` (one option per
    real layer: a strategy code, or with ``settings.levers`` a strategy under a
    lever, ``costmodels.levers``). ``calibration`` replaces the roofline
    compute of the layers it measured."""
    a = graph.arrays
    n = graph.num_layers
    delta = DTYPE_BYTES[settings.dtype]
    dpn = hw.devices_per_node
    gb = batch / d
    ma, mb = _tier(hw, m, m > dpn)
    total = grad_total = bwd_total = 0.0
    fed = {v for (_, v) in graph.edges}  # layers with a producer
    strategies = [_option(settings, c)[0] for c in choice]
    for i in range(n):
        s, lever = _option(settings, choice[i])
        cin, cout = float(a.in_channels[i]), float(a.out_channels[i])
        local = _local_params(graph, i, s, m)
        samples = gb if s == Strategy.REPLICATED else gb / m
        comp, bwd = _shard_seconds(graph, i, s, hw, settings.dtype, gb, m)
        if calibration is not None:
            measured = _measured_seconds(calibration, graph.names[i], s, samples)
            if measured is not None:
                bwd, comp = bwd / comp * measured if comp > 0 else measured * 2 / 3, measured
        if lever.remat:  # the forward runs again inside the backward pass
            comp, bwd = comp + (comp - bwd), bwd + (comp - bwd)
        bwd_total += bwd
        # gradient sync: this layer's share of bucketed all-reduces
        ranks, per_node = _group(s, d, m, dpn)
        bucket = settings.gradient_bucket_bytes
        if int(a.kind[i]) == LayerKind.DENSE and float(a.params[i]) <= 0:  # tied: its own gradient of the table
            local = float(a.in_channels[i]) * float(a.out_channels[i])
        out_el = cout * math.prod(float(x) for x in a.out_spatial[i])
        read = 1.0  # an element-wise layer's parameters get a gradient where read, one per output element
        if int(a.kind[i]) == LayerKind.ELEMENTWISE and float(a.params[i]) > out_el:
            read = out_el / float(a.params[i])
        gbytes = DTYPE_BYTES[settings.dtype] * local * read  # the device's own shard of the gradient
        grad = _allreduce(hw, ranks, per_node, bucket) * gbytes / bucket
        if lever.zero_stage:  # ZeRO: reduce-scatter the gradients (stage 1: all-reduce), gather the weights
            if lever.zero_stage >= 2:
                grad = _hierarchical(hw, ranks, per_node, bucket, gather=False) * gbytes / bucket
            wbytes = settings.weight_bytes_per_param * local
            uses = 2.0 if lever.zero_stage == 3 else 1.0
            total += uses * _hierarchical(hw, ranks, per_node, bucket, gather=True) * wbytes / bucket
        grad_total += grad
        # halo
        halo = 0.0
        if s == Strategy.SPATIAL:
            rows = max(0.0, (a.kernel[i][0] - 1) * a.dilation[i][0] + 1 - a.stride[i][0])
            lo, hi = math.floor(rows / 2), rows - math.floor(rows / 2)
            xr = cin * a.in_spatial[i][1] * a.in_spatial[i][2] * gb * delta
            yr = cout * a.out_spatial[i][1] * a.out_spatial[i][2] * gb * delta
            msgs = [lo * xr, hi * xr]  # forward: rows of x (ParaDL §4.4)
            if i in fed:  # input gradient: rows of dL/dy; none for a layer fed by the model input
                msgs += [lo * yr, hi * yr]
            if a.params[i] > 0:  # weight gradient: XLA re-exchanges the rows of x (measured)
                msgs += [lo * xr, hi * xr]
            if lever.remat:  # the recomputed forward exchanges its rows again
                msgs += [lo * xr, hi * xr]
            for nbytes in msgs:
                halo += ma + nbytes / mb if nbytes > 0 else 0.0
            if int(a.kind[i]) in ATTENTION_KINDS:
                # sequence parallel: gather the keys and the values, reduce-scatter their gradients; no halo
                rows_in = float(a.in_spatial[i][0])
                kv_channels = key_value_channels(float(a.in_channels[i]), float(a.out_channels[i]))
                kv = kv_channels * rows_in * gb * delta * _row_padding(rows_in, m)
                halo = 2.0 * (_convert(_H, _R, kv, m, ma, mb) * (2 if lever.remat else 1)
                              + _convert(_P, _H, kv, m, ma, mb))
        total += comp + grad + halo
    # edges
    consumers = set()
    for (u, v) in graph.edges:
        consumers.add(u)
        ku, kv = int(a.kind[u]), int(a.kind[v])
        _, out_u, _, gout_u = _layouts(ku, strategies[u])
        in_v, _, gin_v, _ = _layouts(kv, strategies[v])
        out_el = float(a.out_channels[u] * a.out_spatial[u][0] * a.out_spatial[u][1] * a.out_spatial[u][2])
        nbytes = out_el * gb * delta
        pad = _row_padding(float(a.out_spatial[u][0]), m)  # for a conversion from or to rows split
        fwd_bytes = nbytes * (pad if _H in (out_u, in_v) else 1.0)
        bwd_bytes = nbytes * (pad if _H in (gin_v, gout_u) else 1.0)
        total += _convert(out_u, in_v, fwd_bytes, m, ma, mb) + _convert(gin_v, gout_u, bwd_bytes, m, ma, mb)
    for i in range(n):
        if i in consumers:
            continue
        _, out_i, _, gout_i = _layouts(int(a.kind[i]), strategies[i])
        out_el = float(a.out_channels[i] * a.out_spatial[i][0] * a.out_spatial[i][1] * a.out_spatial[i][2])
        nbytes = out_el * gb * delta * (_row_padding(float(a.out_spatial[i][0]), m) if out_i == _H else 1.0)
        t = _B if out_i == _B else _R  # the loss runs batch-split, else on the gathered output
        total += _convert(out_i, t, nbytes, m, ma, mb) + _convert(t, gout_i, nbytes, m, ma, mb)
    return total - hw.gradient_overlap * min(grad_total, bwd_total)
