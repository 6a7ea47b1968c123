"""Moves of a plan scored exactly, for all layers and strategies at once
(a pass costs ``O(n S + e S^2)`` array work): every single-layer change and
every change of the two layers of an edge, by the discrete objective of
:mod:`search.problem` (the cost model at one-hot probabilities). Memory is
the larger of its two phases, each updated from the plan's sums: the
backward phase (persistent bytes plus the largest workspace, which needs
the plan's top three workspaces) and the optimizer phase (a plain sum).
Where the problem holds runs of recomputing layers
(:func:`search.problem.has_runs`), whose memory is no such sum, each
move's memory is the exact memory of the plan it makes, computed in the
window of layers whose runs the move can change
(:mod:`search.local.run_moves`: ``O(run length)`` per move)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from search.local.run_moves import moved_run_memories, window_bounds
from search.problem import DiscreteProblem, has_runs, plan_memory

__all__ = ["CurrentState", "MoveScores", "current_state", "pair_memory_floors", "pair_moves", "single_moves",
           "with_overlap"]


class MoveScores(NamedTuple):
    """Exact time and memory of the plan after each possible move."""

    time_s: np.ndarray  # [n, S] (single) or [e, S, S] (pair)
    memory_bytes: np.ndarray


class CurrentState(NamedTuple):
    base_s: float  # time without the overlap term
    grad_s: float
    bwd_s: float
    persistent_bytes: float  # backward phase without its workspace term
    optimizer_bytes: float  # optimizer phase
    workspace: np.ndarray  # [n] each layer's workspace under the plan
    top_idx: np.ndarray  # [3] layers with the largest workspaces (-1 if fewer layers)
    top_val: np.ndarray  # [3]
    layer_delta_s: np.ndarray  # [n, S] base-time change of moving one layer
    edge_now_s: np.ndarray  # [e] each edge's resharding under the plan
    runs: bool = False  # the problem holds runs of recomputing layers: memories are the plans' exact ones
    run_memory_bytes: float = 0.0  # with runs, the plan's memory

    @property
    def memory_bytes(self) -> float:
        """The plan's memory (:func:`search.problem.plan_memory`): the larger phase."""
        if self.runs:
            return self.run_memory_bytes
        return max(self.persistent_bytes + float(self.top_val[0]), self.optimizer_bytes)


def current_state(p: DiscreteProblem, c: np.ndarray) -> CurrentState:
    n, e = p.num_layers, p.num_edges
    rows, ar = np.arange(n), np.arange(e)
    cs, cd = c[p.edge_src], c[p.edge_dst]
    edge_now = p.reshard_s[ar, cs, cd]
    out_d = p.reshard_s[ar, :, cd] - edge_now[:, None]  # [e, S]: source moves
    in_d = p.reshard_s[ar, cs, :] - edge_now[:, None]  # [e, S]: destination moves
    lt_now = p.layer_time_s[rows, c]
    delta = p.layer_time_s - lt_now[:, None]
    if e:
        delta = delta + p.src_incidence @ out_d + p.dst_incidence @ in_d
    ws = p.workspace_bytes[rows, c]
    runs = has_runs(p)
    k = min(3, n)
    top = np.argsort(-ws, kind="stable")[:k]
    top_idx = np.full(3, -1, dtype=np.int64)
    top_val = np.zeros(3)
    top_idx[:k], top_val[:k] = top, ws[top]
    return CurrentState(
        base_s=float(lt_now.sum() + edge_now.sum()),
        grad_s=float(p.grad_sync_s[rows, c].sum()),
        bwd_s=float(p.backward_s[rows, c].sum()),
        persistent_bytes=float(p.persistent_bytes[rows, c].sum()),
        optimizer_bytes=float(p.optimizer_bytes[rows, c].sum()),
        workspace=ws,
        top_idx=top_idx,
        top_val=top_val,
        layer_delta_s=delta,
        edge_now_s=edge_now,
        runs=runs,
        run_memory_bytes=plan_memory(p, c) if runs else 0.0,
    )


def _moved_memories(p: DiscreteProblem, c: np.ndarray, layers: np.ndarray,
                    scored: np.ndarray | None = None) -> np.ndarray:
    """Exact memories ``[K, O, ...]`` of plan ``c`` with the layers
    ``layers`` [K, m] moved to every combination of options (``m`` = 1:
    ``[K, O]``; 2: ``[K, O, O]``; ``inf`` where a layer cannot run the
    option, or where ``scored`` [K, O, ...] is false), each in the window of
    layers its move can change (:func:`search.local.run_moves.moved_run_memories`)."""
    O = p.num_options
    K, m = layers.shape
    grid = np.stack(np.meshgrid(*[np.arange(O)] * m, indexing="ij"), axis=-1).reshape(-1, m)  # [O^m, m]
    runs = np.ones((K, grid.shape[0]), bool)
    for j in range(m):
        runs &= p.feasible[layers[:, j][:, None], grid[None, :, j]]
    if scored is not None:
        runs &= scored.reshape(K, -1)
    kk, gg = np.nonzero(runs)
    out = np.full((K, grid.shape[0]), np.inf)
    out[kk, gg] = moved_run_memories(p, c, layers[kk], grid[gg])
    return out.reshape((K,) + (O,) * m)


def with_overlap(p: DiscreteProblem, base, grad, bwd):
    if not p.gradient_overlap:
        return base
    return base - p.gradient_overlap * np.minimum(grad, bwd)


