"""``UsageError``: a mistake in what the user asked for (a name, a path, an
option), raised by the library's resolvers (:func:`planner.models.loading.load_model`)
and by the command line, which prints it as one line and exits with 2."""

from __future__ import annotations

__all__ = ["InternalError", "UsageError", "one_line"]


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

