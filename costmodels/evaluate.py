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

``memory = max(sum_l sum_o p[l,o] (state - update + activations)[l,o] - credit
                 + max_l (sum_o p[l,o] workspace[l,o] + transient[l]),
              sum_l sum_o p[l,o] state[l,o])``

the larger of the backward phase (the saved activations and the largest
transient beside the state, but not the optimizer's update) and the
optimizer step (the state with the update; XLA frees the activations
before it: buffer assignment, docs/validation.md "The memory promise").
``credit`` and ``transient`` are what runs of consecutive recomputing
layers change (:func:`recomputed_runs`); both are zero where no two
consecutive layers recompute.

The overlap term models the gradient all-reduce of a layer running while
the backward pass of the layers before it computes (bucketed data-parallel
training); ``gradient_overlap = 0`` (the presets' default) reproduces
ParaDL, which assumes none (ParaDL §2).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from costmodels.levers import option_recomputing, strategy_probs
from costmodels.table import CostTable

__all__ = ["expected_time", "iteration_time", "memory_per_device", "one_hot", "recomputed_runs",
           "recomputed_runs_per_layer", "reshard_per_edge"]


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


def recomputed_runs_per_layer(table: CostTable, probs):
    """What runs of recomputing layers change in the backward phase's memory,
    under option probabilities ``probs`` [L, O]: ``(credit, transient)``,
    ``[L]`` bytes each (the credit by the joining consumer whose kept input
    it frees).

    A *run* is a recomputing layer (``remat``) and the consecutive layers
    after it, in the table's order (a topological one), that recompute
    *joining* it (``remat+join``). The backward pass recomputes the whole
    run from what enters it (``jax.checkpoint`` semantics: the residuals of
    a checkpointed function are its inputs), so

    * an edge ``(p, c)`` whose two ends are in one run (``p`` recomputes and
      every layer ``p+1..c`` joins) needs no checkpoint: ``credit`` (bytes)
      is the part of the joining consumers' kept inputs
      (``checkpoint_bytes``, each edge its ``edge_input_share``) such edges
      free;
    * at layer ``l``'s backward step, the run's recomputed activations of
      the layers up to ``l`` are live (those after it are freed):
      ``transient`` [L] is what the run adds to ``l``'s workspace beyond its
      own recomputed activations (which the workspace holds already),
      ``R[l - 1]`` with ``R[l] = rec[l] + beta[l] R[l - 1]``, ``beta`` the
      probability that a layer joins the run before it and ``rec`` its
      expected recomputed bytes (Chen et al. 2016, "Training Deep Nets with
      Sublinear Memory Cost", section 3: a segment's activations are
      recomputed together during its backward pass).

    A run of one layer has neither: its input is kept (``checkpoint_bytes``)
    and its activations are its own transient; so has a joining layer after
    one that keeps its activations. Layers are drawn
    independently, as for the resharding in :func:`iteration_time`; at
    one-hot probabilities both are the discrete plan's values."""
    L, O = probs.shape
    mask = table.layer_mask
    remat, joins = (jnp.asarray(f) for f in option_recomputing(O))  # [O] option o recomputes, ... joining
    rho = jnp.sum(jnp.where(remat[None, :], probs, 0.0), axis=-1) * mask  # [L] the layer recomputes
    beta = jnp.sum(jnp.where(joins[None, :], probs, 0.0), axis=-1) * mask  # [L] ... joining the run before it
    rec = jnp.sum(probs * table.recompute_bytes, axis=-1) * mask  # [L]

    def link(left, right):  # composing x -> a x + b: R[l] = rec[l] + beta[l] R[l - 1]
        return left[0] * right[0], right[0] * left[1] + right[1]

    _, R = jax.lax.associative_scan(link, (beta, rec))
    transient = R - rec
    src, dst = table.edge_src, table.edge_dst
    # the product of beta over the layers src+1..dst-1 of each edge, from prefix sums (O(E + L), not
    # O(E L)): the layers that cannot join are counted, the logs of the others summed; at one-hot
    # probabilities every log is 0 and the product exact
    zero = beta <= 0.0
    zeros = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(zero.astype(jnp.int32))])  # [L + 1] over layers < k
    logs = jnp.concatenate([jnp.zeros(1), jnp.cumsum(jnp.log(jnp.where(zero, 1.0, beta)))])  # [L + 1]
    lo, hi = src + 1, jnp.maximum(dst, src + 1)  # the half-open range [src + 1, dst)
    between = jnp.where(zeros[hi] - zeros[lo] > 0, 0.0, jnp.exp(logs[hi] - logs[lo]))  # [E]
    in_run = rho[src] * between * (src < dst)  # [E]
    kept = jnp.sum(jnp.where(joins[None, :], probs[dst] * table.checkpoint_bytes[dst], 0.0), axis=-1)  # [E]
    credit = jnp.zeros(L).at[dst].add(in_run * kept * table.edge_input_share * table.edge_mask)  # [L] per consumer
    return credit, transient


def recomputed_runs(table: CostTable, probs):
    """:func:`recomputed_runs_per_layer` with the credit summed: ``(credit,
    transient)``, bytes and ``[L]`` bytes."""
    credit, transient = recomputed_runs_per_layer(table, probs)
    return jnp.sum(credit), transient


@jax.jit
def memory_per_device(table: CostTable, probs):
    """Peak bytes per device under the relaxed plan ``probs`` [L, O]."""
    mask = table.layer_mask[:, None]
    credit, transient = recomputed_runs(table, probs)
    persistent = jnp.sum(probs * (table.state_bytes - table.update_bytes + table.activation_bytes) * mask) - credit
    workspace = jnp.max(jnp.sum(probs * table.workspace_bytes * mask, axis=-1) + transient)
    optimizer_step = jnp.sum(probs * table.state_bytes * mask)
    return jnp.maximum(persistent + workspace, optimizer_step)
