"""A Vision Transformer written as a user would in Flax nnx, for
``shardplan``'s ``package.module:factory`` models: ViT-S/16 (Touvron et
al., "DeiT", 2021: width 384, 6 heads, 12 blocks) with global average
pooling instead of a class token.

    PYTHONPATH=. shardplan plan examples.flax_vit:vit_s16 --devices 64 --hardware dgx-a100
    PYTHONPATH=. shardplan layers examples.flax_vit:tiny

It follows the rules of docs/transformers.md ("Writing a model the extractor
maps"): one fused query-key-value ``nnx.Linear`` reshaped to
``(batch, tokens, heads, 3, head_dim)``, ``jax.nn.dot_product_attention``,
and the learned positions in a module of their own.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


class Attention(nnx.Module):
    def __init__(self, width: int, heads: int, rngs: nnx.Rngs) -> None:
        self.heads = heads
        self.qkv = nnx.Linear(width, 3 * width, rngs=rngs)
        self.proj = nnx.Linear(width, width, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, self.heads, 3, c // self.heads)
        out = jax.nn.dot_product_attention(qkv[:, :, :, 0], qkv[:, :, :, 1], qkv[:, :, :, 2])
        return self.proj(out.reshape(b, n, c))


class Block(nnx.Module):
    def __init__(self, width: int, heads: int, rngs: nnx.Rngs) -> None:
        self.ln1 = nnx.LayerNorm(width, rngs=rngs)
        self.attn = Attention(width, heads, rngs)
        self.ln2 = nnx.LayerNorm(width, rngs=rngs)
        self.fc1 = nnx.Linear(width, 4 * width, rngs=rngs)
        self.fc2 = nnx.Linear(4 * width, width, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(nnx.gelu(self.fc1(self.ln2(x))))


class Positions(nnx.Module):
    def __init__(self, tokens: int, width: int, rngs: nnx.Rngs) -> None:
        self.table = nnx.Param(nnx.initializers.normal(0.02)(rngs.params(), (1, tokens, width)))

    def __call__(self, x: jax.Array) -> jax.Array:
        return x + self.table[...]


class ViT(nnx.Module):
    def __init__(self, image: int, patch: int, width: int, depth: int, heads: int, classes: int,
                 rngs: nnx.Rngs) -> None:
        self.patches = nnx.Conv(3, width, (patch, patch), strides=(patch, patch), padding="VALID", rngs=rngs)
        self.positions = Positions((image // patch) ** 2, width, rngs)
        self.blocks = nnx.List([Block(width, heads, rngs) for _ in range(depth)])
        self.norm = nnx.LayerNorm(width, rngs=rngs)
        self.head = nnx.Linear(width, classes, rngs=rngs)

    def __call__(self, images: jax.Array) -> jax.Array:
        x = self.patches(images)
        x = self.positions(x.reshape(x.shape[0], -1, x.shape[-1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x).mean(axis=1))


def vit_s16() -> tuple[ViT, jax.ShapeDtypeStruct]:
    """ViT-S/16 at 224x224, 1000 classes (abstract: no weights allocated)."""
    model = nnx.eval_shape(lambda: ViT(224, 16, 384, 12, 6, 1000, nnx.Rngs(0)))
    return model, jax.ShapeDtypeStruct((1, 224, 224, 3), jnp.float32)


def tiny(abstract: bool = True) -> tuple[ViT, jax.ShapeDtypeStruct]:
    """A two-block ViT on 32x32 images (16 tokens of width 64, 4 heads, 10 classes)."""
    make = lambda: ViT(32, 8, 64, 2, 4, 10, nnx.Rngs(0))  # noqa: E731
    model = nnx.eval_shape(make) if abstract else make()
    return model, jax.ShapeDtypeStruct((8, 32, 32, 3), jnp.float32)
