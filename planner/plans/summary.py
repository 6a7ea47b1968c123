"""``Plan.summary()``: the per-layer table of a plan as plain text (the
command line renders the same rows with rich)."""

from __future__ import annotations

from typing import Any

from planner._format import format_bytes

__all__ = ["format_spec", "pipeline_header", "pipeline_summary", "plan_summary", "stage_rows"]


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


def _runs(runs: tuple[tuple[int, int], ...]) -> str:
    """``((0, 1), (16, 17))`` -> ``"blocks 0-1, 16-17"``."""
    text = ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs)
    return ("blocks " if len(runs) > 1 or runs[0][1] > runs[0][0] else "block ") + text


def stage_rows(plan: Any) -> list[str]:
    """One line per stage of a pipelined plan: its blocks (per model chunk),
    the embedding on the first, the final norm and output layer on the last."""
    p = plan.pipeline
    names = [r.name for r in plan.layers]
    first_block = next((i for i, n in enumerate(names) if n.startswith("blocks/")), 0)
    last_block = max((i for i, n in enumerate(names) if n.startswith("blocks/")), default=len(names) - 1)
    before, after = " + ".join(names[:first_block]), " + ".join(names[last_block + 1:])
    rows = []
    for i in range(p.stages):
        parts = ([before] if i == 0 and before else []) + [_runs(p.blocks_of_stage(i))] \
            + ([after] if i == p.stages - 1 and after else [])
        rows.append(f"stage {i}: {' + '.join(parts)}")
    return rows


def pipeline_header(plan: Any) -> list[str]:
    """The header lines of a pipelined plan: mesh, micro-batches, schedule and
    memory levers; the predicted step with its parts; the memory."""
    p = plan.pipeline
    ms = lambda s: f"{s * 1e3:.1f} ms"  # noqa: E731
    return [
        f"{plan.model} on {plan.devices} x {plan.hardware}, mesh {p.stages}x{p.data}x{p.tensor} (stage x data x "
        f"model), batch {plan.batch} = micro-batch {p.micro_batch} x {p.microbatches} micro-batches x {p.data} "
        f"replicas, {plan.dtype}, {plan.optimizer}",
        f"schedule {p.schedule}, v={p.chunks}, recomputation {p.recompute}, sequence parallelism "
        f"{'on' if p.sequence_parallel else 'off'}, ZeRO-1 (distributed optimizer) "
        f"{'on' if p.distributed_optimizer else 'off'}",
        f"predicted step {p.step_s:.3f} s: pipeline {p.pipeline_s:.3f} s (bubble {ms(p.bubble_s)}, transfers "
        f"{ms(p.transfer_s)}), gradient sync {ms(p.gradient_sync_s)}, optimizer {ms(p.optimizer_s)}",
        f"peak memory {format_bytes(p.peak_bytes)} per device (state {format_bytes(p.state_bytes)}, activations "
        f"{format_bytes(p.activation_bytes)}; limit {format_bytes(plan.memory_limit_bytes)})",
    ]


def pipeline_summary(plan: Any) -> str:
    """A pipelined plan as text: :func:`pipeline_header`, one row per stage
    (:func:`stage_rows`), and the per-layer strategies of one block with the
    embedding and output layers, once (every block runs the same)."""
    specs = {s.name: s for s in plan.layer_specs}
    rows = [(r.name, r.kind, r.option, format_spec(specs[r.name].input_spec) if r.name in specs else "",
             format_spec(specs[r.name].output_spec) if r.name in specs else "") for r in plan.layers]
    cols = ("layer", "kind", "strategy", "input", "output")
    widths = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(cols)]
    line = lambda row: "  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip()  # noqa: E731
    d, t = plan.pipeline.data, plan.pipeline.tensor
    return "\n".join([
        *pipeline_header(plan), *stage_rows(plan),
        f"per-layer strategies of every block (shown for block 0) on each stage's {d}x{t} data x model sub-mesh:",
        line(cols), *(line(r) for r in rows)])
