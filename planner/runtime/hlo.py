"""Collectives of a compiled XLA program, read from its HLO text
(``compiled.as_text()``), each mapped back to the mesh axes it runs over.

What is parsed (jax-notes.md §3, "Parsing collectives"):

* kinds ``all-reduce``, ``all-gather``, ``reduce-scatter``, ``all-to-all``,
  ``collective-permute``, and their asynchronous ``-start`` forms (GPU/TPU;
  the matching ``-done`` is skipped so nothing is counted twice);
* tuple-shaped (combined) collectives: the bytes of every element are summed;
* the three replica-group formats that one HLO can mix: explicit
  ``{{0,1},{2,3}}`` (``{}`` = one group of every device), iota
  ``[4,2]<=[8]`` (optionally transposed, ``[2,4]<=[4,2]T(1,0)``) and the
  mesh format ``mesh['axis_0'=4,'axis_1'=2] {'axis_0'}`` whose axis names
  are XLA's own; ``collective-permute`` gives ``source_target_pairs``.

Every format is expanded to explicit groups of logical device ids (the
position in the program's device assignment, which for a jitted program on
a mesh is the mesh's flattened device order), then labelled with the user
mesh's axes by comparing against the groups each subset of axes produces.

``bytes_per_device`` is the collective's result size on one device, as the
HLO states it: the gathered buffer of an all-gather, the reduced buffer of an
all-reduce, one shard of a reduce-scatter, the local pieces of an all-to-all.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections.abc import Sequence

import numpy as np

__all__ = ["DTYPE_BYTES", "HloCollective", "expand_replica_groups", "label_mesh_axes", "parse_collectives"]

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")

DTYPE_BYTES = {
    "pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3": 1, "f8e4m3fnuz": 1, "f8e5m2fnuz": 1,
    "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
    "s32": 4, "u32": 4, "f32": 4,
    "s64": 8, "u64": 8, "f64": 8, "c64": 8,
    "c128": 16,
}

_OP = re.compile(
    r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(?P<shape>.+?)\s+(?P<kind>"
    + "|".join(re.escape(k) for k in KINDS)
    + r")(?P<start>-start)?\((?P<rest>.*)$"
)
_ARRAY = re.compile(r"\b([a-z]+\d*[a-z0-9]*)\[([\d,]*)\]")
_EXPLICIT = re.compile(r"replica_groups=\{((?:\{[\d,\s]*\},?\s*)*)\}")
_IOTA = re.compile(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?")
_MESH = re.compile(
    r"replica_groups=mesh\[([^\]]*)\](?:,\s*device_ids=\((.*?)\))?\s*\{([^}]*)\}"
)
_PAIRS = re.compile(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}")
_OP_NAME = re.compile(r'op_name="([^"]*)"')


@dataclasses.dataclass(frozen=True)
class HloCollective:
    kind: str  # all-reduce | all-gather | reduce-scatter | all-to-all | collective-permute
    bytes_per_device: int  # result size on one device, tuple elements summed
    groups: tuple[tuple[int, ...], ...]  # logical device ids; for a permute, its (source, target) pairs
    axes: tuple[str, ...] | None  # user mesh axes, None if the groups match no set of axes
    op_name: str  # the metadata op_name (coarse attribution)
    asynchronous: bool = False


def _array_bytes(shape_text: str) -> list[int]:
    out = []
    for dtype, dims in _ARRAY.findall(shape_text):
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"unknown HLO element type {dtype!r} in {shape_text!r}")
        n = math.prod(int(d) for d in dims.split(",") if d) if dims else 1
        out.append(n * DTYPE_BYTES[dtype])
    return out


def expand_replica_groups(line: str, num_devices: int) -> tuple[tuple[int, ...], ...]:
    """Explicit groups of a collective's HLO line, whatever its format."""
    m = _IOTA.search(line)
    if m:
        shape = [int(x) for x in m.group(1).split(",")]
        reshape = [int(x) for x in m.group(2).split(",")]
        ids = np.arange(math.prod(reshape)).reshape(reshape)
        if m.group(3):
            ids = ids.transpose([int(x) for x in m.group(3).split(",")])
        ids = ids.reshape(shape)
        return tuple(tuple(int(v) for v in row) for row in ids.reshape(shape[0], -1))
    m = _MESH.search(line)
    if m:
        axes = re.findall(r"'([^']+)'\s*=\s*(\d+)", m.group(1))
        names = [a for a, _ in axes]
        sizes = [int(s) for _, s in axes]
        over = re.findall(r"'([^']+)'", m.group(3))
        unknown = set(over) - set(names)
        if unknown:
            raise ValueError(f"mesh replica groups name unknown axes {sorted(unknown)}: {line.strip()[:200]}")
        ids = _device_ids(m.group(2), math.prod(sizes), line).reshape(sizes)
        keep = [i for i, n in enumerate(names) if n not in over]
        moved = np.moveaxis(ids, [names.index(o) for o in over], list(range(len(keep), len(names))))
        size = math.prod(sizes[names.index(o)] for o in over)
        return tuple(tuple(int(v) for v in row) for row in moved.reshape(-1, size))
    m = _EXPLICIT.search(line)
    if m:
        groups = tuple(
            tuple(int(v) for v in g.split(",") if v.strip())
            for g in re.findall(r"\{([\d,\s]*)\}", m.group(1))
        )
        return groups if groups else (tuple(range(num_devices)),)
    if "replica_groups" not in line:
        return (tuple(range(num_devices)),)
    raise ValueError(f"unrecognised replica_groups format: {line.strip()[:200]}")


def _device_ids(text: str | None, n: int, line: str) -> np.ndarray:
    """The device at each position of a mesh-format group's mesh: absent =
    identity, an iota ``[2,4]T(1,0)`` or an explicit list ``[0,2,1,3]``."""
    if not text:
        return np.arange(n)
    it = re.fullmatch(r"\s*\[([\d,]+)\](?:T\(([\d,]+)\))?\s*", text)
    if it and it.group(2):
        dims = [int(x) for x in it.group(1).split(",")]
        ids = np.arange(math.prod(dims)).reshape(dims).transpose([int(x) for x in it.group(2).split(",")])
    elif it:
        values = [int(x) for x in it.group(1).split(",")]
        ids = np.asarray(values) if len(values) == n else np.arange(math.prod(values))
    else:
        ids = np.asarray([int(x) for x in re.findall(r"\d+", text)])
    if ids.size != n:
        raise ValueError(f"mesh device_ids do not match the mesh size {n}: {line.strip()[:200]}")
    return ids.reshape(-1)


def label_mesh_axes(
    groups: Sequence[Sequence[int]], mesh_shape: Sequence[int], axis_names: Sequence[str]
) -> tuple[str, ...] | None:
    """The mesh axes whose groups (devices differing only along those axes, in
    the mesh's row-major logical order) equal ``groups``; None if none do."""
    target = {frozenset(g) for g in groups}
    ids = np.arange(math.prod(mesh_shape)).reshape(mesh_shape)
    for r in range(1, len(axis_names) + 1):
        for subset in itertools.combinations(range(len(axis_names)), r):
            rest = [i for i in range(len(axis_names)) if i not in subset]
            moved = np.transpose(ids, rest + list(subset)).reshape(-1, math.prod(mesh_shape[i] for i in subset))
            if {frozenset(int(v) for v in row) for row in moved} == target:
                return tuple(axis_names[i] for i in subset)
    return None


def parse_collectives(
    hlo_text: str, mesh_shape: Sequence[int] | None = None, axis_names: Sequence[str] | None = None
) -> tuple[HloCollective, ...]:
    """Every collective of a compiled HLO module, with its mesh axes when a
    mesh (shape and axis names) is given."""
    if (mesh_shape is None) != (axis_names is None):
        raise ValueError("give both mesh_shape and axis_names, or neither")
    num_devices = math.prod(mesh_shape) if mesh_shape is not None else 0
    out = []
    for line in hlo_text.splitlines():
        m = _OP.match(line)
        if not m:
            continue
        kind, is_async = m.group("kind"), bool(m.group("start"))
        sizes = _array_bytes(m.group("shape"))
        # an async start returns (operands..., results..., [u32 contexts]), the operands as a nested tuple in
        # XLA:GPU's ((operands), results) form (a reduce-scatter; an all-reduce for an H100); keep the results.
        # A flat all-reduce start's tuple is its combined results.
        nested = m.group("shape").lstrip().startswith("((")
        if is_async and len(sizes) > 1 and (nested or kind in ("all-gather", "collective-permute", "all-to-all")):
            data = [s for s in sizes if s]
            sizes = data[len(data) // 2:]
        nbytes = sum(sizes)
        if kind == "collective-permute":
            p = _PAIRS.search(line)
            groups = tuple((int(a), int(b)) for a, b in re.findall(r"\{(\d+),(\d+)\}", p.group(1))) if p else ()
            axes = None
            if mesh_shape is not None and groups:
                # a permute runs along the axes its (source, target) pairs stay within
                linked = _components(groups, num_devices)
                axes = label_mesh_axes(linked, mesh_shape, axis_names) or _containing_axes(
                    groups, mesh_shape, axis_names)
        else:
            groups = expand_replica_groups(line, num_devices)
            axes = label_mesh_axes(groups, mesh_shape, axis_names) if mesh_shape is not None else None
        name = _OP_NAME.search(line)
        out.append(HloCollective(kind, int(nbytes), groups, axes, name.group(1) if name else "", is_async))
    return tuple(out)


def _containing_axes(
    pairs: Sequence[tuple[int, int]], mesh_shape: Sequence[int], axis_names: Sequence[str]
) -> tuple[str, ...] | None:
    """The smallest set of mesh axes whose groups hold both ends of every pair
    (a permute between some neighbours of an axis only, e.g. a halo exchange
    that skips the edge shards)."""
    ids = np.arange(math.prod(mesh_shape)).reshape(mesh_shape)
    coords = {int(ids[idx]): idx for idx in np.ndindex(*mesh_shape)}
    for r in range(1, len(axis_names) + 1):
        for subset in itertools.combinations(range(len(axis_names)), r):
            fixed = [i for i in range(len(axis_names)) if i not in subset]
            if all(all(coords[a][i] == coords[b][i] for i in fixed) for a, b in pairs):
                return tuple(axis_names[i] for i in subset)
    return None


def _components(pairs: Sequence[tuple[int, int]], n: int) -> tuple[tuple[int, ...], ...]:
    """Connected components of the devices a permute links (isolated devices alone)."""
    parent = list(range(n))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for a, b in pairs:
        parent[find(a)] = find(b)
    comps: dict[int, list[int]] = {}
    for i in range(n):
        comps.setdefault(find(i), []).append(i)
    return tuple(tuple(c) for c in comps.values())