def single_moves(p: DiscreteProblem, c: np.ndarray, cur: CurrentState | None = None) -> MoveScores:
    """Time and memory ``[n, S]`` after moving layer ``l`` to strategy ``s``
    (the rest of plan ``c`` fixed)."""
    cur = current_state(p, c) if cur is None else cur
    rows = np.arange(p.num_layers)
    time = with_overlap(
        p,
        cur.base_s + cur.layer_delta_s,
        cur.grad_s + p.grad_sync_s - p.grad_sync_s[rows, c][:, None],
        cur.bwd_s + p.backward_s - p.backward_s[rows, c][:, None],
    )
    others = np.where(rows == cur.top_idx[0], cur.top_val[1], cur.top_val[0])  # largest workspace elsewhere
    backward = (
        cur.persistent_bytes
        + p.persistent_bytes
        - p.persistent_bytes[rows, c][:, None]
        + np.maximum(others[:, None], p.workspace_bytes)
    )
    optimizer = cur.optimizer_bytes + p.optimizer_bytes - p.optimizer_bytes[rows, c][:, None]
    if cur.runs:
        return MoveScores(time, _moved_memories(p, c, rows[:, None]))
    return MoveScores(time, np.maximum(backward, optimizer))


def pair_moves(p: DiscreteProblem, c: np.ndarray, cur: CurrentState | None = None,
               faster_than: float | None = None, only: np.ndarray | None = None) -> MoveScores:
    """Time and memory ``[e, S, S]`` after moving both layers of edge ``k``,
    its source to ``s`` and its destination to ``t``. With ``faster_than``,
    only the moves whose time is below it get their memory (the others
    ``inf``), and with ``only`` [e, S, S] (bool) only those it marks: where
    plans hold runs, a memory costs a window of layers
    (:mod:`search.local.run_moves`), and the searches need only some."""
    cur = current_state(p, c) if cur is None else cur
    u, v = p.edge_src, p.edge_dst
    rows = np.arange(p.num_layers)
    ar = np.arange(p.num_edges)
    cu, cv = c[u], c[v]
    # the edge itself is counted in both single deltas; correct it to its joint value
    corr = (
        p.reshard_s
        - p.reshard_s[ar, :, cv][:, :, None]
        - p.reshard_s[ar, cu, :][:, None, :]
        + cur.edge_now_s[:, None, None]
    )
    base = cur.base_s + cur.layer_delta_s[u][:, :, None] + cur.layer_delta_s[v][:, None, :] + corr
    dg = p.grad_sync_s - p.grad_sync_s[rows, c][:, None]
    db = p.backward_s - p.backward_s[rows, c][:, None]
    time = with_overlap(
        p,
        base,
        cur.grad_s + dg[u][:, :, None] + dg[v][:, None, :],
        cur.bwd_s + db[u][:, :, None] + db[v][:, None, :],
    )
    # largest workspace outside {u, v}: the first of the top three that is neither
    ti, tv = cur.top_idx, cur.top_val
    hit = (ti[None, :] == u[:, None]) | (ti[None, :] == v[:, None]) | (ti[None, :] < 0)
    others = np.where(~hit[:, 0], tv[0], np.where(~hit[:, 1], tv[1], np.where(~hit[:, 2], tv[2], 0.0)))
    dA = p.persistent_bytes - p.persistent_bytes[rows, c][:, None]
    dQ = p.optimizer_bytes - p.optimizer_bytes[rows, c][:, None]
    ws = np.maximum(np.maximum(others[:, None, None], p.workspace_bytes[u][:, :, None]), p.workspace_bytes[v][:, None, :])
    backward = cur.persistent_bytes + dA[u][:, :, None] + dA[v][:, None, :] + ws
    optimizer = cur.optimizer_bytes + dQ[u][:, :, None] + dQ[v][:, None, :]
    scored = None if faster_than is None else time < faster_than
    if only is not None:
        scored = only if scored is None else scored & only
    if cur.runs:
        return MoveScores(time, _moved_memories(p, c, np.stack([u, v], axis=1), scored))
    memory = np.maximum(backward, optimizer)
    return MoveScores(time, memory if scored is None else np.where(scored, memory, np.inf))


def pair_memory_floors(p: DiscreteProblem, c: np.ndarray, cur: CurrentState | None = None) -> np.ndarray:
    """A lower bound ``[e, S, S]`` on each memory of :func:`pair_moves`, at
    ``O(e S^2)`` without windows: exact where plans hold no runs; with runs,
    the optimizer phase exact and the backward phase from
    :func:`search.local.run_moves.window_bounds` (the most credit, the peak
    outside the window or the moved layers' workspaces). A search that
    ranks moves by memory saved scores only the moves this bound cannot
    rule out (``pair_moves(only=)``)."""
    cur = current_state(p, c) if cur is None else cur
    if not cur.runs:
        return pair_moves(p, c, cur).memory_bytes
    u, v = p.edge_src, p.edge_dst
    rows = np.arange(p.num_layers)
    credit_most, outside = window_bounds(p, c, np.stack([u, v], axis=1))
    dA = p.persistent_bytes - p.persistent_bytes[rows, c][:, None]
    dQ = p.optimizer_bytes - p.optimizer_bytes[rows, c][:, None]
    peak = np.maximum(np.maximum(outside[:, None, None], p.workspace_bytes[u][:, :, None]),
                      p.workspace_bytes[v][:, None, :])
    backward = cur.persistent_bytes - credit_most[:, None, None] + dA[u][:, :, None] + dA[v][:, None, :] + peak
    optimizer = cur.optimizer_bytes + dQ[u][:, :, None] + dQ[v][:, None, :]
    ok = p.feasible[u][:, :, None] & p.feasible[v][:, None, :]
    return np.where(ok, np.maximum(backward, optimizer), np.inf)
