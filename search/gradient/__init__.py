"""The gradient method: the plan relaxed to per-layer probabilities
(:mod:`search.gradient.relax`) and searched by gradient descent on the cost
model under an augmented-Lagrangian memory term
(:mod:`search.gradient.descent`), in JAX; its rounded plans go to the local
search (:mod:`search.local`). This module's ``__all__`` is what the rest of
``search`` uses.
"""

from search.gradient.descent import GradientConfig, RelaxedResult, relaxed_search
from search.gradient.relax import masked_logits, relaxed_probs, round_probs, temperature_at

__all__ = [
    "GradientConfig",
    "RelaxedResult",
    "masked_logits",
    "relaxed_probs",
    "relaxed_search",
    "round_probs",
    "temperature_at",
]
