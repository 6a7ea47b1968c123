"""Pipeline stage cuts over a chain of layers: the exact dynamic programme,
and brute force over every cut set as the tests' oracle.

A cut set splits layers ``0..L-1`` into ``S`` contiguous stages; stage
``i`` holds layers ``starts[i] .. starts[i+1]-1``. Its time per
micro-batch ``t_i`` is its layers' forward-plus-backward time plus the
transfer across the boundary after its last layer (none after the last
stage). Its peak memory is its layers' parameter state (weights,
gradients, optimizer state) plus their activations kept per micro-batch
times the micro-batches in flight at stage ``i``:

* GPipe: all ``m``, every forward runs before the first backward (Huang et
  al. 2019, GPipe; Narayanan et al. 2021, Megatron-LM SC21 §2.2.1);
* 1F1B: ``min(S - i, m)``, stage ``i`` (from 0) runs ``S - i`` forwards
  before its first backward and then alternates one forward with one
  backward (Harlap et al. 2018, PipeDream; Megatron-LM SC21 §2.2.1: at most
  the pipeline depth in flight).

The step time of ``m`` micro-batches is

    T = (m - 1) * max_i t_i + sum_i t_i

one micro-batch's latency through every stage plus ``m - 1`` more slots of
the slowest stage (Zheng et al. 2022, Alpa OSDI'22 §5.2; with ``S`` equal
stages ``(m + S - 1) * t``, the pipeline bubble of Megatron-LM SC21 §2.2.1).

Exact method (Alpa's inter-operator formulation, Alpa §5.2): for a bound
``t_max`` on every stage's time, a DP over stages finds the least
``sum_i t_i`` of a cut set whose stages all take at most ``t_max`` and fit
the memory limit; the optimum is the least ``(m - 1) * t_max + sum`` over
every ``t_max`` that is some segment's time (the optimum's slowest stage
is such a segment, and at that bound the DP's sum is no larger than the
optimum's). The candidates run in increasing order from the first feasible
one (bisection: feasibility grows with ``t_max``) and stop once
``(m - 1) * t_max`` plus the least sum of any cut set cannot beat the best
found. Each DP costs ``O(S * (L - S + 1)^2)``: stage ``i`` ends within a
window of ``L - S + 1`` layers.

A chain of identical blocks needs no other path. Each segment's time is
summed left to right from its first layer, so equal runs of layers have
equal times and identical blocks between a distinct first and last layer,
with equal boundaries, give ``O(L)`` distinct candidates, not ``O(L^2)``.
Balanced cuts are not optimal in general even there: under 1F1B the
earlier stages hold more micro-batches, so a tight limit moves layers
towards the later stages.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import NamedTuple

import numpy as np

from costmodels import in_flight_microbatches as held_microbatches
from costmodels import parse_schedule

__all__ = [
    "MAX_CUT_SETS",
    "SCHEDULES",
    "StageCutProblem",
    "StageCuts",
    "StageCutsInfeasibleError",
    "in_flight_microbatches",
    "score_stage_cuts",
    "solve_stage_cuts",
    "solve_stage_cuts_brute",
]

SCHEDULES = ("gpipe", "1f1b")
MAX_CUT_SETS = 1_000_000  # brute force's limit


class StageCutProblem(NamedTuple):
    """A chain of layers to cut into pipeline stages (module docstring)."""

    layer_time_s: np.ndarray  # [L] seconds, forward + backward of one micro-batch
    layer_state_bytes: np.ndarray  # [L] bytes, weights + gradients + optimizer state
    layer_activation_bytes: np.ndarray  # [L] bytes kept per micro-batch in flight
    boundary_time_s: np.ndarray  # [L-1] seconds, transfer after layer j when a stage ends there
    num_stages: int  # S
    num_microbatches: int  # m
    schedule: str = "1f1b"  # gpipe | 1f1b
    memory_limit_bytes: float = math.inf  # per stage


@dataclasses.dataclass(frozen=True)
class StageCuts:
    """A cut set and its cost."""

    stage_starts: tuple[int, ...]  # [S] first layer of each stage (the first is 0)
    stage_time_s: tuple[float, ...]  # [S] seconds per micro-batch, boundary transfer after it included
    stage_memory_bytes: tuple[float, ...]  # [S] peak bytes: state + activations x in-flight micro-batches
    step_time_s: float  # (m - 1) * max(stage_time_s) + sum(stage_time_s)


class StageCutsInfeasibleError(ValueError):
    """No cut set fits the memory limit; ``min_memory_bytes`` is the least
    peak stage memory of any cut set (the smallest limit that fits)."""

    def __init__(self, message: str, min_memory_bytes: float):
        super().__init__(message)
        self.min_memory_bytes = min_memory_bytes


class _Segments(NamedTuple):
    # W = L - S + 1; [i, a, b]: stage i holding layers i + a .. i + b
    time_s: np.ndarray  # [S, W, W] seconds; inf where b < a or over the memory limit
    memory_bytes: np.ndarray  # [S, W, W] peak bytes; inf where b < a


def in_flight_microbatches(num_stages: int, num_microbatches: int, schedule: str) -> np.ndarray:
    """``[S]`` micro-batches whose activations stage ``i`` holds at its peak
    (GPipe ``m``, 1F1B ``min(S - i, m)``): :func:`costmodels.in_flight_microbatches`
    for each stage, as float64."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    held = held_microbatches(parse_schedule(schedule), num_stages, num_microbatches, 1.0, np.arange(num_stages))
    return np.asarray(held, dtype=np.float64)


