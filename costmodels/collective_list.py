"""The collectives a discrete plan issues, one record each: what the
evaluator reports and what validation against XLA's compiled program
compares with (host-side, plain data).

``bytes_per_device`` is the size of the collective's result on one device,
which is how XLA's HLO states it (jax-notes.md §3): the gathered tensor for
an all-gather, the reduced buffer for an all-reduce, one shard for a
reduce-scatter or an all-to-all, the halo rows for a collective-permute.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence

import numpy as np

from costmodels.layers import (
    ATTENTION_KINDS,
    LayerArrays,
    LayerKind,
    LayerTable,
    is_kind,
    key_value_channels,
    read_parameter_fraction,
    tied_output,
    token_lookups,
)
from costmodels.levers import Lever
from costmodels.reshard import COLLECTIVE_NAMES, CONVERSION, Collective
from costmodels.shards import row_padding
from costmodels.strategies import (
    AXIS_NAMES,
    DATA_AXIS,
    MODEL_AXIS,
    Layout,
    Strategy,
    strategy_layouts,
)
from costmodels.table import CostSettings

__all__ = [
    "CollectiveRecord",
    "adds_run_batch_split",
    "auxiliary_collectives",
    "plan_collectives",
    "sharded_parameters",
]


@dataclasses.dataclass(frozen=True)
class CollectiveRecord:
    kind: str  # all-gather | all-to-all | all-reduce | reduce-scatter | collective-permute
    axes: tuple[str, ...]  # mesh axes the collective runs over: ("model",), ("data",), ("data", "model")
    phase: str  # forward | backward | recompute | gradient | update
    where: str  # "layer" or "src -> dst" for an edge
    bytes_per_device: float


def plan_collectives(
    graph: LayerTable, choice: Sequence[int], batch: float, d: int, m: int, settings: CostSettings | None = None,
    levers: Sequence[Lever] | None = None, *, one_conversion_per_output: bool | Collection[int] = False,
) -> tuple[CollectiveRecord, ...]:
    """Every collective of one training iteration of the discrete plan ``choice``
    (a strategy code per layer, each under ``levers``' lever, default none)
    on a ``d x m`` mesh, in layer order (gradient collectives last).

    A rematerialised layer (:mod:`costmodels.levers`) issues its forward
    exchanges again when the backward pass recomputes it (phase
    ``recompute``). A ZeRO layer's gradients and weights (ZeRO §7.2, over the
    gradient all-reduce's group): stage 1 all-reduces the whole gradient and
    all-gathers the updated weights (phase ``update``); stage 2
    reduce-scatters the gradient and all-gathers the updated weights; stage
    3 reduce-scatters the gradient and all-gathers the weights before their
    forward and their backward use.

    The gradient of a residual ``add`` is the gradient of each of its
    inputs: where two producers take it in one layout, it is converted once
    (one collective; XLA computes a value once). With
    ``one_conversion_per_output``, likewise a layer's output for all the
    readers that take it in one layout (``True``: every layer's, an export
    that pins no reader's input apart, a linen model's,
    ``planner.runtime.linen``; a collection of layers: theirs, output and
    gradient, an output the export pins to its readers' one layout, the sum
    of their input gradients converted back once). The time model
    (:mod:`costmodels.table`) charges each edge its conversion, an upper
    bound there."""
    settings = CostSettings() if settings is None else settings
    a = graph.unpadded()
    n = graph.num_layers
    choice = np.asarray(choice, dtype=int)[:n]
    delta = settings.activation_bytes
    gb = batch / d
    lay = np.asarray(strategy_layouts(np.asarray(a.kind, dtype=np.int32)))  # [L, S, 4]
    out_el = a.out_channels * a.out_spatial.prod(axis=-1)
    plain = Lever(0, False)
    levers = [plain] * n if levers is None else list(levers)[:n]
    if len(levers) != n:
        raise ValueError(f"levers gives {len(levers)} layers' levers for a plan of {n} layers")
    recs: list[CollectiveRecord] = []

    pad = np.asarray(row_padding(a.out_spatial[:, 0], m))  # [L] a row-split output's padded size

    issued: set[tuple] = set()  # (tensor, its bytes, source layout, target layout) already converted

    def convert(src_layout: int, dst_layout: int, nbytes: float, phase: str, where: str, rows_of: int,
                tensor: tuple | None = None) -> None:
        if m <= 1:
            return
        kind = Collective(int(CONVERSION[src_layout, dst_layout]))
        if kind is Collective.NONE:
            return
        if tensor is not None:  # one tensor into one layout: one collective
            key = (tensor, nbytes, int(src_layout), int(dst_layout))
            if key in issued:
                return
            issued.add(key)
        if Layout.SPATIAL in (src_layout, dst_layout):
            nbytes *= float(pad[rows_of])
        result = nbytes if kind in (Collective.ALL_GATHER, Collective.ALL_REDUCE) else nbytes / m
        recs.append(CollectiveRecord(COLLECTIVE_NAMES[kind], (MODEL_AXIS,), phase, where, float(result)))

    consumers = set()
    produced = {v for _, v in graph.edges}
    batch_adds = adds_run_batch_split(graph, choice, d, m)
    fwd_in = lambda v: Layout.BATCH if v in batch_adds else lay[v, choice[v], 0]  # noqa: E731
    fwd_out = lambda u: Layout.BATCH if u in batch_adds else lay[u, choice[u], 1]  # noqa: E731
    adds = np.asarray(a.kind) == LayerKind.ADD  # [L] an add's input gradients are its output gradient
    pinned = frozenset() if isinstance(one_conversion_per_output, bool) else frozenset(one_conversion_per_output)
    for u, v in graph.edges:
        consumers.add(u)
        nbytes = float(out_el[u]) * gb * delta
        where = f"{graph.names[u]} -> {graph.names[v]}"
        once = u in pinned or one_conversion_per_output is True
        convert(fwd_out(u), fwd_in(v), nbytes, "forward", where, u, ("output", u) if once else None)
        convert(lay[v, choice[v], 2], lay[u, choice[u], 3], nbytes, "backward", where, u,
                ("gradient", v) if adds[v] else ("output gradient", u) if u in pinned else None)
    attention = is_kind(np.asarray(a.kind), ATTENTION_KINDS)
    for i in range(n):
        s = choice[i]
        first = len(recs)
        if s == Strategy.SPATIAL and m > 1:
            recs.extend(_spatial_exchanges(a, i, graph.names[i], bool(attention[i]), i in produced, gb * delta, m))
        if levers[i].remat:  # the backward pass runs the layer's forward again, its exchanges too
            recs.extend(dataclasses.replace(r, phase="recompute") for r in recs[first:] if r.phase == "forward")
        if i not in consumers:  # a model output: the loss runs batch-split, else on the gathered output
            out_l, gout_l = lay[i, s, 1], lay[i, s, 3]
            nbytes = float(out_el[i]) * gb * delta
            t = Layout.BATCH if out_l == Layout.BATCH else Layout.REPLICATED
            convert(out_l, t, nbytes, "forward", f"{graph.names[i]} -> loss", i)
            convert(t, gout_l, nbytes, "backward", f"{graph.names[i]} -> loss", i)
    recs.extend(_gradient_collectives(graph, a, choice, d, m, settings, levers))
    return tuple(recs)


def _spatial_exchanges(a, i: int, name: str, attention: bool, fed: bool, sample_bytes: float, m: int
                       ) -> list[CollectiveRecord]:
    """The exchanges inside layer ``i`` split by rows over ``m`` devices
    (``spatial``); ``sample_bytes``: the group's batch times the element size."""
    if attention:
        # sequence parallelism: the keys and the values gathered, their gradients reduce-scattered
        # the keys (or values) of the fused input, split by rows (padded)
        kv_channels = key_value_channels(float(a.in_channels[i]), float(a.out_channels[i]))
        kv = kv_channels * float(a.in_spatial[i, 0]) * sample_bytes * float(row_padding(a.in_spatial[i, 0], m))
        return ([CollectiveRecord("all-gather", (MODEL_AXIS,), "forward", f"{name} ({what})", kv)
                 for what in ("keys", "values")]
                + [CollectiveRecord("reduce-scatter", (MODEL_AXIS,), "backward", f"{name} ({what})", kv / m)
                   for what in ("keys", "values")])
    rows = max(0.0, (a.kernel[i, 0] - 1) * a.dilation[i, 0] + 1 - a.stride[i, 0])
    if rows <= 0:
        return []
    x_row = a.in_channels[i] * a.in_spatial[i, 1] * a.in_spatial[i, 2] * sample_bytes
    y_row = a.out_channels[i] * a.out_spatial[i, 1] * a.out_spatial[i, 2] * sample_bytes
    out = [CollectiveRecord("collective-permute", (MODEL_AXIS,), "forward", name, float(rows * x_row))]
    if fed:  # the input gradient (none for a layer fed by the model input)
        out.append(CollectiveRecord("collective-permute", (MODEL_AXIS,), "backward", name, float(rows * y_row)))
    if a.params[i] > 0:
        # The weight gradient needs the input's halo again: XLA's SPMD partitioner
        # re-exchanges it rather than keeping the forward's haloed input
        # (measured, docs/validation.md).
        out.append(CollectiveRecord("collective-permute", (MODEL_AXIS,), "backward", f"{name} (weight gradient)",
                                    float(rows * x_row)))
    return out


def _gradient_collectives(graph: LayerTable, a: LayerArrays, choice: np.ndarray, d: int, m: int,
                          settings: CostSettings, levers: Sequence[Lever]) -> list[CollectiveRecord]:
    """Each weighted layer's gradient reduction over its replicas, and ZeRO's
    weight gathers (:func:`plan_collectives`'s docstring); ``a``: ``graph``'s
    unpadded arrays."""
    recs: list[CollectiveRecord] = []
    local = sharded_parameters(graph, choice, m)
    tied = tied_output(np.asarray(a.kind), np.asarray(a.params))
    local = np.where(tied, np.asarray(a.in_channels) * np.asarray(a.out_channels), local)  # its gradient of the table
    read = read_parameter_fraction(np.asarray(a.kind), np.asarray(a.params), np.asarray(a.out_elements))
    for i in range(graph.num_layers):
        s = choice[i]
        if a.params[i] <= 0 and not tied[i]:
            continue
        axes = AXIS_NAMES if s in (Strategy.DATA, Strategy.SPATIAL) and m > 1 else (DATA_AXIS,)
        ranks = d * m if axes == AXIS_NAMES else d
        if ranks <= 1:
            continue
        name, z = graph.names[i], levers[i].zero_stage
        grad = float(local[i] * read[i]) * settings.gradient_bytes_per_param
        weights = float(local[i]) * settings.weight_bytes_per_param
        if z >= 2:  # ZeRO §7.2.1: each device reduces its shard of the gradient
            recs.append(CollectiveRecord("reduce-scatter", axes, "gradient", name, grad / ranks))
        else:
            recs.append(CollectiveRecord("all-reduce", axes, "gradient", name, grad))
        if z == 3:  # ZeRO §7.2.2: the weights gathered before the forward and the backward use
            recs.append(CollectiveRecord("all-gather", axes, "forward", f"{name} (weights)", weights))
            recs.append(CollectiveRecord("all-gather", axes, "backward", f"{name} (weights)", weights))
        elif z:  # the updated shards gathered after the optimizer step
            recs.append(CollectiveRecord("all-gather", axes, "update", f"{name} (weights)", weights))
    return recs


def adds_run_batch_split(graph: LayerTable, choice: Sequence[int], d: int, m: int) -> set[int]:
    """The adds whose forward XLA runs batch-split whatever the plan says: an
    add planned in a layout other than the batch split, whose two operands
    arrive one batch-split and one in the add's layout, and whose result
    feeds a ReLU planned in the add's layout, on a mesh with ``d > 1`` and
    ``m > 1``. The plan converts the batch-split operand; XLA converts the
    other one to the batch split, adds there, and converts the result back
    for the ReLU: one all-to-all more, forward only. Why: the ReLU's
    derivative reads its input, so the add's result has two users (the
    ReLU's ``max`` and its mask's ``gt``), and with two users Shardy takes
    the add's sharding from its batch-split operand (isolated on ``relu(h +
    x)`` under ``grad``: on 2x4 and 4x2 whatever the operand order, never
    with ``tanh``; docs/validation.md "An add whose operands arrive split
    differently"). A ReLU is an element-wise layer named for it
    (``relu``, ``relu_1``: the extraction names functional layers by op)."""
    if d <= 1 or m <= 1:
        return set()
    a = graph.unpadded()
    n = graph.num_layers
    choice = np.asarray(choice, dtype=int)[:n]
    lay = np.asarray(strategy_layouts(np.asarray(a.kind, dtype=np.int32)))  # [L, S, 4]
    producers: dict[int, list[int]] = {}
    users: dict[int, list[int]] = {}
    for u, v in graph.edges:
        producers.setdefault(v, []).append(u)
        users.setdefault(u, []).append(v)
    out = set()
    for v in range(n):
        if graph.kind_names[v] != "add" or len(producers.get(v, [])) != 2 or len(users.get(v, [])) != 1:
            continue
        at = lay[v, choice[v], 0]
        arriving = sorted(int(lay[u, choice[u], 1]) for u in producers[v])
        w = users[v][0]
        relu = graph.kind_names[w] == "elementwise" and graph.names[w].rsplit("/", 1)[-1].startswith("relu")
        if at != Layout.BATCH and arriving == sorted((int(Layout.BATCH), int(at))) and relu \
                and lay[w, choice[w], 0] == at:
            out.add(v)
    return out


def sharded_parameters(graph: LayerTable, choice: Sequence[int], m: int) -> np.ndarray:
    """Parameters each device holds per layer ``[L]`` under ``choice``: a filter
    layer splits its kernel and bias (they follow the output channels); a
    channel layer splits its kernel's input channels and keeps the whole bias
    (ParaDL §4.7: the bias is added once, after the partial sums are
    reduced); the other strategies replicate everything."""
    a = graph.unpadded()
    choice = np.asarray(choice, dtype=int)[: graph.num_layers]
    params = np.asarray(a.params, dtype=np.float64)
    # kernel = prod(window) * in / groups * out (conv; a dense layer has a 1-wide window)
    kernel = np.prod(np.asarray(a.kernel, dtype=np.float64), axis=-1) * a.in_channels / np.maximum(a.groups, 1) \
        * a.out_channels
    kernel = np.minimum(kernel, params)
    bias = params - kernel
    return np.where(choice == Strategy.FILTER, params / m,
                    np.where(choice == Strategy.CHANNEL, kernel / m + bias, params))


def auxiliary_collectives(
    graph: LayerTable, choice: Sequence[int], batch: float, d: int, m: int, settings: CostSettings | None = None
) -> tuple[CollectiveRecord, ...]:
    """The small collectives a compiled training step adds beside
    :func:`plan_collectives`, which the time model neglects: batch-norm
    statistics and the loss mean, reduced over the axes the batch is split on,
    and getting the input batch (split over every device) and the labels into
    the first layers' and the loss's layouts.

    * Batch norm in training mode (Flax's fast variance, E[x] and E[x^2]):
      forward one all-reduce of 2 x C values (ioffe-szegedy 2015, Alg. 1);
      backward, beside the scale and shift gradients (2 x C, counted as
      gradient all-reduces), one more C-vector for the mean's gradient, as
      XLA computes it (measured in docs/validation.md). C is the channels
      one device holds (C / m under filter).
    * The loss: the batch mean of the per-sample losses, one scalar.
    """
    settings = CostSettings() if settings is None else settings
    a = graph.unpadded()
    n = graph.num_layers
    choice = np.asarray(choice, dtype=int)[:n]
    delta = settings.activation_bytes
    consumers = {u for u, _ in graph.edges}
    recs: list[CollectiveRecord] = []

    def batch_axes(s: int) -> tuple[str, ...]:
        if s == Strategy.DATA or s == Strategy.SPATIAL:  # batch (and rows) over every device
            return AXIS_NAMES if m > 1 else (DATA_AXIS,)
        return (DATA_AXIS,)

    def ranks(axes: tuple[str, ...]) -> int:
        return d * m if axes == AXIS_NAMES else d

    for i in range(n):
        if graph.kind_names[i] != "batch_norm":
            continue
        s = int(choice[i])
        axes = batch_axes(s)
        c = float(a.out_channels[i]) / (m if s == Strategy.FILTER else 1)
        if ranks(axes) > 1:
            recs.append(CollectiveRecord("all-reduce", axes, "forward", f"{graph.names[i]} (statistics)", 2 * c * delta))
            recs.append(CollectiveRecord("all-reduce", axes, "backward", f"{graph.names[i]} (statistics)", c * delta))
    lay = np.asarray(strategy_layouts(np.asarray(a.kind, dtype=np.int32)))  # [L, S, 4]
    gb = batch / d
    if m > 1:
        # The input batch arrives split over every device (Layout.BATCH); the
        # layers without a producer take it in their own layout.
        produced = {v for _, v in graph.edges}
        for i in range(n):
            if i in produced:
                continue
            kind = Collective(int(CONVERSION[Layout.BATCH, lay[i, choice[i], 0]]))
            if kind is Collective.NONE:
                continue
            nbytes = float(a.in_elements[i]) * gb * delta
            if lay[i, choice[i], 0] == Layout.SPATIAL:  # split by rows: padded to a multiple of m
                nbytes *= float(row_padding(a.in_spatial[i, 0], m))
            result = nbytes if kind in (Collective.ALL_GATHER, Collective.ALL_REDUCE) else nbytes / m
            recs.append(CollectiveRecord(COLLECTIVE_NAMES[kind], (MODEL_AXIS,), "forward",
                                         f"input -> {graph.names[i]}", result))
    sinks = [i for i in range(n) if i not in consumers]
    if sinks:
        s = int(choice[sinks[-1]])
        batch_split = lay[sinks[-1], s, 1] == Layout.BATCH
        if m > 1 and not batch_split:  # the loss runs on the group's gathered labels (int32)
            # one per sample, or one per token where an embedding reads the model input (token ids)
            lookups = token_lookups(graph)
            per_sample = float(a.in_spatial[lookups[0], 0]) if lookups else 1.0
            recs.append(CollectiveRecord("all-gather", (MODEL_AXIS,), "forward", "labels -> loss",
                                         gb * 4.0 * per_sample))
        axes = AXIS_NAMES if batch_split and m > 1 else (DATA_AXIS,)
        if ranks(axes) > 1:
            recs.append(CollectiveRecord("all-reduce", axes, "forward", "loss", 4.0))
    return tuple(recs)
