"""Primitive tables of the jaxpr walk behind :func:`planner.extract`, and the
forward FLOPs of an equation counted the XLA way (jax-notes.md §1). Private."""

from __future__ import annotations

import math
from typing import Any

import jax.extend.core as jex

_CALL_PRIMITIVES = frozenset(
    {"jit", "pjit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call",
     "custom_vjp_call_jaxpr", "checkpoint", "remat", "remat2"}
)
# Ops that never change values in a way the cost model cares about (0 FLOPs).
_FREE = frozenset(
    {"convert_element_type", "copy", "copy_p", "reduce_precision", "stop_gradient",
     "optimization_barrier", "bitcast_convert_type", "sharding_constraint"}
)
_SHAPE_OPS = frozenset({"reshape", "broadcast_in_dim", "squeeze", "expand_dims"})
_ELEMENTWISE = frozenset(
    {
        # unary
        "neg", "sign", "floor", "ceil", "round", "is_finite", "exp", "exp2", "log",
        "log1p", "expm1", "tanh", "logistic", "sin", "cos", "tan", "asin", "acos",
        "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "sqrt", "rsqrt", "cbrt",
        "abs", "square", "integer_pow", "erf", "erfc", "erf_inv", "lgamma", "digamma",
        "not", "real", "imag", "conj", "population_count", "clz",
        # binary / ternary
        "add", "add_any", "sub", "mul", "div", "rem", "pow", "max", "min", "atan2",
        "nextafter", "and", "or", "xor", "eq", "ne", "ge", "gt", "le", "lt",
        "shift_left", "shift_right_logical", "shift_right_arithmetic", "select_n", "clamp",
    }
)
# Transcendental element-wise ops, by the transcendental values their
# derivative reads. XLA's fusion does not duplicate expensive ops into the
# backward pass, so those values stay from the forward pass: its output
# (_READS_ITS_OUTPUT; tanh: 1 - y^2, logistic: y (1 - y), exp: y, sqrt: y),
# unless it is the activation function's output, which its consumer keeps
# anyway; and a value its JVP computes (_READS_ANOTHER; erf, erfc: exp(-x^2),
# sin and cos: each other), with its output too where a later op of the
# function reads it (x * erf(x)). Measured on XLA:CPU (docs/validation.md,
# tests/test_extract.py): GELU(tanh) keeps its tanh, GELU(erf) its erf and
# the exp (jaxlib 0.10; 0.12 keeps one of them), SiLU its logistic; tanh
# alone no more than ReLU.
_READS_ITS_OUTPUT = frozenset({"tanh", "logistic", "exp", "exp2", "expm1", "sqrt", "rsqrt", "cbrt"})
_READS_ANOTHER = frozenset({"erf", "erfc", "sin", "cos"})


def _kept_values(p: str) -> int:
    """Transcendental values of op ``p``'s size the backward pass reads if
    ``p`` is not the activation function's last op (one fewer if it is)."""
    return int(p in _READS_ITS_OUTPUT or p in _READS_ANOTHER) + int(p in _READS_ANOTHER)


# Element-wise ops that, with exactly one activation operand and constants
# otherwise, only rescale / shift / select it: folded into its producer.
_RESCALE = frozenset({"mul", "div", "add", "sub", "neg", "select_n"})
_CUMULATIVE = frozenset({"cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp", "argmax", "argmin"})


def _size(aval: Any) -> int:
    return math.prod(getattr(aval, "shape", ()))


def _jaxpr_flops(jaxpr: jex.Jaxpr) -> float:
    return float(sum(_eqn_flops(e) for e in jaxpr.eqns))


def _eqn_flops(eqn: jex.JaxprEqn) -> float:
    """Forward FLOPs of one equation, counted the XLA way (jax-notes.md §1)."""
    p = eqn.primitive.name
    params = eqn.params
    if p == "cond":
        return max((_jaxpr_flops(b.jaxpr) for b in params["branches"]), default=0.0)
    if p == "scan":
        return float(params["length"]) * _jaxpr_flops(params["jaxpr"].jaxpr)
    subs = list(jex.jaxprs_in_params(params))
    if subs:  # calls; a while loop counts one trip
        return float(sum(_jaxpr_flops(s) for s in subs))
    out = _size(eqn.outvars[0].aval) if eqn.outvars else 0
    if p == "conv_general_dilated":
        rhs = eqn.invars[1].aval.shape
        out_features = rhs[params["dimension_numbers"].rhs_spec[0]]
        return 2.0 * out * math.prod(rhs) / out_features / params["feature_group_count"]
    if p == "dot_general":
        (lc, _), _ = params["dimension_numbers"]
        lhs = eqn.invars[0].aval.shape
        return 2.0 * out * math.prod(lhs[i] for i in lc)
    if p in _ELEMENTWISE:
        return float(out)
    if p.startswith("reduce_window"):
        return float(out * math.prod(params.get("window_dimensions", (1,))))
    if p.startswith("reduce_") or p in _CUMULATIVE:
        return float(_size(eqn.invars[0].aval))
    return 0.0
