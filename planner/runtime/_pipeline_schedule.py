"""A pipeline schedule as data: which stage runs the forward or the backward
pass of which micro-batch at each tick, and the buffer slots a lock-step
executor needs to hold the activations and cotangents in flight.

A tick is one unit of work on every stage at once (a forward or a backward
pass of one micro-batch through the stage's layers, or nothing). The tables
come from a list scheduler: each stage walks its own order of operations
and runs the next one as soon as its input was produced in an earlier tick
(the forward of micro-batch ``i`` on stage ``s`` needs stage ``s - 1``'s
forward of ``i``; its backward needs stage ``s + 1``'s backward of ``i``,
and on the last stage its own forward). The orders:

* ``gpipe`` (Huang et al. 2019, "GPipe", fig. 2c): every stage runs the
  forwards of micro-batches ``0 .. m - 1``, then their backwards from the
  last micro-batch to the first. A stage holds all ``m`` micro-batches'
  activations at its peak.
* ``1f1b`` (Narayanan et al. 2021, "Efficient Large-Scale Language Model
  Training on GPU Clusters", sec. 2.2.1, the PipeDream-Flush order): stage
  ``s`` runs ``min(S - s - 1, m)`` warm-up forwards, then alternates one
  forward and one backward, then drains the remaining backwards. A stage
  holds at most ``min(S - s, m)`` micro-batches' activations.

Both take ``2 (m + S - 1)`` ticks (the bubble is ``2 (S - 1)`` ticks of
every stage's ``2 (m + S - 1)``, Narayanan et al. 2021, eq. 1 with equal
forward and backward ticks); they differ in memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "BACKWARD",
    "FORWARD",
    "IDLE",
    "SCHEDULE_NAMES",
    "ExecutorTables",
    "PipelineSchedule",
    "executor_tables",
    "pipeline_schedule",
]

IDLE, FORWARD, BACKWARD = 0, 1, 2
SCHEDULE_NAMES = ("gpipe", "1f1b")


@dataclass(frozen=True, eq=False)
class PipelineSchedule:
    """What every stage does at every tick of one training step."""

    name: str
    stages: int
    micro_batches: int
    op: np.ndarray  # [ticks, stages] int: IDLE, FORWARD or BACKWARD
    micro_batch: np.ndarray  # [ticks, stages] int: the micro-batch of the op, -1 when idle

    @property
    def ticks(self) -> int:
        return int(self.op.shape[0])

    def stashed(self) -> np.ndarray:
        """``[ticks, stages]``: micro-batches whose forward on the stage has
        run and whose backward has not finished by the end of the tick (the
        activations a stage keeps for its backward passes)."""
        done_f = np.cumsum(self.op == FORWARD, axis=0)
        done_b = np.cumsum(self.op == BACKWARD, axis=0)
        # a backward tick still holds its micro-batch while it runs
        return done_f - done_b + (self.op == BACKWARD)

    def peak_stashed(self) -> np.ndarray:
        """``[stages]``: the most micro-batch activations a stage keeps at once."""
        return self.stashed().max(axis=0)


def _stage_orders(name: str, stages: int, micro_batches: int) -> list[list[tuple[int, int]]]:
    """Each stage's ``(op, micro-batch)`` sequence under schedule ``name``."""
    m = micro_batches
    orders = []
    for s in range(stages):
        if name == "gpipe":
            order = [(FORWARD, i) for i in range(m)] + [(BACKWARD, i) for i in reversed(range(m))]
        else:
            warm = min(stages - s - 1, m)
            order = [(FORWARD, i) for i in range(warm)]
            for j in range(m - warm):
                order += [(FORWARD, warm + j), (BACKWARD, j)]
            order += [(BACKWARD, i) for i in range(m - warm, m)]
        orders.append(order)
    return orders


