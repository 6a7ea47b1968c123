"""Steps 1 and 2 of :func:`search.exact.dp.solve_dp` (its module docstring):
the workspace caps (or, over runs, the intervals of the largest transient)
and the scaled arrays of the relaxation (:func:`relaxation`), and the
Lagrangian ascent on the two phases' additive constraints for all caps at
once (:func:`coordinate_ascent`), which records every plan it meets that
keeps both phases (upper bounds) and each cap's best lower bound."""

from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np

from search.exact._dp_chain import Chain, to_layers, viterbi
from search.exact.dp_runs import lighter_runs, run_intervals
from search.exact.memory import memory_by_workspace_cap
from search.exact.runs import (
    BUCKETS,
    MOST_BUCKET_OPEN_STATES,
    BucketMoves,
    RunChain,
    SkipMoves,
    all_bucket_moves,
    bucket_viterbi,
    pair_groups,
    skip_added,
    skip_moves,
)
from search.problem import DiscreteProblem, plan_memories, plan_memory, plan_time, plan_times

__all__ = ["DualSearch", "Duals", "Relaxation", "coordinate_ascent", "dual_plans", "relaxation", "start_duals"]

_TOL = 1e-9  # relative: bounds closer than this count as equal
_ASCENT_STAGES = 6  # turns of the dual's coordinate ascent (lambda, mu, ...); more barely shrank the label search on random chains


class Relaxation(NamedTuple):
    """The caps of step 1 and the relaxation's arrays, times scaled by ``t0``
    and bytes by ``m0``; element ``k = c * V + v`` is cap ``c`` on time
    variant ``v``."""

    caps: np.ndarray  # [C] bytes: each cap's largest workspace (over runs, largest transient)
    floors: np.ndarray  # [C] bytes: the least each cap's plans count for it (over runs, the interval's floor)
    budgets: np.ndarray  # [C] bytes: the backward phase's additive budget per cap
    variants: int  # V: additive time functions (two with an overlap term, the time their max)
    t0: float  # seconds: the time scale
    m0: float  # bytes: the memory scale
    cap_of: np.ndarray  # [K] each element's cap
    unary_t: np.ndarray  # [K, n, S] scaled seconds (inf outside the cap)
    pair: np.ndarray  # [n, S, S] scaled seconds
    use: np.ndarray  # [2, n, S] the two phases' additive bytes, scaled
    budget_n: np.ndarray  # [2, K] the two phases' budgets, scaled
    rows: np.ndarray  # [1, n] positions
    credit: np.ndarray | None  # [n, S, S] backward-phase pair terms (scaled), runs only
    bucketed: bool  # runs under a limit: intervals of the peak, bucketed Viterbi
    moves: BucketMoves | None  # the buckets' moves per cap (bucketed)
    skips: SkipMoves | None  # the open skip edges' states, their bytes scaled (bucketed)
    groups: list | None  # bucket_viterbi's pair groups, once for every multiplier (bucketed)


