"""The input batch a plan's model takes (:func:`example_input`), for
``planner.shard`` and ``validate`` of one-stage and pipelined plans alike."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from planner.plans.record import Plan

__all__ = ["example_input"]


def example_input(plan: Plan, batch: int) -> jax.ShapeDtypeStruct:
    """An input of ``batch`` samples for the model ``plan`` was made for:
    ``(batch, *spatial, channels)`` float32, or ``(batch, tokens)`` int32 token
    ids where the plan's model looks its input up in an embedding."""
    c, *spatial = plan.input_shape
    if c == 1 and len(spatial) == 1 and any(r.kind == "embed" for r in plan.layers):
        return jax.ShapeDtypeStruct((batch, *spatial), jnp.int32)
    return jax.ShapeDtypeStruct((batch, *spatial, c), jnp.float32)
