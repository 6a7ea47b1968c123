"""``shardplan oracle``: the ParaDL oracle on the command line.

    shardplan oracle MODEL --devices 16,32,...,1024 [--hardware NAME|FILE]
        [--strategies data,spatial,filter,channel,pipeline,data+filter,data+spatial]
        [--batch-per-device b | --batch B] [--segments S] [--compat paradl]
        [--lc FILE ...] [--dataset-size D] [--optimizer sgd|momentum|adam]
        [--calibration FILE] [--rank] [--json] [--plot FILE.png]

One row per strategy and device count (:func:`planner.oracle`): a
rich table on a terminal, JSON otherwise (a list of rows). ``--rank``
orders the strategies at each device count instead, by throughput (time
per sample: the strategies run different global batches). ``--plot`` also draws
throughput (samples per second) against GPU count, its legend naming the
strategies left out past their parallelism limits (needs the ``plot`` extra,
matplotlib).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from planner.cli.common import COMMAND_HELP, add_model_argument
from planner.usage import json_text

__all__ = ["add_oracle_commands", "left_out_notes", "parse_devices", "plot_report"]

_PLOT_HINT = "install the plot extra: pip install 'shardplan[plot]' (matplotlib)"


def parse_devices(text: str) -> list[int]:
    """``"16,32,64"`` -> ``[16, 32, 64]``."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            raise ValueError(f"--devices {text!r} is not a comma-separated list of positive integers, e.g. 16,32,64")
        out.append(int(part))
    return out


def _fmt_ms(s: float) -> str:
    return f"{s * 1e3:.2f}"


def _fmt_epoch(s: float | None) -> str:
    if s is None:
        return ""
    return f"{s / 3600:.2f} h" if s >= 3600 else f"{s / 60:.1f} min" if s >= 60 else f"{s:.1f} s"


def _render_rows(report: Any) -> None:
    from rich import box
    from planner.cli._terminal import console as terminal
    from rich.table import Table

    from planner._format import format_bytes

    table = Table(title=f"{report.model} on {report.hardware} ({report.mode} mode), per iteration",
                  box=box.SIMPLE_HEAD, show_edge=False)
    for col, just in (("strategy", "left"), ("GPUs", "right"), ("B", "right"), ("compute ms", "right"),
                      ("comm ms", "right"), ("WU ms", "right"), ("total ms", "right"), ("memory", "right"),
                      ("epoch", "right"), ("bottleneck", "left")):
        table.add_column(col, justify=just, overflow="fold")
    for r in report.rows:
        style = None if r.feasible else "dim red"
        table.add_row(r.strategy, str(r.devices), f"{r.batch:g}", _fmt_ms(r.compute_s), _fmt_ms(r.comm_s),
                      _fmt_ms(r.weight_update_s), _fmt_ms(r.total_s), format_bytes(r.memory_bytes_per_device),
                      _fmt_epoch(r.epoch_s), r.bottleneck, style=style)
    terminal().print(table)


def _ranking(report: Any, devices: list[int]) -> list[dict[str, Any]]:
    out = []
    for p in sorted(set(devices)):
        for i, r in enumerate(report.ranking(p), start=1):
            out.append({"devices": p, "rank": i if r.feasible else None, "strategy": r.strategy,
                        "batch": r.batch, "total_s": r.total_s,
                        "samples_per_s": r.batch / r.total_s if r.total_s else None,
                        "epoch_s": r.epoch_s, "feasible": r.feasible, "bottleneck": r.bottleneck})
    return out


def _render_ranking(report: Any, ranking: list[dict[str, Any]]) -> None:
    from rich import box
    from planner.cli._terminal import console as terminal
    from rich.table import Table

    table = Table(title=f"{report.model} on {report.hardware} ({report.mode} mode): strategies by throughput "
                        "(samples per second; global batches differ)", box=box.SIMPLE_HEAD, show_edge=False)
    for col, just in (("GPUs", "right"), ("rank", "right"), ("strategy", "left"), ("B", "right"),
                      ("ms/iter", "right"), ("samples/s", "right"), ("epoch", "right"), ("bottleneck", "left")):
        table.add_column(col, justify=just, overflow="fold")
    for r in ranking:
        ok = r["feasible"]
        table.add_row(str(r["devices"]), str(r["rank"] or "-"), r["strategy"], f"{r['batch']:g}",
                      _fmt_ms(r["total_s"]) if ok else "", f"{r['samples_per_s']:,.0f}" if ok else "",
                      _fmt_epoch(r["epoch_s"]) if ok else "", r["bottleneck"], style=None if ok else "dim red")
    terminal().print(table)


