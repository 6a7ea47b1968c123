"""The module rules of the jaxpr walk behind :func:`planner.extract`
(private; the documented behaviour is in :mod:`planner.models.extraction`):
the equations inside a marked module call gather into a :class:`_Region`,
which becomes one layer when the call ends (a conv, dense, norm or
embedding module; a multi-head attention; a position embedding), or an
error naming what the module does that no layer kind covers. A mixin of
:class:`planner.models._jaxpr_walk._Walker`, whose state and helpers
(``b``, ``batch``, ``open``, ``emit``, ``check``, ``resolve``,
``unsupported_error``) and transformer rules it uses."""

from __future__ import annotations

import math
from typing import Any

from planner.ir.builder import GraphBuilder
from planner.models._primitives import _eqn_flops
from planner.models._regions import _ModuleInfo, _Region
from planner.models._transformer_walk import _LOOKUPS, _Positions
from planner.usage import InternalError


class _ModuleRules:
    """Module regions and their layers (see the module docstring)."""

    b: Any  # GraphBuilder
    batch: int
    open: _Region | None

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
