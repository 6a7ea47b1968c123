"""Each way people write a transformer's attention maps onto the planner's
layers: separate or fused projections, ``jax.nn.dot_product_attention`` or
attention by hand (``@`` or ``einsum``), multi-head, grouped-query and
multi-query, rotary positions in their usual forms, causal masks from
``tril`` / ``where``, nnx and linen. Oracles: the model's own parameter
count, and XLA's count of its forward FLOPs."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import planner

B, T, C, H = 2, 16, 32, 4
HD = C // H


def rope_pairs(x):
    """Rotary positions on interleaved pairs (x[..., ::2], x[..., 1::2]), as Meta's reference code."""
    half = x.shape[-1] // 2
    freq = 10000.0 ** (-jnp.arange(half, dtype=jnp.float32) / half)
    ang = jnp.arange(x.shape[1], dtype=jnp.float32)[:, None] * freq
    cos, sin = jnp.cos(ang)[None, :, None, :], jnp.sin(ang)[None, :, None, :]
    x1, x2 = x[..., ::2], x[..., 1::2]
    return jnp.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).reshape(x.shape)


def by_hand(q, k, v, causal=True):
    """(B, T, H, D) queries, keys, values: scores by einsum, a tril mask, softmax, values by einsum."""
    if k.shape[2] != q.shape[2]:  # grouped-query: each key-value head serves a group of query heads
        k = jnp.repeat(k, q.shape[2] // k.shape[2], axis=2)
        v = jnp.repeat(v, q.shape[2] // v.shape[2], axis=2)
    att = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
    if causal:
        att = jnp.where(jnp.tril(jnp.ones((q.shape[1], q.shape[1]), bool)), att, -1e9)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(att, axis=-1), v)


class Separate(nnx.Module):
    def __init__(self, kv_heads, attend, rope, rngs):
        self.kv, self.attend, self.rope = kv_heads, attend, rope
        self.q = nnx.Linear(C, C, use_bias=False, rngs=rngs)
        self.k = nnx.Linear(C, kv_heads * HD, use_bias=False, rngs=rngs)
        self.v = nnx.Linear(C, kv_heads * HD, use_bias=False, rngs=rngs)
        self.o = nnx.Linear(C, C, use_bias=False, rngs=rngs)
        self.head = nnx.Linear(C, 10, rngs=rngs)

    def __call__(self, x):
        q = self.q(x).reshape(B, T, H, HD)
        k = self.k(x).reshape(B, T, self.kv, HD)
        v = self.v(x).reshape(B, T, self.kv, HD)
        if self.rope:
            q, k = rope_pairs(q), rope_pairs(k)
        y = self.attend(q, k, v)
        return self.head(x + self.o(y.reshape(B, T, C)))


def _dot_product(q, k, v):
    return jax.nn.dot_product_attention(q, k, v, is_causal=True)


class LinenHandWritten(nn.Module):
    @nn.compact
    def __call__(self, x):
        q = nn.Dense(C, name="query")(x).reshape(B, T, H, HD).transpose(0, 2, 1, 3)
        k = nn.Dense(C, name="key")(x).reshape(B, T, H, HD).transpose(0, 2, 1, 3)
        v = nn.Dense(C, name="value")(x).reshape(B, T, H, HD).transpose(0, 2, 1, 3)
        att = q @ k.swapaxes(-2, -1) * HD ** -0.5
        att = jnp.where(nn.make_causal_mask(jnp.ones((B, T))) > 0, att, jnp.finfo(att.dtype).min)
        y = (jax.nn.softmax(att, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
        return nn.Dense(10)(x + nn.Dense(C, name="out")(y))


CASES = {
    "separate, dot_product_attention, multi-head": lambda r: Separate(H, _dot_product, False, r),
    "separate, dot_product_attention, grouped-query 2:1": lambda r: Separate(2, _dot_product, False, r),
    "separate, dot_product_attention, multi-query": lambda r: Separate(1, _dot_product, False, r),
    "separate, einsum by hand, rotary pairs": lambda r: Separate(H, by_hand, True, r),
    "separate, einsum by hand, grouped-query, rotary pairs": lambda r: Separate(2, by_hand, True, r),
    "linen, @ by hand, make_causal_mask": None,
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_attention_idiom_maps_with_every_parameter_and_its_flops(case):
    x = jax.ShapeDtypeStruct((B, T, C), jnp.float32)
    if CASES[case] is None:
        model = LinenHandWritten()
        variables = jax.eval_shape(model.init, jax.random.key(0), x)
        params = sum(math.prod(v.shape) for v in jax.tree.leaves(variables["params"]))
        xla = jax.jit(lambda v, x: model.apply(v, x)).lower(variables, x).cost_analysis()
    else:
        model = nnx.eval_shape(lambda: CASES[case](nnx.Rngs(0)))
        params = sum(math.prod(v.shape) for v in jax.tree.leaves(nnx.state(model, nnx.Param)))
        graphdef, state = nnx.split(model)
        xla = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x)).lower(state, x).cost_analysis()
    g = planner.extract(model, x)
    assert g.on_unsupported == "error"
    assert g.total("params") == params
    kinds = [k for k in g.kind_names if "attention" in k]
    assert kinds == ["causal_attention"], g.kind_names
    i = g.kind_names.index("causal_attention")
    assert len([u for u, v in g.edges if v == i]) == 3  # its queries, keys and values
    flops = (xla[0] if isinstance(xla, list) else xla)["flops"]
    assert g.total("flops_fwd") * B == pytest.approx(flops, rel=0.02)


class Unmapped(nnx.Module):
    """Attentions the planner has no layer for: a position bias added to the
    scores (ALiBi-like), a sigmoid in place of the softmax."""

    def __init__(self, variant, rngs):
        self.variant = variant
        self.q, self.k, self.v, self.o = (nnx.Linear(C, C, rngs=rngs) for _ in range(4))

    def __call__(self, x):
        q, k, v = (f(x).reshape(B, T, H, HD) for f in (self.q, self.k, self.v))
        att = jnp.einsum("bqhd,bkhd->bhqk", q, k)
        if self.variant == "position bias":
            att = jax.nn.softmax(att + 0.1 * jnp.arange(T)[None, None, None, :], axis=-1)
        else:
            att = jax.nn.sigmoid(att)
        return self.o(jnp.einsum("bhqk,bkhd->bqhd", att, v).reshape(B, T, C))


@pytest.mark.parametrize("variant", ["position bias", "sigmoid"])
def test_an_unmapped_attention_is_refused_by_name_or_kept_with_its_work(variant):
    """Refused by default, naming the operation; with on_unsupported="replicate"
    replicated layers hold all of it: every parameter, and the FLOPs of the
    scores computed before the unmapped operation (XLA's count within 2%)."""
    model = nnx.eval_shape(lambda: Unmapped(variant, nnx.Rngs(0)))
    x = jax.ShapeDtypeStruct((B, T, C), jnp.float32)
    with pytest.raises(ValueError, match="operation '(add|logistic)' on activation"):
        planner.extract(model, x)
    g = planner.extract(model, x, on_unsupported="replicate")
    assert g.on_unsupported == "replicate" and "other" in g.kind_names
    assert g.total("params") == sum(math.prod(v.shape) for v in jax.tree.leaves(nnx.state(model, nnx.Param)))
    graphdef, state = nnx.split(model)
    ca = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x)).lower(state, x).cost_analysis()
    assert g.total("flops_fwd") * B == pytest.approx((ca[0] if isinstance(ca, list) else ca)["flops"], rel=0.02)
