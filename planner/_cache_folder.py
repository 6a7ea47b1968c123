"""Whether a cache folder is safe to use: what is read from a cache (JAX's
compiled programs, which run as native code; cost tables, which decide a
plan) must be what this user wrote. A folder another user owns, or one every
user may write, could hold what someone else planted: it is refused, and
the work is done without a cache. Standard library only: the command line
checks its cache before importing anything heavy."""

from __future__ import annotations

import os
import stat

__all__ = ["cache_folder_refusal"]


def cache_folder_refusal(*folders: str | os.PathLike[str]) -> str | None:
    """Why the cache in ``folders`` (its folder and subfolders) must not be
    used (one line), or None when it may: refused when one of them is not a
    folder, belongs to another user than this process's, or is writable by
    every user. A folder that does not exist yet may be used (it is made
    with this user's permissions)."""
    for p in folders:
        try:
            st = os.stat(p)
        except FileNotFoundError:
            continue
        except OSError as e:
            return f"{p}: {e.strerror}"
        if not stat.S_ISDIR(st.st_mode):
            return f"{p} is not a folder"
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            return f"{p} belongs to another user (uid {st.st_uid})"
        if st.st_mode & stat.S_IWOTH:
            return f"{p} is writable by every user (mode {stat.S_IMODE(st.st_mode):o})"
    return None