def relaxation(p: DiscreteProblem, ch: Chain, rc: RunChain | None, limit: float) -> Relaxation | None:
    """Step 1 and the arrays of step 2 (``rc``: the run chain where plans
    hold runs, ``ch`` its arrays). None where no cap's lower bound on
    memory fits ``limit`` (skipping above the limit loses no plan)."""
    bucketed = rc is not None and np.isfinite(limit)  # runs under a limit: intervals of the peak, not caps
    moves = skips = None
    if bucketed:
        caps, floors, _ = run_intervals(p, rc, limit)
        if caps.size == 0:
            return None
        moves = all_bucket_moves(rc, caps, BUCKETS)
        # which open skip edges still earn their credits, their bytes scaled as the phases' below (m0 = limit);
        # past MOST_BUCKET_OPEN_STATES open over a layer, none: every credit taken as earned
        skips = skip_moves(rc, MOST_BUCKET_OPEN_STATES)
        if skips is not None:
            skips = skips._replace(add=[a / limit for a in skips.add])
    elif np.isfinite(limit):
        caps, cap_memory = memory_by_workspace_cap(p)
        caps = caps[cap_memory <= limit]  # a lower bound per cap: skipping above the limit loses no plan
        if caps.size == 0:
            return None
        floors = caps
    else:
        caps = floors = np.array([np.inf])
    budgets = limit - floors if np.isfinite(limit) else np.array([np.inf])  # backward phase's budget per cap
    variants = [ch.time]
    if p.gradient_overlap:  # time = max of these two additive functions
        variants = [ch.time - p.gradient_overlap * ch.grad, ch.time - p.gradient_overlap * ch.bwd]
    V = len(variants)
    t0 = max(float(np.sum(np.min(ch.time, axis=1))), 1e-30)
    m0 = limit if np.isfinite(limit) else 1.0
    # element k = (cap c, variant v): k = c * V + v
    cap_of = np.repeat(np.arange(caps.size), V)
    within = ch.workspace[None] <= caps[:, None, None]  # [C, n, S]
    unary_t = np.stack([np.where(within[c], variants[v], np.inf) for c, v in zip(cap_of, np.tile(np.arange(V), caps.size))])
    unary_t = unary_t / t0
    pair = ch.pair / t0
    use = np.stack([ch.persistent, ch.optimizer]) / m0  # [2, n, S]: the two phases' additive bytes
    K = unary_t.shape[0]
    budget_n = np.stack([budgets[cap_of], np.full(K, limit)]) / m0  # [2, K]
    rows = np.arange(p.num_layers)[None, :]
    credit = None if rc is None else -rc.credit / m0  # [n, S, S] backward-phase pair terms (scaled), runs only
    groups = pair_groups(pair, credit) if bucketed else None  # (bucket_viterbi's, once for every multiplier)
    return Relaxation(caps, floors, budgets, V, t0, m0, cap_of, unary_t, pair, use, budget_n, rows, credit, bucketed,
                      moves, skips, groups)


class Duals(NamedTuple):
    """The ascent's state per element, updated in place (scaled units)."""

    lower: np.ndarray  # [K] seconds: the best Lagrangian bound of each element
    mult: np.ndarray  # [2, K] current (lambda, mu)
    mult_best: np.ndarray  # [2, K] the multipliers of the best lower bound
    # the plan at ``mult``: whether it keeps each phase, its dual value and the dual's slopes
    fit: np.ndarray  # [2, K] bool
    dual: np.ndarray  # [K]
    slope: np.ndarray  # [2, K]


def start_duals(K: int) -> Duals:
    """The :class:`Duals` of ``K`` elements before the ascent: no bound, zero multipliers."""
    return Duals(np.full(K, -np.inf), np.zeros((2, K)), np.zeros((2, K)), np.zeros((2, K), dtype=bool),
                 np.zeros(K), np.zeros((2, K)))


class DualSearch(NamedTuple):
    """What the ascent reads and updates: the problem, its chain (``rc``
    over runs, ``order`` its layers by position), the relaxation, the
    duals, ``best`` (the best plan's time ``"t"`` and path by position
    ``"path"``) and ``repaired`` (the plans :func:`search.exact.dp_runs.lighter_runs`
    has repaired)."""

    p: DiscreteProblem
    ch: Chain
    rc: RunChain | None
    order: np.ndarray  # [n]
    limit: float  # bytes
    rx: Relaxation
    duals: Duals
    best: dict
    repaired: set


