"""``GraphBuilder``: the one way a :class:`~planner.ir.graph.LayerGraph` is made.

The zoo, the ParaDL importer and the Flax extractor all add layers through
these methods, so shape inference, parameter counts and FLOP counting live
in one place (:mod:`planner.ir.flops`).

Conventions (per sample, channels first, spatial dims padded with 1):

* a layer input is a node id: :attr:`GraphBuilder.input` (the model input,
  ``-1``) or the id returned when a layer was added;
* padding is ``"SAME"`` / ``"VALID"`` (Flax semantics) or one ``(lo, hi)``
  pair per spatial dim;
* names are unique; :meth:`GraphBuilder.auto_name` makes ``scope/op``,
  ``scope/op_1``, ... the way the Flax extractor names functional ops.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from planner.ir import flops as F
from planner.ir.graph import (
    MAX_SPATIAL_DIMS,
    LayerArrays,
    LayerGraph,
    LayerKind,
    layer_path,
)

__all__ = ["GraphBuilder", "resolve_padding"]

Padding = str | Sequence[tuple[int, int]]

MODEL_INPUT = -1


def _tuple(v: int | Sequence[int], rank: int, what: str) -> tuple[int, ...]:
    t = (int(v),) * rank if isinstance(v, (int, np.integer)) else tuple(int(x) for x in v)
    if len(t) != rank:
        raise ValueError(f"{what} has {len(t)} dims, expected {rank}")
    if any(x < 1 for x in t):
        raise ValueError(f"{what} must be positive, got {t}")
    return t


def resolve_padding(
    padding: Padding,
    in_spatial: Sequence[int],
    kernel: Sequence[int],
    stride: Sequence[int],
    dilation: Sequence[int],
) -> tuple[tuple[int, int], ...]:
    """Explicit ``(lo, hi)`` padding per spatial dim, with Flax's SAME/VALID rules."""
    rank = len(in_spatial)
    if isinstance(padding, str):
        mode = padding.upper()
        if mode == "VALID":
            return ((0, 0),) * rank
        if mode == "SAME":
            pads = []
            for n, k, s, d in zip(in_spatial, kernel, stride, dilation, strict=True):
                out = -(-n // s)
                total = max((out - 1) * s + (k - 1) * d + 1 - n, 0)
                pads.append((total // 2, total - total // 2))
            return tuple(pads)
        raise ValueError(f"padding must be 'SAME', 'VALID' or (lo, hi) pairs, got {padding!r}")
    pads = tuple((int(lo), int(hi)) for lo, hi in padding)
    if len(pads) != rank:
        raise ValueError(f"padding has {len(pads)} dims, expected {rank}")
    return pads


def _window_out(n: int, k: int, s: int, d: int, lo: int, hi: int) -> int:
    eff = (k - 1) * d + 1
    out = (n + lo + hi - eff) // s + 1
    if out < 1:
        raise ValueError(f"window of {eff} does not fit an input of {n} with padding ({lo}, {hi})")
    return out


class GraphBuilder:
    """Accumulates layers and edges, then :meth:`build` s a :class:`LayerGraph`."""

    input = MODEL_INPUT

    def __init__(self, model_name: str, input_shape: Sequence[int], *, input_gradient: bool = False) -> None:
        """``input_gradient``: layers fed by the model input compute its gradient
        too (a sub-graph of a larger model, or a benchmark timing
        ``jax.grad`` w.r.t. the input); by default they do not."""
        shape = tuple(int(x) for x in input_shape)
        if not 1 <= len(shape) <= 1 + MAX_SPATIAL_DIMS or any(x < 1 for x in shape):
            raise ValueError(
                f"input_shape must be (channels, *spatial) with 0-3 positive spatial dims, got {shape}"
            )
        self.model_name = model_name
        self.input_shape = shape
        self.input_gradient = bool(input_gradient)
        self._rows: list[dict[str, Any]] = []
        self._names: list[str] = []
        self._edges: list[tuple[int, int]] = []
        self._counts: dict[str, int] = {}

    # -- naming --------------------------------------------------------------
    def auto_name(self, scope: str, op: str) -> str:
        """``scope/op`` the first time, then ``scope/op_1``, ``scope/op_2``, ..."""
        base = layer_path(scope, op)
        n = self._counts.get(base, 0)
        self._counts[base] = n + 1
        name = base if n == 0 else f"{base}_{n}"
        while name in self._names:  # an explicit name already took it
            n += 1
            self._counts[base] = n + 1
            name = f"{base}_{n}"
        return name

    def shape(self, node: int) -> tuple[int, tuple[int, ...]]:
        """``(channels, spatial)`` of a node's output (spatial unpadded)."""
        if node == MODEL_INPUT:
            return self.input_shape[0], self.input_shape[1:]
        if not 0 <= node < len(self._rows):
            raise ValueError(f"unknown node {node}")
        r = self._rows[node]
        return r["out_channels"], r["_out_spatial"]

    # -- generic -------------------------------------------------------------
    def _add(
        self,
        name: str,
        kind: LayerKind,
        inputs: Sequence[int],
        out_channels: int,
        out_spatial: Sequence[int],
        *,
        kernel: Sequence[int] = (),
        stride: Sequence[int] = (),
        dilation: Sequence[int] = (),
        pads: Sequence[tuple[int, int]] = (),
        groups: int = 1,
        params: float = 0.0,
        buffers: float = 0.0,
        flops: F.LayerFlops = F.NO_FLOPS,
        saved_elements: float = 0.0,
        in_channels: int | None = None,
    ) -> int:
        """One row; ``in_channels`` (default: the first input's) for a layer
        that reads several inputs as one (an attention's queries, keys and
        values)."""
        if not name:
            raise ValueError("layer name must be non-empty")
        if name in self._names:
            raise ValueError(f"duplicate layer name {name!r}")
        if not inputs:
            raise ValueError(f"layer {name!r} needs at least one input")
        in_c, in_sp = self.shape(inputs[0])
        in_c = in_c if in_channels is None else int(in_channels)
        out_spatial = tuple(int(x) for x in out_spatial)
        if out_channels < 1 or any(x < 1 for x in out_spatial):
            raise ValueError(f"layer {name!r}: output shape ({out_channels}, {out_spatial}) must be positive")

        def pad3(v: Sequence[int], fill: int = 1) -> list[int]:
            return list(v) + [fill] * (MAX_SPATIAL_DIMS - len(v))

        idx = len(self._rows)
        only_model_input = all(i == MODEL_INPUT for i in inputs) and not self.input_gradient
        self._rows.append(
            dict(
                mask=1.0,
                kind=float(kind),
                spatial_rank=float(len(in_sp)),
                out_spatial_rank=float(len(out_spatial)),
                in_channels=in_c,
                in_spatial=pad3(in_sp),
                out_channels=int(out_channels),
                out_spatial=pad3(out_spatial),
                _out_spatial=out_spatial,
                kernel=pad3(kernel),
                stride=pad3(stride),
                dilation=pad3(dilation),
                pad_lo=pad3([p[0] for p in pads], 0),
                pad_hi=pad3([p[1] for p in pads], 0),
                groups=groups,
                params=params,
                buffers=buffers,
                flops_fwd=flops.forward,
                # No gradient flows into the model input: jax.grad w.r.t. the
                # parameters never computes it (XLA drops it), unless asked for.
                flops_bwd_data=0.0 if only_model_input else flops.backward_data,
                flops_bwd_weight=flops.backward_weight,
                saved_elements=saved_elements,
            )
        )
        self._names.append(name)
        for i in inputs:
            if i != MODEL_INPUT:
                self.shape(i)  # validates
                self._edges.append((int(i), idx))
        return idx

    def other(
        self,
        name: str,
        inputs: Sequence[int],
        out_channels: int,
        out_spatial: Sequence[int],
        *,
        params: float = 0.0,
        flops_fwd: float = 0.0,
    ) -> int:
        """A layer with no dedicated model (``OTHER``): replicated in every plan,
        its cost estimated from its forward FLOPs (each backward pass taken as
        equal to the forward)."""
        c, sp = self.shape(inputs[0])
        return self._add(
            name, LayerKind.OTHER, inputs, out_channels, out_spatial,
            params=params,
            flops=F.LayerFlops(flops_fwd, flops_fwd, flops_fwd if params else 0.0),
            saved_elements=float(c * math.prod(sp)) if params or flops_fwd else 0.0,
        )

    # -- layers with parameters ----------------------------------------------
    def conv(
        self,
        name: str,
        x: int,
        features: int,
        kernel: int | Sequence[int],
        *,
        stride: int | Sequence[int] = 1,
        padding: Padding = "SAME",
        dilation: int | Sequence[int] = 1,
        groups: int = 1,
        bias: bool = True,
    ) -> int:
        c, sp = self.shape(x)
        rank = len(sp)
        if rank == 0:
            raise ValueError(f"conv {name!r} needs a spatial input, got ({c},)")
        k = _tuple(kernel, rank, f"conv {name!r} kernel")
        s = _tuple(stride, rank, f"conv {name!r} stride")
        d = _tuple(dilation, rank, f"conv {name!r} dilation")
        if c % groups or features % groups:
            raise ValueError(f"conv {name!r}: groups={groups} must divide in ({c}) and out ({features}) channels")
        pads = resolve_padding(padding, sp, k, s, d)
        out_sp = tuple(_window_out(n, *a, *p) for n, *a, p in zip(sp, k, s, d, pads, strict=True))
        fl = F.conv_flops(c, features, sp, out_sp, k, s, d, pads, groups, bias)
        params = math.prod(k) * (c // groups) * features + (features if bias else 0)
        return self._add(
            name, LayerKind.CONV, [x], features, out_sp,
            kernel=k, stride=s, dilation=d, pads=pads, groups=groups,
            params=params, flops=fl, saved_elements=float(c * math.prod(sp)),
        )

    def dense(self, name: str, x: int, features: int, *, bias: bool = True, tied: bool = False) -> int:
        """A dense layer on the channel dim (per spatial position, as Flax's
        ``Linear`` on an NHWC tensor); flatten first for a classifier.
        ``tied``: its kernel is an embedding table's (``x @ table.T``, a
        language model's output layer with tied embeddings), counted as
        that embedding's parameters, so this layer owns none (no bias)."""
        c, sp = self.shape(x)
        bias = bias and not tied
        fl = F.dense_flops(c, features, math.prod(sp), bias)
        return self._add(
            name, LayerKind.DENSE, [x], features, sp,
            params=0 if tied else c * features + (features if bias else 0),
            flops=fl, saved_elements=float(c * math.prod(sp)),
        )

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

    def batch_norm(self, name: str, x: int, *, affine: bool = True) -> int:
        c, sp = self.shape(x)
        n = c * math.prod(sp)
        return self._add(
            name, LayerKind.BATCH_NORM, [x], c, sp,
            params=2 * c if affine else 0, buffers=2 * c,
            flops=F.batch_norm_flops(n, affine), saved_elements=float(n),
        )

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

    # -- layers without parameters ---------------------------------------------
    def elementwise(self, name: str, x: int, *, flops_per_element: float = 1.0, saves_output: bool = True) -> int:
        """ReLU and other activations (1 FLOP per element, as XLA counts ``max``);
        dropout; scaling."""
        c, sp = self.shape(x)
        n = c * math.prod(sp)
        return self._add(
            name, LayerKind.ELEMENTWISE, [x], c, sp,
            flops=F.elementwise_flops(n, flops_per_element),
            saved_elements=float(n) if saves_output else 0.0,
        )

    def relu(self, name: str, x: int) -> int:
        return self.elementwise(name, x)

    def pool(
        self,
        name: str,
        x: int,
        window: int | Sequence[int],
        *,
        stride: int | Sequence[int] | None = None,
        padding: Padding = "VALID",
        op: str = "max",
    ) -> int:
        """Max or average pooling (Flax ``max_pool`` / ``avg_pool``; stride
        defaults to the window)."""
        c, sp = self.shape(x)
        rank = len(sp)
        if rank == 0:
            raise ValueError(f"pool {name!r} needs a spatial input")
        if op not in ("max", "avg"):
            raise ValueError(f"pool op must be 'max' or 'avg', got {op!r}")
        w = _tuple(window, rank, f"pool {name!r} window")
        s = w if stride is None else _tuple(stride, rank, f"pool {name!r} stride")
        one = (1,) * rank
        pads = resolve_padding(padding, sp, w, s, one)
        out_sp = tuple(_window_out(n, k, st, 1, *p) for n, k, st, p in zip(sp, w, s, pads, strict=True))
        n_in, n_out = c * math.prod(sp), c * math.prod(out_sp)
        return self._add(
            name, LayerKind.POOL, [x], c, out_sp, kernel=w, stride=s, dilation=one, pads=pads,
            flops=F.pool_flops(n_in, n_out, math.prod(w), op),
            saved_elements=float(n_in) if op == "max" else 0.0,
        )

    def max_pool(self, name: str, x: int, window: int | Sequence[int], **kw: Any) -> int:
        return self.pool(name, x, window, op="max", **kw)

    def avg_pool(self, name: str, x: int, window: int | Sequence[int], **kw: Any) -> int:
        return self.pool(name, x, window, op="avg", **kw)

    def global_avg_pool(self, name: str, x: int) -> int:
        """Mean over all spatial dims (``x.mean(axis=(1, 2))``); output is flat."""
        c, sp = self.shape(x)
        n = c * math.prod(sp)
        return self._add(
            name, LayerKind.POOL, [x], c, (), kernel=sp, stride=sp, dilation=(1,) * len(sp),
            pads=((0, 0),) * len(sp), flops=F.global_pool_flops(n),
        )

    def _same_shape(self, op: str, name: str, xs: Sequence[int]) -> tuple[int, tuple[int, ...], int]:
        """``(channels, spatial, elements)`` of two or more equal-shaped inputs."""
        if len(xs) < 2:
            raise ValueError(f"{op} {name!r} needs at least two inputs")
        shapes = {self.shape(i) for i in xs}
        if len(shapes) != 1:
            raise ValueError(f"{op} {name!r}: inputs have different shapes {sorted(shapes)}")
        c, sp = shapes.pop()
        return c, sp, c * math.prod(sp)

    def add(self, name: str, xs: Sequence[int]) -> int:
        c, sp, n = self._same_shape("add", name, xs)
        return self._add(name, LayerKind.ADD, xs, c, sp, flops=F.add_flops(n, len(xs)))

    def multiply(self, name: str, xs: Sequence[int]) -> int:
        """Element-wise product of equal-shaped activations (a gated MLP's
        ``silu(gate) * up``); the backward pass keeps every input."""
        c, sp, n = self._same_shape("multiply", name, xs)
        return self._add(name, LayerKind.MULTIPLY, xs, c, sp, flops=F.multiply_flops(n, len(xs)),
                         saved_elements=float(n * len(xs)))

    def concat(self, name: str, xs: Sequence[int]) -> int:
        """Concatenation along channels."""
        if len(xs) < 2:
            raise ValueError(f"concat {name!r} needs at least two inputs")
        sps = {self.shape(i)[1] for i in xs}
        if len(sps) != 1:
            raise ValueError(f"concat {name!r}: inputs have different spatial shapes {sorted(sps)}")
        sp = sps.pop()
        return self._add(name, LayerKind.CONCAT, xs, sum(self.shape(i)[0] for i in xs), sp)

    def flatten(self, name: str, x: int) -> int:
        c, sp = self.shape(x)
        return self._add(name, LayerKind.FLATTEN, [x], c * math.prod(sp), ())

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

    # -- result ------------------------------------------------------------------
    def build(self, *, measured_time_per_sample_s: float | None = None) -> LayerGraph:
        if not self._rows:
            raise ValueError(f"model {self.model_name!r} has no layers")
        fields = {}
        for f in LayerArrays._fields:
            if f.startswith("edge_"):
                continue
            fields[f] = np.asarray([r[f] for r in self._rows], dtype=np.float64)
        e = np.asarray(self._edges, dtype=np.float64).reshape(-1, 2)
        fields["edge_src"], fields["edge_dst"] = e[:, 0], e[:, 1]
        fields["edge_mask"] = np.ones(len(e))
        g = LayerGraph(
            arrays=LayerArrays(**fields),
            names=tuple(self._names),
            model_name=self.model_name,
            input_shape=self.input_shape,
            measured_time_per_sample_s=measured_time_per_sample_s,
        )
        return g.padded()
