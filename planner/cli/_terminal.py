"""The one rich console every ``shardplan`` table, summary and progress bar
is printed through: each string it renders (a cell, a title, a caption, a
printed line) has its control characters escaped first
(:func:`planner._format.printable`), so that a name read from a file (a
``.net`` layer, a hardware preset's name) reaches the terminal as text,
never as an escape sequence it acts on."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.text import Text

from planner._format import printable

__all__ = ["console"]


class _PrintableConsole(Console):
    """A rich ``Console`` whose every rendered string is :func:`printable`
    (``render_str`` is where rich turns each string, markup and all, into text)."""

    def render_str(self, text: str, **options: Any) -> Text:
        return super().render_str(printable(text), **options)


def console(stderr: bool = False) -> Console:
    """The console for the command's tables (stdout), or for its progress (``stderr=True``)."""
    return _PrintableConsole(stderr=stderr)