def dual_plans(s: DualSearch, m: np.ndarray, idx: np.ndarray):
    """Viterbi for elements ``idx`` at multipliers ``m [2, k]``: records
    the plans that keep both phases (exact check) and the bounds; returns
    whether each plan keeps each phase [2, k], the dual value
    ``V - m . budget`` [k] and its slopes ``used - budget`` [2, k]."""
    p, rx, best, limit = s.p, s.rx, s.best, s.limit
    use, credit, rows = rx.use, rx.credit, rx.rows
    u = rx.unary_t[idx] + m[0][:, None, None] * use[0][None] + m[1][:, None, None] * use[1][None]
    weighted = None if credit is None else (credit, m[0])
    if rx.bucketed:
        moves, cap_of = rx.moves, rx.cap_of
        val, path = bucket_viterbi(u, rx.pair, moves._replace(allowed=moves.allowed[cap_of[idx]],
                                                              nxt=moves.nxt[cap_of[idx]],
                                                              start=moves.start[cap_of[idx]]), weighted, rx.skips,
                                   rx.groups)
    else:
        val, path = viterbi(u, rx.pair, weighted)
    used = np.stack([np.sum(use[r][rows, path], axis=1) for r in range(2)])
    if credit is not None:  # the checkpoints freed inside runs, along each path
        used[0] += np.sum(credit[rows[:, 1:], path[:, :-1], path[:, 1:]], axis=1)
    if rx.skips is not None:  # the skip edges' credits the paths do not earn
        used[0] += skip_added(rx.skips, path)
    fits = used <= rx.budget_n[:, idx] * (1 + 1e-15)
    both = np.flatnonzero(fits.all(axis=0))
    if both.size:  # upper bounds: exact time and memory of the plans that keep both phases
        layers = to_layers(s.ch, path[both])
        mem, t = plan_memories(p, layers), plan_times(p, layers)
        j = int(np.argmin(np.where(mem <= limit, t, np.inf)))
        if mem[j] <= limit and t[j] < best["t"]:
            best["t"], best["path"] = float(t[j]), path[both[j]]
        if s.rc is not None:  # runs: the fastest plan broken only by the runs' transients, repaired
            j = int(np.argmin(np.where(mem > limit, t, np.inf)))
            if mem[j] > limit and t[j] < best["t"] and tuple(path[both[j]]) not in s.repaired:
                s.repaired.add(tuple(path[both[j]]))
                fixed = lighter_runs(p, layers[j])
                if plan_memory(p, fixed) <= limit and plan_time(p, fixed) < best["t"]:
                    best["t"], best["path"] = plan_time(p, fixed), fixed[s.order]
    with np.errstate(invalid="ignore"):  # a zero multiplier drops its (maybe infinite) budget
        g = val - np.sum(np.where(m > 0, m * rx.budget_n[:, idx], 0.0), axis=0)
        excess = used - rx.budget_n[:, idx]
    d = s.duals
    better = g * rx.t0 > d.lower[idx]
    d.lower[idx[better]] = g[better] * rx.t0
    d.mult_best[:, idx[better]] = m[:, better]
    return fits, g, excess


