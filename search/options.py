"""A problem's options restricted: the compact problem the exact solvers
search (without the options no layer can run and without duplicates,
:func:`compact_options`), each strategy's option without levers, and the
problems without runs, without recomputing or with only some strategies'
options, on which the solvers reason about runs of recomputing layers
(:func:`search.problem.has_runs`). A restricted option costs ``+inf`` time
and memory, as an infeasible one does (:mod:`search.problem`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from search.problem import DiscreteProblem

__all__ = [
    "CompactProblem",
    "compact_options",
    "drop_duplicate_options",
    "plain_options",
    "recomputing_saves_no_time",
    "restricted",
    "with_strategies_of",
    "without_joins",
    "without_recomputing",
]


def plain_options(p: DiscreteProblem) -> np.ndarray:
    """``[S]``: the option of each strategy without levers (``-1`` where the
    problem has none)."""
    S = p.strategy_reshard_s.shape[-1]
    out = np.full(S, -1, dtype=np.int64)
    plain = np.flatnonzero(p.option_lever == 0)
    out[p.option_strategy[plain]] = plain
    return out


class CompactProblem(NamedTuple):
    """A problem without duplicate or unrunnable options (:func:`compact_options`)."""

    problem: DiscreteProblem  # [n, O'] columns
    option_ids: np.ndarray  # [O'] the option each column was
    representative: np.ndarray  # [n, O] the option that stands for each option at each layer (-1: cannot run)


def restricted(p: DiscreteProblem, feasible: np.ndarray) -> DiscreteProblem:
    """``p`` with only the options ``feasible`` [n, O] allows (costs +inf, or 0 for the
    overlap terms and recomputed bytes, elsewhere: the problem's convention)."""
    inf = lambda x: np.where(feasible, x, np.inf)  # noqa: E731
    zero = lambda x: np.where(feasible, x, 0.0)  # noqa: E731
    return p._replace(feasible=feasible, layer_time_s=inf(p.layer_time_s), persistent_bytes=inf(p.persistent_bytes),
                      workspace_bytes=inf(p.workspace_bytes), optimizer_bytes=inf(p.optimizer_bytes),
                      grad_sync_s=zero(p.grad_sync_s), backward_s=zero(p.backward_s),
                      recompute_bytes=zero(p.recompute_bytes))


def _row_ids(rows: np.ndarray) -> np.ndarray:
    """One integer per row of ``rows`` [k, w], equal exactly where the rows
    are equal (a sort of the rows as byte strings; adding zero makes -0.0
    the bytes of 0.0)."""
    rows = np.ascontiguousarray(rows, dtype=np.float64) + 0.0
    as_bytes = rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).ravel()
    return np.unique(as_bytes, return_inverse=True)[1].ravel()


def drop_duplicate_options(p: DiscreteProblem) -> tuple[DiscreteProblem, np.ndarray]:
    """``p`` with every option that duplicates a lower-numbered one at a layer
    ruled out there: same time, memory, gradient sync and backward compute,
    and the same resharding on every edge of the layer. A plan using the
    duplicate costs what the plan using the original costs, so the optimum is
    kept; what goes is symmetry the exact solvers would otherwise branch over
    (on a mesh without a model axis every strategy is data parallelism;
    ZeRO's stages tie where a layer has nothing to shard). Also returns, per
    layer, the option kept for each option ``[n, O]`` (itself if kept, ``-1``
    where it cannot run)."""
    n, O = p.num_layers, p.num_options
    F = p.feasible
    if n == 0 or O < 2:
        return p, np.where(F, np.arange(O)[None, :], -1)
    flags = np.broadcast_to(p.option_recomputes + 2.0 * p.option_joins, (n, O))
    per_layer = np.stack([p.layer_time_s, p.persistent_bytes, p.workspace_bytes, p.optimizer_bytes, p.grad_sync_s,
                          p.backward_s, p.recompute_bytes, flags], axis=-1)  # [n, O, 8]
    ids = _row_ids(per_layer.reshape(n * O, -1)).reshape(n, O)
    same = ids[:, :, None] == ids[:, None, :]  # [n, O, O]
    if p.num_edges:
        e, R = p.num_edges, p.reshard_s  # [e, O, O]
        as_source = _row_ids(R.reshape(e * O, O)).reshape(e, O)  # equal where two options' rows are
        as_destination = _row_ids(np.concatenate([np.swapaxes(R, 1, 2), p.checkpoint_credit[:, :, None]], axis=2)
                                  .reshape(e * O, O + 1)).reshape(e, O)  # equal columns and checkpoint credit
        for incidence, edge_ids in ((p.src_incidence, as_source), (p.dst_incidence, as_destination)):
            differ = (edge_ids[:, :, None] != edge_ids[:, None, :]).reshape(e, O * O).astype(np.float32)
            same &= np.asarray(incidence @ differ).reshape(n, O, O) == 0  # equal on every edge the layer has
    same &= F[:, :, None] & F[:, None, :]
    # the lowest equivalent option stands for each (an option is its own equivalent)
    rep = np.where(F, np.argmax(same, axis=1), -1)  # [n, O]
    feasible = F & (rep == np.arange(O)[None, :])
    if feasible.sum() == p.feasible.sum():
        return p, rep
    return restricted(p, feasible), rep


