"""The zoo's transformers (:data:`planner.models.zoo.TRANSFORMERS`) as
``flax.nnx`` modules: ``vit-tiny``, ``vit-b16``, ``gpt2-small`` and
``decoder-tiny``.

Each executes exactly the layers of its :class:`LayerGraph` twin
(``planner.models.zoo.get_model(name)``) in the same order, with module
paths equal to the graph's layer names (``blocks/0/attn/qkv``,
``blocks/0/mlp/fc1``), so that XLA's FLOP count of the module checks the
graph's (``tests/test_transformer_layers.py``).

* Self-attention (:class:`SelfAttention`) projects the queries, keys and
  values with one ``nnx.Linear`` of ``3 x width`` features grouped by head
  (reshaped to ``(batch, tokens, heads, 3, head_dim)``: each head's query,
  key and value are neighbours, as in Megatron-LM's fused QKV weight), so
  that splitting those features in equal parts splits whole heads; then
  ``jax.nn.dot_product_attention`` (XLA implementation) and an output
  ``nnx.Linear``.
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

from planner.models.zoo import TRANSFORMERS, TransformerConfig

__all__ = ["Decoder", "PositionEmbedding", "SelfAttention", "TransformerBlock", "ViT", "transformer"]


class SelfAttention(nnx.Module):
    """Self-attention of ``heads`` heads with a fused QKV projection grouped by head."""

    def __init__(self, width: int, heads: int, *, causal: bool, bias: bool, rngs: nnx.Rngs) -> None:
        if width % heads:
            raise ValueError(f"SelfAttention: heads ({heads}) must divide the width ({width})")
        self.heads, self.causal = heads, causal
        self.qkv = nnx.Linear(width, 3 * width, use_bias=bias, rngs=rngs)
        self.out = nnx.Linear(width, width, use_bias=bias, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        b, s, c = x.shape
        qkv = self.qkv(x).reshape(b, s, self.heads, 3, c // self.heads)
        h = jax.nn.dot_product_attention(qkv[..., 0, :], qkv[..., 1, :], qkv[..., 2, :], is_causal=self.causal)
        return self.out(h.reshape(b, s, c))


class _MLP(nnx.Module):
    def __init__(self, width: int, hidden: int, *, gated: bool, rngs: nnx.Rngs) -> None:
        self.gated = gated
        if gated:
            self.gate = nnx.Linear(width, hidden, use_bias=False, rngs=rngs)
            self.up = nnx.Linear(width, hidden, use_bias=False, rngs=rngs)
            self.down = nnx.Linear(hidden, width, use_bias=False, rngs=rngs)
        else:
            self.fc1 = nnx.Linear(width, hidden, rngs=rngs)
            self.fc2 = nnx.Linear(hidden, width, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        if self.gated:
            return self.down(jax.nn.silu(self.gate(x)) * self.up(x))
        return self.fc2(jax.nn.gelu(self.fc1(x)))


def _norm(width: int, rms: bool, rngs: nnx.Rngs) -> nnx.Module:
    return nnx.RMSNorm(width, rngs=rngs) if rms else nnx.LayerNorm(width, rngs=rngs)


class TransformerBlock(nnx.Module):
    """A pre-norm block (``planner.models.zoo._transformer_block``)."""

    def __init__(self, cfg: TransformerConfig, *, causal: bool, rngs: nnx.Rngs) -> None:
        self.norm1 = _norm(cfg.width, cfg.gated, rngs)
        self.attn = SelfAttention(cfg.width, cfg.heads, causal=causal, bias=not cfg.gated, rngs=rngs)
        self.norm2 = _norm(cfg.width, cfg.gated, rngs)
        self.mlp = _MLP(cfg.width, cfg.hidden, gated=cfg.gated, rngs=rngs)

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
        self.patch_embed = nnx.Conv(3, cfg.width, (p, p), strides=(p, p), padding="VALID", rngs=rngs)
        self.pos_embed = PositionEmbedding((cfg.image // p) ** 2, cfg.width, class_token=True, rngs=rngs)
        self.blocks = nnx.List([TransformerBlock(cfg, causal=False, rngs=rngs) for _ in range(cfg.depth)])
        self.norm = nnx.LayerNorm(cfg.width, rngs=rngs)
        self.head = nnx.Linear(cfg.width, cfg.classes, rngs=rngs)

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
        self.pos_embed = PositionEmbedding(cfg.tokens, cfg.width, rngs=rngs)
        self.blocks = nnx.List([TransformerBlock(cfg, causal=True, rngs=rngs) for _ in range(cfg.depth)])
        self.norm = _norm(cfg.width, cfg.gated, rngs)
        self.lm_head = None if cfg.tied else nnx.Linear(cfg.width, cfg.vocab, use_bias=False, rngs=rngs)

    def __call__(self, ids: jax.Array) -> jax.Array:
        x = self.pos_embed(self.embed(ids))
        for block in self.blocks:
            x = block(x)
        x = self.norm(x)
        return self.embed.attend(x) if self.lm_head is None else self.lm_head(x)


def transformer(name: str, rngs: nnx.Rngs) -> nnx.Module:
    """The zoo transformer ``name`` (a key of :data:`TRANSFORMERS`) as an nnx module."""
    cfg = TRANSFORMERS[name]
    return ViT(cfg, rngs=rngs) if cfg.image else Decoder(cfg, rngs=rngs)
