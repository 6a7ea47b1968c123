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
from planner.ir._token_layers import TokenLayers
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


class GraphBuilder(TokenLayers):
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

    def batch_norm(self, name: str, x: int, *, affine: bool = True) -> int:
        c, sp = self.shape(x)
        n = c * math.prod(sp)
        return self._add(
            name, LayerKind.BATCH_NORM, [x], c, sp,
            params=2 * c if affine else 0, buffers=2 * c,
            flops=F.batch_norm_flops(n, affine), saved_elements=float(n),
        )

    # -- layers without parameters ---------------------------------------------
    def elementwise(self, name: str, x: int, *, flops_per_element: float = 1.0, saves_output: bool = True,
                    kept_values: int = 0) -> int:
        """ReLU and other activations (1 FLOP per element, as XLA counts ``max``);
        dropout; scaling. It keeps its input (``saves_output``) and
        ``kept_values`` more values of its size: the transcendental values its
        derivative reads (GELU's tanh, SiLU's logistic: ``_primitives._kept_values``)."""
        c, sp = self.shape(x)
        n = c * math.prod(sp)
        return self._add(
            name, LayerKind.ELEMENTWISE, [x], c, sp,
            flops=F.elementwise_flops(n, flops_per_element),
            saved_elements=float(n) * (float(saves_output) + kept_values),
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
