"""The transformer layer kinds of a parametric graph (private; used by
:class:`planner.automl.parametric.ParametricGraph`): what a decoder's norms,
attentions, embeddings, products and learned positions become at other
widths and sequence lengths, with the conventions of :mod:`planner.ir.flops`
and :class:`~planner.ir.builder.GraphBuilder`, so that at the template's
sizes the arrays are the builder's.

Host side (:func:`transformer_structure`), from the template: each layer's
constants (an attention's heads and its output-to-input channel ratio, a
norm's FLOP coefficients, parameters per channel). Device side
(:func:`transformer_rules`), in ``jnp``: the layers' FLOPs, parameters and
saved activations from their (continuous) channels and positions.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np

from costmodels import ATTENTION_KINDS
from planner.ir import flops as F
from planner.ir.graph import LayerGraph, LayerKind


class TransformerStructure(NamedTuple):
    """Per template layer (``[n]``), the constants of its transformer rule."""

    attention: np.ndarray  # 1.0 for an attention
    causal: np.ndarray  # 1.0 for a causal attention
    heads: np.ndarray  # an attention's query heads
    ratio: np.ndarray  # an attention's output channels over its input's (queries over queries, keys, values)
    norm: np.ndarray  # 1.0 for a layer / RMS norm
    norm_coef: np.ndarray  # [n, 4] a norm's FLOPs: forward a n + b t, backward c n (input) and d n (weights)
    embed: np.ndarray  # 1.0 for a token embedding
    multiply: np.ndarray  # inputs of a product (0 elsewhere)
    positions: np.ndarray  # 1.0 for learned positions (an element-wise layer with parameters)
    params_per: np.ndarray  # parameters per output channel (norm, embedding) or per channel and token (positions)
    tied: np.ndarray  # 1.0 for a dense layer tied to an embedding's table (owns no parameters)
    backward_per_element: np.ndarray  # an element-wise layer's backward FLOPs per input element


def _norm_coefficients(a: Any, i: int) -> tuple[float, float, float, float]:
    """The norm layer ``i``'s FLOP coefficients: the one of
    :func:`planner.ir.flops.norm_flops`'s variants (RMS or not, scale, bias)
    that gives the template's counts."""
    c = float(a.in_channels[i])
    n = c * float(np.prod(a.in_spatial[i]))
    for rms in (False, True):
        for scale, bias in ((True, True), (True, False), (False, True), (False, False)):
            fl = F.norm_flops(int(n), int(c), rms, scale, bias)
            if np.allclose((fl.forward, fl.backward_data, fl.backward_weight),
                           (a.flops_fwd[i], a.flops_bwd_data[i], a.flops_bwd_weight[i]), rtol=1e-6):
                return ((3.0 if rms else 5.0) + float(scale) + float(bias), 1.0 if rms else 5.0,
                        fl.backward_data / n, fl.backward_weight / n)
    raise ValueError(f"norm layer {i} has FLOPs no layer or RMS norm has")


def transformer_structure(t: LayerGraph, indeg: np.ndarray) -> TransformerStructure:
    a = t.unpadded()
    n = t.num_layers
    kind = a.kind.astype(int)
    attention = np.isin(kind, ATTENTION_KINDS)
    if np.any(attention & (indeg != 1)):
        i = int(np.argmax(attention & (indeg != 1)))
        raise ValueError(f"attention {t.names[i]!r} reads separate projections; a parametric graph rescales "
                         "attentions of one fused projection (planner.TransformerConfig's graphs)")
    norm = kind == LayerKind.NORM
    coef = np.zeros((n, 4))
    for i in np.flatnonzero(norm):
        coef[i] = _norm_coefficients(a, i)
    in_el = a.in_channels * np.prod(a.in_spatial, axis=1)
    out_el = a.out_channels * np.prod(a.out_spatial, axis=1)
    positions = (kind == LayerKind.ELEMENTWISE) & (a.params > 0)
    params_per = np.where(np.isin(kind, (LayerKind.NORM, LayerKind.EMBED)), a.params / a.out_channels,
                          np.where(positions, a.params / np.maximum(out_el, 1.0), 0.0))
    return TransformerStructure(
        attention=attention.astype(float), causal=(kind == LayerKind.CAUSAL_ATTENTION).astype(float),
        heads=np.where(attention, a.groups, 1.0), ratio=np.where(attention, a.out_channels / a.in_channels, 1.0),
        norm=norm.astype(float), norm_coef=coef, embed=(kind == LayerKind.EMBED).astype(float),
        multiply=np.where(kind == LayerKind.MULTIPLY, indeg, 0).astype(float), positions=positions.astype(float),
        params_per=params_per, tied=((kind == LayerKind.DENSE) & (a.params <= 0)).astype(float),
        backward_per_element=np.where(kind == LayerKind.ELEMENTWISE, a.flops_bwd_data / np.maximum(in_el, 1.0),
                                      0.0),
    )


class TransformerCounts(NamedTuple):
    """The rules' results per layer, ``[n]`` each (0 where a rule does not apply)."""

    mask: Any  # 1.0 where a transformer rule applies (its counts replace the generic ones)
    flops_fwd: Any
    flops_bwd_data: Any
    flops_bwd_weight: Any
    params: Any
    saved: Any


def transformer_rules(ts: TransformerStructure, in_c: Any, out_c: Any, in_pos: Any, out_pos: Any) -> TransformerCounts:
    """The transformer layers' counts from their channels and positions
    (tokens), in ``jnp``: planner.ir.flops' formulas."""
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    att, causal, heads = f32(ts.attention), f32(ts.causal), f32(ts.heads)
    norm, embed, mult, pos = f32(ts.norm), f32(ts.embed), f32(ts.multiply), f32(ts.positions)
    in_el, out_el = in_c * in_pos, out_c * out_pos
    s = in_pos  # an attention's tokens
    # planner.ir.flops.attention_flops: 4 s^2 c + 5 h s^2 - h s (+ h s^2 + s^2 causal); backward 8 s^2 c + 7 h s^2
    att_fwd = 4.0 * s * s * out_c + 5.0 * heads * s * s - heads * s + causal * (heads * s * s + s * s)
    att_bwd = 8.0 * s * s * out_c + 7.0 * heads * s * s
    coef = f32(ts.norm_coef)
    norm_fwd = coef[:, 0] * in_el + coef[:, 1] * in_pos  # norm_flops: a n + b t
    fwd = att * att_fwd + norm * norm_fwd + (mult - 1.0) * jnp.where(mult > 0, out_el, 0.0) + pos * out_el
    bwd_data = att * att_bwd + norm * coef[:, 2] * in_el + mult * (mult - 1.0) * out_el
    bwd_weight = norm * coef[:, 3] * in_el + embed * out_el + pos * out_el  # embed_flops: the table's scatter-add
    params = (norm + embed) * f32(ts.params_per) * out_c + pos * f32(ts.params_per) * out_el
    saved = att * (in_el + heads * s * s) + norm * in_el + embed * in_pos + mult * out_el
    rule = jnp.clip(att + norm + embed + jnp.minimum(mult, 1.0) + pos, 0.0, 1.0)
    return TransformerCounts(rule, fwd, bwd_data, bwd_weight, params, saved)
