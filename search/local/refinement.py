"""Discrete refinement of plans: rounding, repair to memory feasibility at
the least time cost (:mod:`search.local._repair`), local search with single-layer moves, moves of the two
layers of an edge (so a layer and its neighbour change together and pay,
or save, their resharding once: :mod:`search.local.moves`) and memory trades
between two layers, and a large neighbourhood that re-plans whole chain
segments by Viterbi (:mod:`search.local.segments`).

Every move is scored exactly, by the discrete objective of
:mod:`search.problem` (the cost model at one-hot probabilities), for all
layers and strategies at once: a pass costs ``O(n S + e S^2)`` array work.
"""

from __future__ import annotations

import time as _time
from typing import NamedTuple

import numpy as np

from search.exact import MinimumMemory, smallest_memory
from search.local._repair import repair
from search.local.moves import MoveScores, current_state, pair_moves, single_moves, with_overlap
from search.local.relevel import relevel
from search.local.segments import Segments, chain_segments, segment_moves
from search.options import plain_options
from search.problem import DiscreteProblem, plan_memory, plan_time

__all__ = ["RefineResult", "drop_idle_levers", "free_levers", "local_search", "refine"]

_REL_TOL = 1e-10  # a move must improve the time by more than this fraction to count


def drop_idle_levers(p: DiscreteProblem, choice, memory_limit: float, rel_tol: float = 1e-6) -> np.ndarray:
    """``choice`` with every lever that buys nothing dropped: one layer at a
    time (the least memory added first), a layer under a memory lever
    (:mod:`costmodels.levers`) moves to its strategy's plain option wherever
    the plan stays within ``memory_limit`` and no slower than ``choice`` (to
    ``rel_tol``, the float32 table's precision). Each remaining lever is then
    needed for the plan's time or its fit, and an exact solver's optimum
    stays optimal to that tolerance (ZeRO-2 ties plain data parallelism
    wherever the all-reduce is a ring: its reduce-scatter and all-gather are
    the ring's two halves, equal up to float32 rounding)."""
    c = np.array(choice, dtype=np.int64)
    plain = plain_options(p)[p.option_strategy[c]]  # [n] each layer's strategy without levers
    levered = np.flatnonzero((p.option_lever[c] != 0) & (plain >= 0))
    if not levered.size:
        return c
    t0 = plan_time(p, c)
    # the order is a heuristic (each drop is checked exactly below): by the memory
    # the drop alone adds to the plan (the larger phase), then by what it adds to
    # the two phases together (a phase with room now may bind after other drops)
    alone = single_moves(p, c).memory_bytes[levered, plain[levered]]
    both = (p.persistent_bytes[levered, plain[levered]] - p.persistent_bytes[levered, c[levered]]
            + p.optimizer_bytes[levered, plain[levered]] - p.optimizer_bytes[levered, c[levered]])
    for lay in levered[np.lexsort((both, alone))]:
        old = int(c[lay])
        c[lay] = plain[lay]
        if not (p.feasible[lay, c[lay]] and plan_time(p, c) <= t0 * (1 + rel_tol)
                and plan_memory(p, c) <= memory_limit):
            c[lay] = old
    return c


def free_levers(p: DiscreteProblem, choice, rel_tol: float = 1e-6) -> np.ndarray:
    """``choice`` with every lever change that frees memory at no cost in
    time made (the reverse of :func:`drop_idle_levers`): a layer moves to
    the option of its strategy, keeping or recomputing as it does, that
    needs the least memory among those no slower than ``choice`` (to
    ``rel_tol``, the float32 table's precision), one layer at a time, each
    kept where the plan stays within that time and needs less memory. Such a
    move changes no run (only its ZeRO stage differs), so what it frees adds
    up. The local search then spends the memory freed: its trades pay for a
    faster move with a move that costs time (:func:`_trade`), and ZeRO-2,
    which ties plain data parallelism wherever the all-reduce is a ring,
    costs none, so that many layers at once free what one faster move needs
    (ResNet-152 on 8 V100s with runs at its levers-only limit: most
    layers of the MILP's plan are on ZeRO-2, of the gradient method's
    local optimum fewer than half)."""
    c = np.array(choice, dtype=np.int64)
    t0, m_now = plan_time(p, c), plan_memory(p, c)
    same = ((p.option_strategy[None, :] == p.option_strategy[c][:, None])
            & (p.option_recomputes[None, :] == p.option_recomputes[c][:, None])
            & (p.option_joins[None, :] == p.option_joins[c][:, None]))  # [n, O] only the ZeRO stage differs
    for _ in range(p.num_layers):  # rounds: a move may free memory only once others moved the larger phase
        single = single_moves(p, c)
        ok = same & (single.time_s <= t0 * (1 + rel_tol)) & (single.memory_bytes < m_now)
        if not ok.any():
            break
        memory = np.where(ok, single.memory_bytes, np.inf)
        before = c.copy()
        for lay in np.flatnonzero(ok.any(axis=1))[np.argsort(memory[ok.any(axis=1)].min(axis=1), kind="stable")]:
            old = int(c[lay])
            c[lay] = int(np.argmin(memory[lay]))
            m = plan_memory(p, c)
            if plan_time(p, c) <= t0 * (1 + rel_tol) and m < m_now:
                m_now = m
            else:
                c[lay] = old
        if np.array_equal(c, before):
            break
    return c


