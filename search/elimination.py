"""An exact dynamic programme over plans of a DAG of small frontier, in JAX:
the hard minimum (with the optimal plan, by backtracking) and the soft
minimum ``-tau log sum_plans exp(-time(plan) / tau)`` (smooth; it tends to
the minimum as ``tau -> 0``, and its gradient with respect to a layer's
costs is the probability of each strategy under the Gibbs distribution
over plans).

Layers are visited in topological order. The *frontier* is the set of
layers whose output still has a consumer ahead. The DP value is a table over
the joint strategies of ``C`` carried axes, ``V[s_0, ..., s_{C-1}]``
(``S**C`` entries), one axis per frontier layer (axes beyond the frontier
are *dummies*: the table is constant along them). An event appends an axis
for the new layer (``K = C + 1`` axes, ``S**K`` entries, never stored), adds
the layer's time along it and the resharding of each incoming edge along
the (source axis, new axis) pair, and eliminates one axis (min or soft-min
over it): the frontier layer with no consumer left, or a dummy (dropped
without a reduction) when none leaves. A layer that frees two axes takes a
second event. This is variable elimination along a path decomposition
(Bertelè and Brioschi, "Nonserial Dynamic Programming", 1972): exact for
any DAG, at ``O(L S**K)`` work where ``K`` is the largest frontier plus the
new layer (2 on chains, 3 on ResNets). Everything is arrays (a ``lax.scan``
over events whose elimination is a ``lax.switch`` over the ``K`` axes, so
each branch is one static, fused reduction), so it jits, vmaps and
differentiates.

Tables are processed ``B`` at a time as *lanes*, the last axis of every
array (``[L, S, B]`` layer times, ``[E, S, S, B]`` resharding), so that each
step is a vectorised pass over ``S**K x B`` floats; tables sharing a
schedule (graphs of one structure) share a scan.

The objective is ``time`` of :func:`costmodels.iteration_time` without its
gradient-overlap term (exact when ``gradient_overlap = 0``, every preset).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from costmodels import NUM_STRATEGIES as S, LayerTable

__all__ = [
    "INFEASIBLE_S",
    "MAX_SLOTS",
    "DPSchedule",
    "best_plan",
    "best_plans",
    "dp_schedule",
    "frontier_size",
    "pad_schedule",
    "soft_min_lanes",
    "soft_min_time",
]

MAX_SLOTS = 4  # axes of an event's table, K: S**4 = 625 joint states
INFEASIBLE_S = 1e30  # time of an infeasible strategy (finite: gradients stay finite)


class DPSchedule(NamedTuple):
    """The DP as a sequence of ``T`` events (``I`` incoming-edge columns, ``K``
    axes per event, ``C = K - 1`` carried). An event appends axis ``K - 1``
    (the layer it adds, or a dummy), adds that layer's time and its incoming
    edges' resharding, and eliminates axis ``kill_axis``; the remaining axes,
    in order, are the next event's carried axes. Layer ``-1`` is a dummy."""

    layer: np.ndarray  # [T] int32 layer the event adds (0 when it adds none)
    add: np.ndarray  # [T] bool: the event adds ``layer``
    kill_axis: np.ndarray  # [T] int32 axis (0..K-1) eliminated
    kill_real: np.ndarray  # [T] bool: that axis is a layer (reduce over it), not a dummy (drop it)
    killed: np.ndarray  # [T] int32 layer on that axis (-1: a dummy)
    in_edge: np.ndarray  # [T, I] int32 index of an incoming edge in the table's edge arrays
    in_axis: np.ndarray  # [T, I] int32 axis (0..K-2) of that edge's source layer
    in_mask: np.ndarray  # [T, I] float32 1 for a real incoming edge
    carried: np.ndarray  # [T, C] int32 layer on each carried axis after the event (-1: a dummy)
    slots: np.ndarray  # [K] int32 0..K-1 (its length is K)


def _edges(graph: LayerTable) -> np.ndarray:
    return np.asarray(graph.edges, dtype=int).reshape(-1, 2)  # [e, 2] source, destination


