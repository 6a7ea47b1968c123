"""Repair of a plan to memory feasibility at the least time cost, for the
refinement (:mod:`search.local.refinement`): batches of single-layer moves
by added time per byte saved, moves of an edge's two layers where no single
move saves memory, and a walk to the smallest-memory plan where the moves
get stuck. Every move is scored exactly (:mod:`search.local.moves`)."""

from __future__ import annotations

import numpy as np

from search.exact import smallest_memory
from search.local.moves import current_state, pair_memory_floors, pair_moves, single_moves, with_overlap
from search.problem import DiscreteProblem, has_runs, plan_memory

__all__ = ["repair"]

_PAIR_CHUNK = 4096  # moves of an edge's two layers scored per pass where plans hold runs (_cheapest_pair)


def repair(p: DiscreteProblem, choice, memory_limit: float, max_rounds: int | None = None,
           fallback: np.ndarray | None = None, max_pair_moves: int | None = None) -> tuple[np.ndarray, bool]:
    """Moves towards ``memory <= memory_limit`` at the least added time per
    byte saved: each round takes, in order of that ratio, the best single
    move of pairwise non-adjacent layers until their savings cover the
    excess (sequential greedy, batched); when no single move saves memory,
    the best move of an edge's two layers. Savings are not additive (memory
    is the larger of two phases, and the backward phase has the largest
    workspace), so a batch is kept only if the plan's exact memory drops,
    else its first move alone is made (which saves alone): every round
    lowers the memory. Where the moves get stuck above the limit, the plan
    walks to ``fallback`` (default: the exact smallest-memory plan,
    :func:`search.exact.memory.minimum_memory`) on the shortest prefix of its
    layers that fits (:func:`_walk_towards`), so it fits whenever any plan
    does. Returns the plan and whether it fits.

    ``max_pair_moves``: the moves of an edge's two layers it may make before
    it walks. Default: any number where plans hold no runs (all are scored
    at once), none where they may (:func:`search.problem.has_runs`): there
    each pair move's memory costs a window of layers, seconds per move on
    ResNet-152 near its smallest memory, where the walk and the local
    search that follows reached the same plans without them (ad-hoc probes
    on 8 and 256 V100s: ``docs/search.md``)."""
    c = np.array(choice, dtype=np.int64)
    limit = float(memory_limit)
    max_rounds = 2 * p.num_layers + 20 if max_rounds is None else max_rounds
    if max_pair_moves is None:
        max_pair_moves = 0 if has_runs(p) else max_rounds
    for _ in range(max_rounds):
        cur = current_state(p, c)
        t_now = with_overlap(p, cur.base_s, cur.grad_s, cur.bwd_s)
        m_now = cur.memory_bytes
        if m_now <= limit:
            return c, True
        single = single_moves(p, c, cur)
        saved = m_now - single.memory_bytes
        ok = (saved > 0) & np.isfinite(single.time_s)
        if ok.any():
            score = np.where(ok, (single.time_s - t_now) / np.where(ok, saved, 1.0), np.inf)
            best_s = np.argmin(score, axis=1)
            rows = np.arange(p.num_layers)
            best_score, best_saved = score[rows, best_s], saved[rows, best_s]
            excess = m_now - limit
            blocked = ~np.isfinite(best_score)
            covered = 0.0
            trial = c.copy()
            first = None
            for lay in np.argsort(best_score, kind="stable"):
                if blocked[lay]:
                    continue
                first = (lay, best_s[lay]) if first is None else first
                trial[lay] = best_s[lay]
                covered += best_saved[lay]
                if covered >= excess:
                    break
                blocked[lay] = True
                blocked[p.neighbor_idx[p.neighbor_ptr[lay]:p.neighbor_ptr[lay + 1]]] = True
            if plan_memory(p, trial) < m_now:
                c = trial
            else:
                c[first[0]] = first[1]
            continue
        if not p.num_edges or max_pair_moves <= 0:
            break
        move = _cheapest_pair(p, c, cur, t_now, m_now)
        if move is None:
            break
        max_pair_moves -= 1
        k, s, t = move
        c[p.edge_src[k]], c[p.edge_dst[k]] = s, t
    if plan_memory(p, c) > limit:
        c = _walk_towards(p, c, smallest_memory(p).choice if fallback is None else fallback, limit)
    return c, plan_memory(p, c) <= limit


