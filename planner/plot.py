"""Plots of a :class:`~planner.planning.Plan` (the ``plot`` extra, matplotlib).

* :func:`plot_plan_time`: per-layer stacked seconds per iteration (compute,
  communication, resharding), each bar in its layer's strategy colour, a
  layer's memory levers marked over its bar (``Z1``-``Z3`` for a ZeRO stage, ``R`` recomputed).
* :func:`plot_plan_memory`: per-layer memory bytes per device in strategy
  colours, their running total, the plan's peak and the memory limit.
* :func:`plot_history`: the search's objective (predicted seconds per
  iteration) and its penalty side (memory over the limit) against step,
  with the stage boundaries marked.
* :func:`plot_plan`: all of them on one :class:`matplotlib.figure.Figure`,
  optionally written to a file.

Every function that draws takes ``ax=None`` (a new figure when ``None``)
and returns the axes it drew on. Figures are built with
:class:`matplotlib.figure.Figure`, never through ``pyplot``: nothing is
shown, nothing is registered globally, nothing needs closing. matplotlib is
imported on first use; without it the functions raise a one-line
``ImportError`` with the install hint.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from costmodels import STRATEGY_NAMES, write_atomic

__all__ = ["MAX_DPI", "MAX_WIDTH_IN", "check_dpi", "STRATEGY_COLORS", "layer_label_step", "plot_history", "plot_plan", "plot_plan_memory",
           "plot_plan_time"]

PLOT_HINT = "install the plot extra: pip install 'shardplan[plot]' (matplotlib)"

# Okabe & Ito, "Color Universal Design" (2008): a palette distinguishable under
# the common colour-vision deficiencies; grey for layers that shard nothing.
STRATEGY_COLORS: Mapping[str, str] = {
    "data": "#0072B2",  # blue
    "filter": "#E69F00",  # orange
    "channel": "#009E73",  # bluish green
    "spatial": "#CC79A7",  # reddish purple
    "replicated": "#999999",  # grey
}

# Components of a layer's time, bottom to top: (label, LayerCost field, hatch).
_TIME_PARTS = (("compute", "compute_s", ""), ("communication", "comm_s", "////"), ("resharding", "reshard_s", "...."))
_LIMIT_COLOR = "#D55E00"  # vermillion (Okabe & Ito)
_STAGE_MARKERS = ("o", "s", "^", "D", "v", "P", "*")  # one per search stage, in order of appearance


def _require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ImportError(f"plotting needs matplotlib, which is not installed; {PLOT_HINT}") from None


def _new_axes(ax: Any, width_in: float = 8.0, height_in: float = 4.0) -> Any:
    if ax is not None:
        return ax
    from matplotlib.figure import Figure

    return Figure(figsize=(width_in, height_in), layout="constrained").subplots()


def _layers(plan: Any) -> Sequence[Any]:
    layers = getattr(plan, "layers", None)
    if not layers:
        raise ValueError("the plan has no layers to plot; pass a Plan from planner.plan or Plan.read")
    return layers


MAX_DPI = 1200  # pixels grow with dpi squared; 1200 dpi is a print resolution
MAX_WIDTH_IN = 24.0  # per-layer figures grow 0.22 inch a layer up to this width, then thin their labels
_LABEL_FONTS = (8.0, 6.0)  # tick-label sizes tried in turn before labelling only every k-th layer
_LABEL_PITCH = 1.25  # a rotated label takes its font size times this across the axis
_AXES_SHARE = 0.8  # of the figure's width, what the axes get (the legend sits to their right)


def _figure_width_in(num_layers: int) -> float:
    return min(MAX_WIDTH_IN, max(8.0, 0.22 * num_layers))


def layer_label_step(num_layers: int, width_in: float) -> tuple[int, float]:
    """``(k, font size)``: label every k-th layer of a per-layer axis
    ``width_in`` inches wide, so that the rotated labels do not overlap: 8 pt
    labels on every layer where they fit, else 6 pt, else 6 pt on every k-th
    layer (k as small as fits)."""
    room_pt = width_in * 72.0 * _AXES_SHARE
    for size in _LABEL_FONTS:
        if num_layers * size * _LABEL_PITCH <= room_pt:
            return 1, size
    size = _LABEL_FONTS[-1]
    return max(1, math.ceil(num_layers * size * _LABEL_PITCH / room_pt)), size


def _label_layers(ax: Any, names: Sequence[str]) -> None:
    """Name the layers on the x axis: every layer where the labels fit the
    figure's width, else every k-th (k from :func:`layer_label_step`), a
    minor tick on each layer and the x label saying which are named."""
    step, size = layer_label_step(len(names), ax.figure.get_figwidth())
    shown = range(0, len(names), step)
    ax.set_xticks(list(shown))
    ax.set_xticklabels([names[i] for i in shown], rotation=90, fontsize=size)
    if step > 1:
        ax.set_xticks(range(len(names)), minor=True)
        ax.set_xlabel(f"{len(names)} layers in plan order (one in {step} named)", fontsize=8)
    ax.set_xlim(-0.6, len(names) - 0.4)


def _strategy_handles(strategies: Sequence[str]) -> list[Any]:
    from matplotlib.patches import Patch

    used = [s for s in STRATEGY_NAMES if s in set(strategies)]
    return [Patch(facecolor=STRATEGY_COLORS[s], label=s) for s in used]


def _lever_mark(layer: Any) -> str:
    """The mark a per-layer plot puts over a layer's bar for its memory levers:
    ``Z1``-``Z3`` (ZeRO stage), ``R`` (recomputed), both as ``Z3R``; "" for none."""
    z, r = int(getattr(layer, "zero_stage", 0) or 0), bool(getattr(layer, "remat", False))
    return (f"Z{z}" if z else "") + ("R" if r else "")


def _mark_levers(ax: Any, layers: Sequence[Any], heights: Sequence[float]) -> list[Any]:
    """Each lever layer's :func:`_lever_mark` over its bar (texts with the ``gid``
    ``lever``), and a legend entry saying what the marks mean (none without levers)."""
    from matplotlib.lines import Line2D

    marks = [(i, _lever_mark(r)) for i, r in enumerate(layers) if _lever_mark(r)]
    for i, mark in marks:
        ax.annotate(mark, (i, heights[i]), xytext=(0, 2), textcoords="offset points", ha="center", va="bottom",
                    fontsize=6, rotation=90, gid="lever")
    if not marks:
        return []
    return [Line2D([], [], linestyle="none", label="Z1-Z3: ZeRO stage, R: recomputed")]


def _bytes_formatter() -> Any:
    from matplotlib.ticker import FuncFormatter

    from planner._format import format_bytes

    return FuncFormatter(lambda v, _pos: format_bytes(v))


def plot_plan_time(plan: Any, ax: Any = None) -> Any:
    """Per-layer predicted seconds per iteration as stacked bars, one bar per
    layer in plan order: compute (solid), communication (hatched ``////``)
    and resharding (hatched ``....``), each in the layer's strategy colour
    (:data:`STRATEGY_COLORS`). The three bar containers are labelled
    ``compute``, ``communication`` and ``resharding``. Returns the axes."""
    _require_matplotlib()
    layers = _layers(plan)
    ax = _new_axes(ax, _figure_width_in(len(layers)))
    from matplotlib.patches import Patch

    x = range(len(layers))
    colors = [STRATEGY_COLORS.get(r.strategy, "black") for r in layers]
    bottom = [0.0] * len(layers)
    for label, field, hatch in _TIME_PARTS:
        ms = [float(getattr(r, field)) * 1e3 for r in layers]
        ax.bar(x, ms, bottom=bottom, color=colors, hatch=hatch, edgecolor="white", linewidth=0.3, label=label)
        bottom = [b + v for b, v in zip(bottom, ms, strict=True)]
    _label_layers(ax, [r.name for r in layers])
    ax.set_ylabel("milliseconds per iteration")
    total = getattr(plan, "iteration_s", None)
    mesh = getattr(plan, "mesh", None)
    title = f"{getattr(plan, 'model', 'plan')}: time per layer"
    if mesh is not None and total is not None:
        title += f" (mesh {mesh[0]}x{mesh[1]}, {total * 1e3:.3f} ms/iteration)"
    ax.set_title(title, fontsize=10)
    parts = [Patch(facecolor="white", edgecolor="black", hatch=h, label=label) for label, _f, h in _TIME_PARTS]
    parts += _mark_levers(ax, layers, bottom)
    ax.legend(handles=_strategy_handles([r.strategy for r in layers]) + parts, fontsize=7, loc="upper left",
              bbox_to_anchor=(1.01, 1.0))
    ax.grid(True, axis="y", alpha=0.3)
    return ax


def plot_plan_memory(plan: Any, ax: Any = None) -> Any:
    """Per-layer memory bytes per device (weights, gradients, optimizer state
    and saved activations) as bars in strategy colours, their running total
    (a step line labelled ``cumulative``), the plan's peak
    (``memory_bytes_per_device``: the larger of the backward pass, which adds the
    transient workspace, and the optimizer step, search.problem; on the
    ``cpu`` platform what XLA:CPU's schedule holds, costmodels.xla_cpu) and the
    memory limit (``memory_limit_bytes``, a horizontal line labelled
    ``limit``), on a logarithmic byte axis. Returns the axes."""
    _require_matplotlib()
    layers = _layers(plan)
    ax = _new_axes(ax, _figure_width_in(len(layers)))
    x = list(range(len(layers)))
    nbytes = [float(r.memory_bytes) for r in layers]
    ax.bar(x, nbytes, color=[STRATEGY_COLORS.get(r.strategy, "black") for r in layers], label="memory")
    running, cumulative = 0.0, []
    for b in nbytes:
        running += b
        cumulative.append(running)
    ax.step(x, cumulative, where="mid", color="black", linewidth=1.0, label="cumulative")
    handles = _strategy_handles([r.strategy for r in layers]) + _mark_levers(ax, layers, nbytes)
    from matplotlib.lines import Line2D

    handles.append(Line2D([], [], color="black", linewidth=1.0, label="cumulative"))
    peak = getattr(plan, "memory_bytes_per_device", None)
    if peak is not None:
        ax.axhline(float(peak), color="black", linestyle="--", linewidth=1.0, label="peak")
        handles.append(Line2D([], [], color="black", linestyle="--", label="peak per device"))
    limit = getattr(plan, "memory_limit_bytes", None)
    if limit is not None:
        ax.axhline(float(limit), color=_LIMIT_COLOR, linewidth=1.5, label="limit")
        handles.append(Line2D([], [], color=_LIMIT_COLOR, linewidth=1.5, label="limit"))
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(_bytes_formatter())
    ax.set_ylabel("bytes per device")
    _label_layers(ax, [r.name for r in layers])
    ax.set_title(f"{getattr(plan, 'model', 'plan')}: memory per layer against the limit", fontsize=10)
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(True, axis="y", alpha=0.3)
    return ax


def _field(entry: Any, key: str) -> Any:
    return entry[key] if isinstance(entry, Mapping) else getattr(entry, key)


def _finite(v: Any) -> float:
    return float(v) if v is not None and math.isfinite(float(v)) else math.nan


def plot_history(plan_or_history: Any, ax: Any = None, memory_limit_bytes: float | None = None) -> Any:
    """The search's steps (a Plan's ``history`` or a sequence of
    :class:`search.HistoryEntry`): the objective, predicted seconds per
    iteration (line labelled ``objective``, milliseconds, on ``ax``), and the
    penalty side, memory over the limit (``memory_bytes / limit``, line
    labelled ``memory / limit`` on a twin axis sharing x, with a line at 1),
    against step. Each stage (relaxed, rounded, repaired, local_search, dp,
    milp, minimum_memory) has its own marker, labelled in the legend; a
    dotted vertical line marks where a new stage begins; steps that do not
    fit the limit are marked ×. The limit comes
    from the plan, or ``memory_limit_bytes`` for a bare history (without one,
    the twin axis shows bytes). Non-finite values are left as gaps. Returns
    ``ax`` (the twin axis is ``ax.figure.axes`` after it)."""
    _require_matplotlib()
    history = getattr(plan_or_history, "history", plan_or_history)
    if history is None or len(history) == 0:
        raise ValueError("no recorded search history to plot; plan with planner.plan (or shardplan plan -o FILE) "
                         "to get a plan whose history is recorded")
    if memory_limit_bytes is None:
        memory_limit_bytes = getattr(plan_or_history, "memory_limit_bytes", None)
    steps = list(range(len(history)))
    stages = [str(_field(e, "stage")) for e in history]
    time_ms = [_finite(_field(e, "time_s")) * 1e3 for e in history]
    memory = [_finite(_field(e, "memory_bytes")) for e in history]
    fits = [bool(_field(e, "fits")) for e in history]
    ax = _new_axes(ax)
    from matplotlib.ticker import MaxNLocator

    objective_color, memory_color = STRATEGY_COLORS["data"], _LIMIT_COLOR
    marker_size = 4.0 if len(steps) <= 200 else 0.0
    ax.plot(steps, time_ms, "-", color=objective_color, linewidth=1.0, label="objective")
    for k, stage in enumerate(dict.fromkeys(stages)):
        at = [i for i in steps if stages[i] == stage]
        ax.plot(at, [time_ms[i] for i in at], linestyle="none", marker=_STAGE_MARKERS[k % len(_STAGE_MARKERS)],
                markersize=marker_size + 1.0, color=objective_color, label=stage)
    bad = [i for i in steps if not fits[i]]
    if bad:
        ax.plot(bad, [time_ms[i] for i in bad], "x", color="black", markersize=7, label="does not fit")
    for i in steps[1:]:
        if stages[i] != stages[i - 1]:
            ax.axvline(i - 0.5, color="grey", linestyle=":", linewidth=0.8, gid="stage boundary")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(-0.5, len(steps) - 0.5)
    ax.set_xlabel("search step (dotted lines: a new stage)")
    ax.set_ylabel("objective: predicted ms per iteration", color=objective_color)
    twin = ax.twinx()
    if memory_limit_bytes:
        twin.plot(steps, [m / memory_limit_bytes for m in memory], "-", color=memory_color, marker="s",
                  markersize=marker_size * 0.6, linewidth=1.0, label="memory / limit")
        twin.axhline(1.0, color=memory_color, linestyle="--", linewidth=0.8)
        twin.set_ylabel("penalty side: memory / limit (over 1: too big)", color=memory_color)
    else:
        twin.plot(steps, memory, "-", color=memory_color, marker="s", markersize=marker_size * 0.6,
                  linewidth=1.0, label="memory")
        twin.yaxis.set_major_formatter(_bytes_formatter())
        twin.set_ylabel("memory per device", color=memory_color)
    handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    ax.legend(handles=handles, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncols=5)
    ax.set_title(f"{getattr(plan_or_history, 'model', 'search')}: search history", fontsize=10)
    return ax


def check_dpi(dpi: Any) -> int:
    """``dpi`` if it is an integer from 1 to :data:`MAX_DPI`; else a one-line
    ``ValueError`` saying why (the pixel count grows with dpi squared)."""
    if isinstance(dpi, bool) or not isinstance(dpi, int) or not 1 <= dpi <= MAX_DPI:
        pixels = MAX_WIDTH_IN * 8.0 * MAX_DPI**2 / 1e6
        raise ValueError(f"dpi must be an integer from 1 to {MAX_DPI}, got {dpi!r} (the image's pixel count grows "
                         f"with dpi squared: a {MAX_WIDTH_IN:g} x 8 inch figure at {MAX_DPI} dpi is already "
                         f"{pixels:.0f} megapixels); for print use 300, or a vector format (.pdf, .svg)")
    return dpi


def plot_plan(plan: Any, path: str | Path | None = None, *, history: bool = False, dpi: int = 120) -> Any:
    """One :class:`matplotlib.figure.Figure` with :func:`plot_plan_time` above
    :func:`plot_plan_memory` (and :func:`plot_history` below them with
    ``history=True``), written to ``path`` when given (format from the suffix:
    ``.png``, ``.pdf``, ``.svg``, ...). Returns the figure. Raises
    ``ValueError`` for an unsupported suffix, an unwritable path, or
    ``history=True`` on a plan without a recorded history."""
    check_dpi(dpi)
    _require_matplotlib()
    from matplotlib.figure import Figure

    layers = _layers(plan)
    recorded = getattr(plan, "history", ())
    if history and not recorded:
        raise ValueError("the plan has no recorded search history; plan it again with this version of shardplan "
                         "(planner.plan or shardplan plan -o FILE) to record one")
    fig = Figure(figsize=(_figure_width_in(len(layers)), 11.5 if history else 8.0), layout="constrained")
    axes = fig.subplots(3 if history else 2, 1)
    plot_plan_time(plan, axes[0])
    plot_plan_memory(plan, axes[1])
    if history:
        plot_history(plan, axes[2])
    if path is not None:
        suffix = Path(path).suffix.lstrip(".").lower()
        formats = fig.canvas.get_supported_filetypes()
        if suffix not in formats:
            raise ValueError(f"cannot write a plot to {str(path)!r}: unknown file type {suffix!r}; "
                             f"use one of {', '.join('.' + f for f in sorted(formats))}")
        buf = io.BytesIO()
        fig.savefig(buf, format=suffix, dpi=dpi)
        write_atomic(path, buf.getvalue())  # a kill mid-write leaves any previous plot whole
    return fig
