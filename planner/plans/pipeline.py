"""``Pipeline``: the pipelined part of a plan (stages, micro-batches, the
schedule, recomputation, and the predicted step with its parts), as plain
data, and how a chain of identical blocks is cut into balanced stages
(:func:`stage_blocks`). The plan file reads it in
:mod:`planner.plans.file`."""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["PIPELINE_AXIS_NAMES", "STAGE_EVALUATION_KEYS", "Pipeline", "stage_blocks"]

PIPELINE_AXIS_NAMES = ("stage", "data", "model")  # a pipelined plan's mesh axes, outermost first

_SCHEDULES = ("gpipe", "1f1b", "interleaved")
_RECOMPUTES = ("none", "selective", "full")
# the stage's one-micro-batch evaluation (Plan.evaluation) that the plan file's top-level keys do not hold
STAGE_EVALUATION_KEYS = ("devices", "mesh", "batch", "iteration_s", "memory_bytes_per_device")


def stage_blocks(blocks: int, stages: int, chunks: int = 1) -> tuple[tuple[int, int], ...]:
    """First and last block index of each model chunk, in model order: the
    ``blocks`` are cut into ``stages x chunks`` equal runs; chunk ``c`` runs
    on stage ``c % stages`` (Megatron-LM's interleaved schedule, Narayanan et
    al. 2021, §2.2.2: device ``i`` holds chunks ``i, i + S, ...``; with one
    chunk, run ``i`` is stage ``i``)."""
    runs = stages * chunks
    if stages < 1 or chunks < 1 or blocks % runs:
        raise ValueError(f"{blocks} blocks do not split into {stages} stages x {chunks} chunks of equal size")
    n = blocks // runs
    return tuple((c * n, (c + 1) * n - 1) for c in range(runs))


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """A plan's pipeline: a decoder's blocks cut into ``stages`` balanced
    stages on a ``stages x data x tensor`` mesh (axes
    :data:`PIPELINE_AXIS_NAMES`; tensor innermost, Megatron-LM's rank order),
    each stage's ``data x tensor`` sub-mesh the same.

    The first stage also runs the embedding, the last the final norm and the
    output layer. ``stage_blocks`` holds the first and last block index of
    each *model chunk* in model order (``stages x chunks`` entries; chunk
    ``c`` runs on stage ``c % stages``: with ``chunks`` 1, entry ``i`` is
    stage ``i``'s blocks); :meth:`blocks_of_stage` groups them by stage.

    The per-layer plan of a stage is Megatron-LM's tensor-parallel layout
    (:func:`costmodels.megatron_options`): the plan's ``evaluation`` costs
    one block with the embedding before it and the output layer after it,
    for one micro-batch per data replica (``micro_batch x data`` samples) on
    the ``data x tensor`` sub-mesh, without memory levers; every block runs
    the same strategies. Its time and memory are that one pass's; the
    plan's step and memory are the pipelined step's below
    (:func:`costmodels.chain_cost`: the schedule, its bubble, the transfers
    between stages, the gradient reduction, the optimizer step, 18 B per
    parameter of mixed-precision state, the activations in flight)."""

    stages: int
    data: int
    tensor: int
    chunks: int  # model chunks per device (interleave v; 1: no interleaving)
    micro_batch: int  # samples per micro-batch
    microbatches: int  # micro-batches per step (per data replica)
    schedule: str  # gpipe | 1f1b | interleaved
    recompute: str  # none | selective | full
    sequence_parallel: bool
    distributed_optimizer: bool  # ZeRO-1: master weights and optimizer state sharded over data
    blocks: int  # the decoder's blocks
    stage_blocks: tuple[tuple[int, int], ...]  # (first, last) block of each model chunk (class docstring)
    step_s: float  # predicted seconds per training step
    pipeline_s: float  # of step_s: the micro-batches through the pipeline, bubble included
    bubble_s: float  # of pipeline_s: beyond the slowest stage's slots
    transfer_s: float  # of pipeline_s: the slowest stage's point-to-point transfers
    gradient_sync_s: float  # of step_s: the exposed data-parallel (and tied-table) gradient reduction
    optimizer_s: float  # of step_s: the optimizer step
    state_bytes: float  # at the stage of the peak: weights, gradients, optimizer state per device
    activation_bytes: float  # ... its activations per device (the micro-batches in flight)
    peak_bytes: float  # the largest stage's state + activations per device
    candidates: int = 0  # pipelined configurations costed
    fitting: int = 0  # ... of which fit the memory

    def __post_init__(self) -> None:
        if self.schedule not in _SCHEDULES:
            raise ValueError(f"pipeline.schedule must be one of {', '.join(_SCHEDULES)}, got {self.schedule!r}")
        if self.recompute not in _RECOMPUTES:
            raise ValueError(f"pipeline.recompute must be one of {', '.join(_RECOMPUTES)}, got {self.recompute!r}")
        if self.stage_blocks != stage_blocks(self.blocks, self.stages, self.chunks):
            raise ValueError(f"pipeline.stage_blocks {self.stage_blocks!r} are not {self.blocks} blocks cut into "
                             f"{self.stages} stages x {self.chunks} chunks")

    @property
    def devices(self) -> int:
        return self.stages * self.data * self.tensor

    @property
    def mesh(self) -> tuple[int, int, int]:  # (stage, data, model)
        return (self.stages, self.data, self.tensor)

    @property
    def batch(self) -> int:  # global: micro-batches x their size x data replicas
        return self.micro_batch * self.microbatches * self.data

    def blocks_of_stage(self, stage: int) -> tuple[tuple[int, int], ...]:
        """The (first, last) block runs stage ``stage`` holds (one per chunk)."""
        return self.stage_blocks[stage::self.stages]

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "stage_blocks": [list(r) for r in self.stage_blocks]}

