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
