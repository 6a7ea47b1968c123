"""The jaxpr walk behind :func:`planner.extract` (one algorithm: a single
pass over the equations whose regions, chains and layer rules share the
walker's state; its primitive tables are in
:mod:`planner.models._primitives`, its rules for the functional ops between
modules in :mod:`planner.models._functional_walk`, its transformer rules in
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

from planner.ir.builder import GraphBuilder
from planner.models._functional_walk import _Chain, _FunctionalRules
from planner.models._primitives import _CALL_PRIMITIVES, _ELEMENTWISE, _FREE, _eqn_flops
from planner.models._transformer_walk import _LOOKUPS, _Heads, _Positions, _Scores, _TransformerRules
from planner.usage import InternalError

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


class _Walker(_FunctionalRules, _TransformerRules):
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
