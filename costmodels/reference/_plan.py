"""What both halves of the plain-Python reference (:mod:`costmodels.reference`)
read of one layer under one option: its layouts, the parameters a device
holds, the option's strategy and lever, the replica group."""

from __future__ import annotations

from costmodels.layers import LayerKind, LayerTable
from costmodels.levers import Lever, lever_menu
from costmodels.strategies import Layout, Strategy
from costmodels.table import CostSettings

_B, _R, _C, _H, _P = Layout.BATCH, Layout.REPLICATED, Layout.CHANNEL, Layout.SPATIAL, Layout.PARTIAL


def _layouts(kind: int, s: int) -> tuple[int, int, int, int]:
    """(input, output, input-gradient produced, output-gradient needed)."""
    if kind in (LayerKind.CONV, LayerKind.DENSE, LayerKind.EMBED):
        return {
            Strategy.DATA: (_B, _B, _B, _B),
            Strategy.FILTER: (_R, _C, _P, _C),
            Strategy.CHANNEL: (_C, _P, _C, _R),
            Strategy.SPATIAL: (_H, _H, _H, _H),
            Strategy.REPLICATED: (_R, _R, _R, _R),
        }[s]
    return {
        Strategy.DATA: (_B, _B, _B, _B),
        Strategy.FILTER: (_C, _C, _C, _C),
        Strategy.CHANNEL: (_R, _R, _R, _R),
        Strategy.SPATIAL: (_H, _H, _H, _H),
        Strategy.REPLICATED: (_R, _R, _R, _R),
    }[s]


def _local_params(graph: LayerTable, i: int, s: int, m: float) -> float:
    """Parameters one device holds of layer ``i`` under strategy ``s``."""
    a = graph.arrays
    params = float(a.params[i])
    if s == Strategy.FILTER:  # kernel and bias follow the output channels (ParaDL §4.6)
        return params / m
    if s == Strategy.CHANNEL:  # the kernel's input channels split, the bias whole (ParaDL §4.7)
        window = float(a.kernel[i][0]) * float(a.kernel[i][1]) * float(a.kernel[i][2])
        kernel = min(params, window * float(a.in_channels[i]) / max(float(a.groups[i]), 1.0)
                     * float(a.out_channels[i]))
        return kernel / m + (params - kernel)
    return params


def _option(settings: CostSettings, option: int) -> tuple[int, Lever]:
    """(strategy, lever) of an option code under ``settings.levers``."""
    menu = lever_menu(settings.levers)
    return int(option) // len(menu), menu[int(option) % len(menu)]


def _group(s: int, d: int, m: int, dpn: int) -> tuple[float, float]:
    """The ranks holding replicas of a layer's weights, and how many share a node."""
    if s in (Strategy.DATA, Strategy.SPATIAL):
        return d * m, min(d * m, dpn)
    return d, max(1, dpn // m)
