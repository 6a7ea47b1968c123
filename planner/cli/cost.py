"""The cost-model subcommands of the ``shardplan`` command line:

* ``shardplan hardware [NAME|FILE] [--json]``: list the hardware presets, or
  show one (or a user file);
* ``shardplan evaluate MODEL --devices P [--mesh DxM] (--strategy NAME |
  --plan FILE) [--batch B | --batch-per-device b] [--hardware NAME|FILE]
  [--dtype float32|bfloat16] [--optimizer sgd|momentum|adam]
  [--calibration FILE] [--json] [--full]``: per-layer compute, communication,
  resharding and memory of one plan, and the totals (on a terminal, above
  40 layers, runs of alike layers grouped unless ``--full``:
  :mod:`planner._compact`).

``--plan FILE`` reads a plan file as :meth:`Plan.read` does, or a JSON
object without a schema with a ``"layers"`` list of ``{"name": ...,
"strategy": ...}`` rows (an ``evaluate --json`` output), type-checked the
same way (:func:`planner.plans.file.evaluation_fields`).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from typing import Any

from planner.cli.common import COMMAND_HELP, add_model_argument
from planner.usage import json_text

__all__ = ["add_cost_commands", "layer_cost_table", "parse_mesh"]

_MESH = re.compile(r"\s*(\d+)\s*[xX×]\s*(\d+)\s*")


def parse_mesh(text: str) -> tuple[int, int]:
    match = _MESH.fullmatch(text)
    if not match:
        raise ValueError(f"--mesh {text!r} is not of the form DxM, e.g. 8x4 (data x model)")
    return int(match.group(1)), int(match.group(2))


_PLAN_ACCEPTED = "expected a plan file (shardplan plan -o) or an evaluate --json output, with a layers list"


def _read_plan(path: str, graph: Any) -> tuple[dict[str, str], dict[str, Any]]:
    """Layer name -> strategy (with its levers, ``data+zero2``) from a plan
    file, which must be for ``graph``: its ``graph_fingerprint`` (or, without
    one, its ``model``) must match; and the settings it records (devices,
    mesh, batch, dtype, optimizer, hardware, levers), those of them it has.
    A file with a ``"schema"`` is a plan file, read as :meth:`Plan.read`
    reads it; one without is an ``evaluate --json`` output, read by
    :func:`planner.plans.file.evaluation_fields`: both check every field's
    type and coerce nothing."""
    from costmodels import read_json
    from planner.evaluation import option_label
    from planner.plans.file import evaluation_fields
    from planner.planning import Plan

    data = read_json(path, "plan file (shardplan plan -o) or evaluate --json output")
    try:
        if isinstance(data, dict) and "schema" in data:
            plan = Plan.from_dict(data)
            fields = {k: getattr(plan, k) for k in ("model", "graph_fingerprint", "devices", "mesh", "batch",
                                                    "dtype", "optimizer", "hardware", "levers", "hardware_spec")}
            fields["layers"] = [(x.name, x.option) for x in plan.layers]
        else:
            fields = evaluation_fields(data)
            fields["layers"] = [(name, option_label({"strategy": s, "zero_stage": z, "remat": r, "joins": j}))
                                for name, s, z, r, j in fields["layers"]]
    except ValueError as e:
        raise ValueError(f"{path}: {e}; {_PLAN_ACCEPTED}") from None
    if fields.get("mesh") is not None and len(fields["mesh"]) == 3:  # (stage, data, model)
        raise ValueError(f"{path} is a pipelined plan: evaluate --plan costs one-stage plans; its predicted step "
                         "is the plan file's pipeline (shardplan plan prints it)")
    model, fingerprint = fields.get("model"), fields.get("graph_fingerprint")
    if (fingerprint and fingerprint != graph.fingerprint) or (not fingerprint and model and model != graph.model_name):
        raise ValueError(
            f"{path} was made for model {model!r}, not for {graph.model_name!r} (another layer graph); "
            f"plan {graph.model_name} with shardplan plan, or pass the model the plan was made for"
        )
    names = [name for name, _ in fields["layers"]]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"{path}: layers {dup[:3]} appear more than once; give each layer one strategy")
    settings = {k: fields[k] for k in ("devices", "mesh", "batch", "dtype", "optimizer", "hardware", "levers",
                                       "hardware_spec") if fields.get(k) is not None}
    return dict(fields["layers"]), settings


def _plan_settings(args: argparse.Namespace, path: str, recorded: dict[str, Any]) -> dict[str, Any]:
    """The settings ``evaluate --plan`` runs under: the plan's own, where it
    records them; a command-line value that contradicts one is an error,
    unless ``--override`` asks to evaluate the plan's strategies under it."""
    from costmodels import preset_names

    given = {
        "devices": args.devices, "mesh": parse_mesh(args.mesh) if args.mesh else None, "batch": args.batch,
        "dtype": args.dtype, "optimizer": args.optimizer, "hardware": args.hardware,
    }
    out = dict(given)
    for key, value in given.items():
        mine = recorded.get(key)
        if mine is None:
            continue
        if value is None:
            out[key] = mine
            continue
        if key == "hardware":
            from costmodels import load_hardware

            same = load_hardware(value).name == mine
        else:
            same = value == mine
        if not same and not args.override:
            shown = (lambda m: f"{m[0]}x{m[1]}") if key == "mesh" else str
            raise ValueError(
                f"--{key} {shown(value)} contradicts the plan's {key} {shown(mine)} ({path}); drop --{key} to "
                f"evaluate the plan as made, or add --override to cost its strategies under --{key} {shown(value)}")
    if args.batch_per_device is not None and recorded.get("batch") and given["batch"] is None:
        d = out["devices"] or recorded.get("devices")
        if d and args.batch_per_device * d != recorded["batch"] and not args.override:
            raise ValueError(
                f"--batch-per-device {args.batch_per_device} ({args.batch_per_device * d} in all) contradicts the "
                f"plan's batch {recorded['batch']} ({path}); drop it, or add --override")
        out["batch"] = None if args.override else recorded["batch"]
    if out["hardware"] == recorded.get("hardware") and "hardware_spec" in recorded:
        out["hardware"] = recorded["hardware_spec"]  # the hardware the plan was made for, numbers and all
    elif given["hardware"] is None and recorded.get("hardware") not in (None, *preset_names()):
        # a file names hardware by preset only: its "hardware" string is never opened as a path
        raise ValueError(f"{path} records hardware {recorded['hardware']!r}, which is not a preset, and no "
                         "hardware_spec; give --hardware NAME|FILE for the hardware it was made for")
    return out