def _independent_best_moves(p: DiscreteProblem, gain: np.ndarray, best_s: np.ndarray) -> list[tuple[int, int]]:
    """Improving single moves of pairwise non-adjacent layers, largest gain first."""
    cand = np.flatnonzero(gain > 0)
    cand = cand[np.argsort(-gain[cand], kind="stable")]
    blocked = np.zeros(p.num_layers, dtype=bool)
    chosen = []
    for lay in cand:
        if blocked[lay]:
            continue
        chosen.append((int(lay), int(best_s[lay])))
        blocked[lay] = True
        blocked[p.neighbor_idx[p.neighbor_ptr[lay]:p.neighbor_ptr[lay + 1]]] = True
    return chosen


def _swap(p: DiscreteProblem, c: np.ndarray, single: MoveScores, t_now: float, m_now: float, limit: float,
          tol: float, tries: int = 8) -> np.ndarray | None:
    """A trade of memory between two layers: one move that is faster but
    does not fit on its own, paid for by a move elsewhere that frees enough
    memory, with a net gain. For each gaining move the cheapest payer comes
    from a prefix minimum over payers sorted by memory change; the best
    ``tries`` trades are checked exactly (memory changes do not add up: the
    larger phase and the largest workspace bind) and the first that improves
    is made."""
    dT = single.time_s - t_now
    dM = single.memory_bytes - m_now
    slack = limit - m_now
    finite = np.isfinite(dT)
    gain = finite & (dT < -tol) & (dM > slack)
    payer = finite & (dM < 0)
    if not gain.any() or not payer.any():
        return None
    pl, ps = np.nonzero(payer)
    order = np.argsort(dM[pl, ps], kind="stable")
    pl, ps = pl[order], ps[order]
    pdm, pdt = dM[pl, ps], dT[pl, ps]
    run_min = np.minimum.accumulate(pdt)
    run_arg = np.zeros(pdt.size, dtype=np.int64)  # index of the prefix minimum
    best = 0
    for j in range(1, pdt.size):  # host loop over payers (at most n S)
        if pdt[j] < pdt[best]:
            best = j
        run_arg[j] = best
    gl, gs = np.nonzero(gain)
    k = np.searchsorted(pdm, slack - dM[gl, gs], side="right") - 1
    has = k >= 0
    gl, gs, k = gl[has], gs[has], k[has]
    if not gl.size:
        return None
    net = dT[gl, gs] + run_min[k]
    good = np.flatnonzero(net < -tol)
    for j in good[np.argsort(net[good], kind="stable")][:tries]:
        b = run_arg[k[j]]
        if pl[b] == gl[j]:
            continue
        trial = c.copy()
        trial[gl[j]], trial[pl[b]] = gs[j], ps[b]
        if plan_memory(p, trial) <= limit and plan_time(p, trial) < t_now - tol:
            return trial
    return None


