"""Flax nnx modules as a pipeline :class:`~planner.runtime.pipeline.Chain`:
a first module, identical blocks (a list of them, or one module whose
parameters carry a leading layer axis, as ``nnx.vmap`` over a constructor
makes) and a head with a loss, as pure functions of their parameters."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from planner.runtime.pipeline import Chain, ChainParams, param_name

__all__ = ["nnx_chain"]


def _split(module: nnx.Module, what: str) -> tuple[nnx.GraphDef, nnx.State]:
    graphdef, params, rest = nnx.split(module, nnx.Param, ...)
    if jax.tree.leaves(rest):
        names = sorted({param_name(p) for p, _ in jax.tree_util.tree_flatten_with_path(rest)[0]})
        raise ValueError(f"the pipeline's {what} may hold only nnx.Param state (no batch statistics, "
                         f"random-number streams or caches); it holds {names[:5]}")
    return graphdef, params


def nnx_chain(first: nnx.Module, blocks: Sequence[nnx.Module] | nnx.Module, head: nnx.Module,
              loss_fn: Callable[[jax.Array, jax.Array], jax.Array]) -> tuple[Chain, ChainParams]:
    """``(chain, params)`` for ``head(blocks[-1](... blocks[0](first(x))))``
    with the mean loss ``loss_fn(head output, y)``. ``blocks`` is a list of
    modules of one structure (their parameters stacked in order) or one
    module whose parameters already have a leading layer axis."""
    first_def, first_params = _split(first, "first part")
    head_def, head_params = _split(head, "head")
    if isinstance(blocks, nnx.Module):
        block_def, block_params = _split(blocks, "blocks")
    else:
        split = [_split(b, f"block {i}") for i, b in enumerate(blocks)]
        if not split:
            raise ValueError("a pipeline needs at least one block")
        block_def = split[0][0]
        if any(d != block_def for d, _ in split[1:]):
            raise ValueError("pipelined blocks must be identical modules (one structure, one set of shapes)")
        block_params = jax.tree.map(lambda *a: jnp.stack(a), *(p for _, p in split))

    def run_first(params, x):
        return nnx.merge(first_def, params)(x)

    def run_block(params, h):
        return nnx.merge(block_def, params)(h)

    def head_loss(params, h, y):
        return loss_fn(nnx.merge(head_def, params)(h), y)

    return Chain(run_first, run_block, head_loss), ChainParams(first_params, block_params, head_params)
