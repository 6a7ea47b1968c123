"""``shardplan validate``: compile a plan's sharded training step on the local
devices and compare predicted with compiled memory and communication.

``shardplan validate MODEL --plan plan.json [--json] [--memory-rtol F]
[--activation-rtol F] [--comm-rtol F]``

MODEL is a built-in model name (its Flax twin, :func:`planner.flax_model`,
built abstract: nothing is initialised or run) or ``package.module:factory``
returning ``(flax_module, example_input)``. Prints a side-by-side table of
memory and of collectives by kind and mesh axes (a rich table on a terminal,
JSON otherwise or with ``--json``: :meth:`ValidationReport.to_dict`). Exit
status 0 when every figure is within tolerance, 1 when one is not (a
compiled program above the plan's memory limit is one, with a line naming
the part that grew; on stderr with JSON), 2 for usage errors.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from planner.cli.common import COMMAND_HELP
from planner.usage import json_text

__all__ = ["add_validate_commands"]

_ACCEPTED = "expected a built-in model name or package.module:factory returning (flax_module, example_input)"


def _flax_model(spec: str) -> Any:
    from planner.models.loading import flax_model_of
    from planner.usage import UsageError

    model = flax_model_of(spec)
    if model is None:
        raise UsageError(f"unknown model {spec!r} (validate needs a Flax model)", _ACCEPTED)
    return model


def _exact_bytes(v: float) -> str:
    """Every byte, grouped (``"176,736,156"``): validate compares to the byte."""
    return f"{v:,.0f}"


def _render(report: Any) -> None:
    from rich import box
    from planner.cli._terminal import console as terminal
    from rich.table import Table

    def mark(ok: bool) -> str:
        return "[green]ok[/]" if ok else "[bold red]OUT[/]"

    console = terminal()
    where = report.platform + (f" ({report.scheduler} scheduler)" if report.scheduler else "")
    mem = Table(title=f"{report.model}, mesh {'x'.join(map(str, report.mesh))}, batch {report.batch}, {report.optimizer}, {where}: "
                      "memory per device", box=box.SIMPLE_HEAD)
    for col, justify in (("part", "left"), ("predicted", "right"), ("compiled", "right"), ("error", "right"),
                         ("tolerance", "right"), ("", "left"), ("note", "left")):
        mem.add_column(col, justify=justify)
    for r in report.memory:
        err = (r.compiled_bytes - r.predicted_bytes) / r.predicted_bytes if r.predicted_bytes else 0.0
        mem.add_row(r.part, _exact_bytes(r.predicted_bytes), _exact_bytes(r.compiled_bytes), f"{err:+.1%}",
                    "exact" if r.rtol == 0 else f"{r.rtol:.0%}", mark(r.ok), r.note)
    console.print(mem)
    col = Table(title="collectives per device, by kind and mesh axes", box=box.SIMPLE_HEAD)
    for name, justify in (("kind", "left"), ("axes", "left"), ("predicted", "right"), ("compiled", "right"),
                          ("ops", "right"), ("", "left"), ("note", "left")):
        col.add_column(name, justify=justify)
    for r in report.collectives:
        col.add_row(r.kind, ",".join(r.axes), _exact_bytes(r.predicted_bytes), _exact_bytes(r.compiled_bytes),
                    str(r.count), mark(r.ok), r.note + (" (crosses processes)" if r.crosses_processes else ""))
    console.print(col)
    for note in report.notes:
        console.print(f"[yellow]note[/]: {note}")
    if report.over_limit is not None:
        console.print(f"[bold red]memory: the compiled program does not fit the plan's limit[/]: {report.over_limit.note}")
    console.print("[green]all figures within tolerance[/]" if report.ok else
                  "[bold red]some figures are outside tolerance[/]")


def _run_validate(args: argparse.Namespace) -> int:

    from planner.planning import Plan
    from planner.runtime.validation import validate
    from planner.usage import UsageError
    from planner.user_code import UserCodeError, user_code

    for name in ("memory_rtol", "activation_rtol", "comm_rtol"):
        if getattr(args, name) < 0:
            raise UsageError(f"--{name.replace('_', '-')} must be a non-negative fraction", "expected e.g. 0.05")
    model = _flax_model(args.model)
    plan = Plan.read(args.plan)
    mesh = None
    if args.gpu_target:  # compile-only devices of the plan's GPU (the gpu-aot extra)
        from planner.runtime.gpu_target import gpu_target_mesh

        try:
            mesh = gpu_target_mesh(plan)
        except ImportError as e:
            raise UsageError(str(e), "install the extra, or validate without --gpu-target on this machine's "
                                     "devices") from None
    try:  # the step compiled runs the user's forward pass again: its prints must not reach --json's stdout
        with user_code("your model", "while shardplan compiled its training step", args.model, errors=False):
            report = validate(model, plan, mesh=mesh, memory_rtol=args.memory_rtol,
                              activation_rtol=args.activation_rtol, comm_rtol=args.comm_rtol)
    except UserCodeError as e:  # raised tracing the model: name the factory the user gave
        raise e.named(args.model) from None
    if args.json or not sys.stdout.isatty():
        print(json_text(report.to_dict()))
        if report.over_limit is not None:
            print(f"memory: the compiled program does not fit the plan's limit: {report.over_limit.note}",
                  file=sys.stderr)
    else:
        _render(report)
    return 0 if report.ok else 1


def add_validate_commands(sub: Any) -> None:
    """Register ``validate`` on an argparse subparsers object."""
    va = sub.add_parser(
        "validate", help=COMMAND_HELP["validate"],
        description="Compile the plan's sharded training step on the local devices and compare, per device, "
                    "predicted with compiled memory and collectives (by kind and mesh axes); exit 1 when a "
                    "figure is outside tolerance.",
    )
    va.add_argument("model", metavar="MODEL", help="built-in model name or package.module:factory")
    va.add_argument("--plan", required=True, metavar="FILE", help="plan JSON (shardplan plan -o FILE)")
    va.add_argument("--memory-rtol", type=float, default=0.30, metavar="F",
                    help="relative tolerance of the total memory per device (default 0.30)")
    va.add_argument("--activation-rtol", type=float, default=0.50, metavar="F",
                    help="relative tolerance of activations and temporaries (default 0.50)")
    va.add_argument("--comm-rtol", type=float, default=0.05, metavar="F",
                    help="relative tolerance of collective bytes per kind and axes (default 0.05)")
    va.add_argument("--gpu-target", action="store_true",
                    help="compile for the plan's GPU (dgx-a100, dgx-h100, h200) on compile-only devices, on this "
                         "machine, GPU or not, in the plan's precision (needs the gpu-aot extra)")
    va.add_argument("--json", action="store_true", help="print JSON even on a terminal")
    va.set_defaults(run=_run_validate)
