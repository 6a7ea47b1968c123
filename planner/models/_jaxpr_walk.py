"""The jaxpr walk behind :func:`planner.extract` (one algorithm, kept whole: a
single pass over the equations whose regions, chains and layer rules share
the walker's state; its primitive tables are in
:mod:`planner.models._primitives`, its transformer rules in
:mod:`planner.models._transformer_walk`): turns a traced
forward pass, whose equations carry module-path markers in their name
stacks, into layers added through :class:`~planner.ir.builder.GraphBuilder`
(jax-notes.md §1). Private: the documented behaviour is in
:mod:`planner.models.extraction`."""

# long module: one pass over the equations whose regions, chains and layer rules share the walker's state

from __future__ import annotations

import dataclasses
import itertools
import math
import re
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax.extend.core as jex
import numpy as np

from planner.ir.builder import GraphBuilder
from planner.usage import InternalError
from planner.models._primitives import (
    _CALL_PRIMITIVES,
    _ELEMENTWISE,
    _FREE,
    _RESCALE,
    _SHAPE_OPS,
    _eqn_flops,
    _kept_values,
)
from planner.models._transformer_walk import (
    _HEAD_GROUPING_HINT,
    _LOOKUPS,
    _Heads,
    _Positions,
    _Scores,
    _TransformerRules,
)

_REPLICATE_HINT = (
    'pass on_unsupported="replicate" (shardplan: --on-unsupported replicate) to keep it as a '
    "replicated layer whose cost is estimated from its FLOPs"
)

_MARK = "shardplan:"
_MARK_RE = re.compile(r"shardplan:(\d+):([^/()\s]*)")


# -- module metadata ------------------------------------------------------------------
class _ModuleInfo(NamedTuple):
    path: str
    type_name: str  # e.g. "nnx.Embed" or "MyBlock"
    kind: str | None  # "conv" | "dense" | "batch_norm" | "layer_norm" | "rms_norm" | "embed" | "attend" | "mha"
    #                   | "opaque" | None (transparent)
    bias: bool  # has a bias parameter (conv / dense / batch norm / layer norm)
    scale: bool  # has a scale parameter (batch norm / layer and RMS norm)
    params: int  # trainable parameters of the module and its submodules
    direct_params: int  # trainable parameters owned by the module itself
    attributes: tuple[tuple[str, Any], ...] = ()  # what a composite layer needs (mha: heads, features, bias)


# -- the walk ---------------------------------------------------------------------------
@dataclasses.dataclass(eq=False)
class _Region:
    """An in-progress call of a module that becomes one layer."""

    key: tuple[str, int]
    info: _ModuleInfo
    inputs: list[int] = dataclasses.field(default_factory=list)
    key_eqn: Any = None  # the conv_general_dilated / dot_general of a Conv / Linear
    repeated: bool = False  # more than one of them
    out_aval: Any = None
    flops: float = 0.0
    node: int | None = None
    prims: set[str] = dataclasses.field(default_factory=set)  # primitives applied to activations


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


