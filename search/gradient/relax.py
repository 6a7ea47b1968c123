"""The relaxed plan: per-layer logits over strategies, masked by feasibility,
turned into probabilities by a softmax (or a Gumbel-softmax) at a
temperature that is annealed towards zero, where the probabilities become
one-hot and the relaxed cost becomes the discrete plan's exact cost."""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["MASKED_LOGIT", "masked_logits", "relaxed_probs", "temperature_at", "round_probs"]

MASKED_LOGIT = -1e9  # finite, so gradients through the softmax stay finite


def masked_logits(logits, feasible):
    """Logits ``[..., L, S]`` with infeasible strategies pushed to (almost) minus infinity."""
    return jnp.where(feasible, logits, MASKED_LOGIT)


def relaxed_probs(logits, feasible, temperature, key=None):
    """Probabilities ``[..., L, S]``: ``softmax(masked logits / temperature)``;
    with a PRNG ``key``, a Gumbel-softmax sample (Jang et al., Maddison et
    al., 2017): Gumbel noise is added to the logits first."""
    z = logits
    if key is not None:
        z = z + jax.random.gumbel(key, jnp.shape(logits), dtype=jnp.result_type(logits))
    return jax.nn.softmax(masked_logits(z, feasible) / temperature, axis=-1)


def temperature_at(step, total_steps, start, end):
    """Geometric annealing from ``start`` (step 0) to ``end`` (the last step)."""
    frac = step / jnp.maximum(total_steps - 1, 1)
    return start * (end / start) ** frac


def round_probs(probs, feasible):
    """The discrete plan ``[..., L]``: each layer's most likely feasible strategy."""
    return jnp.argmax(jnp.where(feasible, probs, -1.0), axis=-1)
