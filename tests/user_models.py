"""Transformers written the way people write them, not the way the zoo's
twins are: test models for extraction, planning, validation and training.

* :func:`llama`: a Llama in ``flax.nnx`` after Meta's reference code and its
  common JAX ports: separate ``wq`` / ``wk`` / ``wv`` / ``wo`` projections,
  rotary embeddings applied to the query and key head views with
  ``rotate_half`` (the Hugging Face form), grouped-query attention through
  ``jax.nn.dot_product_attention`` (4 query heads per key-value head),
  SwiGLU, ``nnx.RMSNorm``, an untied output layer.
* :func:`nanogpt`: Karpathy's nanoGPT ported to ``flax.nnx`` line by line:
  a fused ``c_attn`` split with ``jnp.split(..., 3, axis=-1)``, attention
  written by hand (``q @ k.swapaxes(-2, -1)``, a ``jnp.tril`` causal mask,
  ``jax.nn.softmax``, ``@ v``), learned positions ``wpe(jnp.arange(T))``,
  GELU, LayerNorm, and the output tied to ``wte`` through ``wte.attend``.
* :func:`linen_cnn`: a ``flax.linen`` CNN with batch norm under a ``train``
  flag.
* :func:`linen_gpt`: a ``flax.linen`` GPT with ``nn.MultiHeadDotProductAttention``
  and learned positions owned by its root module.
* :func:`vit`: a small ViT in ``flax.nnx`` with Flax's own
  ``nnx.MultiHeadAttention``, patches embedded by a strided ``nnx.Conv`` and
  positions owned by its root module.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import nnx


def rotate_half(x):
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([-x2, x1], axis=-1)


def rope_tables(seq_len: int, head_dim: int, theta: float = 10000.0):
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    freqs = jnp.outer(jnp.arange(seq_len, dtype=jnp.float32), inv_freq)
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb)[None, :, None, :], jnp.sin(emb)[None, :, None, :]


class Attention(nnx.Module):
    def __init__(self, dim: int, n_heads: int, n_kv_heads: int, *, rngs: nnx.Rngs):
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, dim // n_heads
        self.wq = nnx.Linear(dim, n_heads * self.head_dim, use_bias=False, rngs=rngs)
        self.wk = nnx.Linear(dim, n_kv_heads * self.head_dim, use_bias=False, rngs=rngs)
        self.wv = nnx.Linear(dim, n_kv_heads * self.head_dim, use_bias=False, rngs=rngs)
        self.wo = nnx.Linear(n_heads * self.head_dim, dim, use_bias=False, rngs=rngs)

    def __call__(self, x):
        b, t, _ = x.shape
        q = self.wq(x).reshape(b, t, self.n_heads, self.head_dim)
        k = self.wk(x).reshape(b, t, self.n_kv_heads, self.head_dim)
        v = self.wv(x).reshape(b, t, self.n_kv_heads, self.head_dim)
        cos, sin = rope_tables(t, self.head_dim)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        out = jax.nn.dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.reshape(b, t, -1))


class FeedForward(nnx.Module):
    def __init__(self, dim: int, hidden: int, *, rngs: nnx.Rngs):
        self.w1 = nnx.Linear(dim, hidden, use_bias=False, rngs=rngs)
        self.w2 = nnx.Linear(hidden, dim, use_bias=False, rngs=rngs)
        self.w3 = nnx.Linear(dim, hidden, use_bias=False, rngs=rngs)

    def __call__(self, x):
        return self.w2(jax.nn.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nnx.Module):
    def __init__(self, dim: int, n_heads: int, n_kv_heads: int, hidden: int, *, rngs: nnx.Rngs):
        self.attention_norm = nnx.RMSNorm(dim, rngs=rngs)
        self.attention = Attention(dim, n_heads, n_kv_heads, rngs=rngs)
        self.ffn_norm = nnx.RMSNorm(dim, rngs=rngs)
        self.feed_forward = FeedForward(dim, hidden, rngs=rngs)

    def __call__(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nnx.Module):
    def __init__(self, vocab: int = 512, dim: int = 128, n_layers: int = 4, n_heads: int = 8, n_kv_heads: int = 2,
                 hidden: int = 352, *, rngs: nnx.Rngs):
        self.tok_embeddings = nnx.Embed(vocab, dim, rngs=rngs)
        self.layers = nnx.List([TransformerBlock(dim, n_heads, n_kv_heads, hidden, rngs=rngs)
                                for _ in range(n_layers)])
        self.norm = nnx.RMSNorm(dim, rngs=rngs)
        self.output = nnx.Linear(dim, vocab, use_bias=False, rngs=rngs)

    def __call__(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def llama(batch: int = 8, seq: int = 64):
    """A Llama of width 128, 4 blocks, 8 heads over 2 key-value heads, and
    its example input: ``(module, token ids (batch, seq) int32)``."""
    return Llama(rngs=nnx.Rngs(0)), jax.ShapeDtypeStruct((batch, seq), jnp.int32)


class CausalSelfAttention(nnx.Module):
    def __init__(self, n_embd: int, n_head: int, block_size: int, *, rngs: nnx.Rngs):
        self.n_head, self.n_embd = n_head, n_embd
        self.c_attn = nnx.Linear(n_embd, 3 * n_embd, rngs=rngs)
        self.c_proj = nnx.Linear(n_embd, n_embd, rngs=rngs)
        self.block_size = block_size

    def __call__(self, x):
        B, T, C = x.shape
        q, k, v = jnp.split(self.c_attn(x), 3, axis=-1)
        k = k.reshape(B, T, self.n_head, C // self.n_head).transpose(0, 2, 1, 3)
        q = q.reshape(B, T, self.n_head, C // self.n_head).transpose(0, 2, 1, 3)
        v = v.reshape(B, T, self.n_head, C // self.n_head).transpose(0, 2, 1, 3)
        att = (q @ k.swapaxes(-2, -1)) * (1.0 / jnp.sqrt(k.shape[-1]))
        mask = jnp.tril(jnp.ones((T, T), dtype=bool))
        att = jnp.where(mask[None, None], att, -jnp.inf)
        att = jax.nn.softmax(att, axis=-1)
        y = att @ v
        y = y.transpose(0, 2, 1, 3).reshape(B, T, C)
        return self.c_proj(y)


class MLP(nnx.Module):
    def __init__(self, n_embd: int, *, rngs: nnx.Rngs):
        self.c_fc = nnx.Linear(n_embd, 4 * n_embd, rngs=rngs)
        self.c_proj = nnx.Linear(4 * n_embd, n_embd, rngs=rngs)

    def __call__(self, x):
        return self.c_proj(jax.nn.gelu(self.c_fc(x)))


class Block(nnx.Module):
    def __init__(self, n_embd: int, n_head: int, block_size: int, *, rngs: nnx.Rngs):
        self.ln_1 = nnx.LayerNorm(n_embd, rngs=rngs)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size, rngs=rngs)
        self.ln_2 = nnx.LayerNorm(n_embd, rngs=rngs)
        self.mlp = MLP(n_embd, rngs=rngs)

    def __call__(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nnx.Module):
    def __init__(self, vocab_size: int = 512, block_size: int = 128, n_layer: int = 4, n_head: int = 4,
                 n_embd: int = 128, *, rngs: nnx.Rngs):
        self.wte = nnx.Embed(vocab_size, n_embd, rngs=rngs)
        self.wpe = nnx.Embed(block_size, n_embd, rngs=rngs)
        self.h = nnx.List([Block(n_embd, n_head, block_size, rngs=rngs) for _ in range(n_layer)])
        self.ln_f = nnx.LayerNorm(n_embd, rngs=rngs)

    def __call__(self, idx):
        B, T = idx.shape
        pos = jnp.arange(0, T, dtype=jnp.int32)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.wte.attend(self.ln_f(x))


def nanogpt(batch: int = 8, seq: int = 64):
    """nanoGPT of width 128, 4 blocks, 4 heads, positions for 128 tokens
    (64 used), and its example input: ``(module, token ids (batch, seq))``."""
    return GPT(rngs=nnx.Rngs(0)), jax.ShapeDtypeStruct((batch, seq), jnp.int32)


class LinenCNN(nn.Module):
    """A small CNN written in ``flax.linen`` the usual way: ``@nn.compact``,
    batch norm switched by a ``train`` flag, a wide classifier."""

    classes: int = 10

    @nn.compact
    def __call__(self, x, train: bool = True):
        for features in (16, 32):
            x = nn.Conv(features, (3, 3))(x)
            x = nn.BatchNorm(use_running_average=not train)(x)
            x = nn.relu(x)
            x = nn.max_pool(x, (2, 2), strides=(2, 2))
        x = x.reshape(x.shape[0], -1)
        x = nn.relu(nn.Dense(1024)(x))
        return nn.Dense(self.classes)(x)


def linen_cnn(batch: int = 8):
    """The linen CNN and an example input of 16x16 RGB images."""
    return LinenCNN(), jax.ShapeDtypeStruct((batch, 16, 16, 3), jnp.float32)


class LinenBlock(nn.Module):
    heads: int

    @nn.compact
    def __call__(self, x, mask):
        h = nn.LayerNorm()(x)
        x = x + nn.MultiHeadDotProductAttention(num_heads=self.heads)(h, mask=mask)
        h = nn.LayerNorm()(x)
        h = nn.Dense(4 * x.shape[-1])(h)
        h = nn.Dense(x.shape[-1])(nn.gelu(h))
        return x + h


class LinenGPT(nn.Module):
    """A GPT in ``flax.linen``: ``nn.MultiHeadDotProductAttention`` under
    ``nn.make_causal_mask``, learned positions as a parameter of the root
    module (``self.param``), sliced to the sequence and added."""

    vocab: int = 512
    width: int = 128
    depth: int = 2
    heads: int = 4
    max_tokens: int = 128

    @nn.compact
    def __call__(self, ids):
        x = nn.Embed(self.vocab, self.width)(ids)
        pos = self.param("pos_embedding", nn.initializers.normal(0.02), (1, self.max_tokens, self.width))
        x = x + pos[:, : ids.shape[1]]
        mask = nn.make_causal_mask(ids)
        for _ in range(self.depth):
            x = LinenBlock(self.heads)(x, mask)
        return nn.Dense(self.vocab, use_bias=False)(nn.LayerNorm()(x))


def linen_gpt(batch: int = 8, seq: int = 64):
    """The linen GPT (width 128, 2 blocks, 4 heads, positions for 128 tokens)
    and its example input of token ids."""
    return LinenGPT(), jax.ShapeDtypeStruct((batch, seq), jnp.int32)


class EncoderBlock(nnx.Module):
    def __init__(self, width: int, heads: int, *, rngs: nnx.Rngs):
        self.norm1 = nnx.LayerNorm(width, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(num_heads=heads, in_features=width, decode=False, rngs=rngs)
        self.norm2 = nnx.LayerNorm(width, rngs=rngs)
        self.fc1 = nnx.Linear(width, 4 * width, rngs=rngs)
        self.fc2 = nnx.Linear(4 * width, width, rngs=rngs)

    def __call__(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.fc2(jax.nn.gelu(self.fc1(self.norm2(x))))


class ViT(nnx.Module):
    """A small ViT in ``flax.nnx`` as the Flax examples write one: patches
    embedded by a strided ``nnx.Conv``, flattened to tokens, learned
    positions as an ``nnx.Param`` of the root module, encoder blocks with
    Flax's own ``nnx.MultiHeadAttention``, mean pooling and a linear head."""

    def __init__(self, image: int = 32, patch: int = 4, width: int = 96, depth: int = 3, heads: int = 4,
                 classes: int = 10, *, rngs: nnx.Rngs):
        self.patch_embed = nnx.Conv(3, width, (patch, patch), strides=(patch, patch), padding="VALID", rngs=rngs)
        tokens = (image // patch) ** 2
        self.pos_embedding = nnx.Param(jax.random.normal(rngs.params(), (1, tokens, width)) * 0.02)
        self.blocks = nnx.List([EncoderBlock(width, heads, rngs=rngs) for _ in range(depth)])
        self.norm = nnx.LayerNorm(width, rngs=rngs)
        self.head = nnx.Linear(width, classes, rngs=rngs)

    def __call__(self, images):
        x = self.patch_embed(images)
        b, h, w, c = x.shape
        x = x.reshape(b, h * w, c) + self.pos_embedding[...]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x).mean(axis=1))


def vit(batch: int = 8):
    """The ViT (32x32 RGB images, 4x4 patches, width 96, 3 blocks, 4 heads)
    and an example input."""
    return ViT(rngs=nnx.Rngs(0)), jax.ShapeDtypeStruct((batch, 32, 32, 3), jnp.float32)
