"""Reading and writing the project's files (layer graphs, hardware, plans,
calibrations as JSON; plots) in one strict way.

Reading refuses, with one line naming the file: bytes that are not UTF-8,
malformed JSON, ``NaN`` / ``Infinity`` and numbers that overflow to them
(``1e999``), integers longer than :data:`MAX_INT_DIGITS` digits, and nesting
deeper than :data:`MAX_DEPTH` (none of the formats nests past a handful of
levels). Writing is atomic: the text goes to a temporary file in the target's
folder, is flushed and fsynced, then renamed over the target, so a full disk,
a kill mid-write or two concurrent writers leave either the old file or one
whole new one, never a truncated or interleaved mix (POSIX ``rename``).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["MAX_DEPTH", "MAX_INT_DIGITS", "check_writable", "parse_json", "read_json", "write_atomic"]

MAX_DEPTH = 64  # objects and lists inside each other
MAX_INT_DIGITS = 18  # every count the formats hold (batch, devices, layers) is far below 10**18


def _int(text: str, source: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise ValueError(f"{source}: an integer of {digits} digits; numbers in these files have at most "
                         f"{MAX_INT_DIGITS}")
    return int(text)


def _float(text: str, source: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"{source}: number {text} overflows to infinity; give a finite number")
    return v


def _constant(name: str, source: str) -> Any:
    raise ValueError(f"{source}: {name} is not a number JSON allows; give a finite number")


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            items = v.values()
        elif isinstance(v, list):
            items = v
        else:
            continue
        deepest = max(deepest, d)
        if deepest > MAX_DEPTH:
            return deepest
        stack.extend((x, d + 1) for x in items)
    return deepest


def parse_json(text: str, source: str) -> Any:
    """``text`` parsed strictly (module docstring); errors name ``source``."""
    try:
        data = json.loads(text, parse_int=lambda s: _int(s, source), parse_float=lambda s: _float(s, source),
                          parse_constant=lambda s: _constant(s, source))
    except json.JSONDecodeError as e:
        raise ValueError(f"{source}: malformed JSON: {e}") from None
    except RecursionError:
        raise ValueError(f"{source}: JSON nested too deeply (more than {MAX_DEPTH} levels)") from None
    if _depth(data) > MAX_DEPTH:
        raise ValueError(f"{source}: JSON nested too deeply (more than {MAX_DEPTH} levels)")
    return data


def read_json(path: str | os.PathLike[str], what: str) -> Any:
    """The JSON in file ``path``, a ``what`` ("hardware JSON file", "plan
    file", ...), parsed strictly; one-line errors name the file and what was expected."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except IsADirectoryError:
        raise ValueError(f"{p}: is a folder; expected a {what}") from None
    except OSError as e:
        raise ValueError(f"cannot read {p}: {e.strerror}; expected a {what}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{p}: not UTF-8 text; expected a {what}") from None
    try:
        return parse_json(text, str(p))
    except ValueError as e:
        raise ValueError(f"{e}; expected a {what}") from None


def check_writable(path: str | os.PathLike[str], what: str = "output") -> Path:
    """``path`` as a :class:`Path`, or a one-line ``ValueError`` if a file
    could not be written there (its folder missing or not writable, or the
    path a folder); for checking ``-o`` before long work, not after."""
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"cannot write {what} {p}: it is a folder; give a file name")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise ValueError(f"cannot write {what} {p}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"cannot write {what} {p}: folder {parent} is not writable")
    if p.exists() and not os.access(p, os.W_OK):
        raise ValueError(f"cannot write {what} {p}: the file is not writable")
    return p


def write_atomic(path: str | os.PathLike[str], data: str | bytes) -> None:
    """Write ``data`` (text as UTF-8, or bytes) to ``path`` atomically (module docstring)."""
    p = check_writable(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent if str(p.parent) else ".")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        if p.exists():  # keep the old file's permissions
            os.chmod(tmp, p.stat().st_mode & 0o7777)
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, p)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise ValueError(f"cannot write {p}: {e.strerror}; {'the old file is unchanged' if p.exists() else 'nothing written'}") from None
        raise
    try:  # make the rename itself durable
        dir_fd = os.open(p.parent if str(p.parent) else ".", os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass
