"""The ``shardplan`` command line (console script ``shardplan``, or
``python -m planner``).

Subcommands:

* ``shardplan layers MODEL [--batch B] [--json] [--dtype float32|bfloat16] [--full]``:
  the per-layer table of a model (shapes, parameters, FLOPs and activation
  bytes at batch B). A rich table on a terminal (above 40 layers, blocks of
  consecutive layers grouped into one row each unless ``--full``:
  :mod:`planner._compact`), JSON otherwise (or with ``--json``).
* ``shardplan hardware`` and ``shardplan evaluate``: see
  :mod:`planner.cli.cost`.

MODEL is one of (:func:`planner.models.loading.load_model`): a built-in model name
(:data:`planner.models.zoo.MODEL_NAMES`); a ParaDL network file (``.net``,
``.net_sc``, ``.net_256``, or any file whose first line starts with
``Dataset|``; ParaDL §5); a layer-graph ``.json`` file
(:meth:`LayerGraph.to_json`); or ``package.module:factory``, a function that
returns ``(flax_module, example_input)``, extracted with
:func:`planner.extract`.

Errors in what the user gave (unknown names, missing or malformed files, a
bad factory, bad options) exit with status 2 and one line on stderr,
``shardplan: error: <what is wrong>; <what would be accepted>``. This module
is the renderer: it is the only one that prints. Heavy modules (the zoo,
the Flax extractor, rich) are imported only when needed.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from typing import TYPE_CHECKING

from planner.cli.common import COMMAND_HELP, PROG, Parser, add_model_argument, check_outputs, dump_json
from planner._format import printable
from planner.usage import UsageError, one_line

if TYPE_CHECKING:
    from planner.ir.graph import LayerGraph
    from planner.models.loading import call_factory, load_model

__all__ = ["main", "load_model", "call_factory", "layer_report", "UsageError", "DTYPE_BYTES"]

DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2}


# -- the layers report -------------------------------------------------------------


def _num(x: Any) -> int | float:
    x = float(x)
    return int(x) if x.is_integer() and abs(x) < 2**63 else x


def layer_report(graph: LayerGraph, batch: int = 1, dtype: str = "float32") -> dict[str, Any]:
    """The ``layers`` subcommand's data: one row per layer (name, kind,
    channels-first input and output shapes, parameters, forward and backward
    FLOPs at ``batch``, activation bytes kept for the backward pass) and
    totals. Plain ints and floats, ready for JSON."""
    if batch < 1:
        raise ValueError(f"batch must be a positive integer, got {batch}")
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPE_BYTES)}, got {dtype!r}")
    size = DTYPE_BYTES[dtype]
    a = graph.unpadded()
    rows = []
    for i, (name, kind) in enumerate(zip(graph.names, graph.kind_names, strict=True)):
        r = int(a.spatial_rank[i])
        rows.append(
            {
                "name": name,
                "kind": kind,
                "input_shape": [int(a.in_channels[i]), *(int(d) for d in a.in_spatial[i][:r])],
                "output_shape": [int(a.out_channels[i]), *(int(d) for d in a.out_spatial[i][: int(a.out_spatial_rank[i])])],
                "params": _num(a.params[i]),
                "flops_forward": _num(a.flops_fwd[i] * batch),
                "flops_backward": _num((a.flops_bwd_data[i] + a.flops_bwd_weight[i]) * batch),
                "activation_bytes": _num(a.saved_elements[i] * batch * size),
            }
        )
    totals = {"layers": len(rows)}
    for key in ("params", "flops_forward", "flops_backward", "activation_bytes"):
        totals[key] = _num(sum(float(row[key]) for row in rows))
    return {"model": graph.model_name, "batch": batch, "dtype": dtype, "layers": rows, "totals": totals}


def _render_layers_table(report: dict[str, Any], full: bool = True) -> None:
    from rich import box
    from planner.cli._terminal import console as terminal
    from rich.table import Table

    from planner._compact import group_rows, label_group
    from planner._format import format_bytes, format_count, format_shape
    from planner.cli.cost import describe_grouping

    t = report["totals"]
    rows = report["layers"]
    names = [row["name"] for row in rows]
    keys = [(r["kind"], tuple(r["input_shape"]), tuple(r["output_shape"])) for r in rows]
    spans = (tuple(range(i, i + 1) for i in range(len(rows))) if full
             else group_rows(names, [True] * len(rows), keys=keys))
    note = describe_grouping(spans, len(rows),
                             "consecutive layers of one block; input of the first, output of the last", names)
    table = Table(
        title=f"{report['model']}: {t['layers']} layers, batch {report['batch']}, {report['dtype']}",
        box=box.SIMPLE_HEAD,
        show_footer=True,
        show_edge=False,
        collapse_padding=True,
        pad_edge=False,
        caption=note,
        caption_justify="left",
    )
    table.add_column("name", footer="total", overflow="fold", min_width=12)
    table.add_column("kind", overflow="fold")
    table.add_column("input", overflow="fold", min_width=10)
    table.add_column("output", overflow="fold", min_width=10)
    table.add_column("params", justify="right", no_wrap=True, min_width=7, footer=format_count(t["params"]))
    table.add_column("fwd\nFLOPs", justify="right", no_wrap=True, min_width=7, footer=format_count(t["flops_forward"]))
    table.add_column("act.\nbytes", justify="right", no_wrap=True, min_width=8, footer=format_bytes(t["activation_bytes"]))
    for span in spans:
        first, last = rows[span.start], rows[span.stop - 1]
        group = rows[span.start:span.stop]
        params = sum(r["params"] for r in group)
        act = sum(r["activation_bytes"] for r in group)
        table.add_row(
            label_group(names, span) if len(span) > 1 else first["name"],
            "" if len(span) > 1 else first["kind"],
            format_shape(first["input_shape"]),
            format_shape(last["output_shape"]),
            format_count(params) if params else "",
            format_count(sum(r["flops_forward"] for r in group)),
            format_bytes(act) if act else "",
            style="dim" if len(span) > 1 else None,
        )
    terminal().print(table)


def _run_layers(args: argparse.Namespace) -> int:
    if args.batch < 1:
        raise UsageError(f"--batch must be a positive integer, got {args.batch}", "expected e.g. --batch 64")
    from planner.models.loading import load_model

    graph = load_model(args.model, args.on_unsupported)
    report = layer_report(graph, args.batch, args.dtype)
    report["source"] = args.model
    if args.json or not sys.stdout.isatty():
        print(dump_json(report))
    else:
        _render_layers_table(report, full=args.full)
    return 0


# -- entry point ---------------------------------------------------------------------


# the module and function that register each subcommand's full parser
_LAYERS = (__name__, "_add_layers")
_REGISTRARS = {
    "layers": _LAYERS,
    "hardware": ("planner.cli.cost", "add_cost_commands"),
    "evaluate": ("planner.cli.cost", "add_cost_commands"),
    "oracle": ("planner.cli.oracle", "add_oracle_commands"),
    "plan": ("planner.cli.plan", "add_plan_commands"),
    "profile": ("planner.cli.profile", "add_profile_commands"),
    "validate": ("planner.cli.validate", "add_validate_commands"),
    "plot": ("planner.cli.plot", "add_plot_commands"),
}


def _add_layers(sub: Any) -> None:
    from planner._compact import COMPACT_ABOVE

    lay = sub.add_parser(
        "layers",
        help=COMMAND_HELP["layers"],
        description="Print a model's per-layer table: shapes, parameters, FLOPs and activation bytes.",
    )
    add_model_argument(lay)
    lay.add_argument("--batch", type=int, default=1, metavar="B", help="samples per step (default: 1)")
    lay.add_argument("--dtype", choices=tuple(DTYPE_BYTES), default="float32", help="activation dtype (default: float32)")
    lay.add_argument("--json", action="store_true", help="print JSON even on a terminal")
    lay.add_argument("--full", action="store_true",
                     help=f"print every layer's row: a table of more than {COMPACT_ABOVE} layers otherwise groups "
                          "consecutive layers of one block into one row each (JSON is never grouped)")
    lay.set_defaults(run=_run_layers)


def _parser(command: str | None = None) -> Parser:
    """The command line's parser: every subcommand's, or where ``command``
    names one, that one's in full (with the others its module registers)
    and the rest as their one-line help, their modules and what those
    import, JAX among them, not loaded: ``shardplan --help`` answers at once."""
    import importlib

    p = Parser(prog=PROG, description="Plan per-layer sharding of neural network training.")
    p.add_argument("--debug", action="store_true",
                   help=f"show the full traceback of an internal error (or set {DEBUG_ENV}=1)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    wanted = None if command is None else _REGISTRARS.get(command, _LAYERS if command == "layers" else None)
    registered: set[tuple[str, str]] = set()
    for name, line in COMMAND_HELP.items():
        registrar = _REGISTRARS.get(name, _LAYERS)
        if command is not None and registrar != wanted:
            sub.add_parser(name, help=line)  # listed; parsed in full only when it is the command
        elif registrar not in registered:
            registered.add(registrar)
            module, function = registrar
            add = _add_layers if registrar == _LAYERS else getattr(importlib.import_module(module), function)
            add(sub)
    return p


def _command(argv: Sequence[str]) -> str:
    """The subcommand ``argv`` runs (its first word that is not an option), or "" (none: ``--help``)."""
    return next((a for a in argv if not a.startswith("-")), "")


DEBUG_ENV = "SHARDPLAN_DEBUG"
INTERNAL_ERROR_STATUS = 3  # a bug of ours (usage errors: 2; "no plan fits": 1)
CACHE_ENV = "SHARDPLAN_CACHE_DIR"  # the CLI's cache folder (compiled programs, cost tables); "off" disables it


def cache_dir() -> Path | None:
    """The folder the CLI keeps its cache in, so that a second run of the
    same command computes little: ``$SHARDPLAN_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/shardplan`` (``~/.cache/shardplan``); None when
    ``SHARDPLAN_CACHE_DIR=off``. Compiled programs go in its ``jax`` folder
    (:func:`compilation_cache_dir`), cost tables in ``cost-tables``."""
    value = os.environ.get(CACHE_ENV)
    if value is not None:
        return None if value.strip().lower() in ("", "off", "0", "none") else Path(value).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "shardplan"


def cache_refusal() -> str | None:
    """Why the CLI must not use :func:`cache_dir` (another user's folder, or
    one every user may write: :func:`planner._cache_folder.cache_folder_refusal`),
    or None when it may (or the cache is off)."""
    from planner._cache_folder import cache_folder_refusal

    root = cache_dir()
    return None if root is None else cache_folder_refusal(root, root / "jax", root / "cost-tables")


def compilation_cache_dir() -> Path | None:
    """The folder the CLI keeps JAX's compilation cache in: :func:`cache_dir`'s
    ``jax`` folder; None when the cache is off or refused (:func:`cache_refusal`)
    or the user set JAX's own ``JAX_COMPILATION_CACHE_DIR`` (then JAX uses that)."""
    root = cache_dir()
    if root is None or os.environ.get("JAX_COMPILATION_CACHE_DIR") or cache_refusal():
        return None
    return root / "jax"