def _print_json(data: Any) -> None:
    print(json_text(data))


def _run_hardware(args: argparse.Namespace) -> int:
    from costmodels import load_hardware, preset_names

    if args.name is None:
        rows = []
        for n in preset_names():
            hw = load_hardware(n)
            rows.append({
                "name": n,
                "devices_per_node": hw.devices_per_node,
                "memory_bytes": hw.device.memory_bytes,
                "peak_flops_per_s": hw.device.peak_flops_per_s,
                "tiers": [t.name for t in hw.tiers],
                "description": hw.description,
            })
        if args.json or not sys.stdout.isatty():
            _print_json({"presets": rows})
            return 0
        from planner.cli._terminal import console as terminal
        from rich.table import Table

        from planner._format import format_bytes, format_count

        table = Table(title="hardware presets")
        for col in ("name", "per node", "memory", "peak bf16 FLOP/s", "tiers", "description"):
            table.add_column(col, overflow="fold")
        for r in rows:
            peak = r["peak_flops_per_s"].get("bfloat16", r["peak_flops_per_s"]["float32"])
            table.add_row(r["name"], str(r["devices_per_node"]), format_bytes(r["memory_bytes"]),
                          format_count(peak), ", ".join(r["tiers"]), r["description"])
        terminal().print(table)
        return 0
    hw = load_hardware(args.name)
    _print_json(hw.to_dict())
    return 0


