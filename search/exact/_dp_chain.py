"""A chain problem's arrays by position (:class:`Chain`) and the min-sum
Viterbi over them, shared by the steps of :func:`search.exact.dp.solve_dp`
(:mod:`search.exact._dp_bounds`, :mod:`search.exact._dp_labels`) and by the
refinement's segment moves."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from search.problem import DiscreteProblem

__all__ = ["Chain", "chain_arrays", "to_layers", "viterbi"]


def viterbi(unary, pair, weighted=None) -> tuple[np.ndarray, np.ndarray]:
    """Min-sum paths of a batch of chains (the one Viterbi: the chain DP and
    the refinement's segment moves both use it): ``unary [K, n, S]`` (``inf``
    = forbidden), ``pair [n, S, S]`` shared by the chains or ``[K, n, S, S]``
    one per chain (``pair[..., i, s, t]``: position ``i-1`` on ``s`` and
    position ``i`` on ``t``; position 0 unused), plus, with ``weighted =
    (C [n, S, S], w [K])``, ``w[k] C`` on chain ``k``'s pairs. Returns the
    values ``[K]`` and the paths ``[K, n]``."""
    K, n, S = unary.shape
    pair = np.asarray(pair)
    per_chain = pair.ndim == 4
    value = unary[:, 0]
    back = np.zeros((n, K, S), dtype=np.int64)
    for i in range(1, n):
        cand = value[:, :, None] + (pair[:, i] if per_chain else pair[i][None])
        if weighted is not None:
            cand = cand + weighted[1][:, None, None] * weighted[0][i][None]
        back[i] = np.argmin(cand, axis=1)
        value = np.min(cand, axis=1) + unary[:, i]
    path = np.zeros((K, n), dtype=np.int64)
    path[:, n - 1] = np.argmin(value, axis=1)
    rows = np.arange(K)
    for i in range(n - 1, 0, -1):
        path[:, i - 1] = back[i][rows, path[:, i]]
    return np.min(value, axis=1), path


class Chain(NamedTuple):
    order: np.ndarray  # [n] layer index at chain position i
    time: np.ndarray  # [n, S] seconds (inf = infeasible)
    persistent: np.ndarray  # [n, S] backward-phase bytes (0 where infeasible)
    optimizer: np.ndarray  # [n, S] optimizer-phase bytes (0 where infeasible)
    workspace: np.ndarray  # [n, S] bytes (inf where infeasible)
    grad: np.ndarray
    bwd: np.ndarray
    pair: np.ndarray  # [n, S, S] seconds


def chain_arrays(p: DiscreteProblem, order: np.ndarray) -> Chain:
    """``p``'s arrays by chain position, layer ``order[i]`` at position ``i``
    (every layer's input edge at its position: in-degree at most one)."""
    n, S = p.layer_time_s.shape
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)
    pair = np.zeros((n, S, S))
    pair[pos[p.edge_dst]] = p.reshard_s  # in-degree <= 1: one edge per position
    return Chain(
        order=order,
        time=p.layer_time_s[order],
        persistent=np.where(p.feasible, p.persistent_bytes, 0.0)[order],
        optimizer=np.where(p.feasible, p.optimizer_bytes, 0.0)[order],
        workspace=p.workspace_bytes[order],
        grad=p.grad_sync_s[order],
        bwd=p.backward_s[order],
        pair=pair,
    )


def to_layers(ch: Chain, path: np.ndarray) -> np.ndarray:
    """Paths ``[..., n]`` by chain position as plans by layer."""
    out = np.empty_like(path)
    out[..., ch.order] = path
    return out
