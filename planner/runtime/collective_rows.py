"""The collectives a plan predicts against those of the compiled program,
by kind and mesh axes (:func:`compare_collectives`): the collective rows of
``planner.validate`` (:mod:`planner.runtime.validation`), with what XLA
compiles differently from the plan on purpose accounted for
(reduce-scatters lowered as all-reduce + slice on CPU, a two-axis
all-reduce in two steps or split over ``model``)."""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from jax.sharding import Mesh

from costmodels import AXIS_NAMES, DATA_AXIS, MODEL_AXIS
from planner.runtime.hlo import parse_collectives

__all__ = ["CollectiveRow", "close_to", "compare_collectives"]


@dataclasses.dataclass(frozen=True)
class CollectiveRow:
    kind: str  # all-reduce | all-gather | reduce-scatter | all-to-all | collective-permute
    axes: tuple[str, ...]  # mesh axes (size-1 axes dropped); ("?",) when the groups match no axes
    predicted_bytes: float  # per device, summed over the step
    compiled_bytes: float  # per device, summed over the compiled program
    count: int  # compiled ops in this row
    ok: bool
    crosses_processes: bool  # some compiled group spans devices of more than one process
    note: str = ""


def close_to(predicted: float, compiled: float, rtol: float) -> bool:
    """Whether ``compiled`` is within ``rtol`` of ``predicted`` (exactly 0 where 0 is predicted)."""
    if predicted == 0:
        return compiled == 0
    return abs(compiled - predicted) <= rtol * abs(predicted)



def _drop_unit_axes(axes: tuple[str, ...] | None, sizes: Mapping[str, int]) -> tuple[str, ...]:
    if axes is None:
        return ("?",)
    kept = tuple(a for a in axes if sizes[a] > 1)
    return kept


def compare_collectives(records: Sequence[Any], hlo: str, mesh: Mesh, platform: str, rtol: float,
                        exported: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset()),
                        ) -> tuple[CollectiveRow, ...]:
    """One row per ``(kind, mesh axes)``: the bytes per device the predicted
    ``records`` (``costmodels.CollectiveRecord``) move against those of the
    collectives in ``hlo`` (a compiled program's text) on ``mesh``, within
    ``rtol``. On ``platform`` ``cpu`` a predicted reduce-scatter counts as the
    all-reduce XLA:CPU compiles it to, except those the export issues itself
    (``exported``: the layers whose partial sums it reduce-scatters, and
    those whose weight gradients it reduce-scatters)."""
    sizes = dict(mesh.shape)
    scattered, local_grads = exported
    predicted: dict[tuple[str, tuple[str, ...]], float] = defaultdict(float)
    notes: dict[tuple[str, tuple[str, ...]], str] = {}
    for r in records:
        axes = _drop_unit_axes(r.axes, sizes)
        if not axes:
            continue
        kind, nbytes = r.kind, r.bytes_per_device
        if platform == "cpu" and kind == "reduce-scatter" and not (
                (r.phase == "forward" and r.where.split(" -> ")[0] in scattered)
                or (r.phase == "gradient" and r.where in local_grads)):
            ranks = math.prod(sizes[a] for a in axes)
            kind, nbytes = "all-reduce", nbytes * ranks
            notes[(kind, axes)] = f"includes reduce-scatters lowered by XLA:CPU as all-reduce + slice (x{ranks})"
        predicted[(kind, axes)] += nbytes
    device_process = np.array([dev.process_index for dev in mesh.devices.flat])
    compiled: dict[tuple[str, tuple[str, ...]], float] = defaultdict(float)
    counts: dict[tuple[str, tuple[str, ...]], int] = defaultdict(int)
    crosses: dict[tuple[str, tuple[str, ...]], bool] = defaultdict(bool)
    for c in parse_collectives(hlo, tuple(mesh.devices.shape), tuple(mesh.axis_names)):
        axes = _drop_unit_axes(c.axes, sizes)
        if not axes:
            continue
        key = (c.kind, axes)
        compiled[key] += c.bytes_per_device
        counts[key] += 1
        crosses[key] |= any(len({int(device_process[i]) for i in g}) > 1 for g in c.groups)
    _hierarchical(predicted, compiled, notes, rtol)
    _split_over_model(predicted, compiled, notes, rtol, sizes[MODEL_AXIS])
    rows = []
    for key in sorted(set(predicted) | set(compiled)):
        p, g = predicted.get(key, 0.0), compiled.get(key, 0.0)
        rows.append(CollectiveRow(key[0], key[1], p, g, counts.get(key, 0), close_to(p, g, rtol),
                                  crosses.get(key, False), notes.get(key, "")))
    return tuple(rows)


def _hierarchical(predicted: dict, compiled: dict, notes: dict, rtol: float) -> None:
    """XLA may reduce over ``("data", "model")`` in two steps, over ``model``
    then over ``data`` (measured under the spatial strategy). When the
    compiled program lacks exactly such a share of the predicted two-axis
    all-reduce and has it as extra on both single axes, move the prediction."""
    both, mod, dat = ("all-reduce", AXIS_NAMES), ("all-reduce", (MODEL_AXIS,)), ("all-reduce", (DATA_AXIS,))
    missing = predicted.get(both, 0.0) - compiled.get(both, 0.0)
    extra_m = compiled.get(mod, 0.0) - predicted.get(mod, 0.0)
    extra_d = compiled.get(dat, 0.0) - predicted.get(dat, 0.0)
    if missing > 0 and close_to(missing, extra_m, rtol) and close_to(missing, extra_d, rtol):
        predicted[both] -= missing
        predicted[mod] = predicted.get(mod, 0.0) + missing
        predicted[dat] = predicted.get(dat, 0.0) + missing
        note = f"includes {missing:,.0f} B of a (data, model) all-reduce compiled as model then data"
        for key in (both, mod, dat):
            notes[key] = "; ".join(x for x in (notes.get(key, ""), note) if x)


def _split_over_model(predicted: dict, compiled: dict, notes: dict, rtol: float, m: int) -> None:
    """XLA may reduce a gradient the plan all-reduces over ``("data",
    "model")`` in a layout split over ``model`` instead: an all-reduce over
    ``data`` of each device's ``1/m`` of it, then an all-gather over
    ``model`` of the whole (measured on a position table that a linen model
    slices to the sequence, read from an output split by features over
    ``model``: docs/validation.md). When the compiled program lacks exactly
    such a share ``x`` of the predicted two-axis all-reduce and has ``x / m``
    extra on the ``data`` all-reduce and ``x`` extra on the ``model``
    all-gather, move the prediction."""
    both, dat, gat = ("all-reduce", AXIS_NAMES), ("all-reduce", (DATA_AXIS,)), ("all-gather", (MODEL_AXIS,))
    missing = predicted.get(both, 0.0) - compiled.get(both, 0.0)
    extra_d = compiled.get(dat, 0.0) - predicted.get(dat, 0.0)
    extra_g = compiled.get(gat, 0.0) - predicted.get(gat, 0.0)
    if m > 1 and missing > 0 and close_to(missing / m, extra_d, rtol) and close_to(missing, extra_g, rtol):
        predicted[both] -= missing
        predicted[dat] = predicted.get(dat, 0.0) + missing / m
        predicted[gat] = predicted.get(gat, 0.0) + missing
        note = f"includes {missing:,.0f} B of a (data, model) all-reduce compiled split over model: data, then gathered"
        for key in (both, dat, gat):
            notes[key] = "; ".join(x for x in (notes.get(key, ""), note) if x)