def _checked(p: StageCutProblem) -> StageCutProblem:
    """``p`` with float64 arrays, or ``ValueError`` saying what is wrong."""
    time, state, act = (np.asarray(x, dtype=np.float64).reshape(-1) for x in p[:3])
    boundary = np.asarray(p.boundary_time_s, dtype=np.float64).reshape(-1)
    L = time.size
    if L == 0 or state.size != L or act.size != L or boundary.size != L - 1:
        raise ValueError(f"layer_time_s, layer_state_bytes and layer_activation_bytes need one entry per layer "
                         f"and boundary_time_s one fewer; got {time.size}, {state.size}, {act.size}, {boundary.size}")
    if not all(np.all(np.isfinite(x) & (x >= 0)) for x in (time, state, act, boundary)):
        raise ValueError("layer and boundary times and bytes must be finite and non-negative")
    if not 1 <= p.num_stages <= L:
        raise ValueError(f"num_stages must be between 1 and the {L} layers, got {p.num_stages}")
    if p.num_microbatches < 1:
        raise ValueError(f"num_microbatches must be at least 1, got {p.num_microbatches}")
    in_flight_microbatches(1, 1, p.schedule)  # checks the schedule's name
    return p._replace(layer_time_s=time, layer_state_bytes=state, layer_activation_bytes=act,
                      boundary_time_s=boundary, num_stages=int(p.num_stages),
                      num_microbatches=int(p.num_microbatches), memory_limit_bytes=float(p.memory_limit_bytes))


def _segment_sums(x: np.ndarray) -> np.ndarray:
    """``[L, L]``: ``x[a] + ... + x[b]`` summed left to right at ``[a, b]``
    (equal runs of values give equal sums); ``inf`` where ``b < a``."""
    j = np.arange(x.size)
    upper = j[None, :] >= j[:, None]
    return np.where(upper, np.cumsum(np.where(upper, x[None, :], 0.0), axis=1), np.inf)


