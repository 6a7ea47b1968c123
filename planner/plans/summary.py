"""``Plan.summary()``: the per-layer table of a plan as plain text (the
command line renders the same rows with rich)."""

from __future__ import annotations

from typing import Any

from planner._format import format_bytes

__all__ = ["plan_summary", "format_spec"]


def format_spec(spec: Any) -> str:
    """``("data", None, "model")`` -> ``"P(data, -, model)"``; None -> ``"XLA"``."""
    if spec is None:
        return "XLA"
    parts = ["(" + ",".join(e) + ")" if isinstance(e, tuple) else ("-" if e is None else e) for e in spec]
    return "P(" + ", ".join(parts) + ")"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def plan_summary(plan: Any, full: bool = False) -> str:
    """One header line, one row per layer, one total row. Unless ``full``, a
    plan of more than :data:`planner._compact.COMPACT_ABOVE` layers is
    compact as the command line's table is (runs of alike data-parallel
    layers of one block as one row of their sums; :mod:`planner._compact`)."""
    from planner._compact import group_rows, label_group, plain_cost_rows

    d, m = plan.mesh
    header = (
        f"{plan.model} on {plan.devices} x {plan.hardware}, mesh {d}x{m} (data x model), batch {plan.batch}, "
        f"{plan.dtype}, {plan.optimizer}: {plan.iteration_s * 1e3:.3f} ms/iteration, "
        f"{format_bytes(plan.memory_bytes_per_device)} per device (limit {format_bytes(plan.memory_limit_bytes)})"
    )
    specs = {s.name: s for s in plan.layer_specs}
    cols = ("layer", "kind", "strategy", "compute ms", "comm ms", "reshard ms", "memory", "input", "output")
    layers = list(plan.layers)
    names = [r.name for r in layers]
    if full:
        spans = tuple(range(i, i + 1) for i in range(len(layers)))
    else:
        facts = [{"strategy": r.strategy, "requested_strategy": r.requested_strategy, "reshard_s": r.reshard_s,
                  "comm_s": r.comm_s, "zero_stage": r.zero_stage, "remat": r.remat,
                  "joins": r.joins} for r in layers]
        spans = group_rows(names, plain_cost_rows(facts, "data", plan.iteration_s),
                           keys=[(r.kind, r.option) for r in layers])
    rows = []
    for span in spans:
        if len(span) > 1:
            group = layers[span.start:span.stop]
            options = {r.option for r in group}
            strategy = options.pop() if len(options) == 1 else "as above"  # repeated blocks: like the block above
            rows.append((label_group(names, span), "", strategy, _ms(sum(r.compute_s for r in group)),
                         _ms(sum(r.comm_s for r in group)), _ms(sum(r.reshard_s for r in group)),
                         format_bytes(sum(r.memory_bytes for r in group)), "", ""))
            continue
        r = layers[span.start]
        s = specs.get(r.name)
        mark = "*" if getattr(r, "substituted", False) else ""  # costed under another strategy than requested
        rows.append((r.name, r.kind, r.option + mark, _ms(r.compute_s), _ms(r.comm_s), _ms(r.reshard_s),
                     format_bytes(r.memory_bytes),
                     format_spec(s.input_spec) if s else "", format_spec(s.output_spec) if s else ""))
    rows.append(("total", "", "", _ms(sum(r.compute_s for r in plan.layers)), _ms(sum(r.comm_s for r in plan.layers)),
                 _ms(sum(r.reshard_s for r in plan.layers)), format_bytes(plan.memory_bytes_per_device), "", ""))
    grouped = [s for s in spans if len(s) > 1]
    note = (f"{sum(len(s) for s in grouped)} of {len(layers)} layers are grouped into {len(grouped)} rows "
            "'… N layers (first … last)' whose columns are their sums; summary(full=True) shows every layer")
    footer = [note] if grouped else []
    widths = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(cols)]
    right = {3, 4, 5, 6}

    def line(row: tuple[str, ...]) -> str:
        return "  ".join(v.rjust(w) if i in right else v.ljust(w) for i, (v, w) in enumerate(zip(row, widths))).rstrip()

    from planner.unavailable import substitution_notes

    return "\n".join([header, line(cols), *(line(r) for r in rows), *footer, *substitution_notes(plan.layers)])
