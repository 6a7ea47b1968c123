"""The compact view of long per-layer tables (``shardplan plan``,
``evaluate`` and ``layers`` on a terminal; ``--full`` turns it off).

A table of more than :data:`COMPACT_ABOVE` rows is shown with runs of
consecutive *plain* rows of one block collapsed into one summary row each;
every other row is shown as it is. What counts as plain is the caller's
(the command-line renderers: a layer on the table's base strategy without
resharding or notable communication; every row of ``layers``). A block is
the layer name without its last ``/`` part (``layer1/0/conv1`` is in
``layer1/0``; ``conv1`` in the top-level block ``""``); when grouping by
those blocks still leaves more than :data:`COMPACT_ABOVE` rows, the blocks
are taken one ``/`` level shorter (``layer1``), and so on up to the top
level. A run shorter than :data:`MIN_GROUP` rows is shown row by row.
Tables of at most :data:`COMPACT_ABOVE` rows are never grouped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["COMPACT_ABOVE", "MIN_GROUP", "NOTABLE_SHARE", "group_rows", "label_group", "plain_cost_rows"]

COMPACT_ABOVE = 40  # tables of more rows than this are grouped (VGG16's 37 layers are not)
MIN_GROUP = 3  # shorter runs of plain rows are shown row by row
NOTABLE_SHARE = 0.01  # a layer whose communication is at least this share of the iteration always shows


def _block(name: str, depth: int) -> str:
    parts = name.split("/")
    return "/".join(parts[: min(depth, len(parts) - 1)])


def _spans_at(names: Sequence[str], plain: Sequence[bool], depth: int) -> tuple[range, ...]:
    out: list[range] = []
    i, n = 0, len(names)
    while i < n:
        j = i + 1
        if plain[i]:
            block = _block(names[i], depth)
            while j < n and plain[j] and _block(names[j], depth) == block:
                j += 1
        if j - i >= MIN_GROUP:
            out.append(range(i, j))
        else:
            out.extend(range(k, k + 1) for k in range(i, j))
        i = j
    return tuple(out)


def group_rows(names: Sequence[str], plain: Sequence[bool], limit: int = COMPACT_ABOVE) -> tuple[range, ...]:
    """The rows of a table (layer ``names`` in order, and whether each may be
    hidden in a group) as consecutive ranges of row indices covering every
    row once, in order: a range of one row is shown as it is, a longer one
    is a group to show as one summary row. At most ``limit`` rows: every
    row is its own range (the table is unchanged). See the module docstring
    for the rule."""
    if len(plain) != len(names):
        raise ValueError(f"group_rows needs one plain flag per row, got {len(plain)} for {len(names)} rows")
    if len(names) <= limit:
        return tuple(range(i, i + 1) for i in range(len(names)))
    depth = max(name.count("/") for name in names)
    while True:
        spans = _spans_at(names, plain, depth)
        if len(spans) <= limit or depth == 0:
            return spans
        depth -= 1


def plain_cost_rows(layers: Sequence[Mapping[str, Any]], base: str, iteration_s: float | None) -> list[bool]:
    """Which rows the compact view may hide in a group: on ``base``, as
    requested, communicating under :data:`NOTABLE_SHARE`
    of the iteration, and resharding nothing the table would show (under
    0.00005 ms) where ``base`` is data parallelism (there resharding marks a
    change of layout), under that share of the iteration otherwise (on
    ``evaluate --strategy filter`` every convolution reshards)."""
    notable = NOTABLE_SHARE * iteration_s if iteration_s else float("inf")
    reshard = 0.5e-7 if base == "data" else max(0.5e-7, notable)
    return [r["strategy"] == base and r.get("requested_strategy", r["strategy"]) == r["strategy"]
            and not r.get("zero_stage") and not r.get("remat")  # a memory lever is shown
            and r["reshard_s"] < reshard and r["comm_s"] < notable for r in layers]


def label_group(names: list[str], span: range) -> str:
    """``… 12 layers (layer1/0/conv1 … layer1/0/relu_2)``."""
    return f"… {len(span)} layers ({names[span.start]} … {names[span.stop - 1]})"
