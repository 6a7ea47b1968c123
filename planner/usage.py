"""``UsageError``: a mistake in what the user asked for (a name, a path, an
option), raised by the library's resolvers (:func:`planner.models.loading.load_model`)
and by the command line, which prints it as one line and exits with 2."""

from __future__ import annotations

__all__ = ["UsageError", "one_line"]


class UsageError(ValueError):
    """A mistake in what the user asked for: ``what`` is wrong, ``accepted``
    says what would work. ``main`` prints it as one line and exits with 2."""

    def __init__(self, what: str, accepted: str) -> None:
        super().__init__(f"{what}; {accepted}")
        self.what = what
        self.accepted = accepted


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines included) as one space."""
    return " ".join(text.split())

