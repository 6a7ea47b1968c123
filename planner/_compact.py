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

Repeated blocks: where the caller gives each row a key (its kind and
strategy, say), a run of numbered blocks (``blocks/1``, ``blocks/2``, ...: a
name's path up to its first number) alike the block before them (the same
layer names inside, the same keys) is one summary row after that block,
shown in full: a 32-block Llama's plan is its first block and one row for
the 31 like it, not 400 rows.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

__all__ = ["COMPACT_ABOVE", "MIN_GROUP", "NOTABLE_SHARE", "group_rows", "label_group", "numbered_block",
           "plain_cost_rows", "repeats_block"]

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


def group_rows(names: Sequence[str], plain: Sequence[bool], limit: int = COMPACT_ABOVE,
               keys: Sequence[Hashable] | None = None) -> tuple[range, ...]:
    """The rows of a table (layer ``names`` in order, and whether each may be
    hidden in a group) as consecutive ranges of row indices covering every
    row once, in order: a range of one row is shown as it is, a longer one
    is a group to show as one summary row. At most ``limit`` rows: every
    row is its own range (the table is unchanged). With ``keys`` (one per
    row), runs of repeated blocks are one range each. See the module
    docstring for the rule."""
    if len(plain) != len(names):
        raise ValueError(f"group_rows needs one plain flag per row, got {len(plain)} for {len(names)} rows")
    if keys is not None and len(keys) != len(names):
        raise ValueError(f"group_rows needs one key per row, got {len(keys)} for {len(names)} rows")
    if len(names) <= limit:
        return tuple(range(i, i + 1) for i in range(len(names)))
    repeats = _repeated_blocks(names, keys) if keys is not None else ()
    depth = max(name.count("/") for name in names)
    while True:
        spans = _merge_repeats(_spans_at(names, plain, depth), repeats)
        if len(spans) <= limit or depth == 0:
            return spans
        depth -= 1


def numbered_block(name: str) -> str | None:
    """A layer name's path up to its first number (``blocks/3/attn/qkv`` ->
    ``blocks/3``), or None where no part of it is a number."""
    parts = name.split("/")
    for i, part in enumerate(parts[:-1]):
        if part.isdigit():
            return "/".join(parts[: i + 1])
    return None


def _repeated_blocks(names: Sequence[str], keys: Sequence[Hashable]) -> tuple[range, ...]:
    """Ranges of rows of consecutive numbered blocks alike the block before
    them (the same names after the block's path, the same keys), at least
    :data:`MIN_GROUP` blocks each; the block before stays out."""
    blocks: list[tuple[str | None, range]] = []  # consecutive rows of one numbered block (None: none)
    i = 0
    while i < len(names):
        b, j = numbered_block(names[i]), i + 1
        while j < len(names) and b is not None and numbered_block(names[j]) == b:
            j += 1
        blocks.append((b, range(i, j)))
        i = j

    def shape(block: tuple[str | None, range]) -> tuple | None:
        b, rows = block
        if b is None:
            return None
        return b.rpartition("/")[0], tuple((names[r][len(b):], keys[r]) for r in rows)

    out: list[range] = []
    k = 1
    while k < len(blocks):
        first = shape(blocks[k - 1])
        end = k
        while end < len(blocks) and first is not None and shape(blocks[end]) == first:
            end += 1
        if end - k >= MIN_GROUP:
            out.append(range(blocks[k][1].start, blocks[end - 1][1].stop))
        k = max(end, k + 1)
    return tuple(out)


def _merge_repeats(spans: tuple[range, ...], repeats: tuple[range, ...]) -> tuple[range, ...]:
    """``spans`` with those inside a run of repeated blocks made one range
    (a run that some span crosses is left as it is)."""
    out = list(spans)
    for rep in repeats:
        inside = [s for s in out if s.start >= rep.start and s.stop <= rep.stop]
        if sum(len(s) for s in inside) == len(rep):
            out = [s for s in out if not (s.start >= rep.start and s.stop <= rep.stop)] + [rep]
    return tuple(sorted(out, key=lambda s: s.start))


def repeats_block(names: Sequence[str], span: range) -> str | None:
    """Where ``span`` is a run of repeated blocks: the block they repeat (the
    one just before), else None."""
    if len(span) < 2 or span.start == 0:
        return None
    first, last, before = (numbered_block(names[i]) for i in (span.start, span.stop - 1, span.start - 1))
    if first is None or last is None or before is None or len({first, last, before}) < 3:
        return None  # not numbered blocks, one block only, or the span starts inside its first block
    return before if first.rpartition("/")[0] == before.rpartition("/")[0] else None


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
    """``… 12 layers (layer1/0/conv1 … layer1/0/relu_2)``; for repeated
    blocks, ``… 403 layers (blocks/1/norm1 … blocks/31/add_1), 31 blocks like blocks/0``."""
    label = f"… {len(span)} layers ({names[span.start]} … {names[span.stop - 1]})"
    like = repeats_block(names, span)
    if like is not None:
        label += f", {len({numbered_block(names[i]) for i in span})} blocks like {like}"
    return label