def _segments(p: StageCutProblem) -> _Segments:
    """Every stage's time and memory over every segment it may hold."""
    L, S = p.layer_time_s.size, p.num_stages
    W = L - S + 1  # stage i starts at layer i .. i + W - 1 and ends at i .. i + W - 1
    # the transfer after a segment's last layer; none after layer L-1, which only the last stage ends at
    time = _segment_sums(p.layer_time_s) + np.r_[p.boundary_time_s, 0.0][None, :]
    state, act = _segment_sums(p.layer_state_bytes), _segment_sums(p.layer_activation_bytes)
    flight = in_flight_microbatches(S, p.num_microbatches, p.schedule)
    window = np.arange(S)[:, None] + np.arange(W)[None, :]  # [S, W] layer index
    rows, cols = window[:, :, None], window[:, None, :]
    memory = state[rows, cols] + act[rows, cols] * flight[:, None, None]  # [S, W, W]
    return _Segments(np.where(memory <= p.memory_limit_bytes, time[rows, cols], np.inf), memory)


def _least_sum(seg: _Segments, t_max: float) -> tuple[float, np.ndarray]:
    """(The least sum of stage times of a cut set whose every stage takes at
    most ``t_max`` and fits memory, ``inf`` if none; ``[S, W]`` where each
    stage starts, as an offset in its window, given where it ends)."""
    S, W, _ = seg.time_s.shape
    best = np.r_[0.0, np.full(W - 1, np.inf)]  # [a] stages before i, the last ending at layer i - 1 + a
    best_start = np.zeros((S, W), dtype=np.int64)
    for i in range(S):
        allowed = np.where(seg.time_s[i] <= t_max, seg.time_s[i], np.inf)  # [a, b]: layers i + a .. i + b
        total = best[:, None] + allowed
        best_start[i] = np.argmin(total, axis=0)
        best = total[best_start[i], np.arange(W)]
    return float(best[-1]), best_start


def _starts(best_start: np.ndarray) -> tuple[int, ...]:
    """The first layer of each stage, back from the last stage's end."""
    S, W = best_start.shape
    starts, end = [0] * S, W - 1
    for i in range(S - 1, -1, -1):
        starts[i] = i + int(best_start[i, end])
        end = int(best_start[i, end])
    return tuple(starts)


def _slowest(seg: _Segments, best_start: np.ndarray) -> float:
    """The slowest stage's time of the cut set :func:`_starts` reads from ``best_start``."""
    S, W = best_start.shape
    starts = np.r_[_starts(best_start), S + W - 1]  # and one past the last layer
    return float(max(seg.time_s[i, starts[i] - i, starts[i + 1] - 1 - i] for i in range(S)))


def _least_peak_memory(seg: _Segments) -> float:
    """The least peak stage memory of any cut set (a min-max DP)."""
    S, W, _ = seg.memory_bytes.shape
    begin = np.r_[0.0, np.full(W - 1, np.inf)]
    for i in range(S):
        begin = np.min(np.maximum(begin[:, None], seg.memory_bytes[i]), axis=0)
    return float(begin[-1])


