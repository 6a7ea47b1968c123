"""Runs of recomputed layers in the exported training step.

A plan recomputes a *run* of layers (a ``remat`` layer and the ``remat+join``
layers after it, :mod:`costmodels.levers`): the backward pass runs the run's
forward again from what enters it (``jax.checkpoint``'s semantics: the
residuals of a checkpointed function are its inputs; Chen et al. 2016, §3),
so nothing the run computes is kept for the backward pass.

A run crosses functional ops (the ReLUs, pools and residual adds between
modules), so the export cuts the traced forward pass by layer
(:mod:`planner.models.layer_equations`) and :func:`recomputing_forward`
evaluates it equation by equation, each run's equations as one function
whose backward pass recomputes them. Not ``jax.checkpoint``: XLA:CPU expands
the ``optimization_barrier`` it puts around the recomputation before its
common-subexpression elimination, which merges the recomputation back into
the forward pass (``benchmarks/remat_xla.py``). The recomputation reads the
cotangent instead (each floating input plus ``0 *`` one element of the run's
largest output cotangent; the same values while the cotangent is finite), so
XLA can neither merge it with the forward pass nor run it early.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.extend.core as jex
import jax.numpy as jnp

__all__ = ["recomputing_forward", "run_members"]


def run_members(layers: Sequence[str | None], runs: Sequence[Sequence[str]]) -> list[list[int]]:
    """For each run (its layer names), the indices of the equations whose
    layers (``layers``, one per equation) it holds. A layer in no run, in two
    runs, or owning no equation (a part of a module the walk maps to one
    layer, e.g. an attention's projections) is refused."""
    run_of: dict[str, int] = {}
    for r, run in enumerate(runs):
        if not run:
            raise ValueError(f"run {r} names no layer")
        for name in run:
            if name in run_of:
                raise ValueError(f"layer {name!r} is in two runs ({run_of[name]} and {r})")
            run_of[name] = r
    members: list[list[int]] = [[] for _ in runs]
    for i, layer in enumerate(layers):
        if layer is not None and layer in run_of:
            members[run_of[layer]].append(i)
    owners = {layer for layer in layers if layer is not None}
    missing = sorted(name for name in run_of if name not in owners)
    if missing:
        raise ValueError(f"cannot recompute {missing[:3]}: no equation of the traced forward pass computes them "
                         "alone (a layer must be a module call or a functional op of its own, as planner.extract "
                         "finds it; the layers of one nnx.MultiHeadAttention are one module call)")
    return members


def _tied(f: Callable[..., list[Any]]) -> Callable[..., list[Any]]:
    """``f`` whose backward pass runs ``f`` again from its inputs, tied to the
    cotangent (module docstring)."""

    @jax.custom_vjp
    def run(*xs: Any) -> list[Any]:
        return f(*xs)

    def fwd(*xs: Any) -> tuple[list[Any], tuple[Any, ...]]:
        return f(*xs), xs

    def bwd(xs: tuple[Any, ...], cts: list[Any]) -> tuple[Any, ...]:
        floating = [c for c in cts if jnp.issubdtype(c.dtype, jnp.inexact) and c.size]
        if floating:
            anchor = jnp.ravel(max(floating, key=lambda c: c.size))[0] * 0
            xs = tuple(x + anchor.astype(x.dtype) if jnp.issubdtype(x.dtype, jnp.inexact) else x for x in xs)
        _, vjp = jax.vjp(f, *xs)
        return vjp(cts)

    run.defvjp(fwd, bwd)
    return run


def _function(jaxpr: jex.Jaxpr, eqns: Sequence[Any], invars: Sequence[Any],
              outvars: Sequence[Any]) -> Callable[..., list[Any]]:
    effects = frozenset().union(*(e.effects for e in eqns)) if eqns else frozenset()
    sub = jex.Jaxpr([], list(invars), list(outvars), list(eqns), effects, jaxpr.debug_info)
    return jex.jaxpr_as_fun(jex.ClosedJaxpr(sub, []))


def _operands(eqn: Any) -> list[Any]:
    return list(dict.fromkeys(v for v in eqn.invars if not isinstance(v, jex.Literal)))


def _results(eqn: Any) -> list[Any]:
    return [v for v in eqn.outvars if not isinstance(v, jex.DropVar)]


def recomputing_forward(closed: jex.ClosedJaxpr, members: Sequence[Sequence[int]]) -> Callable[..., list[Any]]:
    """A function of ``closed``'s inputs giving its outputs, in which the
    equations of each run (``members``: equation indices per run,
    :func:`run_members`) are one function recomputed in the backward pass
    (module docstring); every other equation is evaluated as traced."""
    jaxpr = closed.jaxpr
    run_of: dict[int, int] = {i: r for r, idx in enumerate(members) for i in idx}
    defined_by: dict[Any, int] = {}  # var -> its run
    for i, eqn in enumerate(jaxpr.eqns):
        if i in run_of:
            for v in _results(eqn):
                defined_by[v] = run_of[i]
    ins: list[dict[Any, None]] = [{} for _ in members]  # ordered sets
    outs: list[dict[Any, None]] = [{} for _ in members]
    for i, eqn in enumerate(jaxpr.eqns):
        here = run_of.get(i)
        for v in eqn.invars:
            if isinstance(v, jex.Literal):
                continue
            there = defined_by.get(v)
            if here is not None and there != here:
                ins[here][v] = None
            if there is not None and there != here:
                outs[there][v] = None
    for v in jaxpr.outvars:
        if not isinstance(v, jex.Literal) and v in defined_by:
            outs[defined_by[v]][v] = None
    runs = [_tied(_function(jaxpr, [jaxpr.eqns[i] for i in idx], list(ins[r]), list(outs[r])))
            for r, idx in enumerate(members)]
    singles = {i: (_operands(eqn), _results(eqn)) for i, eqn in enumerate(jaxpr.eqns) if i not in run_of}
    functions = {i: _function(jaxpr, [jaxpr.eqns[i]], a, b) for i, (a, b) in singles.items()}

    def forward(*args: Any) -> list[Any]:
        env: dict[Any, Any] = dict(zip(jaxpr.constvars, closed.consts, strict=True))
        env.update(zip(jaxpr.invars, args, strict=True))

        def read(v: Any) -> Any:
            if isinstance(v, jex.Literal):
                return v.val
            if v not in env:  # a run's output: the run goes now
                r = defined_by[v]
                env.update(zip(outs[r], runs[r](*(read(u) for u in ins[r])), strict=True))
            return env[v]

        for i, (operands, results) in singles.items():
            env.update(zip(results, functions[i](*(read(v) for v in operands)), strict=True))
        return [read(v) for v in jaxpr.outvars]

    return forward
