"""Exact memories of moved plans where plans hold runs of recomputing
layers (:func:`search.problem.has_runs`), computed in a window around each
move instead of over the whole plan.

A plan's backward phase with runs is ``sum persistent − credit + max_l (W_l +
T_l)`` (:func:`search.problem.plan_memories`): ``T_l`` the recomputed bytes
of the layers of ``l``'s run before it, ``credit`` the checkpoints of the
edges inside a run (:func:`search.problem.run_terms`). Changing the options
of layers ``L`` changes runs only from ``A``, the first layer of the run
holding ``min(L) − 1`` (``min(L)`` may join it), to ``B``, the last layer of
the run going on after ``max(L)`` (the layers after it that join): ``A``
and ``B + 1`` start runs before and after the move, so

- the ``T_l`` outside ``[A, B]`` stay, and their largest ``W_l + T_l`` is a
  prefix and a suffix maximum of the plan's;
- an edge inside a run has both ends in one run, so only the edges whose
  destination lies in ``[A, B]`` can change, and their sources lie there too.

So a move costs ``O(B − A)`` instead of ``O(n)``: runs are short next to a
ResNet-152's 514 layers. Checked against
:func:`search.problem.plan_memories` on random problems
(``tests/test_run_moves.py``). Assumes what the tables hold: an option that
does not recompute has ``recompute_bytes`` 0."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from search.problem import DiscreteProblem, run_parts

__all__ = ["RunState", "moved_run_memories", "run_state", "window_bounds"]

_CHUNK_ELEMENTS = 2_000_000  # window entries per chunk of moved plans


class RunState(NamedTuple):
    """The runs of one plan, what every window needs from outside it."""

    start: np.ndarray  # [n] int: the first layer of each layer's run
    end: np.ndarray  # [n] int: the last layer of the run going on after each layer (the layers after it that join)
    peak_before: np.ndarray  # [n + 1] bytes: max of W_l + T_l over layers < i (-inf for none)
    peak_after: np.ndarray  # [n + 1] bytes: max of W_l + T_l over layers >= i (-inf for none)
    credit_before: np.ndarray  # [n + 1] bytes: the credits of the inside edges whose destination is < i
    persistent_bytes: float  # the plan's persistent bytes (before credits)
    optimizer_bytes: float  # the plan's optimizer phase
    in_edges: np.ndarray  # [n, D] int: each layer's incoming edges (-1: none)
    credit_most_before: np.ndarray  # [n + 1] bytes: the largest credit of each edge (any option), summed over dst < i


def run_state(p: DiscreteProblem, c: np.ndarray) -> RunState:
    """The :class:`RunState` of plan ``c`` [n] (the terms of
    :func:`search.problem.run_terms`, kept per layer:
    :func:`search.problem.run_parts`)."""
    n, rows = p.num_layers, np.arange(p.num_layers)
    j = p.option_joins[c] & (rows > 0)  # [n]
    start, transient, credit = (x[0] for x in run_parts(p, c[None]))
    peak = p.workspace_bytes[rows, c] + transient
    peak_before = np.concatenate([[-np.inf], np.maximum.accumulate(peak)])
    peak_after = np.concatenate([np.maximum.accumulate(peak[::-1])[::-1], [-np.inf]])
    # end[l]: one before the first layer after l that does not join
    nxt = np.concatenate([np.where(~j[1:], rows[1:], n), [n]])  # [n] l + 1 if it starts a run, else n
    end = np.minimum.accumulate(nxt[::-1])[::-1] - 1
    dst = p.edge_dst
    by_dst = np.zeros(n + 1)
    np.add.at(by_dst, dst + 1, credit)
    deg = np.bincount(dst, minlength=n)
    in_edges = np.full((n, max(int(deg.max(initial=0)), 1)), -1, dtype=np.int64)
    order = np.argsort(dst, kind="stable")
    slot = np.arange(order.size) - np.repeat(np.cumsum(deg) - deg, deg)
    in_edges[dst[order], slot] = order
    most = np.zeros(n + 1)
    if p.num_edges:
        np.add.at(most, dst + 1, np.maximum(np.max(p.checkpoint_credit, axis=1, initial=0.0), 0.0))
    return RunState(start, end, peak_before, peak_after, np.cumsum(by_dst),
                    float(p.persistent_bytes[rows, c].sum()), float(p.optimizer_bytes[rows, c].sum()), in_edges,
                    np.cumsum(most))


def _windows(st: RunState, layers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The first and last layers ``[N]`` of the windows of moves of ``layers`` [N, m] (module docstring)."""
    lo, hi = layers.min(axis=1), layers.max(axis=1)
    return np.where(lo > 0, st.start[np.maximum(lo - 1, 0)], 0), st.end[hi]