def pipeline_schedule(name: str, stages: int, micro_batches: int) -> PipelineSchedule:
    """The tick table of schedule ``name`` (one of :data:`SCHEDULE_NAMES`) for
    ``stages`` stages and ``micro_batches`` micro-batches."""
    if name not in SCHEDULE_NAMES:
        raise ValueError(f"unknown pipeline schedule {name!r}; choose from {', '.join(SCHEDULE_NAMES)}")
    if stages < 1 or micro_batches < 1:
        raise ValueError(f"a pipeline needs at least one stage and one micro-batch, got {stages} stages "
                         f"and {micro_batches} micro-batches")
    orders = _stage_orders(name, stages, micro_batches)
    finished = {}  # (op, stage, micro-batch) -> the tick it ran
    nxt = [0] * stages
    ops, mbs = [], []
    tick = 0
    while any(n < len(o) for n, o in zip(nxt, orders)):
        row_op, row_mb = [IDLE] * stages, [-1] * stages
        for s in range(stages):
            if nxt[s] == len(orders[s]):
                continue
            op, i = orders[s][nxt[s]]
            need = ((FORWARD, s - 1, i) if op == FORWARD else
                    (BACKWARD, s + 1, i) if s + 1 < stages else (FORWARD, s, i))
            ready = (op == FORWARD and s == 0) or finished.get(need, tick) < tick
            if ready:
                row_op[s], row_mb[s] = op, i
                finished[(op, s, i)] = tick
                nxt[s] += 1
        ops.append(row_op)
        mbs.append(row_mb)
        tick += 1
    return PipelineSchedule(name, stages, micro_batches, np.array(ops, dtype=np.int32),
                            np.array(mbs, dtype=np.int32))


@dataclass(frozen=True, eq=False)
class ExecutorTables:
    """Per tick and stage, what a lock-step executor does with its buffers.

    An activation arriving on a stage (sent by the previous stage's forward
    in the tick before, or, on the first stage, the micro-batch's input in
    its forward tick) is written into an activation slot, where it stays
    until the stage's backward of that micro-batch has run. A cotangent
    arriving from the next stage stays in a cotangent slot until the
    backward that reads it. Slots are reused as soon as they are free."""

    act_slots: int  # activation slots per stage (the most held at once on any stage)
    cot_slots: int  # cotangent slots per stage
    act_in: np.ndarray  # [ticks, stages] int: slot the arriving activation goes to, -1 none
    act_use: np.ndarray  # [ticks, stages] int: slot the tick's forward or backward reads, 0 when idle
    cot_in: np.ndarray  # [ticks, stages] int: slot the arriving cotangent goes to, -1 none
    cot_use: np.ndarray  # [ticks, stages] int: slot the tick's backward reads, 0 otherwise


def _slots(intervals: list[tuple[int, int, int]]) -> tuple[dict[int, int], int]:
    """Slot per micro-batch for ``(first tick, last tick, micro-batch)``
    intervals, reusing a slot once its interval has ended; and the slot count."""
    free_at: list[int] = []  # slot -> first tick it is free again
    slot_of = {}
    for first, last, i in sorted(intervals):
        slot = next((k for k, t in enumerate(free_at) if t <= first), len(free_at))
        if slot == len(free_at):
            free_at.append(0)
        free_at[slot] = last + 1
        slot_of[i] = slot
    return slot_of, len(free_at)


def executor_tables(schedule: PipelineSchedule) -> ExecutorTables:
    """The buffer slots of ``schedule`` (:class:`ExecutorTables`)."""
    stages, ticks = schedule.stages, schedule.ticks
    when = {(int(schedule.op[t, s]), s, int(schedule.micro_batch[t, s])): t
            for t in range(ticks) for s in range(stages) if schedule.op[t, s] != IDLE}
    act_in = np.full((ticks, stages), -1, np.int32)
    cot_in = np.full((ticks, stages), -1, np.int32)
    act_use = np.zeros((ticks, stages), np.int32)
    cot_use = np.zeros((ticks, stages), np.int32)
    act_slots = cot_slots = 0
    for s in range(stages):
        mbs = range(schedule.micro_batches)
        arrive = {i: when[(FORWARD, s, i)] if s == 0 else when[(FORWARD, s - 1, i)] + 1 for i in mbs}
        act_of, n_act = _slots([(arrive[i], when[(BACKWARD, s, i)], i) for i in mbs])
        for i in mbs:
            act_in[arrive[i], s] = act_of[i]
            act_use[when[(FORWARD, s, i)], s] = act_use[when[(BACKWARD, s, i)], s] = act_of[i]
        act_slots = max(act_slots, n_act)
        if s + 1 < stages:
            cot_arrive = {i: when[(BACKWARD, s + 1, i)] + 1 for i in mbs}
            cot_of, n_cot = _slots([(cot_arrive[i], when[(BACKWARD, s, i)], i) for i in mbs])
            for i in mbs:
                cot_in[cot_arrive[i], s] = cot_of[i]
                cot_use[when[(BACKWARD, s, i)], s] = cot_of[i]
            cot_slots = max(cot_slots, n_cot)
    return ExecutorTables(act_slots, max(cot_slots, 1), act_in, act_use, cot_in, cot_use)
