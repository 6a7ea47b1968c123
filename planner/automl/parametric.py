"""Parametric layer graphs: a :class:`LayerGraph` template turned into a
jit-compatible, differentiable function from continuous architecture
parameters (per-group width multipliers, an input-resolution multiplier) to
:class:`LayerArrays`.

Channels, spatial sizes and everything derived from them (parameters, FLOPs,
saved activations, buffers) are recomputed in ``jnp`` with the conventions
of :mod:`planner.ir.flops` and :mod:`planner.ir.builder`, so at integer channel
counts and resolutions the arrays equal the ones :class:`GraphBuilder` builds
(``tests/test_automl.py`` checks it to rtol 1e-6). Rules:

* a conv, dense or ``OTHER`` layer of width group ``g`` has
  ``template out_channels * widths[g]`` output channels (layers in no group
  keep theirs: the stem, the classifier); per-channel layers (batch norm,
  activations, pooling, adds) keep their input's channels; a concat sums its
  inputs'; a flatten multiplies channels by the spatial size;
* the input's spatial dims are ``round(template * resolution)`` (rounded
  with a straight-through estimator: values are integers, gradients those
  of the continuous size); every window layer's output is
  ``floor((n + lo + hi - ((k - 1) d + 1)) / s) + 1`` (straight-through
  floor), with the template's explicit paddings (a ``SAME`` padding was
  resolved at the template's resolution and is kept as it was);
* channels are continuous (smooth in the widths) unless ``rounded=True``:
  then each group's narrowest layer is rounded to the nearest positive
  multiple of ``channel_multiple`` and the group's other layers keep their
  template ratio to it (a bottleneck's 4x expansion stays 4x), the
  architecture one would actually build.

The loop over "rounds" below runs once per window layer on the longest
path (a handful for a ResNet), never once per layer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from costmodels import ATTENTION_KINDS
from planner.automl._transformer_rules import TransformerStructure, transformer_rules, transformer_structure
from planner.ir import flops as F
from planner.ir.graph import LayerArrays, LayerGraph, LayerKind

__all__ = [
    "ArchParams",
    "ParametricGraph",
    "parametric_graph",
    "total_forward_flops",
]

class ArchParams(NamedTuple):
    """Continuous architecture parameters (a pytree: jit, grad and vmap over it)."""

    widths: Any  # [G] width multiplier of each group (1.0 = the template)
    resolution: Any  # [] input-resolution multiplier (1.0 = the template)
    batch: Any  # [] global batch size, samples (continuous; rounded where divisibility matters)


def _ste(x, rounded):
    """Straight-through: the value of ``rounded``, the gradient of ``x``."""
    return x + jax.lax.stop_gradient(rounded - x)


def _floor(x):
    return _ste(x, jnp.floor(x))


def _ceil(x):
    return _ste(x, jnp.ceil(x))


class _Structure(NamedTuple):
    """Host-side (numpy) description of the template used by the jnp rules."""

    n: int
    group: np.ndarray  # [n] width group of conv/dense/other layers, -1 = fixed
    group_min: np.ndarray  # [n] template channels of the narrowest layer of the layer's group (1 if none)
    in_ptr: np.ndarray  # [n] first input, skipping spatial no-op layers (-1 = model input)
    first_src: np.ndarray  # [n] first input (-1 = model input)
    spatial_op: np.ndarray  # [n] 0 copy, 1 window, 2 global pool, 3 flatten
    chan_op: np.ndarray  # [n] 0 copy, 1 scaled, 2 concat, 3 flatten, 4 a fixed ratio to the input's (attention)
    bias: np.ndarray  # [n] 1.0 if the conv/dense layer has a bias
    input_only: np.ndarray  # [n] 1.0 if fed only by the model input (no backward-data pass)
    depthwise: np.ndarray  # [n] 1.0 if groups == in_channels > 1
    add_inputs: np.ndarray  # [n] inputs of an add
    max_pool: np.ndarray  # [n] 1.0 for a max pool (saves its input)
    saved_values: np.ndarray  # [n] input-sized values an activation keeps (its input, the values its derivative reads)
    per_element: np.ndarray  # [n] FLOPs per element of an element-wise layer
    spatial_rounds: int
    chan_rounds: int
    max_kernel: int
    transformer: TransformerStructure  # norms, attentions, embeddings, products, positions

def _structure(t: LayerGraph, group: np.ndarray) -> _Structure:
    a = t.unpadded()
    n = t.num_layers
    kind = a.kind.astype(int)
    first_src = np.full(n, -1)
    indeg = np.zeros(n, int)
    inputs: list[list[int]] = [[] for _ in range(n)]
    for s, d in t.edges:
        if first_src[d] < 0:
            first_src[d] = s
        indeg[d] += 1
        inputs[d].append(s)
    in_sp, out_sp = a.in_spatial, a.out_spatial
    ident = np.all((a.stride == 1) & (a.pad_lo + a.pad_hi == (a.kernel - 1) * a.dilation), axis=1)
    window = np.isin(kind, (LayerKind.CONV, LayerKind.POOL)) & ~ident
    global_pool = (kind == LayerKind.POOL) & (a.out_spatial_rank == 0) & (a.spatial_rank > 0)
    spatial_op = np.where(kind == LayerKind.FLATTEN, 3, np.where(global_pool, 2, np.where(window, 1, 0)))
    bad = (kind == LayerKind.OTHER) & np.any(in_sp != out_sp, axis=1)
    if bad.any():
        raise ValueError(f"layer {t.names[int(np.argmax(bad))]!r} has no shape rule (kind other) and changes the "
                         "spatial shape; a parametric graph cannot rescale it")
    chan_op = np.where(np.isin(kind, (LayerKind.CONV, LayerKind.DENSE, LayerKind.OTHER, LayerKind.EMBED)), 1,
                       np.where(kind == LayerKind.CONCAT, 2, np.where(kind == LayerKind.FLATTEN, 3,
                                np.where(np.isin(kind, ATTENTION_KINDS), 4, 0))))
    in_ptr = first_src.copy()
    for i in range(n):  # skip spatial no-ops (topological order: pointers already compressed)
        p = in_ptr[i]
        if p >= 0 and spatial_op[p] == 0:
            in_ptr[i] = in_ptr[p]
    depth_s, depth_c = np.zeros(n, int), np.zeros(n, int)
    for i in range(n):
        ds = max([depth_s[j] for j in inputs[i]], default=0)
        dc = max([depth_c[j] for j in inputs[i]], default=0)
        depth_s[i] = ds + (spatial_op[i] != 0)
        depth_c[i] = dc + (chan_op[i] >= 2)
    taps = np.prod(a.kernel, axis=1)
    c_in, c_out, g = a.in_channels, a.out_channels, a.groups
    bias = np.where(kind == LayerKind.CONV, a.params - taps * (c_in // g) * c_out,
                    np.where(kind == LayerKind.DENSE, a.params - c_in * c_out, 0.0))
    in_el = c_in * np.prod(in_sp, axis=1)
    out_el = c_out * np.prod(out_sp, axis=1)
    narrow = {g_: c_out[group == g_].min() for g_ in set(group[group >= 0].tolist())}
    return _Structure(
        n=n, group=group, group_min=np.array([narrow.get(g_, 1.0) for g_ in group]), in_ptr=in_ptr, first_src=first_src, spatial_op=spatial_op, chan_op=chan_op,
        bias=np.where(bias > 0, 1.0, 0.0), input_only=(indeg == 0).astype(float),
        depthwise=((g > 1) & (g == c_in)).astype(float),
        add_inputs=np.where(kind == LayerKind.ADD, np.round(a.flops_fwd / np.maximum(out_el, 1)) + 1, 0.0),
        max_pool=((kind == LayerKind.POOL) & (a.saved_elements > 0)).astype(float),
        saved_values=np.where(kind == LayerKind.ELEMENTWISE, a.saved_elements / np.maximum(in_el, 1), 0.0),
        per_element=np.where(kind == LayerKind.ELEMENTWISE, a.flops_fwd / np.maximum(in_el, 1), 0.0),
        spatial_rounds=int(depth_s.max(initial=0)) + 1, chan_rounds=int(depth_c.max(initial=0)) + 1,
        max_kernel=int(a.kernel.max(initial=1)), transformer=transformer_structure(t, indeg),
    )


def _valid_taps(n_in, n_out, k, s, d, lo, kmax: int):
    """Per dim: (output position, tap) pairs landing inside the input, the
    closed form of :func:`planner.ir.flops.valid_taps` (a sum over taps)."""
    t = jnp.arange(kmax, dtype=jnp.float32)  # [T]
    n_in, n_out, k, s, d, lo = (x[..., None] for x in (n_in, n_out, k, s, d, lo))
    first = jnp.maximum(0.0, _ceil((lo - t * d) / s))
    last = jnp.minimum(n_out - 1.0, _floor((n_in - 1.0 + lo - t * d) / s))
    return jnp.sum(jnp.where(t < k, jnp.maximum(0.0, last - first + 1.0), 0.0), axis=-1)


@dataclasses.dataclass(frozen=True, eq=False)
class ParametricGraph:
    """A template graph as a function of :class:`ArchParams`. Call it (inside
    ``jit``/``grad``/``vmap`` or not) to get jnp :class:`LayerArrays` padded
    like the template. Make one with :func:`parametric_graph`."""

    template: LayerGraph
    num_groups: int
    channel_multiple: int
    structure: _Structure = dataclasses.field(repr=False)
    key: tuple = dataclasses.field(init=False, repr=False)  # what equality and hashing compare

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", (self.template.fingerprint, np.shape(self.template.arrays.mask),
                                         tuple(self.structure.group.tolist()), self.channel_multiple))

    def __hash__(self) -> int:  # by value: equal graphs share jit compilations
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ParametricGraph) and self.key == other.key

    def _channels(self, widths: Any, in_pos: Any, rounded: bool) -> tuple[Any, Any]:
        """``[n]`` input and output channels of every layer at ``widths``
        (rounds over concats, flattens and attentions on the longest path)."""
        st, t, n = self.structure, self.template.arrays, self.structure.n
        f32 = lambda x: jnp.asarray(np.asarray(x)[:n], jnp.float32)  # noqa: E731
        scale = jnp.concatenate([widths, jnp.ones(1)])[jnp.asarray(np.where(st.group >= 0, st.group, self.num_groups))]
        scaled = f32(t.out_channels) * scale
        if rounded:  # the group's narrowest layer to a multiple of q, the others in proportion
            q = float(self.channel_multiple)
            narrow = f32(st.group_min) * scale
            ratio = f32(t.out_channels) / f32(st.group_min)
            scaled = jnp.where(jnp.asarray(st.group >= 0), ratio * jnp.maximum(q, jnp.round(narrow / q) * q), scaled)
        c0 = float(self.template.input_shape[0])
        e_src, e_dst = np.asarray(self.template.edges, dtype=int).reshape(-1, 2).T
        chan_op = jnp.asarray(st.chan_op)
        src = jnp.asarray(st.first_src)
        attention_ratio = jnp.asarray(st.transformer.ratio, jnp.float32)
        out_c = scaled
        for _ in range(st.chan_rounds):
            in_c = jnp.where(src >= 0, out_c[jnp.maximum(src, 0)], c0)
            cat = jnp.zeros(n).at[jnp.asarray(e_dst)].add(out_c[jnp.asarray(e_src)]) if e_src.size else jnp.zeros(n)
            out_c = jnp.where(chan_op == 1, scaled, jnp.where(chan_op == 2, cat, jnp.where(
                chan_op == 3, in_c * in_pos, jnp.where(chan_op == 4, in_c * attention_ratio, in_c))))
            # copy layers read their (already updated) producer: iterate along the chain cheaply
            out_c = _propagate_copies(out_c, st, c0)
        return jnp.where(src >= 0, out_c[jnp.maximum(src, 0)], c0), out_c

    def __call__(self, params: ArchParams, rounded: bool = False) -> LayerArrays:
        st = self.structure
        t = self.template.arrays
        n, L = st.n, int(np.shape(t.mask)[0])
        f32 = lambda x: jnp.asarray(np.asarray(x)[:n], jnp.float32)
        widths = jnp.asarray(params.widths, jnp.float32).reshape(-1)
        if widths.shape[0] != self.num_groups:
            raise ValueError(f"widths has {widths.shape[0]} entries; this graph has {self.num_groups} width groups")
        res = jnp.asarray(params.resolution, jnp.float32)
        rank = np.asarray(t.spatial_rank)[:n]
        kernel, stride, dil = f32(t.kernel), f32(t.stride), f32(t.dilation)
        lo, hi = f32(t.pad_lo), f32(t.pad_hi)
        shape = self.template.input_shape
        in0 = [float(x) for x in shape[1:]] + [1.0] * (4 - len(shape))
        x_sp = jnp.stack([_ste(x * res, jnp.round(x * res)) if i < len(shape) - 1 else jnp.float32(x)
                          for i, x in enumerate(in0)])  # [3]
        has_dims = jnp.asarray(np.arange(3)[None, :] < rank[:, None])  # [n, 3]

        # -- spatial: rounds over window layers on the longest path ----------------------
        ptr = jnp.asarray(st.in_ptr)
        op = jnp.asarray(st.spatial_op)[:, None]
        out_sp = jnp.broadcast_to(x_sp, (n, 3))
        for _ in range(st.spatial_rounds):
            in_sp = jnp.where((ptr >= 0)[:, None], out_sp[jnp.maximum(ptr, 0)], x_sp)
            win = _floor((in_sp + lo + hi - ((kernel - 1.0) * dil + 1.0)) / stride) + 1.0
            out_sp = jnp.where(op == 1, win, jnp.where(op >= 2, 1.0, in_sp))
        in_sp = jnp.where((ptr >= 0)[:, None], out_sp[jnp.maximum(ptr, 0)], x_sp)
        glob = op == 2
        kernel = jnp.where(glob & has_dims, in_sp, kernel)
        stride = jnp.where(glob & has_dims, in_sp, stride)
        in_pos, out_pos = jnp.prod(in_sp, axis=1), jnp.prod(out_sp, axis=1)

        in_c, out_c = self._channels(widths, in_pos, rounded)
        groups = jnp.where(jnp.asarray(st.depthwise) > 0, in_c, f32(t.groups))

        # -- derived counts (planner.ir.flops / planner.ir.builder conventions) -----------------
        kind = np.asarray(t.kind)[:n].astype(int)
        is_ = lambda k: jnp.asarray(kind == k)
        in_el, out_el = in_c * in_pos, out_c * out_pos
        bias = jnp.asarray(st.bias, jnp.float32)
        taps = jnp.prod(_valid_taps(in_sp, out_sp, kernel, stride, dil, lo, st.max_kernel), axis=1)
        conv_macs = taps * (in_c / groups) * out_c
        dense_macs = in_c * out_c * in_pos
        macs = jnp.where(is_(LayerKind.CONV), conv_macs, jnp.where(is_(LayerKind.DENSE), dense_macs, 0.0))
        b = bias * out_el  # conv: |y|; dense: out_features * positions = |y| (planner.ir.flops)
        param_layer = is_(LayerKind.CONV) | is_(LayerKind.DENSE)
        bn = is_(LayerKind.BATCH_NORM)
        affine = jnp.asarray((kind == LayerKind.BATCH_NORM) & (np.asarray(t.params)[:n] > 0), jnp.float32)
        pool = is_(LayerKind.POOL) & jnp.asarray(st.spatial_op != 2)
        gpool = is_(LayerKind.POOL) & jnp.asarray(st.spatial_op == 2)
        maxp = jnp.asarray(st.max_pool)
        window = jnp.prod(f32(t.kernel), axis=1)
        ew = is_(LayerKind.ELEMENTWISE)
        other = is_(LayerKind.OTHER)
        fwd = jnp.select(
            [param_layer, bn, pool, gpool, ew, is_(LayerKind.ADD), other],
            [2.0 * macs + b,  # planner.ir.flops.conv_flops / dense_flops
             F.BATCH_NORM_FWD_FLOPS_PER_ELEMENT * in_el,  # batch_norm_flops
             (window - maxp) * out_el,  # pool_flops: window - 1 (max) or window (avg) per output
             in_el,  # global_pool_flops
             jnp.asarray(st.per_element, jnp.float32) * in_el,  # elementwise_flops
             (jnp.asarray(st.add_inputs, jnp.float32) - 1.0) * out_el,  # add_flops
             f32(t.flops_fwd)],
            0.0)
        ew_bwd = jnp.asarray(st.transformer.backward_per_element, jnp.float32) * in_el  # as the template's
        bwd_data = jnp.select(
            [param_layer, bn, pool | gpool, ew, other],
            [2.0 * macs, F.BATCH_NORM_BWD_FLOPS_PER_ELEMENT * in_el, in_el, ew_bwd, f32(t.flops_bwd_data)], 0.0)
        bwd_data = bwd_data * (1.0 - jnp.asarray(st.input_only, jnp.float32))  # builder: no dx into the model input
        bwd_weight = jnp.select([param_layer, bn, other], [2.0 * macs + b, 2.0 * in_el * affine, f32(t.flops_bwd_weight)],
                                0.0)
        kprod = jnp.prod(f32(t.kernel), axis=1)
        untied = 1.0 - jnp.asarray(st.transformer.tied, jnp.float32)  # a tied output layer owns no parameters
        params_ = jnp.select(
            [is_(LayerKind.CONV), is_(LayerKind.DENSE), bn, other],
            [kprod * (in_c / groups) * out_c + bias * out_c, (in_c * out_c + bias * out_c) * untied,
             2.0 * out_c * affine, f32(t.params)], 0.0)
        buffers = jnp.where(bn, 2.0 * out_c, 0.0)
        saved = jnp.select(
            [param_layer | bn, pool, ew, other],
            [in_el, maxp * in_el, jnp.asarray(st.saved_values, jnp.float32) * in_el, f32(t.saved_elements)], 0.0)
        tr = transformer_rules(st.transformer, in_c, out_c, in_pos, out_pos)
        fwd, bwd_data, bwd_weight, params_, saved = (
            jnp.where(tr.mask > 0, new, old) for new, old in ((tr.flops_fwd, fwd), (tr.flops_bwd_data, bwd_data),
                                                              (tr.flops_bwd_weight, bwd_weight), (tr.params, params_),
                                                              (tr.saved, saved)))

        def pad(x, fill):  # real rows from the rules, padding rows from the template
            tmpl = jnp.asarray(np.asarray(fill)[n:], jnp.float32)
            return jnp.concatenate([x.astype(jnp.float32), tmpl.reshape((L - n,) + x.shape[1:])], axis=0)

        ch_in_sp = jnp.where(has_dims, in_sp, 1.0)
        new = {
            "in_channels": in_c, "out_channels": out_c, "in_spatial": ch_in_sp, "out_spatial": out_sp, "kernel": kernel,
            "stride": stride, "groups": groups, "params": params_, "buffers": buffers, "flops_fwd": fwd, "flops_bwd_data": bwd_data,
            "flops_bwd_weight": bwd_weight, "saved_elements": saved,
        }
        fields = {}
        for f in LayerArrays._fields:
            v = getattr(t, f)
            if f in new:
                fields[f] = pad(new[f], v)
            else:
                fields[f] = jnp.asarray(v, jnp.int32 if f in ("edge_src", "edge_dst") else jnp.float32)
        return LayerArrays(**fields)


def _propagate_copies(out_c, st: _Structure, c0: float):
    """Channel-copying layers take their first input's channels; one gather
    through compressed pointers (the nearest non-copy ancestor)."""
    ptr = _copy_pointers(st)
    copy = jnp.asarray(st.chan_op == 0)
    ancestor = jnp.where(ptr >= 0, out_c[jnp.maximum(jnp.asarray(ptr), 0)], c0)
    return jnp.where(copy, ancestor, out_c)


def _copy_pointers(st: _Structure) -> np.ndarray:
    ptr = st.first_src.copy()
    for i in range(st.n):
        p = ptr[i]
        if p >= 0 and st.chan_op[p] == 0:
            ptr[i] = ptr[p]
    return ptr


GroupSpec = Mapping[str, int] | Callable[[str], int | None]


def parametric_graph(template: LayerGraph, groups: GroupSpec, *, channel_multiple: int = 1) -> ParametricGraph:
    """A :class:`ParametricGraph` of ``template`` whose conv/dense layers are
    scaled by width group: ``groups`` maps a layer-name prefix to a group
    index (the longest matching prefix wins; unmatched layers keep their
    width), or is a function from a layer name to a group index or ``None``.
    ``rounded=True`` calls round channels to multiples of ``channel_multiple``."""
    if not isinstance(template, LayerGraph):
        raise ValueError(f"template must be a LayerGraph, got {type(template).__name__}")  # noqa: TRY004
    if not (isinstance(channel_multiple, int) and channel_multiple >= 1):
        raise ValueError(f"channel_multiple must be a positive integer, got {channel_multiple!r}")
    if callable(groups):
        of = groups
    elif isinstance(groups, Mapping):
        prefixes = sorted(groups, key=len, reverse=True)

        def of(name: str) -> int | None:
            return next((int(groups[p]) for p in prefixes if name.startswith(p)), None)
    else:
        raise ValueError(  # noqa: TRY004 (user errors are ValueErrors)
            "groups must map layer-name prefixes to group indices, or be a function of the layer name")
    kind = np.asarray(template.arrays.kind)[: template.num_layers].astype(int)
    a = template.unpadded()
    whole = a.out_channels == a.in_channels * np.prod(a.in_spatial, axis=1)  # a flatten of every position
    reshapes = (kind == LayerKind.FLATTEN) & ~whole
    if np.any(reshapes):  # positions to tokens, a slice of channels: no width rule
        i = int(np.argmax(reshapes))
        raise ValueError(f"parametric graphs have no width rule for the reshape or slice {template.names[i]!r} "
                         "(a ViT's tokens, a split projection); cost such a model with planner.plan per "
                         "configuration")
    scalable = np.isin(kind, (LayerKind.CONV, LayerKind.DENSE, LayerKind.OTHER, LayerKind.EMBED))
    group = np.array([(-1 if (g := of(nm)) is None else int(g)) if s else -1
                      for nm, s in zip(template.names, scalable, strict=True)], dtype=int)
    if (group < -1).any():
        raise ValueError("width group indices must be non-negative")
    used = sorted(set(group[group >= 0].tolist()))
    if not used:
        raise ValueError("no conv or dense layer matches any width group; check the group prefixes")
    k = used[-1] + 1
    if used != list(range(k)):
        raise ValueError(f"width groups must be numbered 0..{k - 1} without gaps; used: {used}")
    return ParametricGraph(template=template, num_groups=k, channel_multiple=channel_multiple,
                           structure=_structure(template, group))


def total_forward_flops(arrays: LayerArrays) -> Any:
    """Forward FLOPs per sample of real layers (a differentiable capacity proxy)."""
    return jnp.sum(jnp.asarray(arrays.flops_fwd) * jnp.asarray(arrays.mask))

