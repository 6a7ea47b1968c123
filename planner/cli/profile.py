"""``shardplan profile``: measure a model's layers on this machine and write
a calibration file.

``shardplan profile MODEL --batch B [--max-devices 8] [--dtype float32|bfloat16]
[--warmup 2] [--repeats 5] [--layers NAME,NAME,...] [--hardware NAME|FILE] [--device-name NAME]
[-o calibration.json]``

Times every layer's forward + backward as a standalone jitted op on the
default JAX device (accelerator or CPU) at the shard shapes the strategy menu
produces for global batch B on up to ``--max-devices`` devices
(:func:`planner.calibrate.profile.profile_layers`), showing a progress bar on a
terminal. ``-o FILE`` writes the calibration (then a per-layer summary is
printed: a rich table on a terminal, JSON otherwise); without ``-o`` the
calibration JSON goes to stdout (version 3: shard shapes and the device,
``--hardware`` the preset this machine is). ``shardplan plan``, ``evaluate``
and ``oracle`` read it with ``--calibration FILE`` and refuse it for other
hardware unless ``--allow-other-hardware``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from planner.cli.common import COMMAND_HELP, add_model_argument
from planner.usage import json_text

__all__ = ["CAPS", "add_profile_commands"]

# The largest value each knob takes, and why: what grows with it.
CAPS: dict[str, tuple[int, str]] = {
    "--batch": (65536, "the one-device shard holds all B samples, so its memory grows with B"),
    "--max-devices": (65536, ("every power-of-two mesh up to P is timed, a number of shard shapes that grows "
                              "with log(P) squared")),
    "--repeats": (1000, "every shard is called that many times, so the run time grows with it"),
    "--warmup": (1000, "every shard is called that many times, so the run time grows with it"),
}


def _progress_bar(console: Any):
    """A rich progress bar on stderr and the callback that advances it."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    bar = Progress(TextColumn("profiling {task.fields[layer]}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), console=console, transient=True)
    task = bar.add_task("profile", total=None, layer="")

    def callback(event) -> None:
        bar.update(task, total=event.total, completed=event.done, layer=event.layer)

    return bar, callback


def _summary(profile: Any, calibration: Any) -> dict[str, Any]:
    return {
        "model": profile.model,
        "device": profile.device,
        "dtype": profile.dtype,
        "batch": profile.batch,
        "max_devices": profile.max_devices,
        "shards": len(profile.timings),
        "shapes": len({(t.layer, t.shape) for t in profile.timings}),
        "layers": [
            {"name": name, "work": [w for w, _ in pts], "seconds": [s for _, s in pts]}
            for name, pts in calibration.layers.items()
        ],
    }


def _render(summary: dict[str, Any], output: str) -> None:
    from rich import box
    from planner.cli._terminal import console as terminal
    from rich.table import Table

    table = Table(
        title=f"{summary['model']} on {summary['device']}, batch {summary['batch']}, {summary['dtype']}, "
              f"up to {summary['max_devices']} devices: forward + backward ms at each work (samples / shard)",
        box=box.SIMPLE_HEAD, show_edge=False,
    )
    table.add_column("layer", overflow="fold")
    table.add_column("measured (work: ms)", overflow="fold")
    for row in summary["layers"]:
        points = "  ".join(f"{w:g}: {s * 1e3:.4g}" for w, s in zip(row["work"], row["seconds"], strict=True))
        table.add_row(row["name"], points)
    console = terminal()
    console.print(table)
    console.print(f"{summary['shapes']} shard shapes timed for {len(summary['layers'])} layers; "
                  f"calibration written to {output}", highlight=False)


def _run_profile(args: argparse.Namespace) -> int:
    from costmodels import load_hardware
    from costmodels import check_writable, write_atomic
    from planner.calibrate.profile import profile_layers
    from planner.cli.common import dump_json
    from planner.models.loading import load_model
    from planner.usage import UsageError

    for name, v, low in (("--batch", args.batch, 1), ("--max-devices", args.max_devices, 1),
                         ("--repeats", args.repeats, 1), ("--warmup", args.warmup, 0)):
        if v < low:
            raise UsageError(f"{name} must be an integer >= {low}, got {v}", f"expected e.g. {name} {max(low, 4)}")
        high, why = CAPS[name]
        if v > high:
            raise UsageError(f"{name} must be at most {high}, got {v} ({why})",
                             f"expected {name} from {low} to {high}")
    layers = [x.strip() for x in args.layers.split(",") if x.strip()] if args.layers else None
    if args.output:
        check_writable(args.output, "-o")  # before profiling, not after it
    graph = load_model(args.model, args.on_unsupported)
    hardware = load_hardware(args.hardware).name if args.hardware else ""
    bar, callback = None, None
    if sys.stderr.isatty():
        from planner.cli._terminal import console as terminal

        bar, callback = _progress_bar(terminal(stderr=True))
        bar.start()
    try:
        profile = profile_layers(
            graph, args.batch, max_devices=args.max_devices, dtype=args.dtype, warmup=args.warmup,
            repeats=args.repeats, layers=layers, callback=callback, device=args.device_name, hardware=hardware,
        )
    finally:
        if bar is not None:
            bar.stop()
    text = json_text(profile.calibration().to_dict())
    if not args.output:
        print(text)
        return 0
    write_atomic(args.output, text + "\n")  # the path was checked before profiling
    summary = _summary(profile, profile.layer_calibration())
    if args.json or not sys.stdout.isatty():
        print(dump_json(summary))
    else:
        _render(summary, args.output)
    return 0


def add_profile_commands(sub: Any) -> None:
    """Register ``profile`` on an argparse subparsers object."""
    p = sub.add_parser(
        "profile", help=COMMAND_HELP["profile"],
        description="Time every layer's forward + backward as a standalone jitted op on the local accelerator "
                    "(or CPU) at the shard shapes the strategy menu produces, with warm-up and medians, and write "
                    "a calibration file for --calibration of plan, evaluate and oracle.",
    )
    add_model_argument(p)
    p.add_argument("--batch", type=int, required=True, metavar="B",
                   help=f"global batch the plans will use (at most {CAPS['--batch'][0]})")
    p.add_argument("--max-devices", type=int, default=8, metavar="P",
                   help="shard shapes of meshes of up to P devices (powers of two; default 8, at most "
                        f"{CAPS['--max-devices'][0]})")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--warmup", type=int, default=2, metavar="N",
                   help=f"untimed calls per shard (default 2, at most {CAPS['--warmup'][0]})")
    p.add_argument("--repeats", type=int, default=5, metavar="N",
                   help=f"timed calls per shard; the median is kept (default 5, at most {CAPS['--repeats'][0]})")
    p.add_argument("--layers", metavar="NAME,...", help="only these layers (default: all)")
    p.add_argument("--hardware", metavar="NAME|FILE",
                   help="the hardware preset (or file) this machine is, recorded in the file: plan, evaluate and "
                        "oracle refuse the calibration for other hardware")
    p.add_argument("--device-name", metavar="NAME", help="device name recorded in the file (default: the JAX "
                                                         "device kind)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON even on a terminal")
    p.add_argument("-o", "--output", metavar="FILE", help="write the calibration to FILE (default: stdout)")
    p.set_defaults(run=_run_profile)