def _cheapest_pair(p: DiscreteProblem, c: np.ndarray, cur, t_now: float, m_now: float,
                   chunk: int = _PAIR_CHUNK) -> tuple[int, int, int] | None:
    """The move of an edge's two layers that saves memory at the least added
    time per byte saved (``(edge, s, t)``, the first in ``[e, S, S]`` order
    among equals), or None if none saves. Where plans hold runs each memory
    costs a window (:mod:`search.local.run_moves`), so moves are scored in chunks
    by a lower bound on their score (their added time over the most they
    can save, :func:`search.local.moves.pair_memory_floors`): every move that
    speeds the plan up first, then the others in order of that bound until
    it exceeds the best score found; the result is the full scoring's."""
    if not cur.runs:  # every memory is a sum: all at once
        time, memory = pair_moves(p, c, cur)
    else:
        floors = pair_memory_floors(p, c, cur)
        most = (m_now - floors) * (1 + 1e-9) + 1e-9 * abs(m_now)  # [e, S, S] the most each move can save
        time = pair_moves(p, c, cur, only=np.zeros(floors.shape, bool)).time_s
        memory = np.full(floors.shape, np.inf)
        cand = np.isfinite(time) & (most > 0)
        dt = time - t_now
        bound = np.where(cand, np.where(dt > 0, dt / np.where(most > 0, most, 1.0), -np.inf), np.inf).ravel()
        order = np.argsort(bound, kind="stable")
        order = order[:int(np.searchsorted(bound[order], np.inf))]  # the candidates, least bound first
        speedups = int(np.searchsorted(bound[order], -np.inf, side="right"))  # scored in the first chunk
        i, best = 0, np.inf
        while i < order.size and bound[order[i]] <= best:
            end = max(i + chunk, speedups)
            take = order[i:end]
            take = take[bound[take] <= best]
            i = end
            only = np.zeros(floors.size, bool)
            only[take] = True
            mem = pair_moves(p, c, cur, only=only.reshape(floors.shape)).memory_bytes.ravel()
            memory.ravel()[take] = mem[take]
            saved = m_now - mem[take]
            good = saved > 0
            if good.any():
                best = min(best, float(np.min((time.ravel()[take] - t_now)[good] / saved[good])))
    saved = m_now - memory
    ok = (saved > 0) & np.isfinite(time)
    if not ok.any():
        return None
    score = np.where(ok, (time - t_now) / np.where(ok, saved, 1.0), np.inf)
    k, s, t = np.unravel_index(int(np.argmin(score)), score.shape)
    return int(k), int(s), int(t)


def _walk_towards(p: DiscreteProblem, choice: np.ndarray, target: np.ndarray, limit: float) -> np.ndarray:
    """``choice`` moved to ``target`` until it fits ``limit``, on a prefix of
    the layers still off ``target``: ordered once, those whose move alone
    saves memory by added time per byte saved, then the others by the memory
    their move leaves, then its time (the phases or the largest workspace
    may need several layers at once); the prefix is the shortest that fits
    found by bisection, each step checked exactly (memory need not fall
    along the prefix, so it is the end of a bracket: that prefix fits, one
    layer less does not). One scoring of every move and ``O(log n)`` exact
    evaluations, where a walk of one layer per scoring would take up to
    ``n`` scorings, each a window of layers per move where plans hold runs.
    It ends at ``target`` if no shorter prefix fits; the plan keeps what of
    ``choice`` it can, and the local search then improves it."""
    c = np.array(choice, dtype=np.int64)
    target = np.asarray(target, dtype=np.int64)
    off = np.flatnonzero(c != target)
    cur = current_state(p, c)
    if cur.memory_bytes <= limit or not off.size:
        return c
    single = single_moves(p, c, cur)
    mem, time = single.memory_bytes[off, target[off]], single.time_s[off, target[off]]
    saved = cur.memory_bytes - mem
    t_now = with_overlap(p, cur.base_s, cur.grad_s, cur.bwd_s)
    score = np.where(saved > 0, (time - t_now) / np.where(saved > 0, saved, 1.0), np.inf)
    order = off[np.lexsort((time, mem, score))]

    def moved(k: int) -> np.ndarray:
        trial = c.copy()
        trial[order[:k]] = target[order[:k]]
        return trial

    lo, hi = 0, order.size  # moved(lo) does not fit; moved(hi) is target (fits if anything does)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if plan_memory(p, moved(mid)) <= limit:
            hi = mid
        else:
            lo = mid
    return moved(hi)