def _run_evaluate(args: argparse.Namespace) -> int:
    from costmodels import load_calibration, load_hardware
    from planner.cli.common import notes_to_stderr
    from planner.evaluation import evaluate
    from planner.models.loading import load_model

    if (args.strategy is None) == (args.plan is None):
        raise ValueError("give exactly one of --strategy NAME or --plan FILE")
    graph = load_model(args.model, args.on_unsupported)
    plan, recorded = None, {}
    settings = {"devices": args.devices, "mesh": parse_mesh(args.mesh) if args.mesh else None,
                "batch": args.batch, "dtype": args.dtype or "float32", "optimizer": args.optimizer or "adam",
                "hardware": args.hardware or "abci-v100"}
    if args.plan:
        plan, recorded = _read_plan(args.plan, graph)
        settings = _plan_settings(args, args.plan, recorded)
        settings["dtype"] = settings["dtype"] or "float32"
        settings["optimizer"] = settings["optimizer"] or "adam"
        settings["hardware"] = settings["hardware"] or "abci-v100"
    if settings["devices"] is None:
        raise ValueError("give --devices P (the plan file records none)" if args.plan else "give --devices P")
    hw = load_hardware(settings["hardware"])
    ev = evaluate(
        graph, hw, settings["devices"],
        mesh=settings["mesh"],
        strategy=args.strategy,
        plan=plan,
        batch=settings["batch"], batch_per_device=args.batch_per_device if settings["batch"] is None else None,
        dtype=settings["dtype"], optimizer=settings["optimizer"],
        calibration=load_calibration(args.calibration) if args.calibration else None,
        allow_other_hardware=args.allow_other_hardware,
        levers=recorded.get("levers") if args.plan else None,  # the menu the plan was searched on
        callback=notes_to_stderr(),
    )
    data = ev.to_dict()
    if args.json or not sys.stdout.isatty():
        _print_json(data)
        return 0
    _render_evaluation(data, full=args.full)
    return 0


def _render_evaluation(data: dict[str, Any], full: bool = True) -> None:
    from planner.cli._terminal import console as terminal

    from planner._format import format_bytes

    d, m = data["mesh"]
    fits = "fits" if data["fits_memory"] else "DOES NOT FIT"
    title = (
        f"{data['model']} on {data['devices']} x {data['hardware']} (mesh {d}x{m}), batch {data['batch']}, "
        f"{data['dtype']}, {data['optimizer']}: {data['iteration_s'] * 1e3:.3f} ms/iteration, "
        f"{format_bytes(data['memory_bytes_per_device'])} per device ({fits} in {format_bytes(data['memory_capacity_bytes'])})"
    )
    asked = {r.get("requested_strategy", r["strategy"]) for r in data["layers"]}
    base = asked.pop() if len(asked) == 1 else "data"  # --strategy NAME: NAME; a plan: data parallelism
    terminal().print(layer_cost_table(title, data["layers"], full=full, base=base, iteration_s=data["iteration_s"]))


def describe_grouping(spans: tuple[range, ...], rows: int, what: str, names: Sequence[str] = ()) -> str | None:
    """The line under a compact table saying what was grouped and how to see
    every row; None when nothing was."""
    from planner._compact import repeats_block

    groups = [s for s in spans if len(s) > 1]
    if not groups:
        return None
    hidden = sum(len(s) for s in groups)
    repeats = any(repeats_block(names, s) for s in groups) if names else False
    what = f"{what}; or runs of blocks alike the one above them, same layers and strategies" if repeats else what
    return (f"{hidden} of {rows} layers are grouped into {len(groups)} rows '… N layers (first … last)' "
            f"whose columns are their sums ({what}); --full prints every row")


