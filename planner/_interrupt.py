"""Ctrl-C in the ``shardplan`` command line: one line on stderr and exit
status 130 (128 + SIGINT, the shell's convention), at any moment.

The handler writes the line and ends the process at once (``os._exit``):
no ``KeyboardInterrupt`` unwinds through imports (where an extension module
turns it into an ``ImportError``) or through JAX, and no interpreter
teardown races the threads XLA is compiling on (which crashes with SIGSEGV).
A Python signal handler runs between bytecodes of the main thread, so a
Ctrl-C during one long native call (an XLA compilation) takes effect when
that call returns. Only the program installs it (``python -m planner``,
the ``shardplan`` script); in-process callers of :func:`planner.cli.main`
keep their own Ctrl-C. Standard library only: it is installed before
anything else is imported."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

__all__ = ["INTERRUPTED_STATUS", "exit_on_interrupt"]

INTERRUPTED_STATUS = 128 + signal.SIGINT  # 130: the shell's status for a process ended by Ctrl-C
_LINE = b"shardplan: interrupted\n"


def _exit_interrupted(signum: int, frame: Any) -> None:
    os.write(2, _LINE)
    os._exit(INTERRUPTED_STATUS)


def exit_on_interrupt() -> None:
    """Make SIGINT print one line and exit 130 immediately (module
    docstring). Does nothing off the main thread, or where SIGINT is ignored
    (a background job, ``nohup``): that choice is the caller's."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        return
    signal.signal(signal.SIGINT, _exit_interrupted)