def _trade(p: DiscreteProblem, c: np.ndarray, single: MoveScores, t_now: float, m_now: float, limit: float,
           tol: float, tries: int = 8, rounds: int = 8) -> np.ndarray | None:
    """A memory trade of one payer for several gainers: a move that frees
    memory at a cost in time (the ``tries`` cheapest per byte freed, then
    the ``tries`` that free the most), followed by a descent of improving
    single moves that now fit (at most ``rounds``, the best move each); the
    first whose end is faster than ``c`` is returned. :func:`_swap` pairs a
    payer with one gainer; here the memory one layer frees may pay for
    several (e.g. one layer sharded by filter so that two others can go
    back to data parallelism)."""
    dT = single.time_s - t_now
    dM = single.memory_bytes - m_now
    payer = np.isfinite(dT) & (dM < 0) & (dT > tol)  # costs time: else it is an improving move itself
    pl, ps = np.nonzero(payer)
    if not pl.size:
        return None
    per_byte = np.argsort(dT[pl, ps] / -dM[pl, ps], kind="stable")[:tries]
    most = np.argsort(dM[pl, ps], kind="stable")[:tries]
    tried = set()
    for j in np.concatenate([per_byte, most]):
        if (pl[j], ps[j]) in tried:
            continue
        tried.add((pl[j], ps[j]))
        trial = c.copy()
        trial[pl[j]] = ps[j]
        for _ in range(rounds):
            cur = current_state(p, trial)
            t_trial = with_overlap(p, cur.base_s, cur.grad_s, cur.bwd_s)
            sm = single_moves(p, trial, cur)
            ok = (sm.memory_bytes <= limit) & (sm.time_s < t_trial - tol)
            ok[pl[j]] = False  # the payer stays paid
            if not ok.any():
                break
            lay, s = np.unravel_index(int(np.argmin(np.where(ok, sm.time_s, np.inf))), ok.shape)
            trial[lay] = s  # fits: the move's exact memory is within the limit
            if sm.time_s[lay, s] < t_now - tol:  # the move's exact time (single_moves scores exactly)
                return trial
    return None


def local_search(p: DiscreteProblem, choice, memory_limit: float, max_moves: int | None = None,
                 segments: Segments | None = None, deadline_s: float | None = None) -> np.ndarray:
    """Improve a plan that fits ``memory_limit`` until no single-layer move,
    no move of an edge's two layers and no memory trade between two layers
    (:func:`_swap`) lowers the time while still fitting. Improving moves of
    non-adjacent layers are applied together when their combination still
    fits and improves (their time gains add up exactly, overlap aside, which
    the combined check covers). With ``segments``, a chain segment may also
    be re-planned as a whole (:func:`segment_moves`) when nothing smaller helps.
    Past ``deadline_s`` (a ``time.perf_counter()`` reading) it stops with
    the plan it has, which fits and is no slower than ``choice``."""
    c = np.array(choice, dtype=np.int64)
    limit = float(memory_limit)
    max_moves = 10 * p.num_layers + 100 if max_moves is None else max_moves
    for _ in range(max_moves):
        if deadline_s is not None and _time.perf_counter() > deadline_s:
            break
        cur = current_state(p, c)
        t_now = with_overlap(p, cur.base_s, cur.grad_s, cur.bwd_s)
        m_now = cur.memory_bytes
        tol = _REL_TOL * abs(t_now)
        single = single_moves(p, c, cur)
        ok = (single.memory_bytes <= limit) & (single.time_s < t_now - tol)
        if ok.any():
            masked = np.where(ok, single.time_s, np.inf)
            best_s = np.argmin(masked, axis=1)
            gain = t_now - masked[np.arange(p.num_layers), best_s]
            moves = _independent_best_moves(p, np.where(np.isfinite(gain), gain, 0.0), best_s)
            if len(moves) > 1:
                trial = c.copy()
                for lay, s in moves:
                    trial[lay] = s
                if plan_memory(p, trial) <= limit and plan_time(p, trial) < t_now - tol:
                    c = trial
                    continue
            lay, s = moves[0]
            c[lay] = s
            continue
        if p.num_edges:
            pair = pair_moves(p, c, cur, faster_than=t_now - tol)
            ok = (pair.memory_bytes <= limit) & (pair.time_s < t_now - tol)
            if ok.any():
                k, s, t = np.unravel_index(int(np.argmin(np.where(ok, pair.time_s, np.inf))), pair.time_s.shape)
                c[p.edge_src[k]], c[p.edge_dst[k]] = s, t
                continue
        if np.isfinite(limit):
            trial = _swap(p, c, single, t_now, m_now, limit, tol)
            if trial is None:
                trial = _trade(p, c, single, t_now, m_now, limit, tol)
            if trial is not None:
                c = trial
                continue
        if segments is not None:
            trial = segment_moves(p, c, segments, limit, tol)
            if trial is not None:
                c = trial
                continue
        break
    return c


class RefineResult(NamedTuple):
    choice: np.ndarray  # [n] the best plan found
    time_s: float
    memory_bytes: float
    feasible: bool
    rounded_time_s: float  # the best candidate as given (before repair and local search)
    repaired_time_s: float  # the best candidate after repair, before local search
    candidates: int  # distinct candidates refined


