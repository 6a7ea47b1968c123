"""Cost tables kept on disk between runs of the command line.

:func:`costmodels.cost_table` is a pure function of its arrays and static
settings, so its result can be kept: a second ``shardplan plan`` of the same
model, hardware and mesh reads the table instead of tracing and running the
cost model again (tracing alone takes about half a second). The key is a
SHA-256 of every input's dtype, shape and bytes, the settings, the cost
model's own source files, and the JAX and NumPy versions, so a changed
input, a changed cost model or a new JAX computes afresh. A file that cannot
be read is computed again and rewritten; a folder that cannot be written
only costs the time: the cache never changes an answer.

Only the command line turns it on (``planner.plan(..., cache_dir=)``); each
entry is one ``.npz`` of the table's arrays, written atomically.
"""

from __future__ import annotations

import hashlib
import io
import warnings
import zipfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

from planner._cache_folder import cache_folder_refusal

__all__ = ["cached_cost_table", "cost_model_fingerprint"]

_XLA_CPU = "xla_cpu."  # prefix of the XLA:CPU buffer fields in a file


def cost_model_fingerprint() -> str:
    """SHA-256 of the cost model's source (every ``.py`` file of
    :mod:`costmodels`, by path and content) and the JAX and NumPy versions."""
    import costmodels
    import jax

    root = Path(costmodels.__file__).resolve().parent
    h = hashlib.sha256(f"jax {jax.__version__} numpy {np.__version__}".encode())
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def _update(h, value: Any) -> None:
    """Feed ``value`` (a pytree of arrays and numbers, a string, None) into ``h``."""
    import jax

    leaves, treedef = jax.tree_util.tree_flatten(value)
    h.update(str(treedef).encode())
    for leaf in leaves:
        a = np.asarray(leaf)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(np.ascontiguousarray(a).tobytes())


def _key(fingerprint: str, args: tuple, settings: Any) -> str:
    h = hashlib.sha256(fingerprint.encode())
    h.update(repr(settings).encode())
    for a in args:
        _update(h, a)
    return h.hexdigest()


def _read(path: Path):
    """The table in ``path``, or None when there is none or it cannot be read."""
    from costmodels import CostTable, XlaCpuBuffers
    import jax

    try:
        with np.load(path) as f:
            arrays = {k: f[k] for k in f.files}
        table = {k: jax.device_put(v) for k, v in arrays.items() if not k.startswith(_XLA_CPU)}
        xla = {k[len(_XLA_CPU):]: jax.device_put(v) for k, v in arrays.items() if k.startswith(_XLA_CPU)}
        return CostTable(**table, xla_cpu=XlaCpuBuffers(**xla) if xla else None)
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile):
        return None


def _write(path: Path, table) -> None:
    """``table``'s arrays into ``path`` (:func:`costmodels.write_atomic`; nothing when it cannot be written)."""
    from costmodels import write_atomic

    arrays = {k: np.asarray(v) for k, v in table._asdict().items() if k != "xla_cpu"}
    if table.xla_cpu is not None:
        arrays.update({_XLA_CPU + k: np.asarray(v) for k, v in table.xla_cpu._asdict().items()})
    data = io.BytesIO()
    np.savez(data, **arrays)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_atomic(path, data.getvalue())
    except (OSError, ValueError):  # ValueError: costmodels.check_writable's "folder not writable"
        return


def cached_cost_table(compute: Callable[[], Any], inputs: tuple, settings: Any, cache_dir: Path | None,
                      fingerprint: str | None = None):
    """``compute()``, a :func:`costmodels.cost_table` of ``inputs`` (its
    arrays, numbers and calibration) under ``settings``: read from
    ``cache_dir`` where an earlier call with the same inputs left it, else
    computed and written there; without ``cache_dir``, just computed.
    ``fingerprint`` (:func:`cost_model_fingerprint`) may be passed in to hash
    the source once for several tables. A ``cache_dir`` another user owns,
    or every user may write, is not used (a ``RuntimeWarning`` says so:
    :func:`planner._cache_folder.cache_folder_refusal`)."""
    if cache_dir is None:
        return compute()
    refusal = cache_folder_refusal(cache_dir)
    if refusal is not None:  # what another user could have planted is not read
        warnings.warn(f"not using the cost-table cache: {refusal}", RuntimeWarning, stacklevel=2)
        return compute()
    path = Path(cache_dir) / f"{_key(fingerprint or cost_model_fingerprint(), inputs, settings)}.npz"
    table = _read(path)
    if table is None:
        table = compute()
        _write(path, table)
    return table
