"""What every ``shardplan`` subcommand module shares: the program name, the
argument parser whose usage errors are one line, and the JSON layout of
reports. (The subcommands import this, never :mod:`planner.cli`, which
imports them.)"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, NoReturn

from planner.ir.unsupported import ON_UNSUPPORTED
from planner.usage import UsageError, json_text

__all__ = ["COMMAND_HELP", "MODEL_HELP", "PROG", "Parser", "add_model_argument", "check_outputs", "dump_json",
           "notes_to_stderr"]

PROG = "shardplan"

# each subcommand's one-line help, in the order --help lists them (the command line builds only
# the subcommand it runs, and lists the others by these lines)
COMMAND_HELP = {
    "layers": "print a model's per-layer table",
    "hardware": "list hardware presets or show one",
    "evaluate": "cost of one plan: per-layer time and memory",
    "oracle": "ParaDL oracle: every strategy's time, memory, limits and bottleneck",
    "plan": "search the fastest per-layer sharding within a memory limit",
    "profile": "time every layer on this machine and write a calibration file",
    "validate": "compare a plan's predicted memory and communication with the compiled program",
    "plot": "draw a plan file: per-layer time and memory, optionally the search history",
}


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (raised, printed by ``main``)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message, f"see '{self.prog} --help'")


# every subcommand's file arguments, by their argparse names: what it reads, and what it writes
INPUT_ARGUMENTS = ("model", "name", "plan", "hardware", "calibration", "lc")
OUTPUT_ARGUMENTS = {"output": "-o", "plot": "--plot"}


def check_outputs(args: argparse.Namespace) -> None:
    """Refuse (``ValueError``, one line) an output file that is one of the
    command's input files, however named (:func:`costmodels.check_not_input`),
    before any work: ``plan graph.json -o graph.json`` would destroy the graph."""
    outputs = {flag: getattr(args, name) for name, flag in OUTPUT_ARGUMENTS.items() if getattr(args, name, None)}
    if not outputs:
        return
    from costmodels import check_not_input

    inputs: list[str] = []
    for name in INPUT_ARGUMENTS:
        value = getattr(args, name, None)
        inputs.extend(value if isinstance(value, list) else [value] if isinstance(value, str) else [])
    for flag, path in outputs.items():
        check_not_input(path, inputs, flag)


def dump_json(report: dict[str, Any]) -> str:
    """Indented JSON with one line per layer row (``json.loads`` reads it back)."""
    lines = []
    for key, value in report.items():
        if key == "layers":
            rows = ",\n".join(f"  {json_text(row, indent=None)}" for row in value)
            lines.append(f' "layers": [\n{rows}\n ]')
        else:
            lines.append(f" {json.dumps(key)}: {json_text(value, indent=None)}")
    return "{\n" + ",\n".join(lines) + "\n}"


def notes_to_stderr(progress: Any = None, verify_notes: bool = False):
    """A callback that prints each distinct ``calibration`` event, and with
    ``verify_notes`` each ``verify`` event saying why a plan was not verified, as one
    ``shardplan: note:`` line on stderr (always: what the answer rests on),
    and hands every event to ``progress`` (the terminal's status) if given."""
    shown: set[str] = set()

    def callback(event) -> None:
        noted = event.stage == "calibration" or (verify_notes and event.stage == "verify"
                                                 and event.message.startswith("not verified"))
        if noted and event.message not in shown:
            shown.add(event.message)
            print(f"{PROG}: note: {event.message}", file=sys.stderr)
        if progress is not None:
            progress(event)

    return callback


MODEL_HELP = "built-in model name, ParaDL .net file, layer-graph .json file or package.module:factory"


def add_model_argument(parser: argparse.ArgumentParser) -> None:
    """The MODEL argument of the commands that load a model
    (:func:`planner.models.loading.load_model`) and its ``--on-unsupported``."""
    parser.add_argument("model", metavar="MODEL", help=MODEL_HELP)
    parser.add_argument(
        "--on-unsupported", choices=ON_UNSUPPORTED, default="error",
        help="for a package.module:factory MODEL: an operation the extraction cannot map to a layer kind is an "
             "error (default), or kept as a replicated layer costed from its FLOPs; a plan records it, so "
             "validate and planner.shard extract the model the same way",
    )