class _Walker(_TransformerRules):
    """Walks a forward jaxpr in execution order and adds its layers to a builder."""

    def __init__(
        self, builder: GraphBuilder, infos: Mapping[str, _ModuleInfo], batch: int, on_unsupported: str
    ) -> None:
        self.b = builder
        self.infos = infos
        self.batch = batch
        self.replicate = on_unsupported == "replicate"
        self.replaced = 0  # unsupported operations and modules kept as replicated OTHER layers
        self.open: _Region | None = None
        self.names: list[str] = []  # of the layers added so far
        self._marks: dict[str, tuple[tuple[str, int], ...]] = {}
        self._ew: dict[int, bool] = {}
        self._ids = itertools.count()
        self.head_work: dict[int, Any] = {}  # _TransformerRules: element-wise work on head views

    # -- helpers -------------------------------------------------------------------
    def markers(self, name_stack: Any) -> tuple[tuple[str, int], ...]:
        s = str(name_stack)
        got = self._marks.get(s)
        if got is None:
            got = tuple((urllib.parse.unquote(p), int(k)) for k, p in _MARK_RE.findall(s)) if _MARK in s else ()
            self._marks[s] = got
        return got

    def emit(self, add_layer: Callable[..., int], name: str, *args: Any, **kwargs: Any) -> int:
        """Add a layer through a GraphBuilder method, remembering its name."""
        node = add_layer(name, *args, **kwargs)
        self.names.append(name)
        return node

    def node_name(self, node: int) -> str:
        return "<model input>" if node == GraphBuilder.input else self.names[node]

    def check(self, node: int, shape: Sequence[int], what: str) -> None:
        """An activation of ``shape`` (batch first, channels last) must be ``node``'s output."""
        c, sp = self.b.shape(node)
        expect = (self.batch, *sp, c)
        if tuple(shape) != expect:
            raise InternalError(
                f"extract, at {what}: the jaxpr has an activation of shape {tuple(shape)} where the layer "
                f"graph expects {expect} (output of {self.node_name(node)!r}, batch {self.batch}, channels last)")

    def per_sample(self, aval: Any) -> tuple[int, tuple[int, ...]]:
        shape = tuple(getattr(aval, "shape", ()))
        if shape and shape[0] == self.batch:
            if len(shape) == 1:
                return 1, ()
            if len(shape) <= 5:
                return shape[-1], shape[1:-1]
            return math.prod(shape[1:]), ()
        return max(1, -(-math.prod(shape) // self.batch)), ()

    def unsupported_error(self, what: str, where: str) -> ValueError:
        return ValueError(
            f"extract: {what} {where} cannot be mapped onto a layer kind of the planner; "
            f"{_REPLICATE_HINT}."
        )

    # -- values ----------------------------------------------------------------------
    def find(self, c: _Chain) -> _Chain:
        while c.alias is not None:
            c = c.alias
        return c

    def root(self, v: Any) -> int:
        if isinstance(v, _Chain):
            c = self.find(v)
            return c.node if c.node is not None else c.root
        return self.resolve(v)

    def resolve(self, v: Any) -> int:
        if isinstance(v, int):
            return v
        if isinstance(v, (_Heads, _Scores)):  # read by an unsupported op: its producer stands in
            return v.node
        if isinstance(v, _Positions):
            raise self.positions_error(v, "read by an operation the planner does not map")
        if isinstance(v, _Region):
            if v.node is None and v is self.open:
                self.close()
            if v.node is None:
                raise InternalError(f"extract: module {v.info.path!r} produced no layer")
            return v.node
        return self.materialize(v)

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

    # -- walking ---------------------------------------------------------------------
    def inner_markers(self, eqn: Any) -> tuple[tuple[str, int], ...]:
        """The module markers of the first equation inside ``eqn``'s jaxprs
        that has any: a module call the export runs inside ``jax.shard_map``
        (``planner.runtime.calls``) is marked inside it, not around it."""
        for sub in jex.jaxprs_in_params(eqn.params):
            for inner in sub.eqns:
                got = self.markers(inner.source_info.name_stack) or self.inner_markers(inner)
                if got:
                    return got
        return ()

    def call_jaxpr(self, eqn: Any) -> jex.Jaxpr | None:
        if eqn.primitive.name not in _CALL_PRIMITIVES:
            return None
        subs = list(jex.jaxprs_in_params(eqn.params))
        if len(subs) != 1:
            return None
        (sub,) = subs
        if len(sub.invars) != len(eqn.invars) or len(sub.outvars) != len(eqn.outvars):
            return None
        return sub

    def call_name(self, eqn: Any) -> str | None:
        p = eqn.primitive.name
        if p in ("jit", "pjit"):
            return eqn.params.get("name")
        if p in ("custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr"):
            cj = eqn.params.get("call_jaxpr") or eqn.params.get("fun_jaxpr")
            dbg = getattr(getattr(cj, "jaxpr", cj), "debug_info", None)
            return getattr(dbg, "func_name", None)
        return None

    def is_elementwise(self, jaxpr: jex.Jaxpr) -> bool:
        got = self._ew.get(id(jaxpr))
        if got is None:
            got = True
            for e in jaxpr.eqns:
                p = e.primitive.name
                if p in _ELEMENTWISE or p in _FREE or p in ("broadcast_in_dim", "iota"):
                    continue
                sub = self.call_jaxpr(e)
                if sub is None or not self.is_elementwise(sub):
                    got = False
                    break
            self._ew[id(jaxpr)] = got
        return got

    def walk(self, jaxpr: jex.Jaxpr, invals: Sequence[Any], prefix: tuple, calls: tuple,
             record: list[list[Any]] | None = None) -> list[Any]:
        """The values of ``jaxpr``'s outputs (layers, chains, regions; ``None``:
        no activation); ``record`` (if given) gets each equation's output
        values, in order (what :meth:`layer_of` maps to layers after the walk)."""
        env: dict[Any, Any] = dict(zip(jaxpr.invars, invals, strict=True))

        def read(a: Any) -> Any:
            return None if isinstance(a, jex.Literal) else env.get(a)

        for eqn in jaxpr.eqns:
            marks = prefix + self.markers(eqn.source_info.name_stack)

            if eqn.primitive.name == "shard_map":  # one opaque op of the module marked inside it
                marks = marks + tuple(m for m in self.inner_markers(eqn) if m not in marks)
            sub = self.call_jaxpr(eqn)
            if sub is not None:
                name = self.call_name(eqn)
                inner = calls
                if name and self.is_elementwise(sub):
                    inner = calls + ((next(self._ids), name),)
                outs = self.walk(sub, [read(a) for a in eqn.invars], marks, inner)
            else:
                outs = self.equation(eqn, [read(a) for a in eqn.invars], marks, calls)
            env.update(zip(eqn.outvars, outs, strict=True))
            if record is not None:
                record.append(outs)
        return [read(a) for a in jaxpr.outvars]

    def layer_of(self, values: Sequence[Any]) -> int | None:
        """After the walk: the layer an equation with output ``values`` belongs
        to (the layer its first activation output is, or is folded into), or
        ``None`` where it computes no activation (e.g. a parameter's reshape,
        or positions looked up in a table, :class:`_Positions`, before they
        are added to the tokens)."""
        for v in values:
            if v is not None and not isinstance(v, _Positions):
                return self.root(v)
        return None

    def equation(self, eqn: Any, vals: list[Any], marks: tuple, calls: tuple) -> list[Any]:
        region = None
        for path, k in marks:  # outermost modelled / opaque module call wins
            info = self.infos.get(path)
            if info is not None and info.kind not in (None, "owner"):
                region = ((path, k), info)
                break
        if region is None and all(v is None for v in vals):
            return [None] * len(eqn.outvars)  # no activation involved: nothing to do
        if self.open is not None and (region is None or region[0] != self.open.key):
            self.close()
        if region is not None:
            return self.region_equation(eqn, vals, *region)
        scope = marks[-1][0] if marks else ""
        return self.functional(eqn, vals, scope, calls)

    # -- module layers ---------------------------------------------------------------------
    def region_equation(self, eqn: Any, vals: list[Any], key: tuple[str, int], info: _ModuleInfo) -> list[Any]:
        reg = self.open
        if reg is None:
            leaf = 0 < info.direct_params == info.params  # may be a position embedding: decided at close
            if info.kind == "opaque" and not self.replicate and not leaf:
                raise self.opaque_error(info)
            reg = self.open = _Region(key, info)
        acts = False
        for v in vals:
            if v is None:
                continue
            acts = True
            if v is not reg:
                n = self.resolve(v)
                if n not in reg.inputs:
                    reg.inputs.append(n)
        reg.flops += _eqn_flops(eqn)
        if not acts:
            # an embedding looked up at constant positions (wpe(arange(T))): its table's rows, not yet a layer
            lookup = info.kind == "embed" and eqn.primitive.name in _LOOKUPS
            return [_Positions(info.path, info.type_name, info.direct_params) if lookup else None
                    for _ in eqn.outvars]
        p = eqn.primitive.name
        reg.prims.add(p)
        want = {"conv": "conv_general_dilated", "dense": "dot_general", "attend": "dot_general"}.get(info.kind)
        if p == want and vals[0] is not None:
            reg.repeated = reg.key_eqn is not None
            reg.key_eqn = eqn
        if eqn.outvars:  # the module's output: its last batch-shaped activation
            aval = eqn.outvars[0].aval
            shape = tuple(getattr(aval, "shape", ()))
            if reg.out_aval is None or (shape and shape[0] == self.batch):
                reg.out_aval = aval
        return [reg] * len(eqn.outvars)

    def close(self) -> None:
        reg, self.open = self.open, None
        if reg is None or not reg.inputs:
            return
        info = reg.info
        label = info.path or {"opaque": info.type_name}.get(info.kind, info.kind)
        name = self.b.auto_name("", label)
        where = f"module {info.path or '<root>'!r} ({info.type_name})"
        problem = None if info.kind == "opaque" else self.module_problem(reg)
        if info.kind == "opaque" and problem is None:
            reg.node = self.position_embedding(reg, name)
            if reg.node is not None:
                return
            if not self.replicate:
                raise self.opaque_error(info)
        if info.kind == "opaque" or problem is not None:
            if problem is not None and not self.replicate:
                raise self.unsupported_error(f"{info.type_name} {problem}", f"at module path {info.path!r}")
            self.replaced += 1  # an opaque module, or one with a problem: both need on_unsupported="replicate"
            c, sp = self.per_sample(reg.out_aval)
            reg.node = self.emit(self.b.other, name, reg.inputs, c, sp, params=float(info.params),
                                    flops_fwd=reg.flops / self.batch)
            return
        (x,) = reg.inputs
        if info.kind == "batch_norm":
            reg.node = self.emit(self.b.batch_norm, name, x, affine=info.scale)
            self.check(reg.node, reg.out_aval.shape, f"the output of {where}")
            expect = 2 * self.b.shape(x)[0] if info.scale else 0
        elif info.kind == "embed":  # a lookup of the model's token ids: (batch, tokens) -> (batch, tokens, features)
            features = int(reg.out_aval.shape[-1])
            reg.node = self.emit(self.b.embed, name, x, info.direct_params // features, features)
            self.check(reg.node, reg.out_aval.shape, f"the output of {where}")
            expect = info.direct_params - info.direct_params % features
        elif info.kind == "attend":  # x @ table.T: the output layer of tied embeddings
            e = reg.key_eqn
            reg.node = self.emit(self.b.dense, name, x, int(e.outvars[0].aval.shape[-1]), bias=False, tied=True)
            self.check(reg.node, e.outvars[0].aval.shape, f"the output of {where}")
            expect = 0
        elif info.kind == "mha":  # nnx.MultiHeadAttention: its projections as one fused layer, the attention, out
            reg.node, expect = self.multi_head_attention(reg, x, where)
        elif info.kind in ("layer_norm", "rms_norm"):
            reg.node = self.emit(self.b.norm, name, x, rms=info.kind == "rms_norm", scale=info.scale,
                                 bias=info.bias)
            self.check(reg.node, reg.out_aval.shape, f"the output of {where}")
            expect = self.b.shape(x)[0] * (int(info.scale) + int(info.bias))
        else:
            e = reg.key_eqn
            rhs = e.invars[1].aval.shape
            if info.kind == "conv":
                p = e.params
                dn = p["dimension_numbers"]
                features = rhs[dn.rhs_spec[0]]
                reg.node = self.emit(
                    self.b.conv, name, x, features, tuple(rhs[d] for d in dn.rhs_spec[2:]),
                    stride=tuple(p["window_strides"]), padding=tuple(tuple(q) for q in p["padding"]),
                    dilation=tuple(p["rhs_dilation"]), groups=int(p["feature_group_count"]), bias=info.bias,
                )
            else:
                features = rhs[1]
                reg.node = self.emit(self.b.dense, name, x, features, bias=info.bias)
            self.check(reg.node, e.outvars[0].aval.shape, f"the output of {where}")
            expect = math.prod(rhs) + (features if info.bias else 0)
        owned = info.params if info.kind == "mha" else info.direct_params  # mha: its projections' parameters
        if owned != expect:
            raise InternalError(f"extract: {where} has {owned} parameters, the layer graph {expect}")

    def opaque_error(self, info: _ModuleInfo) -> ValueError:
        owns = f" (it owns {info.direct_params} parameters directly)" if info.direct_params else ""
        return self.unsupported_error(f"module type {info.type_name}", f"at module path {info.path or '<root>'!r}{owns}")

    def module_problem(self, reg: _Region) -> str | None:
        """Why a Conv / Linear / BatchNorm call cannot be the planner's layer, or None."""
        info = reg.info
        if len(reg.inputs) != 1:
            return f"called on {len(reg.inputs)} activations"
        if info.kind == "batch_norm":
            return "with only one of scale / bias" if info.scale != info.bias else None
        if info.kind in ("layer_norm", "rms_norm"):
            return None
        if info.kind == "mha":
            c, sp = self.b.shape(reg.inputs[0])
            return None if len(sp) == 1 else "on an activation that is not a token sequence (batch, tokens, features)"
        if info.kind == "embed":
            c, sp = self.b.shape(reg.inputs[0])
            if reg.inputs[0] != GraphBuilder.input or c != 1 or len(sp) != 1:
                return "whose input is not the model's token ids (batch, tokens)"
            return None
        e = reg.key_eqn
        if info.kind == "attend":
            if e is None or reg.repeated:
                return "attend that does not apply exactly one dot_general to its input"
            (lc, rc), (lb, rb) = e.params["dimension_numbers"]
            lhs = tuple(e.invars[0].aval.shape)
            c, sp = self.b.shape(reg.inputs[0])
            rhs = tuple(e.invars[1].aval.shape)  # the table (vocab, features), or its transpose
            ok = lhs == (self.batch, *sp, c) and tuple(lc) == (len(lhs) - 1,) and len(rhs) == 2 and rhs[rc[0]] == c
            return None if ok and not (tuple(lb) or tuple(rb)) else "attend contracting another dim than the features"
        want = "conv_general_dilated" if info.kind == "conv" else "dot_general"
        if e is None or reg.repeated:
            return f"that does not apply exactly one {want} to its input"
        lhs, rhs = tuple(e.invars[0].aval.shape), tuple(e.invars[1].aval.shape)
        c, sp = self.b.shape(reg.inputs[0])
        if lhs != (self.batch, *sp, c):
            return f"whose input is transformed before its {want} (e.g. circular padding)"
        if info.kind == "conv":
            p = e.params
            dn = p["dimension_numbers"]
            r = len(lhs) - 2
            nhwc = (0, r + 1, *range(1, r + 1))
            if tuple(dn.lhs_spec) != nhwc or tuple(dn.out_spec) != nhwc:
                return f"with a layout other than channels-last ({dn})"
            if any(d != 1 for d in p["lhs_dilation"]) or p["batch_group_count"] != 1:
                return "with input dilation (transposed) or batch groups"
            return None
        (lc, rc), (lb, rb) = e.params["dimension_numbers"]
        if tuple(lb) or tuple(rb) or tuple(lc) != (len(lhs) - 1,) or len(rhs) != 2 or tuple(rc) != (0,):
            return f"contracting {e.params['dimension_numbers']} instead of the last dim"
        return None

    # -- functional ops ----------------------------------------------------------------------
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

    def unsupported(self, eqn: Any, vals: list[Any], scope: str, hint: str = "") -> list[Any]:
        p = eqn.primitive.name
        shapes = [tuple(a.aval.shape) for a, v in zip(eqn.invars, vals, strict=True) if v is not None]
        if not self.replicate:
            raise self.unsupported_error(
                f"operation {p!r} on activation(s) of shape {', '.join(map(str, shapes))}",
                f"in module scope {scope or '<root>'!r}{hint}",
            )
        self.replaced += 1
        xs: list[int] = []
        flops = _eqn_flops(eqn) / self.batch
        for v in vals:
            if v is not None:
                flops += self.absorbed_flops(v)  # an attention in progress stops here: its work so far is this layer's
                n = self.resolve(v)
                if n not in xs:
                    xs.append(n)
        c, sp = self.per_sample(eqn.outvars[0].aval if eqn.outvars else None)
        node = self.emit(self.b.other, self.b.auto_name(scope, p), xs, c, sp, flops_fwd=flops)
        return [node] * len(eqn.outvars)


# -- entry point -------------------------------------------------------------------------------
