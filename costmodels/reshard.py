"""Resharding: the collective that converts an activation from one model-axis
layout into another, and its time (jnp, vectorised).

``group_bytes`` is the whole activation held by one model-axis group (the
group's ``batch / d`` samples); each of the ``m`` members holds ``1/m`` of it
when split, all of it when replicated or partial.

=================  ================================  ==========================
from \\ to          REPLICATED                        BATCH / CHANNEL / SPATIAL
=================  ================================  ==========================
REPLICATED         free                              free (local slice)
BATCH/CHANNEL/     all-gather (each gives 1/m)       same layout: free;
SPATIAL                                              otherwise all-to-all
PARTIAL            all-reduce                        reduce-scatter
=================  ================================  ==========================

Nothing is ever converted *to* ``PARTIAL``. SplitBrain's group-local
exchanges (SplitBrain §1.2-1.3) are instances: a data-parallel conv
feeding a filter-sharded FC gathers the group's batch (BATCH → REPLICATED,
L_M), and one filter-sharded FC feeding another gathers the features
(CHANNEL → REPLICATED, L_S); their backward passes reduce-scatter the
partial input gradients (PARTIAL → BATCH / CHANNEL).

A replicated layer fed split features (CHANNEL → REPLICATED) gathers them
too, and its replicated input gradient is sliced back for free: what XLA
compiles for the export's shardings, which pin that layer's input
replicated (XLA SPMD partitioner, measured: docs/validation.md, item 11;
unpinned, XLA would all-reduce partial outputs and gather the weight
gradient instead, whatever their sizes).
"""

from __future__ import annotations

import enum

import jax.numpy as jnp
import numpy as np

from costmodels.collectives import (
    all_to_all_s,
    allgather_s,
    reduce_scatter_s,
    ring_allreduce_s,
    tree_allreduce_s,
)
from costmodels.strategies import Layout

__all__ = ["Collective", "conversion_kind", "conversion_s", "COLLECTIVE_NAMES"]


class Collective(enum.IntEnum):
    NONE = 0
    ALL_GATHER = 1
    ALL_TO_ALL = 2
    ALL_REDUCE = 3
    REDUCE_SCATTER = 4


COLLECTIVE_NAMES = tuple(c.name.lower().replace("_", "-") for c in Collective)

_N = len(Layout)


def _conversion_table() -> np.ndarray:
    t = np.zeros((_N, _N), dtype=np.int32)
    split = (Layout.BATCH, Layout.CHANNEL, Layout.SPATIAL)
    for a in split:
        t[a, Layout.REPLICATED] = Collective.ALL_GATHER
        for b in split:
            if a != b:
                t[a, b] = Collective.ALL_TO_ALL
    t[Layout.PARTIAL, Layout.REPLICATED] = Collective.ALL_REDUCE
    for b in split:
        t[Layout.PARTIAL, b] = Collective.REDUCE_SCATTER
    return t


CONVERSION = _conversion_table()  # [from layout, to layout] -> Collective


def conversion_kind(src, dst):
    """The :class:`Collective` that turns layout ``src`` into ``dst`` (arrays of ints)."""
    return jnp.asarray(CONVERSION)[src, dst]


def conversion_s(src, dst, group_bytes, m, alpha, bw):
    """Time of converting an activation of ``group_bytes`` from layout ``src``
    to ``dst`` within model-axis groups of ``m`` devices on a tier with
    latency ``alpha`` and bandwidth ``bw``. Broadcasts over all arguments."""
    kind = conversion_kind(src, dst)
    per_rank = group_bytes / m
    ar = jnp.minimum(ring_allreduce_s(m, group_bytes, alpha, bw), tree_allreduce_s(m, group_bytes, alpha, bw))
    t = jnp.select(
        [kind == Collective.ALL_GATHER, kind == Collective.ALL_TO_ALL,
         kind == Collective.ALL_REDUCE, kind == Collective.REDUCE_SCATTER],
        [allgather_s(m, per_rank, alpha, bw), all_to_all_s(m, per_rank, alpha, bw),
         ar, reduce_scatter_s(m, group_bytes, alpha, bw)],
        0.0,
    )
    return jnp.where(m > 1, t, 0.0)
