"""Brute force for tiny graphs: every combination of feasible strategies,
costed exactly (vectorised over combinations). A test oracle only."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from search.problem import DiscreteProblem, plan_memories, plan_times

__all__ = ["BruteResult", "solve_brute", "solve_brute_limits", "MAX_PLANS"]

MAX_PLANS = 2_000_000


class BruteResult(NamedTuple):
    choice: np.ndarray  # [n] the fastest plan that fits (the smallest-memory plan if none fits)
    time_s: float
    memory_bytes: float
    feasible: bool
    min_memory_bytes: float  # the smallest memory of any plan
    plans: int


def solve_brute(p: DiscreteProblem, memory_limit: float = np.inf, chunk: int = 65_536) -> BruteResult:
    """Enumerate all plans (at most :data:`MAX_PLANS`)."""
    return solve_brute_limits(p, [memory_limit], chunk)[0]


def solve_brute_limits(p: DiscreteProblem, memory_limits, chunk: int = 65_536) -> list[BruteResult]:
    """:func:`solve_brute` at each of ``memory_limits``, every plan costed once."""
    n = p.num_layers
    limits = np.asarray(memory_limits, dtype=float).reshape(-1)
    options = [np.flatnonzero(p.feasible[i]) for i in range(n)]
    sizes = np.array([len(o) for o in options], dtype=np.int64)
    total = int(np.prod(sizes)) if n else 1
    if total > MAX_PLANS:
        raise ValueError(f"{total} plans are too many for brute force (at most {MAX_PLANS}); use a smaller graph")
    strides = np.r_[np.cumprod(sizes[::-1])[::-1][1:], 1] if n else np.zeros(0, np.int64)
    best = [(np.inf, np.inf, None)] * limits.size  # per limit: time, memory, choice
    lightest = (np.inf, None)
    for start in range(0, total, chunk):
        idx = np.arange(start, min(start + chunk, total))
        plans = np.zeros((idx.size, n), dtype=np.int64)
        for i in range(n):  # digits of a mixed-radix counter
            plans[:, i] = options[i][(idx // strides[i]) % sizes[i]]
        t, m = plan_times(p, plans), plan_memories(p, plans)
        j = int(np.argmin(m))
        if m[j] < lightest[0]:
            lightest = (float(m[j]), plans[j])
        for k, limit in enumerate(limits):
            tt = np.where(m <= limit, t, np.inf)
            j = int(np.argmin(tt))
            if tt[j] < best[k][0]:
                best[k] = (float(tt[j]), float(m[j]), plans[j])
    out = []
    for time_s, memory, choice in best:
        if choice is None:
            c = lightest[1]
            out.append(BruteResult(c, float(plan_times(p, c[None])[0]), lightest[0], False, lightest[0], total))
        else:
            out.append(BruteResult(choice, time_s, memory, True, lightest[0], total))
    return out