def _per_s(samples: float, seconds: float) -> float:
    return samples / seconds if seconds > 0 else float("nan")  # nothing to draw for a zero time


def _device_list(devices: list[int]) -> str:
    return ", ".join(str(p) for p in devices)


def left_out_notes(report: Any) -> list[str]:
    """One line per strategy that has rows past a parallelism limit, which
    the oracle plot leaves out: ``filter: left out at p ≥ 128 (p ≤ min F =
    64 filters of a split layer)``, ``spatial: left out at every p (...)``,
    or the device counts themselves where they are not the largest ones."""
    out = []
    for s in dict.fromkeys(r.strategy for r in report.rows):
        rows = [r for r in report.rows if r.strategy == s]
        past = [r for r in rows if r.limit is not None]
        if not past:
            continue
        kept = [r.devices for r in rows if r.limit is None]
        at = sorted({r.devices for r in past})
        if not kept:
            where = "every p"
        elif min(at) > max(kept):
            where = f"p ≥ {min(at)}"
        else:
            where = f"p = {_device_list(at)}"
        why = "; ".join(dict.fromkeys(r.limit.split(": ", 1)[-1] for r in past))
        out.append(f"{s}: left out at {where} ({why})")
    return out


def plot_report(report: Any, path: str | None = None) -> Any:
    """Throughput (samples per second: the strategies run different global
    batches, so seconds per iteration do not compare) against GPU count, one
    colour per strategy: the whole iteration (solid) and compute alone
    (dashed: the throughput were communication and weight update free),
    out-of-memory points marked ×. Rows past a parallelism limit are left
    out, and the legend says which (:func:`left_out_notes`). Written to
    ``path`` when given; returns the figure."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    fig = Figure(figsize=(10, 5.5), layout="constrained")
    ax = fig.subplots()
    strategies = list(dict.fromkeys(r.strategy for r in report.rows))
    oom_labelled = False
    for i, s in enumerate(strategies):
        rows = [r for r in report.rows if r.strategy == s and r.limit is None]
        if not rows:
            continue
        color = f"C{i % 10}"
        p = [r.devices for r in rows]
        ax.plot(p, [_per_s(r.batch, r.total_s) for r in rows], "-o", color=color, label=f"{s}: iteration",
                markersize=3)
        ax.plot(p, [_per_s(r.batch, r.compute_s) for r in rows], "--", color=color, alpha=0.7,
                label=f"{s}: compute")
        oom = [r for r in rows if not r.fits_memory]
        if oom:
            ax.plot([r.devices for r in oom], [_per_s(r.batch, r.total_s) for r in oom], "x", color="red",
                    markersize=10, markeredgewidth=2, label=None if oom_labelled else "out of memory")
            oom_labelled = True
    handles = ax.get_legend_handles_labels()[0]
    notes = left_out_notes(report)
    if notes:
        handles.append(Line2D([], [], linestyle="none", label="past a parallelism limit, not drawn:"))
        handles += [Line2D([], [], linestyle="none", label=n) for n in notes]
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("GPUs")
    ax.set_ylabel("samples per second (global batch / iteration time)")
    ax.set_title(f"{report.model} on {report.hardware} ({report.mode} mode): throughput; "
                 "the strategies' global batches differ", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0),
              title="solid: whole iteration; dashed: compute alone", title_fontsize=7)
    if path is not None:
        import io

        from costmodels import write_atomic

        buf = io.BytesIO()
        fig.savefig(buf, format=os.path.splitext(str(path))[1].lstrip(".").lower() or "png", dpi=120)
        write_atomic(path, buf.getvalue())  # a kill mid-write leaves any previous plot whole
    return fig


def _check_matplotlib() -> None:
    from planner.usage import UsageError

    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("--plot needs matplotlib, which is not installed", _PLOT_HINT) from None


def _run_oracle(args: argparse.Namespace) -> int:
    from planner.paradl.report import oracle
    from planner.usage import UsageError

    if args.plot:
        _check_matplotlib()
        from costmodels import check_writable

        check_writable(args.plot, "--plot")  # before the oracle runs, not after it
    devices = parse_devices(args.devices)
    for name, v in (("--batch", args.batch), ("--batch-per-device", args.batch_per_device),
                    ("--segments", args.segments), ("--dataset-size", args.dataset_size)):
        if v is not None and v < 1:
            raise UsageError(f"{name} must be a positive integer, got {v}", f"expected e.g. {name} 64")
    report = oracle(
        args.model, args.hardware, devices, args.strategies.split(",") if args.strategies else None,
        batch_per_device=args.batch_per_device, batch=args.batch, segments=args.segments,
        compat=args.compat, dataset_size=args.dataset_size, lc=args.lc, optimizer=args.optimizer,
        calibration=args.calibration, allow_other_hardware=args.allow_other_hardware,
        on_unsupported=args.on_unsupported,
    )
    if args.plot:
        plot_report(report, args.plot)
    as_json = args.json or not sys.stdout.isatty()
    if args.rank:
        ranking = _ranking(report, devices)
        if as_json:
            print(json_text(ranking))
        else:
            _render_ranking(report, ranking)
    elif as_json:
        print(json_text(report.row_dicts()))
    else:
        _render_rows(report)
    return 0


def add_oracle_commands(sub: Any) -> None:
    """Register ``oracle`` on an argparse subparsers object."""
    p = sub.add_parser(
        "oracle", help=COMMAND_HELP["oracle"],
        description="Per-iteration compute, communication, weight update, memory, epoch time, feasibility and "
                    "bottleneck of data, spatial, filter, channel, pipeline, data+filter and data+spatial "
                    "parallelism at each device count (ParaDL, ParaDL §4).",
    )
    add_model_argument(p)
    p.add_argument("--devices", required=True, metavar="P,P,...", help="device counts, e.g. 16,32,64,128")
    p.add_argument("--hardware", default="abci-v100", metavar="NAME|FILE",
                   help="preset or hardware JSON file (default abci-v100)")
    p.add_argument("--strategies", metavar="S,S,...",
                   help="data,spatial,filter,channel,pipeline,data+filter,data+spatial (default: all; "
                        "ParaDL's d,s,f,c,p,df,ds accepted)")
    batch = p.add_mutually_exclusive_group()
    batch.add_argument("--batch-per-device", type=int, metavar="b",
                       help="samples each device works on per iteration (ParaDL's --cBon; default: the largest "
                            "power of two that data parallelism fits)")
    batch.add_argument("--batch", type=int, metavar="B", help="fixed global batch for every strategy")
    p.add_argument("--segments", type=int, metavar="S", help="pipeline micro-batches (default min(p, B))")
    p.add_argument("--compat", choices=("paradl",), help="reproduce the original ParaDL oracle code's outputs")
    p.add_argument("--lc", nargs="+", action="extend", metavar="FILE",
                   help="ParaDL .lc masks (filter_*.lc, channel_*.lc, spatial_*.lc, or FAMILY=FILE)")
    p.add_argument("--dataset-size", type=int, metavar="D",
                   help="samples per epoch (default: a .net file's Input header)")
    p.add_argument("--optimizer", choices=("sgd", "momentum", "adam"), default="sgd",
                   help="weight-update time and state in the default mode (default sgd, as ParaDL)")
    p.add_argument("--calibration", metavar="FILE",
                   help="measured per-layer times (shardplan profile) instead of the roofline; default mode only")
    p.add_argument("--allow-other-hardware", action="store_true",
                   help="use a calibration measured on other hardware than --hardware")
    p.add_argument("--rank", action="store_true", help="order the strategies at each device count")
    p.add_argument("--json", action="store_true", help="print JSON even on a terminal")
    p.add_argument("--plot", metavar="FILE.png", help="also draw throughput (samples/s) against GPU count")
    p.set_defaults(run=_run_oracle)
