"""Iteration time and memory of a relaxed plan (per-layer probabilities over
strategies); at one-hot probabilities they are the discrete plan's exact cost.

Both are pure, differentiable and jit-compiled, with no loop over layers:

``time = sum_l sum_s p[l,s] (compute + grad sync + halo + output)[l,s]
       + sum_e sum_{s,t} p[src,s] p[dst,t] reshard[e,s,t]
       - overlap * min(sum p grad_sync, sum p backward_compute)``

``memory = sum_l sum_s p[l,s] (state + activations)[l,s] + max_l sum_s p[l,s] workspace[l,s]``

The overlap term models the gradient all-reduce of a layer running while
the backward pass of the layers before it computes (bucketed data-parallel
training); ``gradient_overlap = 0`` (the presets' default) reproduces
ParaDL, which assumes none (ParaDL §2).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from costmodels.table import CostTable

__all__ = ["iteration_time", "memory_per_device", "one_hot", "reshard_per_edge"]


def one_hot(choice, num_strategies: int):
    """Probabilities ``[L, S]`` of a discrete plan ``[L]``."""
    return jax.nn.one_hot(jnp.asarray(choice), num_strategies, dtype=jnp.float32)


def reshard_per_edge(table: CostTable, probs):
    """Expected resharding time of each edge ``[E]``."""
    ps = probs[table.edge_src]  # [E, S]
    pd = probs[table.edge_dst]  # [E, S]
    return jnp.einsum("es,est,et->e", ps, table.reshard_s, pd) * table.edge_mask


@jax.jit
def iteration_time(table: CostTable, probs):
    """Seconds per training iteration under the relaxed plan ``probs`` [L, S]."""
    mask = table.layer_mask[:, None]
    layer = jnp.sum(probs * table.layer_time_s * mask)
    grad = jnp.sum(probs * table.grad_sync_s * mask)
    bwd = jnp.sum(probs * table.backward_compute_s * mask)
    hidden = table.gradient_overlap * jnp.minimum(grad, bwd)
    return layer + jnp.sum(reshard_per_edge(table, probs)) - hidden


@jax.jit
def memory_per_device(table: CostTable, probs):
    """Peak bytes per device under the relaxed plan ``probs`` [L, S]."""
    mask = table.layer_mask[:, None]
    persistent = jnp.sum(probs * (table.state_bytes + table.activation_bytes) * mask)
    workspace = jnp.max(jnp.sum(probs * table.workspace_bytes * mask, axis=-1))
    return persistent + workspace
