"""Why no plan fits: :class:`InfeasibleMemoryError` and its message, the
smallest memory limit any plan needs with what it holds at its peak and
what would help (:func:`infeasible_message`, from the search's own
smallest plans: nothing is searched again)."""

from __future__ import annotations

import numpy as np

from planner._format import format_bytes_up
from planner.ir.graph import LayerGraph
from planner.schedule_fit import choice_peak
from search import discrete_problem, run_terms

__all__ = ["FLOAT32_ROUNDING", "InfeasibleMemoryError", "infeasible_message"]


class InfeasibleMemoryError(ValueError):
    """No plan on any mesh fits the memory limit. ``required_bytes`` is the
    smallest limit under which some plan fits."""

    def __init__(self, message: str, required_bytes: float) -> None:
        super().__init__(message)
        self.required_bytes = required_bytes


def _advice(P: int, batch: int, batch_is_global: bool, devices_per_node: int | None) -> str:
    """What else would make a plan fit (see :func:`infeasible_message`)."""
    # a model axis of up to devices_per_node devices is allowed (None: any, across nodes)
    wider = devices_per_node is None or devices_per_node > P
    if batch_is_global:
        return (f"use more devices (the global batch of {batch} then splits into fewer samples per device) "
                "or a smaller batch")
    per_device = batch // P if P else batch
    node = "" if devices_per_node is None else f" (up to {devices_per_node} in a node)"
    more = (f", or more devices for a wider model axis{node}" if wider else
            "; more devices would not help: with the per-device batch fixed each device keeps as many samples")
    return f"use a smaller per-device batch (now {per_device}){more}"


# Relative slack between two float32 sums of the same per-layer bytes in different orders:
# float32's unit roundoff (6e-8) times the number of terms of a 1,000-layer model
# (Higham, "Accuracy and Stability of Numerical Algorithms", §4.2: |error| <= (n - 1) u sum|x|).
FLOAT32_ROUNDING = 1e-5


def infeasible_message(graph: LayerGraph, P: int, limit: float, tables, meshes, solutions, margin: float = 0.0,
                        inputs: float = 0.0, *, batch: int = 0, batch_is_global: bool = True,
                        devices_per_node: int | None = None) -> tuple[str, float]:
    """The message and the smallest limit under which some plan fits: the
    smallest memory any plan needs plus the ``inputs`` bytes, plus the share
    ``margin`` of that limit kept free for the platform. Each mesh's
    smallest plan is the search's: a :class:`search.Solution` that does not
    fit is the smallest-memory plan found (proven smallest where its
    ``min_memory_bytes`` is set), so nothing is searched again and the
    message says what the search found. Its advice is what
    would help: more devices only where the global ``batch`` is fixed (each
    then holds fewer samples) or the model axis could still grow inside a
    node of ``devices_per_node``; with the per-device batch fixed, more
    devices bring more samples, not room. On a ``cpu`` table a plan's memory
    is also what XLA:CPU's schedule holds (:mod:`planner.schedule_fit`): each
    mesh's smallest plan needs the larger of the two."""
    choices = [np.asarray(s.choice, dtype=np.int64) for s in solutions]
    peaks = [choice_peak(t, c) for t, c in zip(tables, choices, strict=True)]  # None: no schedule
    needs = [max(s.memory_bytes, pk or 0.0) for s, pk in zip(solutions, peaks, strict=True)]
    k = int(np.argmin(needs))
    p, choice = discrete_problem(tables[k]), choices[k]
    rows = np.arange(p.num_layers)
    persistent = p.persistent_bytes[rows, choice]
    state = p.optimizer_bytes[rows, choice]  # the optimizer step holds the whole state
    # runs of recomputed layers: the checkpoints they free, and their recomputed activations at each step
    (credit,), (transient,) = run_terms(p, choice[None])
    ws = p.workspace_bytes[rows, choice] + transient
    w = int(np.argmax(ws))
    kept_total = float(persistent.sum() - credit)
    # the phase that needs the most (search.problem: the backward pass or the optimizer step)
    if kept_total + float(ws[w]) >= float(state.sum()):
        top = np.argsort(-persistent, kind="stable")[:3]
        parts = ", ".join(f"{graph.names[i]} {format_bytes_up(persistent[i])}" for i in top)
        freed = f", less {format_bytes_up(float(credit))} of checkpoints inside runs of recomputed layers" \
            if credit > 0 else ""
        held = (f"at its peak, in the backward pass, {format_bytes_up(kept_total)} are weights, gradients, "
                f"optimizer state and activations kept for the backward pass (largest: {parts}{freed}) and "
                f"{format_bytes_up(ws[w])} the largest transient workspace (at {graph.names[w]})")
    else:
        top = np.argsort(-state, kind="stable")[:3]
        parts = ", ".join(f"{graph.names[i]} {format_bytes_up(state[i])}" for i in top)
        held = (f"at its peak, the optimizer step, {format_bytes_up(float(state.sum()))} are weights, gradients, "
                f"optimizer state and the optimizer's update (largest: {parts})")
    if peaks[k] is not None and peaks[k] > solutions[k].memory_bytes:
        held += (f"; XLA:CPU's schedule holds more, {format_bytes_up(peaks[k])} at its peak (its kernel copies, "
                 "max-pool buffers and gradient all-reduce: costmodels.xla_cpu)")
    d, m = meshes[k]
    # planning at exactly this limit must fit after the margin and the rounding slack are taken off again
    required = (needs[k] + inputs) / (1.0 - margin) / (1.0 - FLOAT32_ROUNDING) * (1.0 + 1e-9)
    need = format_bytes_up(required)
    kept = (f": {format_bytes_up(needs[k])} for the plan, {format_bytes_up(inputs)} for the input batch and "
            f"{margin:.0%} of the limit kept free for the platform's compiler (MEMORY_MARGIN)") if margin or inputs else ""
    proven = all(s.min_memory_bytes is not None for s in solutions)
    smallest = (f"the smallest memory limit any plan needs is {need}" if proven else
                f"the smallest memory limit the search found a plan for is {need} (not proven smallest: the search "
                "over runs of recomputed layers stopped at its time limit)")
    message = (
        f"no plan of {graph.model_name} on {P} devices fits {format_bytes_up(limit)} per device: {smallest} "
        f"({required:,.0f} bytes, on mesh {d}x{m}){kept}; of the plan's memory, "
        f"{held}; raise the memory limit to at least {need}, {_advice(P, batch, batch_is_global, devices_per_node)}"
    )
    return message, required