def _frontier(n: int, edges: np.ndarray):
    """Per layer: its incoming edges and the layers it frees (sources whose
    last consumer it is, itself if it has none); the carried axes needed
    (the most layers alive after a layer's first event) and the in-degree."""
    last = np.arange(n)
    np.maximum.at(last, edges[:, 0], edges[:, 1])
    into: list[list[int]] = [[] for _ in range(n)]
    for e, d in enumerate(edges[:, 1].tolist()):
        into[d].append(e)
    src, last_l = edges[:, 0].tolist(), last.tolist()
    frees = [sorted({src[e] for e in into[i] if last_l[src[e]] == i} | ({i} if last_l[i] == i else set()))
             for i in range(n)]
    gone = np.cumsum(np.bincount(last + 1, minlength=n + 1))  # [n + 1] layers whose last consumer is before i
    alive_before = np.arange(n) - gone[:n]  # [n] layers j < i with a consumer at or after i
    carried = max([int(alive_before[i]) + (0 if frees[i] else 1) for i in range(n)] + [0])
    return into, frees, carried, max([len(x) for x in into] + [0])


def frontier_size(graph: LayerTable) -> int:
    """``K``, the axes of an event's table: the most layers alive after a
    layer's first event, plus the new layer."""
    return _frontier(graph.num_layers, _edges(graph))[2] + 1


def dp_schedule(graph: LayerTable, slots: int | None = None, inputs: int | None = None) -> DPSchedule:
    """The DP schedule of ``graph`` (host numpy), with ``slots`` axes per
    event (default: :func:`frontier_size`) and ``inputs`` incoming-edge
    columns (default: the largest in-degree), one event per layer plus one
    per extra layer it frees."""
    n = graph.num_layers
    edges = _edges(graph)
    into, frees, C, indeg = _frontier(n, edges)
    need = C + 1
    K = need if slots is None else int(slots)
    if need > K or K > MAX_SLOTS:
        raise ValueError(f"{graph.model_name}: the exact plan DP needs {need} slots (layers alive at once); "
                         f"at most {min(K, MAX_SLOTS)} are supported")
    I_ = max(indeg, 1) if inputs is None else int(inputs)
    if indeg > I_:
        raise ValueError(f"{graph.model_name}: a layer has more than {I_} inputs")
    src = edges[:, 0].tolist()
    C = K - 1
    carry: list[int] = [-1] * C
    events = []  # (layer or -1, kill axis, [(edge, source axis)], carried after)
    for i in range(n):
        W = carry + [i]
        k = W.index(frees[i][0]) if frees[i] else W.index(-1)  # a dummy exists: C is large enough
        carry = W[:k] + W[k + 1:]
        events.append((i, k, W[k], [(e, W.index(src[e])) for e in into[i]], carry))
        for f in frees[i][1:]:
            W = carry + [-1]
            k = W.index(f)
            carry = W[:k] + W[k + 1:]
            events.append((-1, k, f, [], carry))
    T = max(1, len(events))
    s = DPSchedule(
        layer=np.zeros(T, np.int32), add=np.zeros(T, bool), kill_axis=np.full(T, C, np.int32),
        kill_real=np.zeros(T, bool), killed=np.full(T, -1, np.int32), in_edge=np.zeros((T, I_), np.int32),
        in_axis=np.zeros((T, I_), np.int32), in_mask=np.zeros((T, I_), np.float32),
        carried=np.full((T, C), -1, np.int32), slots=np.arange(K, dtype=np.int32),
    )
    for t, (layer, k, killed, ins, after) in enumerate(events):
        if layer >= 0:
            s.layer[t], s.add[t] = layer, True
        s.kill_axis[t], s.killed[t], s.kill_real[t] = k, killed, killed >= 0
        for j, (e, axis) in enumerate(ins):
            s.in_edge[t, j], s.in_axis[t, j], s.in_mask[t, j] = e, axis, 1.0
        s.carried[t] = after
    return s


