"""The discrete planning problem of one :class:`~costmodels.CostTable`, on
the host in float64: the exact cost of a plan (one strategy per layer) and
chain detection.

Every discrete solver (:mod:`search.local`, :mod:`search.exact`) scores
plans with these functions, so they all optimise the same objective: for a
plan ``c``

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
other solvers index by plan). :mod:`search.options` restricts a problem's
options; :mod:`search.exact.memory` finds the smallest memory any plan needs.

Only real layers are kept (padding rows are dropped; they must come last,
as :meth:`planner.LayerGraph.padded` puts them) and parallel edges between
the same two layers are merged by summing their resharding tables.
Infeasible strategies cost ``+inf`` time and memory.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import scipy.sparse

from costmodels import levers_per_strategy, option_recomputing, option_strategy

__all__ = [
    "DiscreteProblem",
    "discrete_problem",
    "plan_time",
    "plan_memory",
    "plan_times",
    "plan_memories",
    "run_parts",
    "run_terms",
    "has_runs",
    "chain_order",
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


def plan_time(p: DiscreteProblem, choice) -> float:
    """Iteration seconds of one plan ``choice`` [n]."""
    return float(plan_times(p, np.asarray(choice)[None])[0])


def plan_memory(p: DiscreteProblem, choice) -> float:
    """Peak bytes per device of one plan ``choice`` [n]."""
    return float(plan_memories(p, np.asarray(choice)[None])[0])


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
