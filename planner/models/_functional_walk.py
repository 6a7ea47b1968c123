"""The functional ops of the jaxpr walk behind :func:`planner.extract`
(private; the documented behaviour is in :mod:`planner.models.extraction`):
what runs between module calls. Element-wise ops of one activation function
on one producer's output gather into a :class:`_Chain` that becomes one
element-wise layer when something else reads it; shape ops, pooling, global
average pooling, first-token slices, concatenations and residual adds
become their layers. A mixin of :class:`planner.models._jaxpr_walk._Walker`,
whose state and helpers (``b``, ``batch``, ``emit``, ``check``,
``resolve``, ``root``, ``unsupported``) and transformer rules
(:mod:`planner.models._transformer_walk`) it uses."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax.extend.core as jex
import numpy as np

from planner.models._primitives import _ELEMENTWISE, _FREE, _RESCALE, _SHAPE_OPS, _kept_values
from planner.models._transformer_walk import _HEAD_GROUPING_HINT, _Heads, _Positions, _Scores


@dataclasses.dataclass(eq=False)
class _Chain:
    """Element-wise ops of one activation function applied to one producer's
    output, not yet a layer."""

    root: int  # the producing node
    scope: str
    shape: tuple[int, ...]
    unit: tuple  # identifies the activation function call the ops belong to
    name: str
    flops_per_element: int = 0
    kept_values: int = 0  # transcendental values its ops' derivatives read (_primitives._kept_values)
    ends_transcendental: bool = False  # its last op's output is one of them: the function's output
    node: int | None = None  # once materialised
    alias: _Chain | None = None  # merged into another chain

    def kept(self, p: str) -> _Chain:
        """Op ``p`` goes on the function: count what its derivative reads."""
        self.kept_values += _kept_values(p)
        self.ends_transcendental = _kept_values(p) > 0
        return self


def _is_zero_literal(a: Any) -> bool:
    return isinstance(a, jex.Literal) and np.size(a.val) == 1 and float(np.asarray(a.val)) == 0.0


def _nn_function(eqn: Any) -> tuple[str, tuple] | None:
    """The ``jax.nn`` / flax activation function an inlined op was traced in
    (``gelu``), and its call site, from the equation's traceback."""
    tb = eqn.source_info.traceback
    if tb is None:
        return None
    frames = tb.frames  # innermost first
    for i, fr in enumerate(frames):
        f = fr.file_name.replace("\\", "/")
        if f.endswith("jax/_src/nn/functions.py") or ("/flax/" in f and "activation" in f):
            site = (frames[i + 1].file_name, frames[i + 1].line_num) if i + 1 < len(frames) else ()
            return fr.function_name, site
    return None


