"""A graph in layer order with its run terms by position (:class:`RunChain`,
:func:`run_chain`), for the DP over runs of recomputing layers
(:mod:`search.exact.runs`, :mod:`search.exact.dp_runs`,
:func:`search.exact.dp.solve_dp`)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from search.exact.layer_chain import skip_resharding
from search.problem import DiscreteProblem

__all__ = ["HOP_BITS", "MAX_OPEN_SKIPS", "RunChain", "run_chain"]

MAX_OPEN_SKIPS = 62  # skip edges open at one position that a label's int64 mask holds
HOP_BITS = 8  # bits of a hop's class in a label's code: at most 255 classes, 7 hops open at once


class RunChain(NamedTuple):
    """A chain problem in layer order with its run terms by position."""

    time: np.ndarray  # [n, O] seconds, +inf where infeasible
    persistent: np.ndarray  # [n, O] backward-phase bytes, +inf where infeasible
    optimizer: np.ndarray  # [n, O] optimizer-phase bytes, +inf where infeasible
    workspace: np.ndarray  # [n, O] bytes, +inf where infeasible
    recompute: np.ndarray  # [n, O] bytes a recomputing option holds again in its run (0 otherwise)
    joins: np.ndarray  # [n, O] bool: the option joins the run before it (never at position 0)
    pair: np.ndarray  # [n, O, O] seconds: position i - 1 on s, i on t (position 0 unused)
    credit: np.ndarray  # [n, O, O] bytes the edge i - 1 -> i frees on (s, t) (search.problem.run_terms)
    # skip edges (src < dst - 1) that can free a checkpoint: their credits, already taken off `persistent` at the
    # destination (a relaxation); a plan earns one only where its source recomputes and the run reaches
    # the destination, else the label search adds it back (search.exact.dp_runs)
    skip_src: np.ndarray  # [K] int
    skip_dst: np.ndarray  # [K] int
    skip_credit: np.ndarray  # [K, O] bytes, by the destination's option
    skip_bit: np.ndarray  # [K] int64: the edge's bit in a label's mask of open edges (reused once it closes)
    skip_opens: np.ndarray  # [n, O] int64: the bits of the skip edges each option opens there (it recomputes)
    # skip edges that reshard (hops): their least resharding over the source's options is folded into
    # `time` at the destination (a relaxation, search.exact.layer_chain.layer_order_chain's "lower"); a label of
    # the search by time carries its source's class in a field of its int64 code and pays the rest there
    hop_src: np.ndarray  # [H] int
    hop_dst: np.ndarray  # [H] int
    hop_class: np.ndarray  # [H, O] int64: the class of each source option (options whose resharding is alike)
    hop_extra: np.ndarray  # [H, C, O] seconds above the least, by the source's class and the destination's option
    hop_shift: np.ndarray  # [H] int64: where the edge's class sits in a label's code (HOP_BITS wide)


def run_chain(p: DiscreteProblem) -> RunChain | None:
    """``p``'s :class:`RunChain`, or None where ``p`` is no graph in layer
    order (runs follow the layers' order, :func:`search.problem.run_terms`):
    every edge runs forward and joins consecutive layers or skips ahead, with
    at most :data:`MAX_OPEN_SKIPS` skip edges that can free a checkpoint
    and at most ``64 // HOP_BITS - 1`` that reshard (each with at most
    ``2 ** HOP_BITS - 1`` classes of source options) over any layer."""
    n, O = p.num_layers, p.num_options
    src, dst = p.edge_src, p.edge_dst
    if np.any(src >= dst):
        return None
    step = dst == src + 1
    skip = np.flatnonzero(~step)
    time = p.layer_time_s.copy()
    hop = skip[np.any(p.reshard_s[skip] != 0.0, axis=(1, 2))]
    hop_class = np.zeros((hop.size, O), dtype=np.int64)
    rows = []
    for h, e in enumerate(hop):
        feasible = np.flatnonzero(p.feasible[src[e]])
        if feasible.size == 0:  # no plan at all
            return None
        classes, which = np.unique(p.reshard_s[e][feasible], axis=0, return_inverse=True)  # [C, O(dst)]
        least = skip_resharding(p, e, "lower")
        time[dst[e]] += least  # (search.exact.layer_chain.layer_order_chain's "lower")
        if classes.shape[0] >= 1 << HOP_BITS:
            return None
        hop_class[h, feasible] = which.reshape(-1)
        rows.append(classes - least[None, :])
    slots = _bits(src[hop], dst[hop], 64 // HOP_BITS - 1)
    if slots is None:
        return None
    hop_extra = np.zeros((hop.size, max((r.shape[0] for r in rows), default=1), O))
    for h, r in enumerate(rows):
        hop_extra[h, :r.shape[0]] = r
    can_start = p.feasible[src[skip]] & p.option_recomputes[None, :]  # [K, O]
    live = can_start.any(axis=1) & (p.checkpoint_credit[skip] > 0).any(axis=1)
    skip = skip[live]  # the others never free anything
    bits = _bits(src[skip], dst[skip], MAX_OPEN_SKIPS)
    if bits is None:
        return None
    pair = np.zeros((n, O, O))
    credit = np.zeros((n, O, O))
    pair[dst[step]] = p.reshard_s[step]  # one edge per position (parallel edges are merged)
    credit[dst[step]] = p.option_recomputes[None, :, None] * p.checkpoint_credit[step][:, None, :]
    joins = np.broadcast_to(p.option_joins, (n, O)) & (np.arange(n) > 0)[:, None]
    persistent = p.persistent_bytes.copy()
    np.subtract.at(persistent, dst[skip], p.checkpoint_credit[skip])
    opens = np.zeros((n, O), dtype=np.int64)
    np.bitwise_or.at(opens, src[skip], np.where(can_start[live], np.int64(1) << bits[:, None], 0))
    return RunChain(time=np.where(p.feasible, time, np.inf), persistent=persistent, optimizer=p.optimizer_bytes,
                    workspace=p.workspace_bytes, recompute=p.recompute_bytes, joins=joins, pair=pair, credit=credit,
                    skip_src=src[skip], skip_dst=dst[skip], skip_credit=p.checkpoint_credit[skip], skip_bit=bits,
                    skip_opens=opens, hop_src=src[hop], hop_dst=dst[hop], hop_class=hop_class, hop_extra=hop_extra,
                    hop_shift=(slots * HOP_BITS).astype(np.int64))


def _bits(src: np.ndarray, dst: np.ndarray, count: int) -> np.ndarray | None:
    """A slot per edge ``(src, dst]`` such that edges open at one position
    have different slots (interval colouring in order of sources), or None
    where more than ``count`` are open at once."""
    out = np.zeros(src.size, dtype=np.int64)
    free_at = np.full(count, -1)  # the destination of the edge holding each slot
    for k in np.argsort(src, kind="stable"):
        ok = np.flatnonzero(free_at <= src[k])
        if ok.size == 0:
            return None
        out[k] = ok[0]
        free_at[ok[0]] = dst[k]
    return out
