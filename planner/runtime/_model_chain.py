"""A whole Flax nnx model as a pipeline :class:`~planner.runtime.pipeline.Chain`:
the part its ``__call__`` runs before its blocks, the blocks, and the part
after them with the loss.

The model keeps its blocks in a list attribute (``nnx.List`` or a list of
identical modules) that its ``__call__`` calls one by one, in order
(``for block in self.blocks: x = block(x)``). The chain's functions run the
model's own ``__call__`` with the blocks swapped for stand-ins: for the
first part, the first stand-in stops the call and hands back what it was
given (the blocks' input); for the head, the first stand-in returns the
activation the last stage holds and the others pass it on, so the rest of
``__call__`` runs on it (the part before the blocks then computes on a
dummy input of zeros, and XLA drops it as dead code). Each parameter
outside the blocks belongs to the part that reads it (found from the traced
program with dead code removed); one read by both (a tied embedding) is
refused, as is a head that reads the model's input.

A model whose blocks are not a list it calls one by one (an ``nnx.vmap``
stack run by ``nnx.scan``) is given as its parts instead
(:func:`planner.runtime.nnx_chain`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.interpreters import partial_eval as pe

from planner.runtime.pipeline import Chain, ChainParams, param_name

__all__ = ["model_chain"]


class _Reached(Exception):
    """Raised by the first block stand-in in the first part's run: carries the blocks' input."""

    def __init__(self, h: Any) -> None:
        super().__init__("the blocks' input")
        self.h = h


def _stand_in_class(box: dict[str, Any]) -> type:
    class _BlockStandIn(nnx.Module):
        def __init__(self, index: int) -> None:
            self.index = index

        def __call__(self, h: jax.Array) -> jax.Array:
            if box["mode"] == "first":
                raise _Reached(h)
            return box["h"] if self.index == 0 else h

    return _BlockStandIn


def _flat(state: Any) -> tuple[list[str], list[jax.Array], Any]:
    """Names, leaves and treedef of an nnx State."""
    pairs, treedef = jax.tree_util.tree_flatten_with_path(state)
    return [param_name(p) for p, _ in pairs], [leaf for _, leaf in pairs], treedef


def _blocks(model: nnx.Module, attribute: str, count: int) -> list[nnx.Module]:
    blocks = getattr(model, attribute, None)
    if not isinstance(blocks, (list, tuple, nnx.List)) or not all(isinstance(b, nnx.Module) for b in blocks):
        raise ValueError(
            f"a pipelined plan runs a model whose {count} blocks are a list attribute {attribute!r} (nnx.List or a "
            f"list of identical modules) that its __call__ calls one by one; {type(model).__name__}.{attribute} is "
            f"{type(blocks).__name__}. Give a model with such a list, or its parts (first, blocks, head), the blocks "
            "a list or an nnx.vmap stack")
    if len(blocks) != count:
        raise ValueError(f"the plan cuts {count} blocks into stages; the model's {attribute!r} holds {len(blocks)}")
    return list(blocks)


def _stack(leaves: tuple) -> Any:
    """The blocks' leaves on a leading layer axis (abstract ones too: a model made by ``nnx.eval_shape``)."""
    if isinstance(leaves[0], jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct((len(leaves), *leaves[0].shape), leaves[0].dtype)
    return jnp.stack(leaves)


def _used(fn: Callable, n: int, *args: Any) -> list[bool]:
    """Which of ``fn``'s first ``n`` flat inputs its output depends on (dead code removed)."""
    closed = jax.make_jaxpr(fn)(*args)
    _, used = pe.dce_jaxpr(closed.jaxpr, [True] * len(closed.jaxpr.outvars))
    return list(used[:n])


def model_chain(model: nnx.Module, x: jax.ShapeDtypeStruct, loss_fn: Callable[[jax.Array, jax.Array], jax.Array],
                *, blocks: int, attribute: str = "blocks") -> tuple[Chain, ChainParams]:
    """``(chain, params)`` of ``model`` (module docstring) for inputs shaped
    like ``x`` (batch first); ``blocks``: how many blocks the list
    ``attribute`` must hold. ``params.first`` and ``params.head`` are dicts
    from the model's parameter names (``embed/embedding``), ``params.blocks``
    a dict from a block's (``attn/qkv/kernel``) to the blocks' parameters
    stacked in order."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    if jax.tree.leaves(rest):
        names = sorted({param_name(p) for p, _ in jax.tree_util.tree_flatten_with_path(rest)[0]})
        raise ValueError(f"a pipelined model may hold only nnx.Param state (no batch statistics, random-number "
                         f"streams or caches); it holds {names[:5]}")
    split = [nnx.split(b, nnx.Param) for b in _blocks(model, attribute, blocks)]
    block_def = split[0][0]
    if any(d != block_def for d, _ in split[1:]):
        raise ValueError("pipelined blocks must be identical modules (one structure, one set of shapes)")
    block_names, _, block_tree = _flat(split[0][1])
    stacked = [_stack(ls) for ls in zip(*(_flat(s)[1] for _, s in split), strict=True)]

    box: dict[str, Any] = {}
    shell = nnx.merge(graphdef, params)  # a copy whose blocks become stand-ins
    setattr(shell, attribute, nnx.List([_stand_in_class(box)(i) for i in range(blocks)]))
    shell_def, shell_params = nnx.split(shell, nnx.Param)
    names, leaves, treedef = _flat(shell_params)

    def run(leaves_: list, x_: jax.Array, mode: str, h: Any = None) -> jax.Array:
        box.update(mode=mode, h=h)
        try:
            out = nnx.merge(shell_def, jax.tree.unflatten(treedef, leaves_))(x_)
        except _Reached as r:
            return r.h
        finally:
            box.clear()
        if mode == "first":
            raise ValueError(f"{type(model).__name__}.__call__ never called its first block (self.{attribute}); "
                             "a pipelined model calls its blocks one by one from that list")
        return out

    x0 = jax.ShapeDtypeStruct(x.shape, x.dtype)
    h0 = jax.eval_shape(lambda ls, x_: run(ls, x_, "first"), leaves, x0)
    in_first = _used(lambda ls, x_: run(ls, x_, "first"), len(leaves), leaves, x0)
    in_head = _used(lambda ls, h: run(ls, jnp.zeros(x0.shape, x0.dtype), "head", h), len(leaves), leaves, h0)
    both = [n for n, a, b in zip(names, in_first, in_head, strict=True) if a and b]
    if both:
        raise ValueError(f"parameters {both[:3]} are read both before and after the blocks (a tied embedding): the "
                         "pipeline keeps the first part's and the head's parameters apart; untie them")
    reads_input = _used(lambda ls, h, x_: run(ls, x_, "head", h), len(leaves) + 2, leaves, h0, x0)[-1]
    if reads_input:
        raise ValueError("the part of the model after its blocks reads the model's input; the pipeline's head "
                         "sees only the last block's output")
    first_names = [n for n, b in zip(names, in_head, strict=True) if not b]
    head_names = [n for n, b in zip(names, in_head, strict=True) if b]
    by_name = dict(zip(names, leaves, strict=True))

    def full(first: dict, head: dict) -> list:
        return [first[n] if n in first else head[n] for n in names]

    def run_first(p: dict, x_: jax.Array) -> jax.Array:
        zeros = {n: jnp.zeros(by_name[n].shape, by_name[n].dtype) for n in head_names}  # unread there
        return run(full(p, zeros), x_, "first")

    def run_block(p: dict, h: jax.Array) -> jax.Array:
        return nnx.merge(block_def, jax.tree.unflatten(block_tree, [p[n] for n in block_names]))(h)

    def head_loss(p: dict, h: jax.Array, y: jax.Array) -> jax.Array:
        zeros = {n: jnp.zeros(by_name[n].shape, by_name[n].dtype) for n in first_names}
        dummy = jnp.zeros((h.shape[0], *x0.shape[1:]), x0.dtype)
        return loss_fn(run(full(zeros, p), dummy, "head", h), y)

    chain_params = ChainParams({n: by_name[n] for n in first_names}, dict(zip(block_names, stacked, strict=True)),
                               {n: by_name[n] for n in head_names})
    return Chain(run_first, run_block, head_loss), chain_params
