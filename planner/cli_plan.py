"""``shardplan plan``: per-layer planning on the command line (issue 5; not yet available)."""

from __future__ import annotations

from typing import Any

__all__ = ["add_plan_commands"]


def add_plan_commands(sub: Any) -> None:
    """Register ``plan`` on an argparse subparsers object (nothing yet)."""
