"""``shardplan plot``: draw a plan file (needs the ``plot`` extra).

``shardplan plot PLAN.json -o OUT.png [--history] [--dpi N]``

Per-layer stacked time (compute, communication, resharding) coloured by
strategy above per-layer memory against the limit
(:func:`planner.plot.plot_plan`); ``--history`` adds a third panel, the
search's objective and memory over the limit against step. The format
follows OUT's suffix (``.png``, ``.pdf``, ``.svg``, ...). Missing
matplotlib, an unreadable or malformed plan, an unknown suffix, an
unwritable OUT, ``--dpi`` outside 1 to :data:`MAX_DPI`, or ``--history``
on a plan without a recorded history exit with 2 and one line on stderr.
"""

from __future__ import annotations

import argparse
from typing import Any

from planner.cli.common import COMMAND_HELP

__all__ = ["MAX_DPI", "add_plot_commands"]

MAX_DPI = 1200  # pixels grow with dpi squared; 1200 dpi is a print resolution


def _run_plot(args: argparse.Namespace) -> int:
    from planner.planning import Plan
    from planner.plot import _require_matplotlib, plot_plan
    from planner.usage import UsageError

    if args.dpi < 1:
        raise UsageError(f"--dpi must be a positive integer, got {args.dpi}", "expected e.g. --dpi 120")
    if args.dpi > MAX_DPI:
        from planner.plot import MAX_WIDTH_IN

        pixels = MAX_WIDTH_IN * 8.0 * MAX_DPI**2 / 1e6
        raise UsageError(f"--dpi must be at most {MAX_DPI}, got {args.dpi} (the image's pixel count grows with "
                         f"dpi squared: a {MAX_WIDTH_IN:g} x 8 inch figure at {MAX_DPI} dpi is already "
                         f"{pixels:.0f} megapixels)",
                         "expected e.g. --dpi 300 for print, or a vector format (-o OUT.pdf or OUT.svg)")
    _require_matplotlib()  # before reading anything: the one-line install hint
    from costmodels import check_writable

    check_writable(args.output, "-o")
    plan = Plan.read(args.plan)
    if args.history and not getattr(plan, "history", ()):
        raise UsageError(
            f"{args.plan} has no recorded search history",
            "write the plan again with 'shardplan plan MODEL --devices P -o FILE' (this version records the "
            "search's steps), or drop --history",
        )
    plot_plan(plan, args.output, history=args.history, dpi=args.dpi)
    return 0


def add_plot_commands(sub: Any) -> None:
    """Register ``plot`` on an argparse subparsers object."""
    p = sub.add_parser(
        "plot", help=COMMAND_HELP["plot"],
        description="Draw a plan file written by 'shardplan plan -o': per-layer stacked time (compute, "
                    "communication, resharding) coloured by strategy, and per-layer memory against the limit. "
                    "Needs matplotlib (pip install 'shardplan[plot]').",
    )
    p.add_argument("plan", metavar="PLAN.json", help="a plan file written by 'shardplan plan -o'")
    p.add_argument("-o", "--output", required=True, metavar="OUT.png",
                   help="image to write; the format follows the suffix (.png, .pdf, .svg, ...)")
    p.add_argument("--history", action="store_true",
                   help="also plot the search objective and memory over the limit against step")
    p.add_argument("--dpi", type=int, default=120, metavar="N",
                   help=f"resolution of raster formats, 1 to {MAX_DPI} (default 120)")
    p.set_defaults(run=_run_plot)
