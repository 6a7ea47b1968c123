"""Alpha-beta costs of collectives over the network tiers of a
:class:`~costmodels.hardware.Hardware` (jnp, elementwise, vmappable).

Ring formulas are ParaDL's (ParaDL §3.1, after NCCL's ring algorithms);
``bytes`` is always the whole buffer unless the name says per rank.
Tier choice is ParaDL's step function by rank count (ParaDL §3.2).
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

from costmodels.hardware import Hardware

__all__ = [
    "MAX_TIERS",
    "Network",
    "network_arrays",
    "tier_of",
    "ring_allreduce_s",
    "tree_allreduce_s",
    "allgather_s",
    "reduce_scatter_s",
    "all_to_all_s",
    "p2p_s",
    "allreduce_s",
    "reduce_scatter_group_s",
    "allgather_group_s",
]

MAX_TIERS = 6


class Network(NamedTuple):
    """Network tiers as arrays (padded by repeating the last tier)."""

    max_ranks: jnp.ndarray  # [T] ranks a tier serves (inf = unbounded)
    intra_node: jnp.ndarray  # [T] 1.0 if the tier only serves ranks inside one node
    latency_s: jnp.ndarray  # [T] alpha, seconds
    bandwidth_bytes_per_s: jnp.ndarray  # [T] 1 / beta
    devices_per_node: jnp.ndarray  # [] devices in one node


def network_arrays(hw: Hardware) -> Network:
    if len(hw.tiers) > MAX_TIERS:
        raise ValueError(f"hardware {hw.name!r} has {len(hw.tiers)} tiers; at most {MAX_TIERS} are supported")
    tiers = list(hw.tiers) + [hw.tiers[-1]] * (MAX_TIERS - len(hw.tiers))
    return Network(
        max_ranks=jnp.asarray([jnp.inf if t.max_ranks is None else t.max_ranks for t in tiers], jnp.float32),
        intra_node=jnp.asarray([float(t.intra_node) for t in tiers], jnp.float32),
        latency_s=jnp.asarray([t.latency_s for t in tiers], jnp.float32),
        bandwidth_bytes_per_s=jnp.asarray([t.bandwidth_bytes_per_s for t in tiers], jnp.float32),
        devices_per_node=jnp.asarray(float(hw.devices_per_node), jnp.float32),
    )


def tier_of(net: Network, ranks, crosses_nodes):
    """(latency_s, bandwidth_bytes_per_s) of the first tier, in file order, that
    serves ``ranks`` ranks, skipping intra-node tiers when ``crosses_nodes``
    (ParaDL §3.2). Broadcasts over ``ranks``."""
    ranks = jnp.asarray(ranks, jnp.float32)[..., None]
    crosses = jnp.asarray(crosses_nodes, bool)[..., None]
    ok = (ranks <= net.max_ranks) & ~(crosses & (net.intra_node > 0))
    idx = jnp.argmax(ok, axis=-1)  # the last tier is unbounded and inter-node: always ok
    return net.latency_s[idx], net.bandwidth_bytes_per_s[idx]


def ring_allreduce_s(n, nbytes, alpha, bw):
    """2(n-1)(alpha + (bytes/n) beta), ParaDL §3.1 (NCCL ring)."""
    n = jnp.maximum(n, 1.0)
    return 2.0 * (n - 1.0) * (alpha + nbytes / n / bw)


def tree_allreduce_s(n, nbytes, alpha, bw):
    """Reduce up and broadcast down a binary tree, pipelined:
    2 ceil(log2 n) alpha + 2 bytes beta (NCCL's tree algorithm, for small messages)."""
    n = jnp.maximum(n, 1.0)
    steps = jnp.ceil(jnp.log2(n))
    return jnp.where(n > 1.0, 2.0 * steps * alpha + 2.0 * nbytes / bw, 0.0)


def allgather_s(n, per_rank_bytes, alpha, bw):
    """(n-1)(alpha + m beta) with m each rank's contribution, ParaDL §3.1."""
    n = jnp.maximum(n, 1.0)
    return (n - 1.0) * (alpha + per_rank_bytes / bw)


def reduce_scatter_s(n, nbytes, alpha, bw):
    """(n-1)(alpha + (bytes/n) beta): the first half of a ring all-reduce (ParaDL §10)."""
    n = jnp.maximum(n, 1.0)
    return (n - 1.0) * (alpha + nbytes / n / bw)


def all_to_all_s(n, per_rank_bytes, alpha, bw):
    """Pairwise exchange: each rank sends (n-1) pieces of per_rank_bytes/n:
    (n-1)(alpha + (m/n) beta)."""
    n = jnp.maximum(n, 1.0)
    return (n - 1.0) * (alpha + per_rank_bytes / n / bw)


def p2p_s(nbytes, alpha, bw):
    """alpha + bytes beta, ParaDL §3.1."""
    return jnp.where(nbytes > 0, alpha + nbytes / bw, 0.0)


def allreduce_s(net: Network, n, ranks_per_node, nbytes, *, tree: bool = True):
    """All-reduce of ``nbytes`` over ``n`` ranks of which ``ranks_per_node`` share
    a node: the cheapest of a flat ring (and, if ``tree``, a flat tree) on the
    tier that serves n ranks, and, when the ranks span nodes, the hierarchical
    scheme (reduce-scatter inside the node, all-reduce of 1/g of the buffer
    across the k nodes, all-gather inside the node; ParaDL §4.8 and §10)."""
    n, g, k, crosses, (a, b), (ai, bi), (ao, bo) = _hierarchy(net, n, ranks_per_node)
    flat = ring_allreduce_s(n, nbytes, a, b)
    if tree:
        flat = jnp.minimum(flat, tree_allreduce_s(n, nbytes, a, b))
    inter = ring_allreduce_s(k, nbytes / g, ao, bo)
    if tree:
        inter = jnp.minimum(inter, tree_allreduce_s(k, nbytes / g, ao, bo))
    hier = reduce_scatter_s(g, nbytes, ai, bi) + inter + allgather_s(g, nbytes / g, ai, bi)
    return jnp.where(crosses & (g > 1.0), jnp.minimum(flat, hier), flat)


def _hierarchy(net: Network, n, ranks_per_node):
    """Ranks, ranks per node, node count, whether the ranks span nodes, and the
    tiers (flat, inside a node, across nodes) of a collective over ``n``
    ranks: what :func:`allreduce_s`, :func:`reduce_scatter_group_s` and
    :func:`allgather_group_s` all choose between."""
    n = jnp.maximum(jnp.asarray(n, jnp.float32), 1.0)
    g = jnp.clip(jnp.asarray(ranks_per_node, jnp.float32), 1.0, n)
    crosses = n > g
    return n, g, n / g, crosses, tier_of(net, n, crosses), tier_of(net, g, False), tier_of(net, n / g, True)


def reduce_scatter_group_s(net: Network, n, ranks_per_node, nbytes):
    """Reduce-scatter of an ``nbytes`` buffer over ``n`` ranks, ``ranks_per_node``
    to a node: the cheaper of a flat ring on the tier that serves ``n`` ranks
    and, across nodes, the hierarchical scheme (reduce-scatter inside the node,
    then of the node's ``1/g`` across the ``k`` nodes): the first half of
    :func:`allreduce_s`'s schemes (ParaDL §10, NCCL's ring)."""
    n, g, k, crosses, (a, b), (ai, bi), (ao, bo) = _hierarchy(net, n, ranks_per_node)
    flat = reduce_scatter_s(n, nbytes, a, b)
    hier = reduce_scatter_s(g, nbytes, ai, bi) + reduce_scatter_s(k, nbytes / g, ao, bo)
    return jnp.where(crosses & (g > 1.0), jnp.minimum(flat, hier), flat)


def allgather_group_s(net: Network, n, ranks_per_node, nbytes):
    """All-gather of an ``nbytes`` buffer (each rank contributing ``nbytes / n``)
    over ``n`` ranks: :func:`reduce_scatter_group_s`'s schemes run backwards
    (across the nodes first, then inside each), the second half of
    :func:`allreduce_s`'s (ParaDL §10)."""
    n, g, k, crosses, (a, b), (ai, bi), (ao, bo) = _hierarchy(net, n, ranks_per_node)
    flat = allgather_s(n, nbytes / n, a, b)
    hier = allgather_s(k, nbytes / n, ao, bo) + allgather_s(g, nbytes / g, ai, bi)
    return jnp.where(crosses & (g > 1.0), jnp.minimum(flat, hier), flat)