def _columns(p: DiscreteProblem, keep: np.ndarray) -> DiscreteProblem:
    """``p`` with only the option columns ``keep``."""
    cols = lambda x: x[:, keep]  # noqa: E731
    return p._replace(
        layer_time_s=cols(p.layer_time_s), persistent_bytes=cols(p.persistent_bytes),
        workspace_bytes=cols(p.workspace_bytes), optimizer_bytes=cols(p.optimizer_bytes),
        grad_sync_s=cols(p.grad_sync_s),
        backward_s=cols(p.backward_s), feasible=cols(p.feasible), reshard_s=p.reshard_s[:, keep][:, :, keep],
        option_strategy=p.option_strategy[keep], option_lever=p.option_lever[keep],
        recompute_bytes=cols(p.recompute_bytes), option_recomputes=p.option_recomputes[keep],
        option_joins=p.option_joins[keep],
        checkpoint_credit=p.checkpoint_credit[:, keep],
    )


def compact_options(p: DiscreteProblem) -> CompactProblem:
    """``p`` without the options no layer can run and without duplicate
    options (:func:`drop_duplicate_options`), the option each kept column
    was, and which option stands for each. A lever menu is sparse (ZeRO only
    on layers with parameters, recomputing only where it saves memory), and
    the solvers' pair and transition arrays grow with the square of the
    options: they search the compact problem and map their plans back."""
    n, O = p.num_layers, p.num_options
    if n == 0:
        return CompactProblem(p, np.arange(O), np.zeros((0, O), dtype=np.int64))
    runnable = np.flatnonzero(p.feasible.any(axis=0))
    q, rep_q = drop_duplicate_options(_columns(p, runnable) if runnable.size < O else p)
    kept = np.flatnonzero(q.feasible.any(axis=0))
    rep = np.full((n, O), -1, dtype=np.int64)  # in the table's option codes
    rep[:, runnable] = np.where(rep_q >= 0, runnable[np.maximum(rep_q, 0)], -1)
    return CompactProblem(_columns(q, kept) if kept.size < q.num_options else q, runnable[kept], rep)


def without_joins(p: DiscreteProblem) -> DiscreteProblem:
    """``p`` without its joining options (``remat+join``): a problem without
    runs (:func:`search.problem.has_runs`), whose memory is a sum over layers again."""
    return restricted(p, p.feasible & ~p.option_joins[None, :])


def with_strategies_of(p: DiscreteProblem, plans) -> DiscreteProblem:
    """``p`` with only the options of the strategies ``plans`` ([k, n] or
    one plan [n]) give each layer: any ZeRO stage, keeping or recomputing,
    alone or in a run, of those strategies (so a plan of it reshards as one
    of them would)."""
    c = np.asarray(plans, dtype=np.int64).reshape(-1, p.num_layers)
    used = np.zeros((p.num_layers, int(p.option_strategy.max()) + 1), dtype=bool)  # [n, strategies]
    used[np.broadcast_to(np.arange(p.num_layers), c.shape), p.option_strategy[c]] = True
    return restricted(p, used[:, p.option_strategy] & p.feasible)


def without_recomputing(p: DiscreteProblem) -> DiscreteProblem:
    """``p`` without its recomputing options (``remat``, ``remat+join``)."""
    return restricted(p, p.feasible & ~p.option_recomputes[None, :])


def recomputing_saves_no_time(p: DiscreteProblem) -> bool:
    """Whether every layer's recomputing option has an option of the same
    strategy that does not recompute, with the same gradient sync, no more
    backward compute and a layer time lower by at least as much (recomputing
    adds the forward pass to the backward pass; to the tables' float32
    rounding, 1e-6 relative; without overlap, only the layer time counts).
    Then, as the plan time's overlap share is at most 1, every plan is at
    least as slow as some plan
    of :func:`without_recomputing` ``(p)``: recomputing (alone or in runs)
    only lowers memory, and that problem's fastest plan, where it fits, is
    the fastest of ``p``. The cost tables' recomputing options are so
    (:mod:`costmodels.levers`)."""
    recomputing = p.feasible & p.option_recomputes[None, :]  # [n, O]
    if not recomputing.any():
        return True
    if not 0.0 <= p.gradient_overlap <= 1.0:
        return False
    plain = p.feasible & ~p.option_recomputes[None, :]
    T = np.where(p.feasible, p.layer_time_s, 0.0)  # (the pairs compared are feasible: no inf - inf)
    G, B = p.grad_sync_s, p.backward_s
    extra_t = T[:, :, None] - T[:, None, :]  # [n, O, O]: o recomputes, o' not
    slack = 1e-6 * np.abs(T)[:, :, None]  # the float32 tables' rounding (their sums round alike)
    ok = (p.option_strategy[:, None] == p.option_strategy[None, :])[None] & plain[:, None, :]
    if p.gradient_overlap:
        extra_b = B[:, :, None] - B[:, None, :]
        ok &= (G[:, :, None] == G[:, None, :]) & (extra_b >= 0.0) & (extra_t >= p.gradient_overlap * extra_b - slack)
    else:  # the time is the layers' and the edges' sums
        ok &= extra_t >= -slack
    return bool(np.all(ok.any(axis=2)[recomputing]))