def pad_schedule(s: DPSchedule, slots: int, inputs: int, steps: int) -> DPSchedule:
    """``s`` widened to ``slots`` axes (dummies in front), ``inputs`` edge
    columns and ``steps`` events (padding events drop the dummy they append)."""
    T, I_ = s.in_edge.shape
    K = len(s.slots)
    if slots < K or inputs < I_ or steps < T:
        raise ValueError("cannot shrink a DP schedule")
    d = slots - K

    def grow(x, shape, fill=0):
        out = np.full(shape, fill, x.dtype)
        out[tuple(slice(0, k) for k in x.shape)] = x
        return out

    carried = np.concatenate([np.full((T, d), -1, np.int32), s.carried], axis=1)
    return DPSchedule(
        layer=grow(s.layer, (steps,)), add=grow(s.add, (steps,)),
        kill_axis=grow(s.kill_axis + d, (steps,), slots - 1), kill_real=grow(s.kill_real, (steps,)),
        killed=grow(s.killed, (steps,), -1), in_edge=grow(s.in_edge, (steps, inputs)),
        in_axis=grow(s.in_axis + d, (steps, inputs)), in_mask=grow(s.in_mask, (steps, inputs)),
        carried=grow(carried, (steps, slots - 1), -1), slots=np.arange(slots, dtype=np.int32))


