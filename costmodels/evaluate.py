"""Iteration time and memory of a relaxed plan (per-layer probabilities over
options: strategies, each under the table's lever settings,
:mod:`costmodels.levers`); at one-hot probabilities they are the discrete
plan's exact cost.

Both are pure, differentiable and jit-compiled, with no loop over layers:

``time = sum_l sum_o p[l,o] (compute + grad sync + weight gathers + halo + output)[l,o]
       + sum_e sum_{s,t} q[e,s,t] reshard[e,s,t]
       - overlap * min(sum p grad_sync, sum p backward_compute)``

with ``p[l, o]`` the probability of option ``o`` and ``q[e]`` the
probability of each (source, destination) *strategy* pair of edge ``e``
(levers leave the resharding alone): :func:`expected_time` takes it as
given (the AutoML cost takes the Gibbs distribution's pair marginals),
:func:`iteration_time` draws the layers independently, ``q[e,s,t] =
p[src,s] p[dst,t]`` with ``p[l, s]`` the summed probability of strategy
``s``'s options (:func:`costmodels.levers.strategy_probs`). This is the one
objective: the exact solvers' float64 host version
(:func:`search.problem.plan_times`) is its value at one-hot probabilities.

``memory = max(sum_l sum_o p[l,o] (state - update + activations)[l,o] + max_l sum_o p[l,o] workspace[l,o],
              sum_l sum_o p[l,o] state[l,o])``

the larger of the backward phase (the saved activations and the largest
transient beside the state, but not the optimizer's update) and the
optimizer step (the state with the update; XLA frees the activations
before it: buffer assignment, docs/validation.md "The memory promise").

The overlap term models the gradient all-reduce of a layer running while
the backward pass of the layers before it computes (bucketed data-parallel
training); ``gradient_overlap = 0`` (the presets' default) reproduces
ParaDL, which assumes none (ParaDL §2).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from costmodels.levers import strategy_probs
from costmodels.table import CostTable

__all__ = ["expected_time", "iteration_time", "memory_per_device", "one_hot", "reshard_per_edge"]


def one_hot(choice, num_options: int):
    """Probabilities ``[L, O]`` of a discrete plan ``[L]`` (option codes)."""
    return jax.nn.one_hot(jnp.asarray(choice), num_options, dtype=jnp.float32)


def reshard_per_edge(table: CostTable, probs):
    """Expected resharding time of each edge ``[E]`` under option probabilities ``[L, O]``."""
    q = strategy_probs(probs)
    ps = q[table.edge_src]  # [E, S]
    pd = q[table.edge_dst]  # [E, S]
    return jnp.einsum("es,est,et->e", ps, table.reshard_s, pd) * table.edge_mask


def expected_time(table: CostTable, probs, pair_probs):
    """Expected seconds per training iteration when each layer's strategy has
    the probabilities ``probs`` [L, O] and each edge's (source, destination)
    strategy pair ``pair_probs`` [E, S, S]. A strategy of probability zero
    adds nothing, whatever the table holds for it (so a cost that cannot be
    computed there gives no NaN, nor NaN gradients)."""
    mask = table.layer_mask[:, None]
    layer = jnp.sum(probs * jnp.where(probs > 0, table.layer_time_s, 0.0) * mask)
    grad = jnp.sum(probs * table.grad_sync_s * mask)
    bwd = jnp.sum(probs * table.backward_compute_s * mask)
    hidden = table.gradient_overlap * jnp.minimum(grad, bwd)
    reshard = jnp.sum(pair_probs * table.reshard_s * table.edge_mask[:, None, None])
    return layer + reshard - hidden


@jax.jit
def iteration_time(table: CostTable, probs):
    """Seconds per training iteration under the relaxed plan ``probs`` [L, O]
    (layers independent: :func:`expected_time` with ``q[e,s,t] = p[src,s] p[dst,t]``)."""
    q = strategy_probs(probs)  # [L, S]
    pair = q[table.edge_src][:, :, None] * q[table.edge_dst][:, None, :]  # [E, S, S]
    return expected_time(table, probs, pair)


@jax.jit
def memory_per_device(table: CostTable, probs):
    """Peak bytes per device under the relaxed plan ``probs`` [L, O]."""
    mask = table.layer_mask[:, None]
    persistent = jnp.sum(probs * (table.state_bytes - table.update_bytes + table.activation_bytes) * mask)
    workspace = jnp.max(jnp.sum(probs * table.workspace_bytes * mask, axis=-1))
    optimizer_step = jnp.sum(probs * table.state_bytes * mask)
    return jnp.maximum(persistent + workspace, optimizer_step)
