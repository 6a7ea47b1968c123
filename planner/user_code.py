"""The boundary around the user's code: a model factory
(``package.module:factory``), the module it imports, and the forward pass
shardplan traces. Everything shardplan runs of the user's goes through
:func:`user_code`:

* what it prints goes to stderr, so that a command's JSON on stdout stays
  valid;
* what it raises is the user's, not shardplan's: a :class:`UserCodeError`
  (a :class:`~planner.usage.UsageError`, exit status 2 in the command line)
  naming the code and the first line of its exception. ``BaseException``
  subclasses (``GeneratorExit``, a bare ``BaseException``) included:
  ``KeyboardInterrupt`` alone passes through, and ``SystemExit`` is reported
  as the code having called ``exit``. Errors shardplan raises itself inside
  the boundary (:class:`UsageError`, :class:`InternalError`) pass through
  unchanged.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from planner.usage import InternalError, UsageError

__all__ = ["UserCodeError", "first_line", "user_code"]

_FIRST_LINE_CHARS = 200  # an exception's message is cut to its first line, at most this long


class UserCodeError(UsageError):
    """The user's code raised (or exited) while shardplan ran it: ``raised``
    says what it did, ``source`` names the code (``package.module:factory``,
    or the model's class)."""

    def __init__(self, raised: str, source: str, accepted: str) -> None:
        super().__init__(f"{raised} ({source})" if source else raised, accepted)
        self.raised = raised
        self.source = source

    def named(self, source: str) -> UserCodeError:
        """The same error naming ``source`` instead (the factory that made the model)."""
        return UserCodeError(self.raised, source, self.accepted)


def first_line(error: BaseException) -> str:
    """``ValueError: the first line`` of ``error`` (its type alone where its message is empty)."""
    lines = str(error).strip().splitlines()
    text = lines[0].strip()[:_FIRST_LINE_CHARS] if lines else ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


@contextlib.contextmanager
def user_code(who: str, during: str = "", source: str = "", *, errors: bool = True,
              accepted: str = "fix the model's code, or run it alone to see the full traceback") -> Iterator[None]:
    """Run the block as the user's code (module docstring): stdout to stderr,
    and an exception it raises as ``UserCodeError("{who} raised {first line}
    {during} ({source})")``. With ``errors=False`` only stdout is protected
    and exceptions pass through as they are: for a block where shardplan's
    own code does most of the work (compiling a training step around the
    user's forward pass), whose errors may be shardplan's."""
    suffix = f" {during}" if during else ""
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    except (KeyboardInterrupt, UsageError, InternalError):
        raise
    except SystemExit as e:
        if not errors:
            raise
        raise UserCodeError(f"{who} called exit({e.code!r}){suffix}", source, accepted) from None
    except BaseException as e:  # noqa: BLE001 - anything the user's code raises is the user's
        if not errors:
            raise
        raise UserCodeError(f"{who} raised {first_line(e)}{suffix}", source, accepted) from None