def _pair_rows(K: int) -> np.ndarray:
    """``[K - 1, S**K]``: for a source on axis ``a`` and the new layer on
    the last axis, the row ``s_a * S + s_new`` of a flattened ``[S*S]``
    resharding table at each flattened joint state."""
    idx = np.arange(S**K)
    digit = lambda k: (idx // S ** (K - 1 - k)) % S
    return np.stack([digit(a) * S + digit(K - 1) for a in range(K - 1)] or [np.zeros(S**K, int)]).astype(np.int32)


def _min_argmin(x, axis: int):
    """Minimum and first argmin along ``axis`` in one variadic reduction."""
    idx = jax.lax.broadcasted_iota(jnp.int32, x.shape, axis)

    def pick(a, b):
        take_b = (b[0] < a[0]) | ((b[0] == a[0]) & (b[1] < a[1]))
        return jnp.where(take_b, b[0], a[0]), jnp.where(take_b, b[1], a[1])

    return jax.lax.reduce((x, idx), (jnp.array(jnp.inf, x.dtype), jnp.int32(0)), pick, (axis,))


def _lane_scan(layer_time, reshard, sched: DPSchedule, eliminate, records: bool):
    """The DP of ``B`` tables sharing one schedule, lanes last: ``layer_time
    [L, S, B]`` (infeasible entries already ``INFEASIBLE_S``), ``reshard
    [E, S, S, B]``. Each event is one branch of a ``lax.switch`` on (kill
    axis, real or dummy): the appended axis, the adds and the elimination
    fuse into one pass that reads ``S**C`` and writes ``S**C`` values per
    lane. Returns the value ``[B]`` and, per event, ``eliminate``'s record
    (``[T, S**C, B]`` int8 argmins when ``records``)."""
    K = sched.slots.shape[0]
    C = K - 1
    B = layer_time.shape[-1]
    rows = jnp.asarray(_pair_rows(K))
    full = (S,) * K + (B,)

    def branch(k, real, V, c, rs, axes, masks, add_on):
        W = V.reshape(S**C, 1, B) + jnp.where(add_on, c, 0.0)[None]  # [S^C, S, B]: appended axis
        W = W.reshape(S**K, B)
        for r, a, m in zip(rs, axes, masks, strict=True):
            W = W + (r.reshape(S * S, B) * m)[rows[a]]
        W = W.reshape(full)
        if real:
            value, rec = eliminate(W, k)
        else:  # a dummy: constant along its axis
            value, rec = jax.lax.index_in_dim(W, 0, k, keepdims=False), None
        rec = (jnp.zeros((S**C, B), jnp.int8) if rec is None else rec.astype(jnp.int8).reshape(S**C, B)) \
            if records else jnp.zeros((), jnp.int8)
        return value.reshape(S**C, B), rec

    branches = [lambda *a, k=k, r=r: branch(k, r, *a) for r in (True, False) for k in range(K)]

    def step(V, x):
        layer, add_on, kill_axis, kill_real, in_edge, in_axis, in_mask = x
        rs = [reshard[in_edge[i]] for i in range(in_edge.shape[0])]
        which = jnp.where(kill_real, kill_axis, K + kill_axis)
        return jax.lax.switch(which, branches, V, layer_time[layer], rs, list(in_axis), list(in_mask), add_on)

    xs = tuple(jnp.asarray(x) for x in (sched.layer, sched.add, sched.kill_axis, sched.kill_real, sched.in_edge,
                                         sched.in_axis, sched.in_mask))
    V, recs = jax.lax.scan(step, jnp.zeros((S**C, B), layer_time.dtype), xs)
    return V[0], recs


def _lanes(table):
    """One table as a single lane: ``[L, S, 1]`` layer times (infeasible:
    ``INFEASIBLE_S``) and ``[E, S, S, 1]`` resharding."""
    if table.feasible.shape[-1] != S:
        raise ValueError(f"the elimination plans strategies, {S} per layer; this table has "
                         f"{table.feasible.shape[-1]} options (memory levers): build it with levers='none'")
    lt = jnp.where(table.feasible, table.layer_time_s, INFEASIBLE_S)
    return lt[..., None], table.reshard_s[..., None]


def soft_min_lanes(layer_time, reshard, sched: DPSchedule, temperature_s):
    """:func:`soft_min_time` of ``B`` tables sharing ``sched``, lanes last
    (as :func:`best_plans`); ``temperature_s`` is a scalar or ``[B]``."""
    tau = jnp.asarray(temperature_s, jnp.float32)

    def eliminate(x, axis):  # -tau log sum exp(-x / tau) along an axis, stabilised by the minimum
        m = jax.lax.stop_gradient(jnp.min(x, axis=axis, keepdims=True))
        soft = m - tau * jnp.log(jnp.sum(jnp.exp(-(x - m) / tau), axis=axis, keepdims=True))
        return jnp.squeeze(soft, axis), None

    value, _ = _lane_scan(layer_time, reshard, sched, eliminate, records=False)
    return value


def soft_min_time(table, sched: DPSchedule, temperature_s):
    """``-tau log sum over plans exp(-time / tau)`` with ``tau = temperature_s``
    (seconds); differentiable in the table's costs."""
    return soft_min_lanes(*_lanes(table), sched, temperature_s)[0]


def best_plans(layer_time, reshard, sched: DPSchedule):
    """The minimum time over plans of ``B`` tables sharing one schedule, lanes
    last: ``layer_time [L, S, B]`` seconds (infeasible entries at least
    ``INFEASIBLE_S``), ``reshard [E, S, S, B]``. Returns the value ``[B]`` and
    a plan reaching it ``[L, B]`` int32 (first strategy on ties), by
    backtracking through the recorded argmins. Not differentiable."""
    layer_time, reshard = jax.lax.stop_gradient((layer_time, reshard))
    K = sched.slots.shape[0]
    C = K - 1
    L, B = layer_time.shape[0], layer_time.shape[-1]
    value, recs = _lane_scan(layer_time, reshard, sched, _min_argmin, records=True)  # recs [T, S^C, B]

    def back(choice, x):  # choice [L + 1, B]; row L (dummies) stays 0
        rec, killed, carried = x
        state = jnp.zeros((B,), jnp.int32)  # [B] flat index of the carried layers' strategies (Horner's rule:
        for j in range(C):  # a multiply-sum here becomes a dot that XLA:CPU threads, slower per step)
            state = state * S + choice[carried[j]]
        got = jnp.take_along_axis(rec, state[None, :], axis=0)[0].astype(jnp.int32)
        return choice.at[killed].set(jnp.where(killed < L, got, 0)), None

    as_row = lambda x: jnp.where(jnp.asarray(x) < 0, L, jnp.asarray(x))
    choice, _ = jax.lax.scan(back, jnp.zeros((L + 1, B), jnp.int32),
                             (recs, as_row(sched.killed), as_row(sched.carried)), reverse=True)
    return value, choice[:L]


def best_plan(table, sched: DPSchedule):
    """The minimum time over plans and one plan reaching it, ``[L]`` int32
    (first strategy on ties). Not differentiable."""
    value, choice = best_plans(*_lanes(table), sched)
    return value[0], choice[:, 0]
