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
from collections.abc import Sequence

import numpy as np

from costmodels.reshard import CONVERSION, COLLECTIVE_NAMES, Collective
from costmodels.strategies import Layout, Strategy, strategy_layouts
from costmodels.table import CostSettings
from planner.graph import LayerGraph

__all__ = ["CollectiveRecord", "plan_collectives"]


@dataclasses.dataclass(frozen=True)
class CollectiveRecord:
    kind: str  # all-gather | all-to-all | all-reduce | reduce-scatter | collective-permute
    axes: tuple[str, ...]  # mesh axes the collective runs over: ("model",), ("data",), ("data", "model")
    phase: str  # forward | backward | gradient
    where: str  # "layer" or "src -> dst" for an edge
    bytes_per_device: float


def plan_collectives(
    graph: LayerGraph, choice: Sequence[int], batch: float, d: int, m: int, settings: CostSettings = CostSettings()
) -> tuple[CollectiveRecord, ...]:
    """Every collective of one training iteration of the discrete plan ``choice``
    on a ``d x m`` mesh, in layer order (gradient all-reduces last)."""
    a = graph.unpadded()
    n = graph.num_layers
    choice = np.asarray(choice, dtype=int)[:n]
    delta = settings.activation_bytes
    gb = batch / d
    lay = np.asarray(strategy_layouts(np.asarray(a.kind, dtype=np.int32)))  # [L, S, 4]
    out_el = a.out_channels * a.out_spatial.prod(axis=-1)
    recs: list[CollectiveRecord] = []

    def convert(src_layout: int, dst_layout: int, nbytes: float, phase: str, where: str) -> None:
        if m <= 1:
            return
        kind = Collective(int(CONVERSION[src_layout, dst_layout]))
        if kind is Collective.NONE:
            return
        result = nbytes if kind in (Collective.ALL_GATHER, Collective.ALL_REDUCE) else nbytes / m
        recs.append(CollectiveRecord(COLLECTIVE_NAMES[kind], ("model",), phase, where, float(result)))

    consumers = set()
    for u, v in graph.edges:
        consumers.add(u)
        nbytes = float(out_el[u]) * gb * delta
        where = f"{graph.names[u]} -> {graph.names[v]}"
        convert(lay[u, choice[u], 1], lay[v, choice[v], 0], nbytes, "forward", where)
        convert(lay[v, choice[v], 2], lay[u, choice[u], 3], nbytes, "backward", where)
    for i in range(n):
        s = choice[i]
        if s == Strategy.SPATIAL and m > 1:
            rows = max(0.0, (a.kernel[i, 0] - 1) * a.dilation[i, 0] + 1 - a.stride[i, 0])
            if rows > 0:
                x_row = a.in_channels[i] * a.in_spatial[i, 1] * a.in_spatial[i, 2] * gb * delta
                y_row = a.out_channels[i] * a.out_spatial[i, 1] * a.out_spatial[i, 2] * gb * delta
                recs.append(CollectiveRecord("collective-permute", ("model",), "forward", graph.names[i], float(rows * x_row)))
                recs.append(CollectiveRecord("collective-permute", ("model",), "backward", graph.names[i], float(rows * y_row)))
        if i not in consumers:  # a model output: the loss runs batch-split, else on the gathered output
            out_l, gout_l = lay[i, s, 1], lay[i, s, 3]
            nbytes = float(out_el[i]) * gb * delta
            t = Layout.BATCH if out_l == Layout.BATCH else Layout.REPLICATED
            convert(out_l, t, nbytes, "forward", f"{graph.names[i]} -> loss")
            convert(t, gout_l, nbytes, "backward", f"{graph.names[i]} -> loss")
    for i in range(n):
        s = choice[i]
        if a.params[i] <= 0:
            continue
        shard = m if s in (Strategy.FILTER, Strategy.CHANNEL) else 1
        axes = ("data", "model") if s in (Strategy.DATA, Strategy.SPATIAL) and m > 1 else ("data",)
        ranks = d * m if axes == ("data", "model") else d
        if ranks > 1:
            nbytes = float(a.params[i]) * settings.gradient_bytes_per_param / shard
            recs.append(CollectiveRecord("all-reduce", axes, "gradient", graph.names[i], nbytes))
    return tuple(recs)
