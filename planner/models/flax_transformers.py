"""Transformer configs (:class:`planner.models.transformer.TransformerConfig`,
the zoo's :data:`planner.models.zoo.TRANSFORMERS`) as ``flax.nnx`` modules.

Each executes exactly the layers of its :class:`LayerGraph` twin
(``planner.models.zoo.get_model(name)``) in the same order, with module
paths equal to the graph's layer names (``blocks/0/attn/qkv``,
``blocks/0/mlp/fc1``), so that XLA's FLOP count of the module checks the
graph's (``tests/test_transformer_layers.py``).

* Self-attention (:class:`SelfAttention`) projects the queries, keys and
  values with one ``nnx.Linear`` of ``(heads + 2 kv_heads) x head_dim``
  features grouped by key-value head (reshaped to ``(batch, tokens,
  kv_heads, heads / kv_heads + 2, head_dim)``: each group's query heads, key
  and value are neighbours, as in Megatron-LM's fused QKV weight; ``(batch,
  tokens, heads, 3, head_dim)`` without grouped-query attention), so that
  splitting those features in equal parts splits whole groups; rotary
  positions on the queries and keys (:func:`rotary`); then
  ``jax.nn.dot_product_attention`` (XLA implementation; it shares each key
  and value among its group's query heads) and an output ``nnx.Linear``.
* Blocks are pre-norm: ``x + attn(norm1(x))``, ``h + mlp(norm2(h))``; the
  MLP is ``fc2(gelu(fc1))`` or, gated, ``down(silu(gate) * up)``.
* :class:`PositionEmbedding` owns the learned positions (and a ViT's class
  token), added to (put in front of) the tokens.

Inputs: images ``(batch, H, W, 3)`` float32 (ViT), token ids
``(batch, tokens)`` int32 (decoders). No dropout.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from planner.models.transformer import TransformerConfig
from planner.models.zoo import TRANSFORMERS

__all__ = ["Decoder", "PositionEmbedding", "SelfAttention", "TransformerBlock", "ViT", "rotary", "transformer"]

ROTARY_BASE = 10000.0  # Su et al. 2021, eq. 15: theta_i = 10000^(-2(i-1)/d)


def rotary(x: jax.Array, base: float = ROTARY_BASE) -> jax.Array:
    """Rotary position embeddings (Su et al. 2021, eq. 34) of ``x``
    ``(batch, tokens, heads, head_dim)``: the first and second halves of
    each head's channels are pairs, turned by the position's angle."""
    tokens, half = x.shape[1], x.shape[-1] // 2
    freq = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angle = jnp.arange(tokens, dtype=jnp.float32)[:, None] * freq  # (tokens, half)
    cos, sin = jnp.cos(angle)[:, None, :].astype(x.dtype), jnp.sin(angle)[:, None, :].astype(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


class SelfAttention(nnx.Module):
    """Self-attention of ``heads`` query heads over ``kv_heads`` key-value
    heads with a fused QKV projection grouped by key-value head."""

    def __init__(self, width: int, heads: int, *, causal: bool, bias: bool, rngs: nnx.Rngs,
                 kv_heads: int | None = None, rotary: bool = False) -> None:
        kv = heads if kv_heads is None else kv_heads
        if width % heads or heads % kv:
            raise ValueError(f"SelfAttention: heads ({heads}) must divide the width ({width}), kv_heads ({kv}) "
                             "the heads")
        self.heads, self.kv_heads, self.causal, self.rotary = heads, kv, causal, rotary
        self.qkv = nnx.Linear(width, (heads + 2 * kv) * (width // heads), use_bias=bias, rngs=rngs)
        self.out = nnx.Linear(width, width, use_bias=bias, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        b, s, c = x.shape
        group = self.heads // self.kv_heads
        qkv = self.qkv(x).reshape(b, s, self.kv_heads, group + 2, c // self.heads)
        q = qkv[..., :group, :].reshape(b, s, self.heads, c // self.heads)
        k, v = qkv[..., group, :], qkv[..., group + 1, :]
        if self.rotary:
            q, k = rotary(q), rotary(k)
        h = jax.nn.dot_product_attention(q, k, v, is_causal=self.causal)
        return self.out(h.reshape(b, s, c))


class _MLP(nnx.Module):
    def __init__(self, width: int, hidden: int, *, gated: bool, bias: bool, rngs: nnx.Rngs) -> None:
        self.gated = gated
        if gated:
            self.gate = nnx.Linear(width, hidden, use_bias=bias, rngs=rngs)
            self.up = nnx.Linear(width, hidden, use_bias=bias, rngs=rngs)
            self.down = nnx.Linear(hidden, width, use_bias=bias, rngs=rngs)
        else:
            self.fc1 = nnx.Linear(width, hidden, use_bias=bias, rngs=rngs)
            self.fc2 = nnx.Linear(hidden, width, use_bias=bias, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        if self.gated:
            return self.down(jax.nn.silu(self.gate(x)) * self.up(x))
        return self.fc2(jax.nn.gelu(self.fc1(x)))


def _norm(cfg: TransformerConfig, rngs: nnx.Rngs) -> nnx.Module:
    if cfg.norm == "rms":
        return nnx.RMSNorm(cfg.width, rngs=rngs)
    return nnx.LayerNorm(cfg.width, use_bias=cfg.bias, rngs=rngs)


class TransformerBlock(nnx.Module):
    """A pre-norm block (``planner.models.zoo._transformer_block``)."""

    def __init__(self, cfg: TransformerConfig, *, causal: bool, rngs: nnx.Rngs) -> None:
        self.norm1 = _norm(cfg, rngs)
        self.attn = SelfAttention(cfg.width, cfg.heads, causal=causal, bias=cfg.bias, rngs=rngs,
                                  kv_heads=cfg.kv_heads, rotary=cfg.rotary)
        self.norm2 = _norm(cfg, rngs)
        self.mlp = _MLP(cfg.width, cfg.hidden, gated=cfg.mlp == "swiglu", bias=cfg.bias, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class PositionEmbedding(nnx.Module):
    """Learned positions added to ``tokens`` tokens; with ``class_token`` a
    learned token is put in front first (then ``tokens + 1`` positions)."""

    def __init__(self, tokens: int, width: int, *, class_token: bool = False, rngs: nnx.Rngs) -> None:
        init = nnx.initializers.normal(0.02)
        self.cls = nnx.Param(init(rngs.params(), (1, 1, width))) if class_token else None
        self.pos = nnx.Param(init(rngs.params(), (1, tokens + int(class_token), width)))

    def __call__(self, x: jax.Array) -> jax.Array:
        if self.cls is not None:
            x = jnp.concatenate([jnp.broadcast_to(self.cls[...], (x.shape[0], 1, x.shape[-1])), x], axis=1)
        return x + self.pos[...]


class ViT(nnx.Module):
    """Vision Transformer (``planner.models.zoo._vit``)."""

    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs) -> None:
        p = cfg.patch
        self.patch_embed = nnx.Conv(3, cfg.width, (p, p), strides=(p, p), padding="VALID", use_bias=cfg.bias,
                                    rngs=rngs)
        self.pos_embed = PositionEmbedding((cfg.image // p) ** 2, cfg.width, class_token=True, rngs=rngs)
        self.blocks = nnx.List([TransformerBlock(cfg, causal=False, rngs=rngs) for _ in range(cfg.depth)])
        self.norm = _norm(cfg, rngs)
        self.head = nnx.Linear(cfg.width, cfg.classes, use_bias=cfg.bias, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.patch_embed(x)
        x = x.reshape(x.shape[0], -1, x.shape[-1])
        x = self.pos_embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


class Decoder(nnx.Module):
    """A decoder-only language model (``planner.models.zoo._decoder``)."""

    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs) -> None:
        self.tied = cfg.tied
        self.embed = nnx.Embed(cfg.vocab, cfg.width, rngs=rngs)
        self.pos_embed = None if cfg.rotary else PositionEmbedding(cfg.tokens, cfg.width, rngs=rngs)
        self.blocks = nnx.List([TransformerBlock(cfg, causal=True, rngs=rngs) for _ in range(cfg.depth)])
        self.norm = _norm(cfg, rngs)
        self.lm_head = None if cfg.tied else nnx.Linear(cfg.width, cfg.vocab, use_bias=False, rngs=rngs)

    def __call__(self, ids: jax.Array) -> jax.Array:
        x = self.embed(ids)
        if self.pos_embed is not None:
            x = self.pos_embed(x)
        for block in self.blocks:
            x = block(x)
        x = self.norm(x)
        return self.embed.attend(x) if self.lm_head is None else self.lm_head(x)


def transformer(config: str | TransformerConfig, rngs: nnx.Rngs) -> nnx.Module:
    """A transformer config, or the zoo transformer of that name (a key of
    :data:`TRANSFORMERS`), as an nnx module."""
    cfg = TRANSFORMERS[config] if isinstance(config, str) else config
    return ViT(cfg, rngs=rngs) if cfg.image else Decoder(cfg, rngs=rngs)