def _ascend(s: DualSearch, r: int, idx: np.ndarray, until: float, bisection_steps: int) -> np.ndarray:
    """Move multiplier ``r`` of elements ``idx`` to the maximum of the dual
    along ``r``, the other multiplier fixed: the smallest value whose plan
    keeps phase ``r`` (the dual is concave and piecewise linear along
    ``r``, its slope the phase's excess, which falls as the multiplier
    grows). The maximum is bracketed by ``lo`` (plan breaks the phase)
    and ``hi`` (plan keeps it): upward by fourfold steps where the plan
    at the current value breaks the phase, downward from zero where it
    keeps it. Each step tries where the two bracketing plans' lines
    cross (the maximum if no third plan is lower there, which ends the
    search) and falls back to bisection when that is not inside the
    bracket. Returns the elements for which no multiplier kept the phase."""
    d, best = s.duals, s.best
    fit, dual, slope, mult, lower = d.fit, d.dual, d.slope, d.mult, d.lower
    k = idx.size
    up = ~fit[r, idx]
    lo, hi = np.where(up, mult[r, idx], np.nan), np.where(up, np.nan, mult[r, idx])
    g_lo, g_hi = np.where(up, dual[idx], np.nan), np.where(up, np.nan, dual[idx])
    s_lo, s_hi = np.where(up, slope[r, idx], np.nan), np.where(up, np.nan, slope[r, idx])
    done = np.zeros(k, dtype=bool)
    for _ in range(64 + bisection_steps):
        if time.perf_counter() > until:
            break
        go = ~done & (lower[idx] < best["t"] * (1 - _TOL))
        if not go.any():
            break
        sel = np.flatnonzero(go)
        l, h = lo[sel], hi[sel]
        both = ~np.isnan(l) & ~np.isnan(h)
        with np.errstate(invalid="ignore", divide="ignore"):
            cross = (g_hi[sel] - h * s_hi[sel] - g_lo[sel] + l * s_lo[sel]) / (s_lo[sel] - s_hi[sel])
            inside_ = both & (cross > l) & (cross < h)
            halve = np.where(l > 0, np.sqrt(np.maximum(l, 1e-300) * h), h / 16.0)
            probe = np.where(inside_, cross, np.where(both, halve, np.where(np.isnan(h),
                             np.where(l > 0, 4.0 * l, 1.0), 0.0)))
        m = mult[:, idx[sel]].copy()
        m[r] = probe
        fits, g, excess = dual_plans(s, m, idx[sel])
        ok = fits[r]
        with np.errstate(invalid="ignore"):  # the crossing lines' value there; the dual is below both
            touched = inside_ & (g >= g_lo[sel] + (probe - l) * s_lo[sel] - 1e-12 * (1 + np.abs(g)))
        for a, b, c, e in ((lo, g_lo, s_lo, ~ok), (hi, g_hi, s_hi, ok)):
            a[sel[e]], b[sel[e]], c[sel[e]] = probe[e], g[e], excess[r, e]
        # the plan now at the multiplier's resting place (hi, or the maximum where the lines touch)
        rest = ok | touched
        fit[:, idx[sel[rest]]] = fits[:, rest]
        dual[idx[sel[rest]]] = g[rest]
        slope[:, idx[sel[rest]]] = excess[:, rest]
        mult[r, idx[sel[rest]]] = probe[rest]
        done[sel] = touched | (ok & (probe == 0)) | (both & (h <= l * (1 + 1e-9)))
    return idx[np.isnan(hi)]


def coordinate_ascent(s: DualSearch, deadline: float, bisection_steps: int) -> None:
    """Step 2's coordinate ascent from the plans at zero multipliers
    (:func:`dual_plans` of every element, already in ``s.duals``): ``lambda``
    and ``mu`` take turns, at most ``_ASCENT_STAGES``, each only where the
    other multiplier moved and the bound is below the best plan; past
    ``deadline`` (a ``time.perf_counter()`` reading) it stops after the
    first turn (which finds the first plans that fit)."""
    d, best = s.duals, s.best
    K = d.lower.size
    stuck = np.zeros(K, dtype=bool)
    stale = np.ones((2, K), dtype=bool)  # the multiplier may be off its maximum along its axis
    for stage in range(_ASCENT_STAGES):  # coordinate ascent: lambda, mu, lambda, ...
        if stage and time.perf_counter() > deadline:  # the first turn always (it finds the first plans that fit)
            break
        r = stage % 2
        # at zero with the phase kept, the slope along r is <= 0: already the maximum there
        idx = np.flatnonzero(stale[r] & ~stuck & (d.lower < best["t"] * (1 - _TOL)) & (~d.fit[r] | (d.mult[r] > 0)))
        if idx.size:
            was = d.mult[r, idx].copy()
            stuck[_ascend(s, r, idx, np.inf if stage == 0 else deadline, bisection_steps)] = True
            stale[1 - r, idx[d.mult[r, idx] != was]] = True  # the other axis's maximum moves with this one
        stale[r] = False
        if not np.any(stale & ~stuck & (d.lower < best["t"] * (1 - _TOL))):
            break
