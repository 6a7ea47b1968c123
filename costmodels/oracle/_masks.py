"""ParaDL's ``.lc`` strategy masks (ParaDL §5): which layers a filter, channel
or spatial configuration splits, read from a file or defaulted, for the
oracle's layer table (:mod:`costmodels.oracle._layers`)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence

import numpy as np

from costmodels.layers import LayerKind
from costmodels.oracle._layers import MASK_FAMILIES, OracleLayers

__all__ = ["default_masks", "lc_family", "load_lc", "parse_lc", "resolve_masks"]


_LC_NAME = re.compile(r"^\s*(?:\d+\s+)?(\S*)\s*$")


def parse_lc(text: str, layers: OracleLayers, *, source: str = "<lc>") -> np.ndarray:
    """A ParaDL ``.lc`` mask (``IDX NAME |0`` or ``|1``, one line per ``.net``
    layer, §5) as a bool array over ``layers``. The names must match the rows
    (``RELU`` matches ``RELU_3``, the importer's numbering)."""
    values, lines = [], []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        fields = line.split("|")
        if len(fields) < 2:
            raise ValueError(f"{source}:{lineno}: {line.strip()!r} has no '|'; expected 'IDX NAME |0' or '|1'")
        v = fields[1].strip()
        if v not in ("0", "1", ""):
            raise ValueError(f"{source}:{lineno}: value {v!r} is not 0 or 1; expected 'IDX NAME |0' or '|1'")
        match = _LC_NAME.match(fields[0])
        values.append(v == "1")
        lines.append((lineno, match.group(1) if match else ""))
    if len(values) != layers.n:
        raise ValueError(
            f"{source}: {len(values)} mask lines for {layers.n} layers of {layers.model_name!r}; "
            "expected one line per layer of the .net file, in order"
        )
    for k, ((lineno, name), have) in enumerate(zip(lines, layers.names, strict=True)):
        if name and not (have == name or have.startswith(name + "_")):
            raise ValueError(
                f"{source}:{lineno}: mask entry {k} names {name!r} but layer {k} of the model is {have!r}; "
                "expected the .net file's layer names, in order"
            )
    return np.asarray(values, dtype=bool)


def load_lc(path: str | os.PathLike[str], layers: OracleLayers) -> np.ndarray:
    """Read a ``.lc`` file (:func:`parse_lc`)."""
    from costmodels.files import read_input

    source = os.fspath(path)
    raw = read_input(source, ".lc mask file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{source}: not UTF-8 text; expected a .lc mask file") from None
    return parse_lc(text, layers, source=source)


def lc_family(path: str | os.PathLike[str]) -> str:
    """Which strategies a ``.lc`` file configures, from its name's prefix
    (``filter_vgg.lc`` -> ``filter``), as the shipped files are named."""
    base = os.path.basename(os.fspath(path)).lower()
    for fam in MASK_FAMILIES:
        if base.startswith(fam):
            return fam
    raise ValueError(
        f"cannot tell which strategy {os.fspath(path)!r} configures; name it filter_*.lc, channel_*.lc or "
        "spatial_*.lc, or pass FAMILY=FILE (e.g. filter=my.lc)"
    )


def default_masks(layers: OracleLayers, compat: bool) -> dict[str, np.ndarray]:
    """Masks when no ``.lc`` is given. Compat: every layer (the original's
    behaviour without ``--lc``). Default: filter = the convs (as the shipped
    masks); channel = the convs not fed by the model input (§2: channel
    parallelism starts at layer 2); spatial = every layer with spatial input
    and output (split dim > 1) from the start to the first one without
    (flatten, dense, global pool)."""
    if compat:
        ones = np.ones(layers.n, bool)
        return {f: ones for f in MASK_FAMILIES}
    conv = layers.kind == LayerKind.CONV
    spatial_rows = (
        (layers.spatial_rank > 0) & (layers.out_spatial_rank > 0) & (layers.kind != LayerKind.DENSE)
        & (layers.in_spatial[:, 0] > 1) & (layers.out_spatial[:, 0] > 1)
    )
    stop = np.flatnonzero(~spatial_rows)
    end = stop[0] if stop.size else layers.n
    spatial = np.zeros(layers.n, bool)
    spatial[:end] = spatial_rows[:end]
    return {"filter": conv, "channel": conv & ~layers.source, "spatial": spatial}


def resolve_masks(
    layers: OracleLayers, compat: bool, given: Mapping[str, Sequence[bool] | np.ndarray] | None
) -> dict[str, np.ndarray]:
    """The default masks overridden by ``given``; a filter mask also serves
    channel when no channel mask is given (ParaDL ran channel with
    ``filter_vgg.lc``, §7.2)."""
    masks = default_masks(layers, compat)
    given = dict(given or {})
    unknown = sorted(set(given) - set(MASK_FAMILIES))
    if unknown:
        raise ValueError(f"unknown mask family {unknown[0]!r}; expected one of {', '.join(MASK_FAMILIES)}")
    for fam, m in given.items():
        m = np.asarray(m, dtype=bool)
        if m.shape != (layers.n,):
            raise ValueError(f"{fam} mask has {m.size} entries for {layers.n} layers; expected one per layer")
        masks[fam] = m
    if "filter" in given and "channel" not in given:
        masks["channel"] = masks["filter"]
    return masks


# -- compute time (§4.10) --------------------------------------------------------------
