"""An exact dynamic programme over plans of a DAG of small frontier, in JAX:
the hard minimum (with the optimal plan, by backtracking) and the soft
minimum ``-tau log sum_plans exp(-time(plan) / tau)`` (smooth; it tends to
the minimum as ``tau -> 0``, and its gradient with respect to a layer's
costs is the probability of each strategy under the Gibbs distribution
over plans).

Layers are visited in topological order. The *frontier* is the set of
layers whose output still has a consumer ahead; each frontier layer holds a
slot, and the DP value is a table over the joint strategies of the slots,
``V[s_0, ..., s_{K-1}]`` (``S**K`` entries, flattened). A step adds the new
layer's time along its slot and the resharding of each incoming edge along
the (source slot, new slot) pair, then eliminates (min or soft-min) the
slots of layers with no consumer left. This is variable elimination along a
path decomposition (Bertelè and Brioschi, "Nonserial Dynamic Programming",
1972): exact for any DAG, at ``O(L S**K)`` work where ``K`` is the largest
frontier (2 on chains, 3 on ResNets). Everything is arrays (a ``lax.scan``
over layers), so it jits, vmaps over tables and differentiates.

The objective is ``time`` of :func:`costmodels.iteration_time` without its
gradient-overlap term (exact when ``gradient_overlap = 0``, every preset).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from costmodels.strategies import NUM_STRATEGIES as S
from planner.graph import LayerGraph

__all__ = [
    "MAX_SLOTS",
    "DPSchedule",
    "best_plan",
    "dp_schedule",
    "frontier_size",
    "pad_schedule",
    "soft_min_time",
]

MAX_SLOTS = 4  # S**4 = 625 joint states
INFEASIBLE_S = 1e30  # time of an infeasible strategy (finite: gradients stay finite)


class DPSchedule(NamedTuple):
    """The DP as a sequence of ``T`` events (``I`` incoming-edge columns, ``K``
    slots). An event adds a layer (its time and its incoming edges' resharding)
    and/or frees one slot; a layer freeing two slots takes two events.
    Padding events do nothing."""

    layer: np.ndarray  # [T] int32 layer the event adds (0 when it adds none)
    add: np.ndarray  # [T] bool: the event adds ``layer``
    slot: np.ndarray  # [T] int32 slot the layer takes
    in_edge: np.ndarray  # [T, I] int32 index of an incoming edge in the table's edge arrays
    in_slot: np.ndarray  # [T, I] int32 slot of that edge's source layer
    in_mask: np.ndarray  # [T, I] float32 1 for a real incoming edge
    kill_slot: np.ndarray  # [T] int32 slot freed after the event
    kill_on: np.ndarray  # [T] bool: the event frees ``kill_slot``
    slots: np.ndarray  # [K] int32 0..K-1 (its length is the slot count)


def _edges(graph: LayerGraph) -> np.ndarray:
    e = graph.num_edges
    a = graph.arrays
    return np.stack([np.asarray(a.edge_src)[:e], np.asarray(a.edge_dst)[:e]], axis=1).astype(int)  # [e, 2]


def _events(n: int, edges: np.ndarray):
    """Slot allocation in layer order (the lowest free slot): the events and
    the number of slots used (the most layers alive at once)."""
    last = np.arange(n)
    np.maximum.at(last, edges[:, 0], edges[:, 1])
    into: list[list[int]] = [[] for _ in range(n)]
    for e, d in enumerate(edges[:, 1].tolist()):
        into[d].append(e)
    src, last_l = edges[:, 0].tolist(), last.tolist()
    events = []  # (layer or -1, slot, [(edge, source slot)], freed slot or -1)
    free: list[int] = []
    used = 0
    slot_of = [0] * n
    for i in range(n):
        if free:
            slot_of[i] = free.pop(0)
        else:
            slot_of[i], used = used, used + 1
        ins = [(e, slot_of[src[e]]) for e in into[i]]
        kills = sorted({slot_of[src[e]] for e in into[i] if last_l[src[e]] == i} | ({slot_of[i]} if last_l[i] == i
                                                                                     else set()))
        events.append((i, slot_of[i], ins, kills[0] if kills else -1))
        events += [(-1, 0, [], k) for k in kills[1:]]
        free = sorted(free + kills)
    return events, max(used, 1), max([len(x) for x in into] + [0])


def frontier_size(graph: LayerGraph) -> int:
    """The number of slots the DP needs: the most layers alive at once."""
    return _events(graph.num_layers, _edges(graph))[1]


def dp_schedule(graph: LayerGraph, slots: int | None = None, inputs: int | None = None) -> DPSchedule:
    """The DP schedule of ``graph`` (host numpy), with ``slots`` slots (default:
    :func:`frontier_size`) and ``inputs`` incoming-edge columns (default: the
    largest in-degree), one event per layer plus one per extra freed slot."""
    events, need, indeg = _events(graph.num_layers, _edges(graph))
    K = need if slots is None else int(slots)
    if need > K or K > MAX_SLOTS:
        raise ValueError(f"{graph.model_name}: the exact plan DP needs {need} slots (layers alive at once); "
                         f"at most {min(K, MAX_SLOTS)} are supported")
    I_ = max(indeg, 1) if inputs is None else int(inputs)
    if indeg > I_:
        raise ValueError(f"{graph.model_name}: a layer has more than {I_} inputs")
    T = max(1, len(events))
    s = DPSchedule(
        layer=np.zeros(T, np.int32), add=np.zeros(T, bool), slot=np.zeros(T, np.int32),
        in_edge=np.zeros((T, I_), np.int32), in_slot=np.zeros((T, I_), np.int32),
        in_mask=np.zeros((T, I_), np.float32), kill_slot=np.zeros(T, np.int32), kill_on=np.zeros(T, bool),
        slots=np.arange(K, dtype=np.int32),
    )
    for t, (layer, slot, ins, kill) in enumerate(events):
        if layer >= 0:
            s.layer[t], s.add[t], s.slot[t] = layer, True, slot
        for j, (e, src_slot) in enumerate(ins):
            s.in_edge[t, j], s.in_slot[t, j], s.in_mask[t, j] = e, src_slot, 1.0
        if kill >= 0:
            s.kill_slot[t], s.kill_on[t] = kill, True
    return s


def pad_schedule(s: DPSchedule, slots: int, inputs: int, steps: int) -> DPSchedule:
    """``s`` widened to ``slots`` slots, ``inputs`` edge columns and ``steps`` events."""
    T, I_ = s.in_edge.shape
    if slots < len(s.slots) or inputs < I_ or steps < T:
        raise ValueError("cannot shrink a DP schedule")

    def grow(x, shape):
        out = np.zeros(shape, x.dtype)
        out[tuple(slice(0, k) for k in x.shape)] = x
        return out

    return DPSchedule(grow(s.layer, (steps,)), grow(s.add, (steps,)), grow(s.slot, (steps,)),
                      grow(s.in_edge, (steps, inputs)), grow(s.in_slot, (steps, inputs)),
                      grow(s.in_mask, (steps, inputs)), grow(s.kill_slot, (steps,)), grow(s.kill_on, (steps,)),
                      np.arange(slots, dtype=np.int32))


def _digits(K: int):
    idx = np.arange(S**K)
    dig = np.stack([(idx // S ** (K - 1 - k)) % S for k in range(K)])  # [K, S^K]
    place = S ** (K - 1 - np.arange(K))  # [K]
    nbr = idx[None, :, None] - (dig * place[:, None])[:, :, None] + np.arange(S)[None, None, :] * place[:, None, None]
    return dig.astype(np.int32), nbr.astype(np.int32), place.astype(np.int32)  # numpy; nbr [K, S^K, S]


def _scan(table, sched: DPSchedule, eliminate):
    K = sched.slots.shape[0]
    dig, nbr, _ = (jnp.asarray(x) for x in _digits(K))
    lt = jnp.where(table.feasible, table.layer_time_s, INFEASIBLE_S)[jnp.asarray(sched.layer)]  # [T, S]
    reshard = table.reshard_s[jnp.asarray(sched.in_edge)] * jnp.asarray(sched.in_mask)[:, :, None, None]

    def step(V, x):
        c, R, add_on, slot, in_slot, kill_slot, kill_on = x
        add = c[dig[slot]]
        for i in range(R.shape[0]):
            add = add + R[i][dig[in_slot[i]], dig[slot]]
        W = jnp.where(add_on, V + add, V)
        reduced, arg = eliminate(W[nbr[kill_slot]])
        return jnp.where(kill_on, reduced, W), arg

    xs = (lt, reshard, jnp.asarray(sched.add), jnp.asarray(sched.slot), jnp.asarray(sched.in_slot),
          jnp.asarray(sched.kill_slot), jnp.asarray(sched.kill_on))
    V, recs = jax.lax.scan(step, jnp.zeros(S**K, jnp.float32), xs)
    return V[0], recs


def soft_min_time(table, sched: DPSchedule, temperature_s):
    """``-tau log sum over plans exp(-time / tau)`` with ``tau = temperature_s``
    (seconds); differentiable in the table's costs."""
    tau = jnp.asarray(temperature_s, jnp.float32)

    def eliminate(x):  # x [S^K, S]
        m = jax.lax.stop_gradient(jnp.min(x, axis=-1))
        return m - tau * jnp.log(jnp.sum(jnp.exp(-(x - m[:, None]) / tau), axis=-1)), jnp.zeros((), jnp.int8)

    value, _ = _scan(table, sched, eliminate)
    return value


def best_plan(table, sched: DPSchedule):
    """The minimum time over plans and one plan reaching it, ``[L]`` int32
    (first strategy on ties). Not differentiable."""
    table = jax.lax.stop_gradient(table)
    K = sched.slots.shape[0]
    L = table.layer_mask.shape[0]
    _, _, place = _digits(K)

    def eliminate(x):
        return jnp.min(x, axis=-1), jnp.argmin(x, axis=-1).astype(jnp.int8)

    value, recs = _scan(table, sched, eliminate)  # recs [T, S^K]

    def back(digits, x):
        rec, slot, kill_slot, kill_on = x
        digits = jnp.where(kill_on, digits.at[kill_slot].set(rec[jnp.sum(digits * place)].astype(jnp.int32)), digits)
        return digits, digits[slot]

    xs = (recs, jnp.asarray(sched.slot), jnp.asarray(sched.kill_slot), jnp.asarray(sched.kill_on))
    _, picked = jax.lax.scan(back, jnp.zeros(K, jnp.int32), xs, reverse=True)
    where = jnp.where(jnp.asarray(sched.add), jnp.asarray(sched.layer), L)  # padding events write nowhere
    return value, jnp.zeros(L, jnp.int32).at[where].set(picked, mode="drop")