class _FunctionalRules:
    """Element-wise chains and the other functional ops (see the module docstring)."""

    b: Any  # GraphBuilder
    batch: int

    def find(self, c: _Chain) -> _Chain:
        while c.alias is not None:
            c = c.alias
        return c

    def materialize(self, c: _Chain) -> int:
        c = self.find(c)
        if c.node is None:
            self.check(c.root, c.shape, f"element-wise op {c.name!r}")
            c.node = self.emit(self.b.elementwise, self.b.auto_name(c.scope, c.name), c.root,
                               flops_per_element=float(max(1, c.flops_per_element)),
                               kept_values=c.kept_values - c.ends_transcendental)
        return c.node

    def unit(self, eqn: Any, calls: tuple) -> tuple[tuple, str]:
        """Which activation function an element-wise op belongs to, and its name:
        the outermost element-wise jitted / custom_jvp function around it
        (``relu``, ``silu``), else the inlined ``jax.nn`` function (``gelu``),
        else the op itself (``relu`` for ``max(x, 0)``)."""
        if calls:
            return ("call", calls[0][0]), calls[0][1]
        fn = _nn_function(eqn)
        if fn is not None:
            return ("fn", *fn), fn[0]
        p = eqn.primitive.name
        zero = p == "max" and any(_is_zero_literal(a) for a in eqn.invars)
        return ("op", id(eqn)), "relu" if zero else p

    def functional(self, eqn: Any, vals: list[Any], scope: str, calls: tuple) -> list[Any]:
        p = eqn.primitive.name
        nout = len(eqn.outvars)
        acts = [(a, v) for a, v in zip(eqn.invars, vals, strict=True) if v is not None]
        out_shape = tuple(eqn.outvars[0].aval.shape) if nout else ()
        same = all(tuple(a.aval.shape) == out_shape for a, _ in acts)
        if any(isinstance(v, _Positions) for _, v in acts):
            return self.positions_op(eqn, vals, acts, scope, out_shape)
        if any(isinstance(v, (_Heads, _Scores)) for _, v in acts):
            return self.attention_op(eqn, vals, acts, scope, out_shape)

        if p in _FREE:
            if nout == len(vals) and all(
                tuple(a.aval.shape) == tuple(o.aval.shape) for a, o in zip(eqn.invars, eqn.outvars, strict=True)
            ):
                return list(vals)
            return self.unsupported(eqn, vals, scope)
        if p in _SHAPE_OPS and len(acts) == 1:
            (a, v), = acts
            if tuple(a.aval.shape) == out_shape:
                return [v]
            if p == "squeeze" and isinstance(v, int) and out_shape == self.natural(v):
                return [v]  # e.g. x[:, 0] after its slice (first_token)
            if p == "reshape":
                x = self.resolve(v)
                c, sp = self.b.shape(x)
                if len(sp) == 1 and out_shape[:2] == (self.batch, sp[0]) and len(out_shape) in (4, 5) \
                        and math.prod(out_shape[2:]) == c:  # channels into heads
                    if len(out_shape) == 5 and out_shape[3] < 3:
                        return self.unsupported(eqn, vals, scope, hint=_HEAD_GROUPING_HINT)
                    return [self.head_view(x, out_shape)]
                if sp and out_shape == (self.batch, c * math.prod(sp)):
                    self.check(x, a.aval.shape, "flatten")
                    return [self.emit(self.b.flatten, self.b.auto_name(scope, "flatten"), x)]
                if len(sp) >= 2 and out_shape == (self.batch, math.prod(sp), c):  # positions -> one token axis
                    self.check(x, a.aval.shape, "reshape")
                    return [self.emit(self.b.tokens, self.b.auto_name(scope, "reshape"), x)]
            return self.unsupported(eqn, vals, scope)
        if p in _ELEMENTWISE:
            if not same:
                return self.unsupported(eqn, vals, scope)
            return self.elementwise(eqn, vals, acts, scope, calls)
        if p in ("reduce_window_max", "reduce_window_sum") and len(acts) == 1:
            node = self.pool(eqn, acts[0], scope)
            if node is not None:
                return [node]
            return self.unsupported(eqn, vals, scope)
        if p == "reduce_sum" and len(acts) == 1:
            (a, v), = acts
            rank = len(a.aval.shape)
            if rank >= 3 and tuple(eqn.params["axes"]) == tuple(range(1, rank - 1)):
                x = self.resolve(v)
                self.check(x, a.aval.shape, "global_avg_pool")
                node = self.emit(self.b.global_avg_pool, self.b.auto_name(scope, "global_avg_pool"), x)
                self.check(node, out_shape, "global_avg_pool")
                return [node]
            return self.unsupported(eqn, vals, scope)
        if p == "slice" and len(acts) == 1:
            (a, v), = acts
            x = self.resolve(v)
            c, sp = self.b.shape(x)
            first = tuple(eqn.params["start_indices"]) == (0,) * 3 and tuple(eqn.params["limit_indices"]) == (
                self.batch, 1, c)
            if len(sp) == 1 and first and eqn.params.get("strides") in (None, (1, 1, 1)):
                self.check(x, a.aval.shape, "first_token")
                return [self.emit(self.b.first_token, self.b.auto_name(scope, "first_token"), x)]
        if p in ("slice", "split") and len(acts) == 1:
            parts = self.channel_slices(eqn, acts[0], scope)
            if parts is not None:
                return parts
        if p == "concatenate" and len(acts) == len(vals) >= 2:
            if eqn.params["dimension"] == len(out_shape) - 1 and len(out_shape) >= 2:
                return self.merge(self.b.concat, "concat", acts, scope, out_shape)
        return self.unsupported(eqn, vals, scope)

    def elementwise(self, eqn: Any, vals: list[Any], acts: list, scope: str, calls: tuple) -> list[Any]:
        p = eqn.primitive.name
        shape = tuple(eqn.outvars[0].aval.shape)
        if len(acts) == 1:
            (_, v), = acts
            rescale = p in _RESCALE
            if isinstance(v, _Chain) and self.find(v).node is None:
                c = self.find(v)
                unit, _ = self.unit(eqn, calls)
                if unit == c.unit:  # the same activation function goes on
                    c.flops_per_element += 0 if p in _FREE else 1  # its rescales are FLOPs too (XLA counts them)
                    c.kept(p)
                    return [c]
            x = self.resolve(v)  # a new function starts: the previous one is a layer
            if rescale:
                return [x]  # only rescales / shifts / selects: folded into its producer
            unit, name = self.unit(eqn, calls)
            return [_Chain(x, scope, shape, unit, name, 0 if p in _FREE else 1).kept(p)]
        roots = {self.root(v) for _, v in acts}
        if len(roots) == 1:  # e.g. x * sigmoid(x): still a function of one producer
            chains: list[_Chain] = []
            for _, v in acts:
                if isinstance(v, _Chain) and self.find(v) not in chains and self.find(v).node is None:
                    chains.append(self.find(v))
            if not chains:
                unit, name = self.unit(eqn, calls)
                return [_Chain(roots.pop(), scope, shape, unit, name, 1).kept(p)]
            c = chains[0]
            for other in chains[1:]:
                c.flops_per_element += other.flops_per_element
                c.kept_values += other.kept_values
                other.alias = c
            c.flops_per_element += 1
            c.kept(p)
            return [c]
        if p in ("add", "add_any") and len(acts) == 2:
            return self.merge(self.b.add, "add", acts, scope, shape)
        if p == "mul" and len(acts) == 2:  # a gate: silu(gate(x)) * up(x)
            return self.merge(self.b.multiply, "multiply", acts, scope, shape)
        return self.unsupported(eqn, vals, scope)

    def merge(self, method: Callable[..., int], op: str, acts: list, scope: str, out_shape: tuple) -> list[int]:
        """One layer of several activations (``add``, ``concat``), every shape checked."""
        xs = [self.resolve(v) for _, v in acts]
        for (a, _), n in zip(acts, xs, strict=True):
            self.check(n, a.aval.shape, op)
        node = self.emit(method, self.b.auto_name(scope, op), xs)
        self.check(node, out_shape, op)
        return [node]

    def pool(self, eqn: Any, act: tuple, scope: str) -> int | None:
        a, v = act
        prm = eqn.params
        wd, ws, pad = prm["window_dimensions"], prm["window_strides"], prm["padding"]
        rank = len(wd)
        ok = (
            rank >= 3 and wd[0] == wd[-1] == 1 and ws[0] == ws[-1] == 1
            and tuple(pad[0]) == tuple(pad[-1]) == (0, 0)
            and all(d == 1 for d in prm["base_dilation"]) and all(d == 1 for d in prm["window_dilation"])
        )
        if not ok:
            return None
        x = self.resolve(v)
        op = "max" if eqn.primitive.name == "reduce_window_max" else "avg"
        self.check(x, a.aval.shape, f"{op}_pool")
        node = self.emit(
            self.b.pool, self.b.auto_name(scope, f"{op}_pool"), x, tuple(wd[1:-1]), stride=tuple(ws[1:-1]),
            padding=tuple(tuple(q) for q in pad[1:-1]), op=op,
        )
        self.check(node, eqn.outvars[0].aval.shape, f"{op}_pool")
        return node
