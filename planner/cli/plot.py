"""``shardplan plot``: draw a plan file (needs the ``plot`` extra).

``shardplan plot PLAN.json -o OUT.png [--history] [--dpi N]``

Per-layer stacked time (compute, communication, resharding) coloured by
strategy above per-layer memory against the limit
(:func:`planner.plot.plot_plan`); ``--history`` adds a third panel, the
search's objective and memory over the limit against step. The format
follows OUT's suffix (``.png``, ``.pdf``, ``.svg``, ...). Missing
matplotlib, an unreadable or malformed plan, an unknown suffix, an
unwritable OUT, ``--dpi`` outside 1 to :data:`planner.plot.MAX_DPI`, or ``--history``
on a plan without a recorded history exit with 2 and one line on stderr.
"""

from __future__ import annotations

import argparse
from typing import Any

from planner.cli.common import COMMAND_HELP

__all__ = ["add_plot_commands"]


def _run_plot(args: argparse.Namespace) -> int:
    from planner.planning import Plan
    from planner.plot import _require_matplotlib, check_dpi, plot_plan
    from planner.usage import UsageError

    try:
        check_dpi(args.dpi)
    except ValueError as e:
        raise UsageError(str(e).replace("dpi must", "--dpi must"), "expected e.g. --dpi 120") from None
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
                   help="resolution of raster formats, 1 to 1200 (planner.plot.MAX_DPI; default 120)")
    p.set_defaults(run=_run_plot)
