"""``shardplan oracle``: the ParaDL oracle on the command line (issue 4; not yet available)."""

from __future__ import annotations

from typing import Any

__all__ = ["add_oracle_commands"]


def add_oracle_commands(sub: Any) -> None:
    """Register ``oracle`` on an argparse subparsers object (nothing yet)."""