def _stage_costs(p: StageCutProblem, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``([K, S] seconds, [K, S] bytes)``: each of ``K`` cut sets' stage times and
    peak memories, from prefix sums over the layers."""
    L = p.layer_time_s.size
    ends = np.concatenate([starts[:, 1:], np.full((starts.shape[0], 1), L)], axis=1)  # [K, S] one past the last
    def total(x):
        prefix = np.r_[0.0, np.cumsum(x)]
        return prefix[ends] - prefix[starts]

    time = total(p.layer_time_s) + np.r_[p.boundary_time_s, 0.0][ends - 1]  # the transfer after each stage
    flight = in_flight_microbatches(p.num_stages, p.num_microbatches, p.schedule)
    return time, total(p.layer_state_bytes) + total(p.layer_activation_bytes) * flight


def _step_times(time_s: np.ndarray, num_microbatches: int) -> np.ndarray:
    """``[K]`` step times of ``[K, S]`` stage times (Alpa §5.2)."""
    return (num_microbatches - 1) * time_s.max(axis=1) + time_s.sum(axis=1)


def score_stage_cuts(p: StageCutProblem, stage_starts) -> StageCuts:
    """The cost of one cut set, ``stage_starts`` the first layer of each of the
    ``S`` stages (memory is reported, not checked against the limit)."""
    p = _checked(p)
    starts = np.asarray(stage_starts, dtype=np.int64).reshape(1, -1)
    L = p.layer_time_s.size
    if starts.shape[1] != p.num_stages or starts[0, 0] != 0 or np.any(np.diff(starts[0]) <= 0) or starts[0, -1] >= L:
        raise ValueError(f"stage_starts must be {p.num_stages} increasing layer indices from 0 below {L}, "
                         f"got {tuple(stage_starts)}")
    time, memory = _stage_costs(p, starts)
    return StageCuts(tuple(int(s) for s in starts[0]), tuple(time[0].tolist()), tuple(memory[0].tolist()),
                     float(_step_times(time, p.num_microbatches)[0]))


def _infeasible(p: StageCutProblem, min_memory_bytes: float) -> StageCutsInfeasibleError:
    S, L = p.num_stages, p.layer_time_s.size
    return StageCutsInfeasibleError(
        f"no cut of {L} layers into {S} stages fits memory_limit_bytes={p.memory_limit_bytes:.6g}: the smallest "
        f"peak stage memory of any cut is {min_memory_bytes:.6g} bytes under {p.schedule} with "
        f"{p.num_microbatches} micro-batches; raise the limit to at least that, use more stages, or fewer "
        f"micro-batches in flight (1F1B, smaller micro-batches, recomputation)", min_memory_bytes)


def solve_stage_cuts(p: StageCutProblem) -> StageCuts:
    """The cut set of least step time whose every stage fits
    ``p.memory_limit_bytes``, proven (module docstring). Raises
    :class:`StageCutsInfeasibleError`, with the smallest limit that fits,
    where none does."""
    p = _checked(p)
    seg = _segments(p)
    floor, floor_start = _least_sum(seg, np.inf)  # no bound on stage time: the least sum of any cut set
    if not np.isfinite(floor):
        raise _infeasible(p, _least_peak_memory(seg))
    candidates = np.unique(seg.time_s[np.isfinite(seg.time_s)])  # sorted
    lo, hi = 0, candidates.size - 1  # bisect for the first feasible candidate (the last one is)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if np.isfinite(_least_sum(seg, candidates[mid])[0]) else (mid + 1, hi)
    m = p.num_microbatches
    best_s, best_start = (m - 1) * _slowest(seg, floor_start) + floor, floor_start
    for t_max in candidates[lo:]:
        if (m - 1) * t_max + floor >= best_s:
            break  # no cut set whose slowest stage takes t_max or longer is faster
        total, start = _least_sum(seg, t_max)
        if (m - 1) * t_max + total < best_s:
            best_s, best_start = (m - 1) * t_max + total, start
    return score_stage_cuts(p, _starts(best_start))


def solve_stage_cuts_brute(p: StageCutProblem) -> StageCuts:
    """Every cut set (``C(L-1, S-1)``, at most :data:`MAX_CUT_SETS`), each costed
    from prefix sums: the fastest that fits memory. The tests' oracle; raises
    :class:`StageCutsInfeasibleError` as :func:`solve_stage_cuts` does."""
    p = _checked(p)
    L, S = p.layer_time_s.size, p.num_stages
    count = math.comb(L - 1, S - 1)
    if count > MAX_CUT_SETS:
        raise ValueError(f"{count} cut sets are too many for brute force (at most {MAX_CUT_SETS})")
    cuts = np.array(list(itertools.combinations(range(1, L), S - 1)), dtype=np.int64).reshape(count, S - 1)
    starts = np.concatenate([np.zeros((count, 1), dtype=np.int64), cuts], axis=1)
    time, memory = _stage_costs(p, starts)
    peak = memory.max(axis=1)
    step = np.where(peak <= p.memory_limit_bytes, _step_times(time, p.num_microbatches), np.inf)
    k = int(np.argmin(step))
    if not np.isfinite(step[k]):
        raise _infeasible(p, float(peak.min()))
    return score_stage_cuts(p, starts[k])
