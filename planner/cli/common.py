"""What every ``shardplan`` subcommand module shares: the program name, the
argument parser whose usage errors are one line, and the JSON layout of
reports. (The subcommands import this, never :mod:`planner.cli`, which
imports them.)"""

from __future__ import annotations

import argparse
import json
from typing import Any, NoReturn

from planner.usage import UsageError

__all__ = ["PROG", "Parser", "add_on_unsupported", "dump_json"]

PROG = "shardplan"


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (raised, printed by ``main``)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message, f"see '{self.prog} --help'")


def dump_json(report: dict[str, Any]) -> str:
    """Indented JSON with one line per layer row (``json.loads`` reads it back)."""
    lines = []
    for key, value in report.items():
        if key == "layers":
            rows = ",\n".join(f"  {json.dumps(row)}" for row in value)
            lines.append(f' "layers": [\n{rows}\n ]')
        else:
            lines.append(f" {json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(lines) + "\n}"


def add_on_unsupported(parser: argparse.ArgumentParser) -> None:
    """The ``--on-unsupported`` option of the commands that read a MODEL."""
    parser.add_argument(
        "--on-unsupported", choices=("error", "replicate"), default="error",
        help="for a package.module:factory MODEL: an operation the extraction cannot map to a layer kind is an "
             "error (default), or kept as a replicated layer costed from its FLOPs; a plan records it, so "
             "validate and planner.shard extract the model the same way",
    )
