"""The discrete planning problem of one :class:`~costmodels.CostTable`, on
the host in float64: the exact cost of a plan (one strategy per layer), the
exact smallest memory any plan needs, and chain detection.

Every discrete solver (:mod:`search.refine`, :mod:`search.dp`,
:mod:`search.milp`, :mod:`search.brute`) scores plans with these functions,
so they all optimise the same objective: for a plan ``c``

``time(c) = sum_l layer_time[l, c_l] + sum_e reshard[e, c_src, c_dst]
          - overlap * min(sum_l grad_sync[l, c_l], sum_l backward[l, c_l])``

``memory(c) = max(sum_l (state - update + activations)[l, c_l] + max_l workspace[l, c_l],
                 sum_l state[l, c_l])``

the larger of two phases of the training step: the backward pass (state
but the optimizer's update, the saved activations, the largest transient)
and the optimizer step (state with the update; the activations are freed
by then: XLA's buffer assignment, docs/validation.md "The memory promise"),
less the checkpoints freed inside runs of recomputed layers and with each
layer's transient grown by its run's recomputed activations
(:func:`run_terms`; zero unless a layer joins the run before it),

which is :func:`costmodels.iteration_time` and
:func:`costmodels.memory_per_device` at one-hot probabilities, summed in
float64 instead of float32 (the table's values themselves are float32).

A plan's choices are *options*: strategies, each under the table's lever
settings (:mod:`costmodels.levers`; without levers, options are the
strategies). Levers leave resharding alone, so the problem holds the
table's resharding by strategy (``strategy_reshard_s``, what the MILP
uses) and expanded to every pair of options (``reshard_s``, what the
other solvers index by plan).

Only real layers are kept (padding rows are dropped; they must come last,
as :meth:`planner.LayerGraph.padded` puts them) and parallel edges between
the same two layers are merged by summing their resharding tables.
Infeasible strategies cost ``+inf`` time and memory.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import scipy.sparse

from costmodels.levers import levers_per_strategy, option_recomputing, option_strategy

__all__ = [
    "DiscreteProblem",
    "MinimumMemory",
    "discrete_problem",
    "plan_time",
    "plan_memory",
    "plan_times",
    "plan_memories",
    "run_parts",
    "run_terms",
    "has_runs",
    "recomputing_saves_no_time",
    "without_joins",
    "without_recomputing",
    "minimum_memory",
    "memory_by_workspace_cap",
    "chain_order",
    "CompactProblem",
    "compact_options",
    "drop_duplicate_options",
    "plain_options",
]


class DiscreteProblem(NamedTuple):
    """One table's costs over its ``n`` real layers, ``O`` options and ``e``
    distinct edges."""

    layer_time_s: np.ndarray  # [n, O] float64, +inf where the option cannot run the layer
    persistent_bytes: np.ndarray  # [n, O] backward phase: state but the update + activations, +inf where infeasible
    workspace_bytes: np.ndarray  # [n, O] backward phase's transient, +inf where infeasible
    optimizer_bytes: np.ndarray  # [n, O] optimizer phase: the state (weights, gradients, optimizer state and
    # update, buffers), +inf where infeasible
    grad_sync_s: np.ndarray  # [n, O] (0 where infeasible)
    backward_s: np.ndarray  # [n, O] (0 where infeasible)
    feasible: np.ndarray  # [n, O] bool
    edge_src: np.ndarray  # [e] int64
    edge_dst: np.ndarray  # [e] int64
    reshard_s: np.ndarray  # [e, O, O] float64, by the two ends' options
    strategy_reshard_s: np.ndarray  # [e, S, S] float64, by the two ends' strategies
    option_strategy: np.ndarray  # [O] int64, each option's strategy
    option_lever: np.ndarray  # [O] int64, each option's lever in the table's menu (0: none)
    src_incidence: scipy.sparse.csr_matrix  # [n, e]: 1 where layer is the edge's source
    dst_incidence: scipy.sparse.csr_matrix  # [n, e]: 1 where layer is the edge's destination
    neighbor_ptr: np.ndarray  # [n + 1] CSR row pointers of the undirected adjacency
    neighbor_idx: np.ndarray  # [...] neighbours of each layer
    gradient_overlap: float
    memory_capacity_bytes: float
    recompute_bytes: np.ndarray  # [n, O] a recomputing option's activations, made again in the backward pass (else 0)
    option_recomputes: np.ndarray  # [O] bool, the option's lever recomputes
    option_joins: np.ndarray  # [O] bool, ... joining the run of the layer before (remat+join)
    checkpoint_credit: np.ndarray  # [e, O] bytes of its destination's kept input the edge frees, by the destination's
    # (joining) option, when both ends are in one run of recomputing layers (costmodels.recomputed_runs)

    @property
    def num_layers(self) -> int:
        return int(self.layer_time_s.shape[0])

    @property
    def num_options(self) -> int:
        return int(self.layer_time_s.shape[1])


    @property
    def num_edges(self) -> int:
        return int(self.edge_src.shape[0])


class MinimumMemory(NamedTuple):
    """The smallest peak memory per device any plan needs, and one such plan."""

    memory_bytes: float
    choice: np.ndarray  # [n] int: a plan reaching it (ties: the faster layer strategy)
    workspace_cap_bytes: float  # its largest workspace
    exact: bool = True  # False: the smallest memory found within a time limit, not proven smallest


def _f64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def discrete_problem(table) -> DiscreteProblem:
    """The :class:`DiscreteProblem` of one (unbatched) ``CostTable``."""
    mask = _f64(table.layer_mask)
    if mask.ndim != 1:
        raise ValueError(f"expected one cost table, got a batch of shape {mask.shape}; index it first")
    n = int(np.sum(mask > 0))
    if np.any(mask[:n] <= 0) or np.any(mask[n:] > 0):
        raise ValueError("the table's real layers must come first and its padding rows last")
    feasible = np.asarray(table.feasible, dtype=bool)[:n]
    no_option = np.flatnonzero(~feasible.any(axis=1))
    if no_option.size:
        raise ValueError(
            f"layer(s) {no_option[:5].tolist()} can run no strategy on this mesh and batch; "
            "choose a mesh whose data axis divides the batch"
        )
    inf = np.inf
    layer_time = np.where(feasible, _f64(table.layer_time_s)[:n], inf)
    state = _f64(table.state_bytes)[:n]
    update = _f64(table.update_bytes)[:n]
    persistent = np.where(feasible, state - update + _f64(table.activation_bytes)[:n], inf)
    optimizer = np.where(feasible, state, inf)
    workspace = np.where(feasible, _f64(table.workspace_bytes)[:n], inf)
    grad = np.where(feasible, _f64(table.grad_sync_s)[:n], 0.0)
    bwd = np.where(feasible, _f64(table.backward_compute_s)[:n], 0.0)
    recompute = np.where(feasible, _f64(table.recompute_bytes)[:n], 0.0)

    emask = _f64(table.edge_mask) > 0
    src = np.asarray(table.edge_src, dtype=np.int64)[emask]
    dst = np.asarray(table.edge_dst, dtype=np.int64)[emask]
    reshard = _f64(table.reshard_s)[emask]
    recomputes, joins = option_recomputing(feasible.shape[1])  # [O] each
    credit = _f64(table.edge_input_share)[emask][:, None] * _f64(table.checkpoint_bytes)[dst] * joins  # [e, O]
    if src.size and (src.max() >= n or dst.max() >= n or np.any(src == dst)):
        raise ValueError("edges must join two different real layers")
    # merge parallel edges (same source and destination): their costs add up
    key = src * max(n, 1) + dst
    uniq, inverse = np.unique(key, return_inverse=True)
    merged = np.zeros((uniq.size,) + reshard.shape[1:])
    np.add.at(merged, inverse, reshard)
    merged_credit = np.zeros((uniq.size, feasible.shape[1]))
    np.add.at(merged_credit, inverse, credit)
    src, dst = uniq // max(n, 1), uniq % max(n, 1)
    e = src.size
    ones = np.ones(e)
    strategy_of = np.asarray(option_strategy(feasible.shape[1]), dtype=np.int64)
    expanded = merged[:, strategy_of][:, :, strategy_of]  # [e, O, O]
    src_inc = scipy.sparse.csr_matrix((ones, (src, np.arange(e))), shape=(n, e))
    dst_inc = scipy.sparse.csr_matrix((ones, (dst, np.arange(e))), shape=(n, e))
    adj = scipy.sparse.csr_matrix((np.ones(2 * e), (np.r_[src, dst], np.r_[dst, src])), shape=(n, n))
    adj.sum_duplicates()
    return DiscreteProblem(
        layer_time_s=layer_time,
        persistent_bytes=persistent,
        workspace_bytes=workspace,
        optimizer_bytes=optimizer,
        grad_sync_s=grad,
        backward_s=bwd,
        feasible=feasible,
        edge_src=src,
        edge_dst=dst,
        reshard_s=expanded,
        strategy_reshard_s=merged,
        option_strategy=strategy_of,
        option_lever=np.arange(feasible.shape[1], dtype=np.int64) % levers_per_strategy(feasible.shape[1]),
        src_incidence=src_inc,
        dst_incidence=dst_inc,
        neighbor_ptr=np.asarray(adj.indptr, dtype=np.int64),
        neighbor_idx=np.asarray(adj.indices, dtype=np.int64),
        gradient_overlap=float(np.asarray(table.gradient_overlap)),
        memory_capacity_bytes=float(np.asarray(table.memory_capacity_bytes)),
        recompute_bytes=recompute,
        option_recomputes=recomputes,
        option_joins=joins,
        checkpoint_credit=merged_credit,
    )


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


def _restricted(p: DiscreteProblem, feasible: np.ndarray) -> DiscreteProblem:
    """``p`` with only the options ``feasible`` [n, O] allows (costs +inf, or 0 for the
    overlap terms and recomputed bytes, elsewhere: the problem's convention)."""
    inf = lambda x: np.where(feasible, x, np.inf)  # noqa: E731
    zero = lambda x: np.where(feasible, x, 0.0)  # noqa: E731
    return p._replace(feasible=feasible, layer_time_s=inf(p.layer_time_s), persistent_bytes=inf(p.persistent_bytes),
                      workspace_bytes=inf(p.workspace_bytes), optimizer_bytes=inf(p.optimizer_bytes),
                      grad_sync_s=zero(p.grad_sync_s), backward_s=zero(p.backward_s),
                      recompute_bytes=zero(p.recompute_bytes))


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
    same = np.all(per_layer[:, :, None, :] == per_layer[:, None, :, :], axis=-1)  # [n, O, O]
    if p.num_edges:
        R = p.reshard_s  # [e, O, O]
        rows = np.all(R[:, :, None, :] == R[:, None, :, :], axis=-1)  # [e, O, O]: as the edge's source
        cols = np.all(R[:, :, :, None] == R[:, :, None, :], axis=1)  # [e, O, O]: as its destination
        credit = p.checkpoint_credit[:, :, None] == p.checkpoint_credit[:, None, :]  # [e, O, O]: as its destination
        differ = (p.src_incidence @ (~rows).reshape(p.num_edges, -1).astype(np.float64)
                  + p.dst_incidence @ (~(cols & credit)).reshape(p.num_edges, -1).astype(np.float64))  # [n, O O]
        same &= np.asarray(differ).reshape(n, O, O) == 0
    same &= F[:, :, None] & F[:, None, :]
    # the lowest equivalent option stands for each (an option is its own equivalent)
    rep = np.where(F, np.argmax(same, axis=1), -1)  # [n, O]
    feasible = F & (rep == np.arange(O)[None, :])
    if feasible.sum() == p.feasible.sum():
        return p, rep
    return _restricted(p, feasible), rep


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


# -- exact cost of plans ----------------------------------------------------------------


def plan_times(p: DiscreteProblem, choices: np.ndarray) -> np.ndarray:
    """Iteration seconds of plans ``choices`` [N, n] (option codes; ``inf`` if any layer is infeasible)."""
    c = np.asarray(choices, dtype=np.int64)
    rows = np.arange(p.num_layers)
    layer = p.layer_time_s[rows, c].sum(axis=-1)
    edges = p.reshard_s[np.arange(p.num_edges), c[..., p.edge_src], c[..., p.edge_dst]].sum(axis=-1)
    if p.gradient_overlap:
        grad = p.grad_sync_s[rows, c].sum(axis=-1)
        bwd = p.backward_s[rows, c].sum(axis=-1)
        return layer + edges - p.gradient_overlap * np.minimum(grad, bwd)
    return layer + edges


def plan_memories(p: DiscreteProblem, choices: np.ndarray) -> np.ndarray:
    """Peak bytes per device of plans ``choices`` [N, n]."""
    c = np.asarray(choices, dtype=np.int64)
    rows = np.arange(p.num_layers)
    if p.num_layers == 0:
        return np.zeros(c.shape[:-1])
    credit, transient = run_terms(p, c)
    backward = p.persistent_bytes[rows, c].sum(axis=-1) - credit + (p.workspace_bytes[rows, c] + transient).max(axis=-1)
    return np.maximum(backward, p.optimizer_bytes[rows, c].sum(axis=-1))


def run_terms(p: DiscreteProblem, choices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What runs of consecutive recomputing layers change in the backward
    phase of plans ``choices`` [N, n] (:func:`costmodels.recomputed_runs` at
    one-hot probabilities): the checkpoint bytes freed by the edges inside a
    run ``[N]``, and each layer's transient beyond its workspace ``[N, n]``,
    the recomputed activations of the run's layers before it."""
    c = np.asarray(choices, dtype=np.int64)
    n = p.num_layers
    j = p.option_joins[c] & (np.arange(n) > 0)  # [N, n] (the first layer has no run to join)
    if not np.any(j[..., 1:] & p.option_recomputes[c[..., :-1]]):  # no layer joins a run: nothing changes
        return np.zeros(c.shape[:-1]), np.zeros(c.shape)
    _, transient, credit = run_parts(p, c)
    return credit.sum(axis=-1), transient


def run_parts(p: DiscreteProblem, choices: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The parts of :func:`run_terms`, per layer and edge, of plans
    ``choices`` [N, n]: the first layer of each layer's run ``[N, n]``, each
    layer's transient ``[N, n]``, and each edge's credit ``[N, e]`` (its
    destination's freed checkpoint where both ends are in one run, else 0)."""
    c = np.asarray(choices, dtype=np.int64)
    n = p.num_layers
    j = p.option_joins[c] & (np.arange(n) > 0)  # [N, n] (the first layer has no run to join)
    rec = p.recompute_bytes[np.arange(n), c]  # [N, n]
    start = np.maximum.accumulate(np.where(j, -1, np.arange(n)), axis=-1)  # [N, n] last layer <= l not joining
    before = np.concatenate([np.zeros(c.shape[:-1] + (1,)), np.cumsum(rec, axis=-1)], axis=-1)  # sums of rec[< k]
    run = before[..., 1:] - np.take_along_axis(before, start, axis=-1)  # [N, n] rec over the run up to l
    src_recomputes = p.option_recomputes[np.take(c, p.edge_src, axis=-1)]  # [N, e]
    inside = src_recomputes & (np.take(start, p.edge_dst, axis=-1) <= p.edge_src) & (p.edge_src < p.edge_dst)
    credit = np.where(inside, p.checkpoint_credit[np.arange(p.num_edges), np.take(c, p.edge_dst, axis=-1)], 0.0)
    return start, run - rec, credit


def has_runs(p: DiscreteProblem) -> bool:
    """Whether a plan may hold a run of recomputing layers that changes its
    memory (:func:`run_terms`), which is then not a sum over layers: a layer
    can join the run of a recomputing layer before it, and some recomputing
    option has activations or a checkpoint to share."""
    can = (p.feasible & p.option_recomputes[None, :]).any(axis=1)  # [n]
    join = (p.feasible & p.option_joins[None, :]).any(axis=1)  # [n]
    return bool(np.any(join[1:] & can[:-1]) and (np.any(p.recompute_bytes > 0) or np.any(p.checkpoint_credit > 0)))


def without_joins(p: DiscreteProblem) -> DiscreteProblem:
    """``p`` without its joining options (``remat+join``): a problem without
    runs (:func:`has_runs`), whose memory is a sum over layers again."""
    return _restricted(p, p.feasible & ~p.option_joins[None, :])


def with_strategies_of(p: DiscreteProblem, plans) -> DiscreteProblem:
    """``p`` with only the options of the strategies ``plans`` ([k, n] or
    one plan [n]) give each layer: any ZeRO stage, keeping or recomputing,
    alone or in a run, of those strategies (so a plan of it reshards as one
    of them would)."""
    c = np.asarray(plans, dtype=np.int64).reshape(-1, p.num_layers)
    used = np.zeros((p.num_layers, int(p.option_strategy.max()) + 1), dtype=bool)  # [n, strategies]
    used[np.broadcast_to(np.arange(p.num_layers), c.shape), p.option_strategy[c]] = True
    return _restricted(p, used[:, p.option_strategy] & p.feasible)


def without_recomputing(p: DiscreteProblem) -> DiscreteProblem:
    """``p`` without its recomputing options (``remat``, ``remat+join``)."""
    return _restricted(p, p.feasible & ~p.option_recomputes[None, :])


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


def plan_time(p: DiscreteProblem, choice) -> float:
    """Iteration seconds of one plan ``choice`` [n]."""
    return float(plan_times(p, np.asarray(choice)[None])[0])


def plan_memory(p: DiscreteProblem, choice) -> float:
    """Peak bytes per device of one plan ``choice`` [n]."""
    return float(plan_memories(p, np.asarray(choice)[None])[0])


# -- the smallest memory any plan needs ---------------------------------------------------


def memory_by_workspace_cap(p: DiscreteProblem) -> tuple[np.ndarray, np.ndarray]:
    """For every workspace cap ``w`` worth trying (every distinct workspace
    value at which each layer has an option within the cap), a lower bound
    on ``max(w + sum_l persistent[l, c_l], sum_l optimizer[l, c_l])`` over
    the plans ``c`` whose every workspace is at most ``w`` (the memory with
    the workspace term taken as ``w``, what the DP bounds at that cap; at a
    plan's own largest workspace, its memory): each phase at its own
    per-layer minimum, ``max(w + sum_l min{persistent[l, o] : workspace[l, o]
    <= w}, sum_l min{optimizer[l, o] : workspace[l, o] <= w})``. Exact where
    one plan reaches both minima (the usual case: sharding a layer more
    lowers both phases); :func:`minimum_memory` finds the exact smallest
    memory.

    Returns ``(caps, memory)``, both ascending in ``caps``. Separable over
    layers because memory does not depend on edges: each layer's best bytes
    of a phase is a step function of the cap, and the sum of step functions
    is accumulated from sorted events."""
    n = p.num_layers
    if n == 0:
        return np.zeros(1), np.zeros(1)
    W = p.workspace_bytes
    caps = np.unique(W[np.isfinite(W)])  # every cap that changes which options are allowed
    backward, covered = _phase_minimum_by_cap(W, p.persistent_bytes, caps)
    optimizer, _ = _phase_minimum_by_cap(W, p.optimizer_bytes, caps)
    ok = covered == n
    caps = caps[ok]
    return caps, np.maximum(caps + backward[ok], optimizer[ok])


def _phase_minimum_by_cap(W: np.ndarray, X: np.ndarray, caps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``sum_l min{X[l, o] : W[l, o] <= cap}`` at every cap, and how many
    layers have an option within it."""
    n = W.shape[0]
    order = np.argsort(W, axis=1, kind="stable")  # infeasible (inf) last
    Ws = np.take_along_axis(W, order, axis=1)
    Xs = np.take_along_axis(X, order, axis=1)
    best = np.minimum.accumulate(Xs, axis=1)
    prev = np.concatenate([np.full((n, 1), np.inf), best[:, :-1]], axis=1)
    changed = (best < prev) & np.isfinite(Ws)
    first = changed & np.isinf(prev)
    delta = np.where(first, best, best - np.where(np.isinf(prev), 0.0, prev))
    ev_w, ev_delta, ev_first = Ws[changed], delta[changed], first[changed].astype(np.int64)
    idx = np.argsort(ev_w, kind="stable")
    ev_w, ev_delta, ev_first = ev_w[idx], ev_delta[idx], ev_first[idx]
    total, covered = np.cumsum(ev_delta), np.cumsum(ev_first)
    at = np.searchsorted(ev_w, caps, side="right") - 1  # the last event at or below each cap
    safe = np.maximum(at, 0)
    return np.where(at >= 0, total[safe], np.inf), np.where(at >= 0, covered[safe], 0)


def _minimum_within_cap(p: DiscreteProblem, cap: float, upper: float, max_labels: int = 200_000):
    """The smallest ``max(cap + sum persistent, sum optimizer)`` over plans
    whose every workspace is at most ``cap``, with such a plan, or ``None``
    when no plan is below ``upper``. Exact: a Pareto search over the two
    phases' partial sums, layer by layer (memory has no edge terms, so the
    layers' order is free), pruned by each phase's minimum still to add and
    by ``upper``. Ties between options of the same memory: the faster one."""
    n = p.num_layers
    within = p.feasible & (p.workspace_bytes <= cap)
    P = np.where(within, p.persistent_bytes, np.inf)
    Q = np.where(within, p.optimizer_bytes, np.inf)
    T = np.where(within, p.layer_time_s, np.inf)
    # each layer's Pareto options over (persistent, optimizer), the faster of equals
    fronts = []
    for i in range(n):
        o = np.flatnonzero(within[i])
        o = o[np.lexsort((T[i, o], Q[i, o], P[i, o]))]
        keep = np.r_[True, Q[i, o[1:]] < np.minimum.accumulate(Q[i, o])[:-1]] if o.size else np.zeros(0, bool)
        fronts.append(o[keep])
    p_rest = np.r_[np.cumsum([P[i, f].min() for i, f in enumerate(fronts)][::-1])[::-1], 0.0]
    q_rest = np.r_[np.cumsum([Q[i, f].min() for i, f in enumerate(fronts)][::-1])[::-1], 0.0]
    lab_p, lab_q = np.zeros(1), np.zeros(1)
    parents: list[tuple[np.ndarray, np.ndarray]] = []  # per layer: (label it extends, option)
    for i, f in enumerate(fronts):
        cand_p = (lab_p[:, None] + P[i, f][None, :]).ravel()
        cand_q = (lab_q[:, None] + Q[i, f][None, :]).ravel()
        parent = np.repeat(np.arange(lab_p.size), f.size)
        option = np.tile(f, lab_p.size)
        ok = np.maximum(cap + cand_p + p_rest[i + 1], cand_q + q_rest[i + 1]) < upper
        cand_p, cand_q, parent, option = cand_p[ok], cand_q[ok], parent[ok], option[ok]
        if cand_p.size == 0:
            return None
        o = np.lexsort((cand_q, cand_p))
        cand_p, cand_q, parent, option = cand_p[o], cand_q[o], parent[o], option[o]
        front = np.r_[True, cand_q[1:] < np.minimum.accumulate(cand_q)[:-1]]
        lab_p, lab_q = cand_p[front], cand_q[front]
        parents.append((parent[front], option[front]))
        if lab_p.size > max_labels:
            raise RuntimeError(f"the smallest memory needs over {max_labels} Pareto labels at one layer")
    memory = np.maximum(cap + lab_p, lab_q)
    j = int(np.argmin(memory))
    choice = np.zeros(n, dtype=np.int64)
    for i in range(n - 1, -1, -1):
        parent, option = parents[i]
        choice[i] = option[j]
        j = int(parent[j])
    return float(memory.min()), choice


def minimum_memory(p: DiscreteProblem) -> MinimumMemory:
    """The exact smallest peak memory per device over all plans (for any
    graph: memory has no edge terms), with a plan that reaches it. Caps are
    tried in the order of their lower bound (:func:`memory_by_workspace_cap`)
    until the next bound is no better than the best plan found. Not for a
    problem with runs of recomputing layers (:func:`has_runs`), whose memory
    has edge terms: :func:`search.milp.smallest_memory` takes any problem."""
    if p.num_layers == 0:
        return MinimumMemory(0.0, np.zeros(0, dtype=np.int64), 0.0)
    if has_runs(p):
        raise ValueError("minimum_memory adds memory up layer by layer, which runs of recomputed layers break; "
                         "use search.milp.smallest_memory")
    caps, bound = memory_by_workspace_cap(p)
    best, choice = np.inf, None
    for k in np.argsort(bound, kind="stable"):
        if bound[k] >= best:
            break
        found = _minimum_within_cap(p, float(caps[k]), best)
        if found is not None:
            best, choice = found
    return MinimumMemory(plan_memory(p, choice), choice, float(p.workspace_bytes[np.arange(p.num_layers), choice].max()))


# -- chains ---------------------------------------------------------------------------------


def chain_order(p: DiscreteProblem) -> np.ndarray | None:
    """An order of the layers in which every edge joins consecutive layers
    (source first), or ``None`` if the graph is not a union of disjoint
    paths. Sequential CNNs (VGG, AlexNet, CosmoFlow) are chains; residual
    networks are not."""
    n = p.num_layers
    out_deg = np.bincount(p.edge_src, minlength=n)
    in_deg = np.bincount(p.edge_dst, minlength=n)
    if n and (out_deg.max(initial=0) > 1 or in_deg.max(initial=0) > 1):
        return None
    nxt = np.full(n, -1, dtype=np.int64)
    nxt[p.edge_src] = p.edge_dst
    order = []
    for start in np.flatnonzero(in_deg == 0):  # path heads, in index order
        v = int(start)
        while v >= 0:
            order.append(v)
            v = int(nxt[v])
    if len(order) != n:  # a cycle: not a DAG
        return None
    return np.asarray(order, dtype=np.int64)
