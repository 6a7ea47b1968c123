"""The token layers of :class:`~planner.ir.builder.GraphBuilder` (private;
a mixin: its methods are the builder's): a transformer's embeddings,
attention, rotary positions, norms, and the reshapes and slices of token
sequences. Per sample, channels first, the tokens in the first spatial
dim; FLOPs by :mod:`planner.ir.flops`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from planner.ir import flops as F
from planner.ir.graph import LayerKind


class TokenLayers:
    """The token-sequence layer methods of ``GraphBuilder`` (which supplies
    ``shape`` and ``_add``)."""

    shape: Any  # GraphBuilder.shape
    _add: Any  # GraphBuilder._add

    def embed(self, name: str, x: int, vocab: int, features: int) -> int:
        """A lookup of token ids (``x``: one channel of ids per position) in a
        learned ``vocab x features`` table (Flax ``Embed``); the backward pass
        keeps the ids."""
        c, sp = self.shape(x)
        if c != 1 or len(sp) != 1:
            raise ValueError(f"embed {name!r} reads token ids of shape (1, tokens), got ({c}, {sp})")
        if vocab < 1 or features < 1:
            raise ValueError(f"embed {name!r}: vocab ({vocab}) and features ({features}) must be positive")
        return self._add(
            name, LayerKind.EMBED, [x], features, sp,
            params=float(vocab) * features, flops=F.embed_flops(sp[0], features), saved_elements=float(sp[0]),
        )

    def position_embedding(self, name: str, x: int, *, class_token: bool = False,
                           table_positions: int | None = None) -> int:
        """A learned embedding per position added to the tokens (``x``:
        ``(channels, tokens)``); with ``class_token`` a learned token is
        first put in front of them (a ViT's ``[CLS]``), so the output has one
        more position. An element-wise layer with parameters: a row per
        position, or ``table_positions`` rows where the table holds more
        positions than are used (nanoGPT's ``wpe`` of ``block_size`` rows,
        looked up at ``arange(tokens)``)."""
        c, sp = self.shape(x)
        if len(sp) != 1:
            raise ValueError(f"position_embedding {name!r} reads tokens (channels, tokens), got ({c}, {sp})")
        out = sp[0] + int(class_token)
        n = c * out
        rows = out if table_positions is None else int(table_positions)
        if rows < out:
            raise ValueError(f"position_embedding {name!r}: a table of {rows} positions for {out} tokens")
        return self._add(
            name, LayerKind.ELEMENTWISE, [x], c, (out,),
            params=float(c * rows + (c if class_token else 0)),
            flops=F.LayerFlops(float(n), 0.0, float(n)),  # the add; its gradient summed over the batch
        )

    def attention(self, name: str, qkv: int | Sequence[int], *, heads: int, kv_heads: int | None = None,
                  causal: bool = False) -> int:
        """Scaled dot-product self-attention (``jax.nn.dot_product_attention``)
        of ``heads`` query heads over ``kv_heads`` key-value heads (default
        ``heads``; fewer: grouped-query attention, one: multi-query; Ainslie
        et al. 2023). It reads either one fused projection ``qkv`` of
        ``(heads + 2 kv_heads) x head_dim`` channels grouped by key-value head
        (each group's query heads, its key and its value together, as
        Megatron-LM's fused QKV weight), so that splitting the channels in
        equal parts splits whole groups; or three projections ``(q, k, v)`` of
        ``heads x head_dim``, ``kv_heads x head_dim`` and ``kv_heads x
        head_dim`` channels (Llama's ``wq``, ``wk``, ``wv``), read as one input
        of their channels together. ``causal``: each position attends to
        itself and the ones before it. Output ``(heads x head_dim, tokens)``.
        No parameters (the projections are dense layers); the backward pass
        keeps the queries, keys and values and the attention probabilities,
        ``heads x tokens^2`` (the quadratic term)."""
        kv = heads if kv_heads is None else int(kv_heads)
        if heads < 1 or kv < 1 or heads % kv:
            raise ValueError(f"attention {name!r}: kv_heads ({kv}) must be positive and divide heads ({heads})")
        inputs = [int(qkv)] if isinstance(qkv, (int, np.integer)) else [int(i) for i in qkv]
        shapes = [self.shape(i) for i in inputs]
        if len(inputs) not in (1, 3) or any(len(sp) != 1 or sp != shapes[0][1] for _, sp in shapes):
            raise ValueError(f"attention {name!r} reads one fused projection or three (queries, keys, values) of "
                             f"tokens (channels, tokens); got {[(c, sp) for c, sp in shapes]}")
        sp = shapes[0][1]
        cin = sum(c for c, _ in shapes)
        if len(inputs) == 3:
            (cq, _), (ck, _), (cv, _) = shapes
            if cq % heads or ck != cv or ck * heads != cq * kv:
                raise ValueError(f"attention {name!r}: queries of {cq}, keys of {ck} and values of {cv} channels "
                                 f"are not {heads} and {kv} heads of one head dim")
        elif cin % (heads + 2 * kv):
            raise ValueError(f"attention {name!r} reads queries, keys and values ((heads + 2 kv_heads) x head_dim "
                             f"= {heads + 2 * kv} x head_dim channels), got {cin} channels")
        c = cin // (heads + 2 * kv) * heads
        s = sp[0]
        kind = LayerKind.CAUSAL_ATTENTION if causal else LayerKind.ATTENTION
        return self._add(
            name, kind, inputs, c, sp, groups=heads, in_channels=cin,
            flops=F.attention_flops(s, c, heads, causal), saved_elements=float(cin * s + heads * s * s),
        )

    def rotary_embedding(self, name: str, x: int, *, rotated_channels: int | None = None,
                         flops_per_element: float = F.ROTARY_FLOPS_PER_ELEMENT) -> int:
        """Rotary position embeddings on ``rotated_channels`` of ``x``'s
        channels over its tokens (default all: a query or key projection; of a
        fused projection laid out for :meth:`attention`, its queries' and
        keys', the values passing unchanged): an element-wise layer of the
        same shape whose FLOPs are :func:`~planner.ir.flops.rotary_flops` of
        the rotated elements (``flops_per_element`` forward: 3 for the
        rotation of pairs; the extractor passes what the model's code
        computes). It saves nothing for the backward pass (the rotation's
        angles are constants)."""
        c, sp = self.shape(x)
        rotated = c if rotated_channels is None else int(rotated_channels)
        if len(sp) != 1 or not 0 < rotated <= c:
            raise ValueError(f"rotary_embedding {name!r} rotates channels of tokens (channels, tokens); got "
                             f"({c}, {sp}) with {rotated} rotated channels")
        return self._add(name, LayerKind.ELEMENTWISE, [x], c, sp,
                         flops=F.rotary_flops(rotated * sp[0], flops_per_element))


    def norm(self, name: str, x: int, *, rms: bool = False, scale: bool = True, bias: bool = True) -> int:
        """Layer normalisation (``rms``: RMS normalisation, no mean and no
        bias) over each position's channels, with a learned per-channel
        ``scale`` and ``bias``; the backward pass keeps the input."""
        c, sp = self.shape(x)
        n = c * math.prod(sp)
        bias = bias and not rms
        return self._add(
            name, LayerKind.NORM, [x], c, sp,
            params=c * (int(scale) + int(bias)),
            flops=F.norm_flops(n, c, rms, scale, bias), saved_elements=float(n),
        )


    def tokens(self, name: str, x: int) -> int:
        """The positions of a spatial activation as one sequence of tokens,
        channels kept: ``(C, H, W) -> (C, H*W)`` (a reshape, kind ``FLATTEN``:
        no kernel, no FLOPs), as a ViT's patch embedding does."""
        c, sp = self.shape(x)
        return self._add(name, LayerKind.FLATTEN, [x], c, (math.prod(sp),))

    def split_channels(self, name: str, x: int, channels: int) -> int:
        """A contiguous part of ``channels`` of ``x``'s channels (one of the
        outputs of ``jnp.split(qkv, 3, axis=-1)``, ``x[..., a:b]``): a slice,
        kind ``FLATTEN`` (no kernel, no FLOPs; it runs batch-split or
        replicated, so a part of a channel-split input is gathered first)."""
        c, sp = self.shape(x)
        if not 0 < channels <= c:
            raise ValueError(f"split_channels {name!r}: {channels} of {c} channels")
        return self._add(name, LayerKind.FLATTEN, [x], int(channels), sp)

    def first_token(self, name: str, x: int) -> int:
        """The first position of a sequence, ``(C, tokens) -> (C,)`` (a ViT's
        class token read out for the head, ``x[:, 0]``): a slice, kind
        ``FLATTEN`` (no kernel, no FLOPs)."""
        c, sp = self.shape(x)
        if len(sp) != 1:
            raise ValueError(f"first_token {name!r} reads tokens (channels, tokens), got ({c}, {sp})")
        return self._add(name, LayerKind.FLATTEN, [x], c, ())
