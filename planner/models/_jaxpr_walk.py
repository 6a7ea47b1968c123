"""The jaxpr walk behind :func:`planner.extract` (one algorithm: a single
pass over the equations whose regions, chains and layer rules share the
walker's state; its primitive tables are in
:mod:`planner.models._primitives`, its module regions in
:mod:`planner.models._module_walk`, its rules for the functional ops
between modules in :mod:`planner.models._functional_walk`, its transformer
rules in :mod:`planner.models._transformer_walk`): turns a traced
forward pass, whose equations carry module-path markers in their name
stacks, into layers added through :class:`~planner.ir.builder.GraphBuilder`
(jax-notes.md §1). Private: the documented behaviour is in
:mod:`planner.models.extraction`."""

from __future__ import annotations

import itertools
import math
import re
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax.extend.core as jex

from planner.ir.builder import GraphBuilder
from planner.models._functional_walk import _Chain, _FunctionalRules
from planner.models._module_walk import _ModuleRules
from planner.models._primitives import _CALL_PRIMITIVES, _ELEMENTWISE, _FREE, _eqn_flops
from planner.models._regions import _ModuleInfo, _Region
from planner.models._transformer_walk import _Heads, _Positions, _Scores, _TransformerRules
from planner.usage import InternalError

_REPLICATE_HINT = (
    'pass on_unsupported="replicate" (shardplan: --on-unsupported replicate) to keep it as a '
    "replicated layer whose cost is estimated from its FLOPs"
)

_MARK = "shardplan:"
_MARK_RE = re.compile(r"shardplan:(\d+):([^/()\s]*)")


# -- the walk ---------------------------------------------------------------------------
class _Walker(_ModuleRules, _FunctionalRules, _TransformerRules):
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
        are added to the tokens). The scores and probabilities of an attention
        belong to the attention layer they became (its activations, which a
        recomputed attention computes again)."""
        for v in values:
            if isinstance(v, _Scores) and v.attention is not None:
                return v.attention
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
