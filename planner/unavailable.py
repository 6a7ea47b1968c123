"""Why a layer cannot run the strategy or the memory lever it was asked
for, in words: the masks of the cost model (:mod:`costmodels.strategies`,
:mod:`costmodels.levers`) explained per layer, for ``evaluate``'s
substitutions and the command line's notes."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from costmodels import (
    ATTENTION_KINDS,
    CHANNELWISE_KINDS,
    Lever,
    Strategy,
    key_value_heads,
    parse_strategy,
    tied_output,
)
from planner.ir.graph import LayerGraph, LayerKind

__all__ = ["lever_unavailable_reason", "substitution_notes", "unavailable_reason"]


def _fmt(x: Any) -> str:
    return f"{float(x):g}"


def unavailable_reason(graph: LayerGraph, i: int, strategy: str | Strategy, batch: float, d: int, m: int) -> str:
    """Why layer ``i`` of ``graph`` cannot run ``strategy`` with a global
    ``batch`` on a ``d x m`` mesh, in one clause: the rule of
    :func:`costmodels.strategy_mask` that excludes it ("" when none does)."""
    s = parse_strategy(strategy) if isinstance(strategy, str) else Strategy(strategy)
    a = graph.arrays
    kind = graph.kind_names[i]
    code = int(a.kind[i])
    param = code in (LayerKind.CONV, LayerKind.DENSE, LayerKind.EMBED)
    channelwise = code in CHANNELWISE_KINDS
    cin, cout, groups = float(a.in_channels[i]), float(a.out_channels[i]), int(a.groups[i])
    n = graph.num_layers
    tied = np.asarray(tied_output(np.asarray(a.kind)[:n], np.asarray(a.params)[:n]))  # [n] (strategy_mask's rule)
    if s in (Strategy.FILTER, Strategy.CHANNEL) and tied.any() and (code == LayerKind.EMBED or tied[i]):
        return (f"{s.name.lower()} does not split a tied embedding table (the lookup and the output layer share it, "
                "and one layout for both is not modelled)")
    if s is not Strategy.DATA and (batch < d or batch % d):
        return f"{s.name.lower()} needs the batch {_fmt(batch)} to split over the {d} data-parallel groups"
    if s is Strategy.DATA:
        if code == LayerKind.OTHER:
            return f"data does not apply to {kind} layers (no per-sample model)"
        if batch < d * m or batch % (d * m):
            return f"data needs the batch {_fmt(batch)} to split over {d * m} devices"
    elif s is Strategy.FILTER:
        if code == LayerKind.NORM:
            return "filter does not split a norm's channels (its statistics run over all of them)"
        if not (param or channelwise):
            return f"filter does not apply to {kind} layers (no channels to split)"
        if param and groups != 1:
            return f"filter does not split grouped convolutions ({groups} groups)"
        if cout % m:
            return f"filter needs the model axis ({m}) to divide the {_fmt(cout)} output channels"
        if code in ATTENTION_KINDS and groups % m:
            return f"filter needs the model axis ({m}) to divide the {groups} heads"
        kv = round(key_value_heads(cin, cout, groups)) if code in ATTENTION_KINDS else 0
        if code in ATTENTION_KINDS and kv % m:
            return (f"filter needs the model axis ({m}) to divide the {kv} key-value heads (grouped-query "
                    "attention; replicating them over the model axis is not modelled)")
    elif s is Strategy.CHANNEL:
        if code == LayerKind.EMBED and m > 1:
            return "channel does not split an embedding's input (one channel of token ids)"
        if not param:
            return f"channel needs a conv or dense layer (a contraction over channels), not {kind}"
        if groups != 1:
            return f"channel does not split grouped convolutions ({groups} groups)"
        if cin % m:
            return f"channel needs the model axis ({m}) to divide the {_fmt(cin)} input channels"
    elif s is Strategy.SPATIAL:
        if not (param or channelwise or code in (LayerKind.CONCAT, LayerKind.NORM)):
            return f"spatial does not apply to {kind} layers"
        if int(a.spatial_rank[i]) < 1:
            return f"spatial needs a spatial dim to split; {kind} layers have none"
        rows_in, rows_out = float(a.in_spatial[i][0]), float(a.out_spatial[i][0])
        need = 2 * m if m > 1 else 1  # two rows per shard (XLA SPMD partitioner, measured: docs/validation.md)
        if rows_in < need or rows_out < need:
            return f"spatial needs >= 2 rows per shard ({need} rows in and out on a model axis of {m})"
        if code == LayerKind.ELEMENTWISE and rows_in != rows_out:
            return f"spatial does not split a layer that adds positions ({_fmt(rows_in)} in, {_fmt(rows_out)} out)"
    return ""


def substitution_notes(layers: Iterable[Any], shown: int = 3) -> list[str]:
    """Footnotes for the layers (:class:`planner.evaluation.LayerCost` or their JSON rows)
    costed under another strategy than requested, one line per requested
    strategy and reason: ``* requested spatial (features/4, ...); cannot run
    here: <reason>``. Tables mark those rows' strategy with ``*``."""
    groups: dict[tuple[str, str], list[str]] = {}
    for r in layers:
        get = r.get if isinstance(r, Mapping) else lambda k, default=None, r=r: getattr(r, k, default)
        strategy = get("strategy")
        asked = get("requested_strategy") or strategy
        if asked != strategy:
            why = get("substitution_reason") or "the cost model excludes it on this mesh and batch"
            groups.setdefault((asked, why), []).append(get("name"))
    lines = []
    for (asked, why), names in groups.items():
        more = f" and {len(names) - shown} more" if len(names) > shown else ""
        lines.append(f"* requested {asked} ({', '.join(names[:shown])}{more}); cannot run here: {why}")
    return lines


def lever_unavailable_reason(lever: Lever) -> str:
    """Why a layer that runs a strategy cannot take ``lever`` with it (the masks of
    :mod:`costmodels.levers`, in words)."""
    why = []
    if lever.zero_stage:
        why.append("ZeRO needs a layer with parameters (not attention, nor a tied embedding or output layer), "
                   "a data-parallel group of more than one device and the group dividing the output channels "
                   "each device holds")
    if lever.remat:
        why.append("recomputing is offered where a layer saves activations (on a model with attention layers, "
                   "only where it saves more than its input)")
    if lever.joins:
        why.append("joining the run before a layer needs a producer that can recompute")
    return "; or ".join(why)