def layer_cost_table(title: str, layers: list[dict[str, Any]], *, full: bool = True, base: str = "data",
                     iteration_s: float | None = None) -> Any:
    """A rich table of per-layer plan rows (name, kind, strategy, compute,
    communication, resharding, memory), as ``evaluate`` and ``plan`` print.
    A layer costed under another strategy than requested shows the costed
    one with a ``*``, and a footnote below the table says what was requested
    and why it cannot run there. Unless ``full``, a table of more than
    :data:`~planner._compact.COMPACT_ABOVE` rows is compact
    (:func:`planner._compact.group_rows`): runs of consecutive layers of one
    block on ``base`` without resharding (on another base than data, each
    resharding under 1% of ``iteration_s``), each communicating under 1% of
    ``iteration_s``, are one summary row of their summed times and memory."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from planner._compact import group_rows, label_group, plain_cost_rows
    from planner._format import format_bytes, printable
    from planner.evaluation import option_label
    from planner.unavailable import substitution_notes

    names = [r["name"] for r in layers]
    if full:
        spans = tuple(range(i, i + 1) for i in range(len(layers)))
    else:
        spans = group_rows(names, plain_cost_rows(layers, base, iteration_s),
                           keys=[(r["kind"], option_label(r)) for r in layers])
    notes = substitution_notes(layers)
    resharding = "without resharding" if base == "data" else "each resharding under 1% of the iteration"
    grouped = describe_grouping(spans, len(layers), f"consecutive {base} layers of one block {resharding}, "
                                               "each communicating under 1% of the iteration", names)
    notes += [grouped] if grouped else []
    table = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False,
                  caption=Text(printable("\n".join(notes))) if notes else None, caption_justify="left")
    for col, just in (("name", "left"), ("kind", "left"), ("strategy", "left"), ("compute ms", "right"),
                      ("comm ms", "right"), ("reshard ms", "right"), ("memory", "right")):
        table.add_column(col, justify=just, overflow="fold")
    for span in spans:
        if len(span) > 1:
            rows = layers[span.start:span.stop]
            strategies = {option_label(r) for r in rows}
            table.add_row(label_group(names, span), "", strategies.pop() if len(strategies) == 1 else "as above",
                          *(f"{sum(r[k] for r in rows) * 1e3:.4f}" for k in ("compute_s", "comm_s", "reshard_s")),
                          format_bytes(sum(r["memory_bytes"] for r in rows)), style="dim")
            continue
        r = layers[span.start]
        mark = "*" if r.get("requested_strategy", r["strategy"]) != r["strategy"] else ""
        table.add_row(r["name"], r["kind"], option_label(r) + mark, f"{r['compute_s'] * 1e3:.4f}",
                      f"{r['comm_s'] * 1e3:.4f}", f"{r['reshard_s'] * 1e3:.4f}", format_bytes(r["memory_bytes"]))
    return table


def add_cost_commands(sub: Any) -> None:
    """Register ``hardware`` and ``evaluate`` on an argparse subparsers object."""
    from planner._compact import COMPACT_ABOVE

    hw = sub.add_parser("hardware", help=COMMAND_HELP["hardware"],
                        description="List the hardware presets, or show one preset or hardware JSON file.")
    hw.add_argument("name", nargs="?", metavar="NAME|FILE", help="a preset name or a hardware JSON file")
    hw.add_argument("--json", action="store_true", help="print JSON even on a terminal")
    hw.set_defaults(run=_run_hardware)

    ev = sub.add_parser("evaluate", help=COMMAND_HELP["evaluate"],
                        description="Per-layer compute, communication, resharding and memory of one plan, and totals.")
    add_model_argument(ev)
    ev.add_argument("--devices", type=int, metavar="P", help="number of devices (default with --plan: the plan's)")
    ev.add_argument("--mesh", metavar="DxM", help="data x model mesh (default: the model axis is one node)")
    ev.add_argument("--strategy", metavar="NAME",
                    help="data | filter | channel | spatial | replicated, for every layer that can run it")
    ev.add_argument("--plan", metavar="FILE", help="JSON with a layers list of {name, strategy}")
    batch = ev.add_mutually_exclusive_group()
    batch.add_argument("--batch", type=int, metavar="B", help="global batch")
    batch.add_argument("--batch-per-device", type=int, metavar="b", help="samples per device (default 32)")
    ev.add_argument("--hardware", metavar="NAME|FILE",
                    help="preset or JSON file (default: the plan's with --plan, else abci-v100)")
    ev.add_argument("--dtype", choices=("float32", "bfloat16"), help="default: the plan's with --plan, else float32")
    ev.add_argument("--optimizer", choices=("sgd", "momentum", "adam"),
                    help="default: the plan's with --plan, else adam")
    ev.add_argument("--override", action="store_true",
                    help="with --plan: cost the plan's strategies under command-line settings that differ from "
                         "the plan's (devices, mesh, batch, hardware, dtype, optimizer)")
    ev.add_argument("--calibration", metavar="FILE", help="measured per-layer times (shardplan profile)")
    ev.add_argument("--allow-other-hardware", action="store_true",
                    help="use a calibration measured on other hardware than --hardware")
    ev.add_argument("--json", action="store_true", help="print JSON even on a terminal")
    ev.add_argument("--full", action="store_true",
                    help=f"print every layer's row: a table of more than {COMPACT_ABOVE} layers otherwise groups "
                         "runs of alike layers into one row each (JSON is never grouped)")
    ev.set_defaults(run=_run_evaluate)
