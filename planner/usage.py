"""``UsageError``: a mistake in what the user asked for (a name, a path, an
option), raised by the library's resolvers (:func:`planner.models.loading.load_model`)
and by the command line, which prints it as one line and exits with 2;
``InternalError``, a bug of ours (exit 3); :func:`json_text`, the one way
JSON is written, which never writes ``NaN`` or ``Infinity``."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["InternalError", "UsageError", "json_text", "one_line"]


class UsageError(ValueError):
    """A mistake in what the user asked for: ``what`` is wrong, ``accepted``
    says what would work. ``main`` prints it as one line and exits with 2."""

    def __init__(self, what: str, accepted: str) -> None:
        super().__init__(f"{what}; {accepted}")
        self.what = what
        self.accepted = accepted


class InternalError(RuntimeError):
    """A bug in shardplan, not in what the user gave: the message says what
    went wrong and asks for a report. ``main`` prints it as one line and
    exits with 3."""

    def __init__(self, what: str) -> None:
        super().__init__(f"internal error: {what}. This is a bug in shardplan; please report it, with the model "
                         "or command that shows it")


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines included) as one space."""
    return " ".join(text.split())



def json_text(value: Any, *, indent: int | None = 1, what: str = "the output") -> str:
    """``value`` as JSON (RFC 8259), which has no NaN or infinity: a
    non-finite number in ``value`` is an :class:`InternalError` (every input
    is checked finite and in range, so only a bug of ours can make one)."""
    try:
        return json.dumps(value, indent=indent, allow_nan=False)
    except ValueError as e:
        raise InternalError(f"{what} holds a NaN or infinite number, which JSON cannot hold ({e})") from None