def refine(p: DiscreteProblem, candidates, memory_limit: float, max_candidates: int = 4,
           segment_window: float = 0.03, smallest: MinimumMemory | None = None,
           relevel_time_limit_s: float | None = None, starts=None, deadline_s: float | None = None) -> RefineResult:
    """Repair and locally improve each distinct candidate plan ``[k, n]``
    (the best ``max_candidates`` after repair get the local search, and
    each distinct local optimum within ``segment_window`` of the best then
    the segment moves), and return the best plan that fits. Repair falls
    back on the exact smallest-memory plan (:func:`repair`), which fits
    whenever any plan does; where it does not, that plan is returned,
    marked infeasible. ``smallest``: that plan's
    :func:`search.exact.milp.smallest_memory`, where the caller has it.
    ``starts`` ``[k, n]``: plans from another source (the Lagrangian's,
    :func:`search.exact.lagrangian.lagrangian_plans`) that are repaired and
    locally searched besides the best ``max_candidates``, so they never
    take those places. Where
    plans may hold runs, the best plan's levers and runs are then re-planned
    exactly within the strategies of the local optima
    (:func:`search.local.relevel.relevel`, its completion within
    ``relevel_time_limit_s``) and locally searched again. Past ``deadline_s``
    (a ``time.perf_counter()`` reading) the local searches stop where they
    are and the re-planning is skipped: the best plan so far is returned
    (it fits; the solver's time budget, :func:`search.solver.solve_many`)."""
    limit = float(memory_limit)
    cands = np.unique(np.asarray(candidates, dtype=np.int64).reshape(-1, p.num_layers), axis=0)
    times = np.array([plan_time(p, x) for x in cands])
    fits = np.array([plan_memory(p, x) <= limit for x in cands])
    rounded = float(np.min(np.where(fits, times, np.inf))) if cands.size else np.inf
    mm = (smallest_memory(p) if smallest is None else smallest).choice  # once: each stuck repair walks to it
    if plan_memory(p, mm) > limit:  # nothing fits
        return RefineResult(mm, plan_time(p, mm), plan_memory(p, mm), False, rounded, np.inf, len(cands))
    extra = np.zeros((0, p.num_layers), dtype=np.int64) if starts is None else \
        np.unique(np.asarray(starts, dtype=np.int64).reshape(-1, p.num_layers), axis=0)

    def repaired_plans(plans):
        out = []
        for x in plans:
            y, ok = repair(p, x, limit, fallback=mm)
            if ok:
                out.append(y)
        return out

    repaired = repaired_plans(cands)
    if not repaired:  # no candidates (every repair fits here: mm does)
        repaired.append(mm)
    repaired = np.unique(np.asarray(repaired), axis=0)
    rtimes = np.array([plan_time(p, y) for y in repaired])
    order = np.argsort(rtimes, kind="stable")[:max_candidates]
    chosen = np.unique(np.asarray([repaired[i] for i in order] + repaired_plans(extra)), axis=0)
    # each after the lever changes that free memory at no cost in time, for the local search to spend
    local = np.unique(np.asarray([local_search(p, free_levers(p, y), limit, deadline_s=deadline_s)
                                  for y in chosen]), axis=0)
    # then the large neighbourhood (whole chain segments) from each distinct local
    # optimum within segment_window of the best one
    ltimes = np.array([plan_time(p, z) for z in local])
    local = local[np.argsort(ltimes, kind="stable")][: int(np.sum(ltimes <= ltimes.min() * (1 + segment_window)))]
    seg = chain_segments(p)
    best, best_t = None, np.inf
    optima = []
    for z in local:
        z = local_search(p, z, limit, segments=seg, deadline_s=deadline_s)
        optima.append(z)
        tz = plan_time(p, z)
        if tz < best_t:
            best, best_t = z, tz
    left = np.inf if deadline_s is None else deadline_s - _time.perf_counter()
    if left <= 0:
        return RefineResult(best, best_t, plan_memory(p, best), True, rounded, float(rtimes.min()), len(cands))
    relevel_s = left if relevel_time_limit_s is None else min(relevel_time_limit_s, left)
    z = relevel(p, best, limit, None if not np.isfinite(relevel_s) else relevel_s, others=np.asarray(optima))
    if plan_time(p, z) < best_t:
        best = local_search(p, z, limit, segments=seg, deadline_s=deadline_s)
        best_t = plan_time(p, best)
    return RefineResult(best, best_t, plan_memory(p, best), True, rounded, float(rtimes.min()), len(cands))
