"""Reading and writing the project's files (layer graphs, hardware, plans,
calibrations as JSON; plots) in one strict way.

Reading (:func:`read_input`) opens only regular files of at most
:data:`MAX_INPUT_BYTES` (a device such as ``/dev/zero``, a pipe, a socket
or a folder is refused before anything is read), then refuses, with one
line naming the file: bytes that are not UTF-8, malformed JSON, ``NaN`` /
``Infinity`` and numbers that overflow to them (``1e999``), integers longer
than :data:`MAX_INT_DIGITS` digits, and nesting deeper than
:data:`MAX_DEPTH` (none of the formats nests past a handful of levels).

Writing (:func:`write_atomic`) never destroys what the path names: a
symbolic link is followed and its target written; a regular file (or a new
one) is written atomically: the text goes to a temporary file in the
target's folder, is flushed and fsynced, then renamed over the target, so a
full disk, a kill mid-write or two concurrent writers leave either the old
file or one whole new one, never a truncated or interleaved mix (POSIX
``rename``); a character device or a pipe (``/dev/null``, a FIFO) and an
already open descriptor (``/dev/stdout``, ``/dev/fd/N``) are written in
place, appending, never replaced; a folder is refused.
:func:`check_not_input` refuses an output that is one of a command's input
files, however named (hard or symbolic links included).
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["FLOAT32_MAX", "FLOAT32_TINY", "MAX_DEPTH", "MAX_INPUT_BYTES", "MAX_INT_DIGITS", "check_float32",
           "check_not_input", "check_writable", "parse_json", "read_input", "read_json", "write_atomic"]

MAX_DEPTH = 64  # objects and lists inside each other
MAX_INT_DIGITS = 18  # every count the formats hold (batch, devices, layers) is far below 10**18
MAX_INPUT_BYTES = 64 * 2**20  # the largest file read: the biggest plan or layer graph is a few MiB
MAX_LINK_HOPS = 40  # symbolic links followed from an output path (Linux's own limit, path_resolution(7))
# The cost model computes in float32 (x64 off): a number a file gives must stay a positive normal
# float32, or it becomes 0 or infinity there and its NaNs reach the answer (IEEE 754 binary32).
FLOAT32_TINY = 2.0**-126  # the smallest positive normal float32, about 1.18e-38
FLOAT32_MAX = (2.0 - 2.0**-23) * 2.0**127  # the largest finite float32, about 3.40e38
_DESCRIPTOR_FOLDER = re.compile(r"/proc/[^/]+/fd")  # /dev/stdout, /dev/fd/N: a descriptor already open



def check_float32(v: float, where: str) -> float:
    """``v`` where it is 0 or within float32's normal range
    (:data:`FLOAT32_TINY` to :data:`FLOAT32_MAX` in magnitude); else a
    ``ValueError`` naming ``where`` (the file and field)."""
    if v != 0 and not FLOAT32_TINY <= abs(v) <= FLOAT32_MAX:
        raise ValueError(f"{where} = {v!r} is outside what float32 holds ({FLOAT32_TINY:.4g} to {FLOAT32_MAX:.4g} "
                         "in magnitude), in which the cost model computes; give a value in that range")
    return v


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


def read_input(path: str | os.PathLike[str], what: str) -> bytes:
    """The bytes of the regular file ``path``, a ``what``; one-line
    ``ValueError`` naming the file and what was expected if it is missing, a
    folder, not a regular file (a device, a pipe, a socket: ``/dev/zero``
    would never end) or more than :data:`MAX_INPUT_BYTES`, each refused
    before anything is read."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # opening a pipe does not wait for a writer
    except IsADirectoryError:
        raise ValueError(f"{p}: is a folder; expected a {what}") from None
    except OSError as e:
        raise ValueError(f"cannot read {p}: {e.strerror}; expected a {what}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        if stat.S_ISDIR(st.st_mode):
            raise ValueError(f"{p}: is a folder; expected a {what}")
        raise ValueError(f"{p}: not a regular file (a device, pipe or socket); expected a {what}")
    with os.fdopen(fd, "rb") as f:
        too_big = (f"{p}: larger than {MAX_INPUT_BYTES // 2**20} MiB, the most an input file may hold; "
                   f"expected a {what}")
        if st.st_size > MAX_INPUT_BYTES:
            raise ValueError(too_big)
        try:
            raw = f.read(MAX_INPUT_BYTES + 1)  # a file growing while read stops at the bound too
        except OSError as e:
            raise ValueError(f"cannot read {p}: {e.strerror}; expected a {what}") from None
    if len(raw) > MAX_INPUT_BYTES:
        raise ValueError(too_big)
    return raw


def read_json(path: str | os.PathLike[str], what: str) -> Any:
    """The JSON in file ``path``, a ``what`` ("hardware JSON file", "plan
    file", ...), read by :func:`read_input` and parsed strictly; one-line
    errors name the file and what was expected."""
    p = Path(path)
    raw = read_input(p, what)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{p}: not UTF-8 text; expected a {what}") from None
    try:
        return parse_json(text, str(p))
    except ValueError as e:
        raise ValueError(f"{e}; expected a {what}") from None


def _resolve(path: str | os.PathLike[str]) -> tuple[Path, bool]:
    """The file ``path`` names once its symbolic links are followed (a
    dangling link: the file it would create), and whether it is an open
    descriptor (``/dev/stdout``, ``/dev/fd/1``), which is written in place."""
    p = os.path.abspath(os.fspath(path))
    for _ in range(MAX_LINK_HOPS):
        folder = os.path.realpath(os.path.dirname(p))
        if _DESCRIPTOR_FOLDER.fullmatch(folder):
            return Path(p), True
        p = os.path.join(folder, os.path.basename(p))
        if not os.path.islink(p):
            return Path(p), False
        p = os.path.abspath(os.path.join(folder, os.readlink(p)))
    raise ValueError(f"cannot write {path}: more than {MAX_LINK_HOPS} symbolic links to follow")


def _in_place(target: Path, descriptor: bool) -> bool:
    """Whether ``target`` is written in place (a device, a pipe, an open
    descriptor) rather than replaced atomically."""
    try:
        mode = os.stat(target).st_mode
    except OSError:
        return False
    return descriptor or not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def check_writable(path: str | os.PathLike[str], what: str = "output") -> Path:
    """The file ``path`` names, symbolic links followed, or a one-line
    ``ValueError`` if :func:`write_atomic` could not write it (its folder
    missing or not writable, the path a folder, the file or device not
    writable); for checking ``-o`` before long work, not after."""
    shown = Path(path)
    given_folder = os.path.dirname(os.fspath(path)) or "."
    if not os.path.isdir(given_folder):  # as the system resolves it: "missing/../x" names no folder
        raise ValueError(f"cannot write {what} {shown}: folder {given_folder} does not exist")
    target, descriptor = _resolve(path)
    if target.is_dir():
        raise ValueError(f"cannot write {what} {shown}: it is a folder; give a file name")
    if _in_place(target, descriptor):
        if not os.access(target, os.W_OK):
            raise ValueError(f"cannot write {what} {shown}: it is not writable")
        return target
    parent = target.parent
    if not parent.is_dir():
        raise ValueError(f"cannot write {what} {shown}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"cannot write {what} {shown}: folder {parent} is not writable")
    if target.exists() and not os.access(target, os.W_OK):
        raise ValueError(f"cannot write {what} {shown}: the file is not writable")
    return target


def check_not_input(output: str | os.PathLike[str], inputs: list[str | os.PathLike[str]], what: str = "-o") -> None:
    """A one-line ``ValueError`` if ``output`` is one of the files ``inputs``,
    however named (same device and inode: hard links and symbolic links
    included); paths that name no file, and outputs that are not regular
    files (``/dev/null``), are never the same."""
    try:
        out = os.stat(_resolve(output)[0])  # the file write_atomic would write
    except (OSError, ValueError):
        return
    if not stat.S_ISREG(out.st_mode):
        return
    for source in inputs:
        try:
            st = os.stat(source)
        except (OSError, ValueError):
            continue
        if (st.st_dev, st.st_ino) == (out.st_dev, out.st_ino):
            same = "" if os.fspath(source) == os.fspath(output) else f" (the same file as {source})"
            raise ValueError(f"{what} {output} is one of this command's input files{same}; writing it would "
                             "destroy the input: give another output file")


def _write_in_place(target: Path, data: bytes) -> None:
    fd = os.open(target, os.O_WRONLY | os.O_APPEND)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike[str], data: str | bytes) -> None:
    """Write ``data`` (text as UTF-8, or bytes) to ``path`` without destroying
    what it names (module docstring): a regular file atomically, a device,
    pipe or open descriptor in place, through symbolic links."""
    p = check_writable(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    if _in_place(p, _resolve(path)[1]):
        try:
            _write_in_place(p, payload)
        except OSError as e:
            raise ValueError(f"cannot write {path}: {e.strerror}") from None
        return
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
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
            raise ValueError(f"cannot write {path}: {e.strerror}; "
                             f"{'the old file is unchanged' if p.exists() else 'nothing written'}") from None
        raise
    try:  # make the rename itself durable
        dir_fd = os.open(p.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass
