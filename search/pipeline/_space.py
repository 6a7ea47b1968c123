"""The configurations a pipelined chain of identical blocks can run, as
arrays (host-side NumPy): every tensor size ``t``, stage count ``S``,
micro-batch size ``b``, interleave ``v``, recomputation and sequence
parallelism that divides what it must divide.

* ``t`` divides the heads and stays inside a node (tensor-parallel
  collectives on the fastest tier, Narayanan et al. 2021, §3.2: "tensor
  model parallelism up to the GPUs in a node"), unless the space names a
  larger one;
* ``S`` divides the blocks (balanced stages) and ``t S`` the devices; the
  data-parallel size ``d = devices / (t S)`` divides the batch;
* ``b`` divides the per-replica batch ``B / d``: ``m = B / (d b)``
  micro-batches per step;
* ``v > 1`` (interleaved 1F1B) divides the blocks per stage and needs
  ``S > 1`` and ``m`` a multiple of ``S`` (Megatron-LM's interleaved
  schedule runs micro-batches in groups of ``S``);
* sequence parallelism needs ``t > 1``;
* the schedule: GPipe or 1F1B at ``v = 1`` (whichever the space names),
  interleaved 1F1B at ``v > 1``.

A :class:`PipelineSpace` narrows any of them to given values (a published
configuration fixes some, the search chooses the rest).
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from costmodels import RECOMPUTE_NAMES, Schedule, parse_recompute, parse_schedule

__all__ = ["Candidates", "PipelineSpace", "candidates"]

MAX_MICRO_BATCH = 64  # micro-batches larger than this leave no pipeline to fill and no memory for activations


@dataclasses.dataclass(frozen=True)
class PipelineSpace:
    """Allowed values per dimension; ``None``: every value that divides
    (module docstring)."""

    tensor: tuple[int, ...] | None = None
    stages: tuple[int, ...] | None = None
    micro_batch: tuple[int, ...] | None = None
    chunks: tuple[int, ...] | None = None  # interleave v (1: plain 1F1B)
    recompute: tuple[str, ...] = RECOMPUTE_NAMES
    sequence_parallel: tuple[bool, ...] = (False, True)
    distributed_optimizer: tuple[bool, ...] = (False,)
    schedule: tuple[str, ...] = ("1f1b", "interleaved")  # gpipe | 1f1b (at v = 1) | interleaved (at v > 1)

    def __post_init__(self) -> None:
        for name in ("tensor", "stages", "micro_batch", "chunks"):
            values = getattr(self, name)
            if values is not None and (not values or any(isinstance(v, bool) or int(v) != v or v < 1 for v in values)):
                raise ValueError(f"pipeline space {name} must be positive whole numbers, got {values!r}")
        for r in self.recompute:
            parse_recompute(r)
        if not self.schedule:
            raise ValueError("pipeline space schedule must name at least one of gpipe, 1f1b, interleaved")
        for name in self.schedule:
            parse_schedule(name)


@dataclasses.dataclass(frozen=True)
class Candidates:
    """One row per configuration ``[C]`` (float arrays but ``segment``)."""

    tensor: np.ndarray
    stages: np.ndarray
    data: np.ndarray
    micro_batch: np.ndarray
    microbatches: np.ndarray
    chunks: np.ndarray
    schedule: np.ndarray
    recompute: np.ndarray
    sequence_parallel: np.ndarray
    distributed_optimizer: np.ndarray
    segment: np.ndarray  # [C] int: the row of (t, b, sp) in ``grid``
    grid: tuple[tuple[int, int, bool], ...]  # the (tensor, micro_batch, sequence_parallel) triples costed

    def __len__(self) -> int:
        return int(self.tensor.shape[0])


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def _allowed(values: tuple[int, ...] | None, natural: list[int]) -> list[int]:
    return natural if values is None else [v for v in natural if v in set(values)]


def candidates(layers: int, heads: int, devices: int, batch: int, devices_per_node: int,
               space: PipelineSpace = PipelineSpace()) -> Candidates:
    """Every configuration of ``space`` that divides (module docstring)."""
    rows: list[tuple] = []
    grid: dict[tuple[int, int, bool], int] = {}
    recomputes = [int(parse_recompute(r)) for r in space.recompute]
    flat = [int(parse_schedule(n)) for n in ("gpipe", "1f1b") if n in space.schedule]  # the schedules at v = 1
    interleaved = "interleaved" in space.schedule
    # a tensor size the space names may span nodes; the search's own stay inside one
    tensors = _divisors(devices) if space.tensor is not None else _divisors(min(devices_per_node, devices))
    for t in _allowed(space.tensor, [k for k in tensors if heads % k == 0]):
        for S in _allowed(space.stages, [k for k in _divisors(layers) if devices % (t * k) == 0]):
            d = devices // (t * S)
            if batch % d:
                continue
            per_replica = batch // d
            for b in _allowed(space.micro_batch, [k for k in _divisors(per_replica) if k <= MAX_MICRO_BATCH]):
                m = per_replica // b
                chunks = [v for v in _allowed(space.chunks, _divisors(layers // S))
                          if (v == 1 and flat) or (v > 1 and interleaved and S > 1 and m % S == 0)]
                for v, r, sp, zero in itertools.product(chunks, recomputes, space.sequence_parallel,
                                                        space.distributed_optimizer):
                    if sp and t == 1:
                        continue
                    key = (t, b, bool(sp))
                    seg = grid.setdefault(key, len(grid))
                    for schedule in (flat if v == 1 else [int(Schedule.INTERLEAVED)]):
                        rows.append((t, S, d, b, m, v, schedule, r, float(sp), float(zero), seg))
    if not rows:
        raise ValueError(
            f"no pipelined configuration of {layers} blocks ({heads} heads) on {devices} devices divides a batch "
            f"of {batch} within the space {space}; allow other tensor, stage or micro-batch sizes, or another batch")
    cols = np.asarray(rows, np.float64).T
    return Candidates(*cols[:10].astype(np.float32), segment=cols[10].astype(np.int32),
                           grid=tuple(sorted(grid, key=grid.get)))