def cost_table_cache_dir() -> Path | None:
    """The folder the CLI keeps cost tables in (:mod:`planner._table_cache`):
    :func:`cache_dir`'s ``cost-tables`` folder; None when the cache is off or refused."""
    root = cache_dir()
    return None if root is None or cache_refusal() else root / "cost-tables"


def _use_compilation_cache() -> None:
    """Point JAX's persistent compilation cache at :func:`compilation_cache_dir`
    (every program cached, however fast it compiled: the CLI's cost tables and
    searches compile in well under JAX's default 1 s threshold). A folder that
    cannot be made leaves the cache off: it only saves time. A folder refused
    (:func:`cache_refusal`) leaves it off with one warning line."""
    refusal = cache_refusal()
    if refusal is not None:
        print(f"{PROG}: warning: not using the cache: {printable(refusal)}; make it your own and not writable by "
              f"others (chmod o-w), or set {CACHE_ENV} to another folder or to off", file=sys.stderr)
        return
    folder = compilation_cache_dir()
    if folder is None:
        return
    try:
        folder.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # this user's alone (cache_refusal)
        folder.mkdir(mode=0o700, exist_ok=True)
    except OSError:
        return
    import jax

    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``shardplan`` command line; returns the exit status: 0, 1 (the
    answer is no: infeasible, out of tolerance), 2 (bad input, one line),
    3 (an internal error: a bug of ours, one line asking for a report, the
    traceback behind ``--debug`` or ``SHARDPLAN_DEBUG=1``), 130
    (interrupted). Called without ``argv`` it is the program: a Ctrl-C at
    any moment is one line and exit 130 (:mod:`planner._interrupt`)."""
    if argv is None:
        from planner._interrupt import exit_on_interrupt

        exit_on_interrupt()
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser(_command(argv))
    debug = "--debug" in argv or os.environ.get(DEBUG_ENV, "") not in ("", "0")
    try:
        args = parser.parse_args(argv)
        check_outputs(args)  # an output that is one of the inputs: refused before any work
        _use_compilation_cache()
        return args.run(args)
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    except KeyboardInterrupt:  # an in-process caller's Ctrl-C
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except (ValueError, ImportError) as e:  # UsageError included
        message = str(e)
    except OSError as e:
        if isinstance(e, BrokenPipeError):  # piped into e.g. head: stop quietly
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return 1
        what = f"cannot read {e.filename}: {e.strerror}" if e.filename else str(e)
        from planner.models.loading import accepted_models

        message = f"{what}; {accepted_models()}"
    except Exception as e:  # a bug of ours, not the user's input (InternalError included)
        if debug:
            raise
        text = printable(one_line(str(e)).removeprefix("internal error: ")[:400])
        print(f"{PROG}: internal error: {type(e).__name__}: {text} (a bug in shardplan, please report it; "
              f"rerun with --debug or {DEBUG_ENV}=1 for the traceback)", file=sys.stderr)
        return INTERNAL_ERROR_STATUS
    print(f"{PROG}: error: {printable(one_line(message))}", file=sys.stderr)  # names from files, escaped
    return 2


def __getattr__(name: str) -> Any:
    """``load_model`` and ``call_factory`` (re-exported), imported on first
    use: ``shardplan --help`` loads neither JAX nor the model loaders."""
    if name in ("load_model", "call_factory"):
        from planner.models import loading

        return getattr(loading, name)
    raise AttributeError(f"module 'planner.cli' has no attribute {name!r}")