def window_bounds(p: DiscreteProblem, c: np.ndarray, layers: np.ndarray,
                  state: RunState | None = None) -> tuple[np.ndarray, np.ndarray]:
    """For plan ``c`` with layers ``layers`` [N, m] moved to any options,
    without computing the windows: the most checkpoint credit the moved
    plan can hold ``[N]`` (the edges outside the move's window as now, each
    inside at its largest credit) and the largest ``W_l + T_l`` outside the
    window ``[N]`` (unchanged by the move). So the moved plan's backward
    phase is at least its persistent bytes minus that credit plus the
    larger of that peak and the moved layers' workspaces (inside the window
    ``W_l + T_l >= W_l``: ``T_l`` sums recomputed bytes, never negative): a
    lower bound on the moves' memories (what :func:`moved_run_memories`
    computes exactly) at ``O(m)`` per move."""
    st = run_state(p, c) if state is None else state
    a, b = _windows(st, np.asarray(layers, np.int64))
    credit = st.credit_before[-1] - (st.credit_before[b + 1] - st.credit_before[a])
    credit += st.credit_most_before[b + 1] - st.credit_most_before[a]
    return credit, np.maximum(st.peak_before[a], st.peak_after[b + 1])


def moved_run_memories(p: DiscreteProblem, c: np.ndarray, layers: np.ndarray, options: np.ndarray,
                       state: RunState | None = None) -> np.ndarray:
    """Exact memories ``[N]`` of plan ``c`` with layers ``layers`` [N, m]
    (distinct in each row) moved to ``options`` [N, m] (options they can
    run): :func:`search.problem.plan_memories` of those plans, window by
    window (module docstring)."""
    st = run_state(p, c) if state is None else state
    layers, options = np.asarray(layers, np.int64), np.asarray(options, np.int64)
    N, m = layers.shape
    a, b = _windows(st, layers)  # [N] the windows' first and last layers
    persistent = st.persistent_bytes + np.sum(p.persistent_bytes[layers, options] - p.persistent_bytes[layers, c[layers]],
                                              axis=1)
    optimizer = st.optimizer_bytes + np.sum(p.optimizer_bytes[layers, options] - p.optimizer_bytes[layers, c[layers]],
                                            axis=1)
    credit_out = st.credit_before[-1] - (st.credit_before[b + 1] - st.credit_before[a])  # [N] edges outside windows
    outside = np.maximum(st.peak_before[a], st.peak_after[b + 1])  # [N] the largest W_l + T_l outside
    peak, credit = np.empty(N), np.empty(N)
    width = b - a + 1
    order = np.argsort(width, kind="stable")  # similar widths share a chunk: little padding
    i = 0
    while i < N:  # chunks of at most _CHUNK_ELEMENTS window entries
        size = max(1, _CHUNK_ELEMENTS // int(width[order[i]]))
        while size > 1 and size * int(width[order[min(i + size, N) - 1]]) > _CHUNK_ELEMENTS:
            size //= 2
        take = order[i:i + size]
        i += take.size
        peak[take], credit[take] = _window_terms(p, c, st, a[take], b[take], layers[take] - a[take, None],
                                                 options[take])
    backward = persistent - credit_out - credit + np.maximum(outside, peak)
    return np.maximum(backward, optimizer)


def _window_terms(p: DiscreteProblem, c: np.ndarray, st: RunState, a: np.ndarray, b: np.ndarray, at: np.ndarray,
                  options: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For moved plans whose runs change in ``[a, b]`` [K] (the moved layers
    at window positions ``at`` [K, m], to ``options``): the largest ``W_l +
    T_l`` in the window and the credits of the edges inside a run whose
    destination is in it, each ``[K]`` (:func:`search.problem.run_terms`
    on the window, which starts a run)."""
    K, w = a.size, int(np.max(b - a)) + 1
    pos = np.arange(w)
    idx = a[:, None] + pos[None, :]  # [K, w]
    valid = idx <= b[:, None]
    idx = np.minimum(idx, p.num_layers - 1)
    cw = c[idx]
    rows = np.arange(K)[:, None]
    cw[rows, at] = options
    j = p.option_joins[cw] & valid & (pos > 0)[None, :]  # the window's first layer starts a run
    rec = np.where(valid, p.recompute_bytes[idx, cw], 0.0)
    start = np.maximum.accumulate(np.where(j, -1, pos[None, :]), axis=1)  # [K, w]
    before = np.concatenate([np.zeros((K, 1)), np.cumsum(rec, axis=1)], axis=1)
    transient = before[:, 1:] - np.take_along_axis(before, start, axis=1) - rec
    peak = np.max(np.where(valid, p.workspace_bytes[idx, cw] + transient, -np.inf), axis=1)
    credit = np.zeros(K)
    for slot in range(st.in_edges.shape[1]):  # each layer's incoming edges (at most a few)
        e = st.in_edges[idx, slot]  # [K, w]
        has = valid & (e >= 0)
        e = np.maximum(e, 0)
        src = p.edge_src[e] - a[:, None]  # the source's window position
        ok = has & (src >= 0) & (src < pos[None, :]) & (start <= src)
        ok &= p.option_recomputes[np.take_along_axis(cw, np.clip(src, 0, w - 1), axis=1)]
        credit += np.sum(np.where(ok, p.checkpoint_credit[e, cw], 0.0), axis=1)
    return peak, credit
