"""The transformer rules of the jaxpr walk behind :func:`planner.extract`
(private; the documented behaviour is in :mod:`planner.models.extraction`):
``jax.nn.dot_product_attention`` on the per-head views of one fused
query-key-value projection becomes one attention layer, and a module owning
only learned positions (and a class token) one position-embedding layer.
A mixin of :class:`planner.models._jaxpr_walk._Walker`, whose state and
helpers (``b``, ``batch``, ``emit``, ``check``, ``unsupported``) it uses."""

from __future__ import annotations

import dataclasses
from typing import Any

from planner.ir.graph import layer_path
from planner.models._primitives import _FREE, _eqn_flops

# The softmax of jax.nn.dot_product_attention between its two matmuls (and a mask's select).
_ATTENTION_SOFTMAX = frozenset({"mul", "div", "sub", "exp", "max", "reduce_max", "reduce_sum", "select_n",
                                "broadcast_in_dim", "stop_gradient", "transpose", "reshape", "convert_element_type"})
_HEAD_GROUPING_HINT = (
    " (a fused query-key-value projection must be grouped by head, reshaped to (batch, tokens, heads, 3, "
    "head_dim), or by key-value head, (batch, tokens, kv_heads, heads / kv_heads + 2, head_dim), and sliced "
    "along that grouped axis, so that an equal split of its features splits whole heads)"
)
# An embedding's lookup of its rows (inside its call).
_LOOKUPS = frozenset({"gather", "dynamic_slice"})
# Element-wise work on head views against constants, or combining views of one projection
# (rotary positions: products with the angles' cosines and sines, sums, halves put side by side).
_HEAD_ELEMENTWISE = frozenset({"mul", "add", "sub", "neg", "div", "concatenate", "stack"})
# Ops that only view a projection's heads (or pass them on unchanged, or repeat key-value heads for their group).
_VIEW_OPS = frozenset({"reshape", "slice", "split", "squeeze", "expand_dims", "transpose", "broadcast_in_dim", *_FREE})
# What a position-embedding module does to its activation: put a class token in front, add.
_POSITION_PRIMS = frozenset({"add", "concatenate", "broadcast_in_dim", "reshape", "convert_element_type", "copy"})


@dataclasses.dataclass(eq=False)
class _Heads:
    """A per-head view of a node's output (a reshape of its channels into
    ``(heads, 3, head_dim)``, ``(kv_heads, heads / kv_heads + 2, head_dim)``
    or ``(heads, head_dim)``), or of an attention's result before it is
    reshaped back: only an attention reads it. ``grouped``: still the 5-D
    view, which may only be sliced along its grouped axis."""

    node: int
    heads: int
    kv_heads: int | None = None  # None: as many as heads
    grouped: bool = False


@dataclasses.dataclass(eq=False)
class _Scores:
    """The scores of an attention in progress: ``q k^T`` of two per-head
    views, of one fused projection or of a query and a key projection,
    through the softmax, until they meet the values."""

    node: int  # the queries' projection
    heads: int
    kv_heads: int | None = None
    key_node: int | None = None  # the keys' projection, where it is another
    masked: bool = False
    flops: float = 0.0  # forward FLOPs per sample so far (q k^T, the softmax): a replicated layer's if it stops
    attention: int | None = None  # the attention layer they became on meeting the values (their equations' layer)


@dataclasses.dataclass(eq=False)
class _Positions:
    """A parameter table no activation flows into: rows of an embedding
    looked up at constant positions (``wpe(jnp.arange(T))``), or a parameter
    a module owns beside its submodules (a root's ``self.param`` of
    positions). Not an activation; added to a token sequence, a
    position-embedding layer that owns the table."""

    path: str  # the layer it becomes: the embedding's module path, or <module path>/<parameter>
    type_name: str  # of the module that owns the table
    params: int  # the table's parameters


@dataclasses.dataclass
class _HeadWork:
    """Element-wise work on the per-head views of one fused projection before
    its attention: forward FLOPs per sample, and whether two views were
    combined (a rotation's pairs, added or put side by side: rotary
    positions) rather than only rescaled."""

    flops: float = 0.0
    combined: bool = False


class _TransformerRules:
    """Attention and position-embedding rules (see the module docstring)."""

    b: Any  # GraphBuilder
    batch: int
    head_work: dict[int, _HeadWork]  # fused projection node -> element-wise work on its head views

    def head_view(self, node: int, out_shape: tuple) -> _Heads:
        """The per-head view of a fused projection reshaped to ``out_shape``:
        ``(B, T, heads, head_dim)``, ``(B, T, heads, 3, head_dim)`` or, grouped
        by key-value head, ``(B, T, kv_heads, group + 2, head_dim)``."""
        if len(out_shape) == 4:
            return _Heads(node, int(out_shape[2]))
        kv, per = int(out_shape[2]), int(out_shape[3])
        if per == 3:  # every head its own key and value
            return _Heads(node, kv, grouped=True)
        return _Heads(node, kv * (per - 2), kv_heads=kv, grouped=True)

    def position_embedding(self, reg: Any, name: str) -> int | None:
        """A module owning only learned positions (and a class token) that it
        adds to (puts in front of) one token sequence: the layer, else None."""
        if len(reg.inputs) != 1 or reg.out_aval is None or not reg.prims <= _POSITION_PRIMS:
            return None
        x = reg.inputs[0]
        c, sp = self.b.shape(x)
        out = tuple(reg.out_aval.shape)
        if len(sp) != 1 or len(out) != 3 or out[0] != self.batch or out[2] != c or out[1] - sp[0] not in (0, 1):
            return None
        cls = out[1] == sp[0] + 1
        if reg.info.direct_params != c * out[1] + (c if cls else 0) or cls != ("concatenate" in reg.prims):
            return None
        node = self.emit(self.b.position_embedding, name, x, class_token=cls)
        self.check(node, out, f"the output of module {reg.info.path!r} ({reg.info.type_name})")
        return node

    def positions_error(self, v: _Positions, what: str) -> ValueError:
        return ValueError(
            f"extract: {v.path!r} ({v.type_name}), a parameter table that no activation flows into (an "
            f"embedding looked up at constant positions, or a parameter of a module that also holds layers), is "
            f"{what}; the planner maps such a table only where it is added to a token sequence of the same width "
            "(learned positions: wpe(arange(tokens)) or a position parameter added to the tokens). Put other uses "
            "(a class token put in front) in a module of their own that owns only those parameters")

    def positions_op(self, eqn: Any, vals: list[Any], acts: list, scope: str, out_shape: tuple) -> list[Any]:
        """An op on positions looked up in an embedding (:class:`_Positions`):
        reshapes and casts carry them; added to a token sequence they are a
        position-embedding layer named by the embedding, owning its table."""
        p = eqn.primitive.name
        pos = [v for _, v in acts if isinstance(v, _Positions)]
        others = [(a, v) for a, v in acts if not isinstance(v, _Positions)]
        if not others and len({id(v) for v in pos}) == 1 and p in _VIEW_OPS:
            return [pos[0]] * len(eqn.outvars)
        if p in ("add", "add_any") and len(pos) == 1 and len(others) == 1:
            (a, v), = others
            x = self.resolve(v)
            c, sp = self.b.shape(x)
            table = pos[0]
            if len(sp) == 1 and out_shape == self.natural(x) and table.params % c == 0:
                node = self.emit(self.b.position_embedding, table.path, x, table_positions=table.params // c)
                self.check(node, out_shape, f"the positions of {table.path!r}")
                return [node]
        raise self.positions_error(pos[0], f"read by {p!r} of shape {out_shape}")

    def channel_slices(self, eqn: Any, act: tuple, scope: str) -> list[int] | None:
        """A token sequence's channels cut into contiguous parts
        (``jnp.split(qkv, 3, axis=-1)``, ``x[..., :C]``): a ``split`` layer per
        part, else None."""
        a, v = act
        x = self.resolve(v)
        c, sp = self.b.shape(x)
        shape = tuple(a.aval.shape)
        if len(sp) != 1 or shape != self.natural(x):
            return None
        if eqn.primitive.name == "split":
            if int(eqn.params["axis"]) % len(shape) != len(shape) - 1:
                return None
            sizes = [int(s) for s in eqn.params["sizes"]]
        else:
            start, limit = tuple(eqn.params["start_indices"]), tuple(eqn.params["limit_indices"])
            if start[:-1] != (0, 0) or limit[:-1] != shape[:-1] or eqn.params.get("strides") not in (None, (1, 1, 1)):
                return None
            sizes = [limit[-1] - start[-1]]
        return [self.emit(self.b.split_channels, self.b.auto_name(scope, "split"), x, n) for n in sizes]

    def natural(self, node: int) -> tuple[int, ...]:
        """The batch-first, channels-last shape of a node's output."""
        c, sp = self.b.shape(node)
        return (self.batch, *sp, c)

    def attention_op(self, eqn: Any, vals: list[Any], acts: list, scope: str, out_shape: tuple) -> list[Any]:
        """An op on per-head views or scores: the steps of
        ``jax.nn.dot_product_attention`` (XLA implementation) on the queries,
        keys and values of one fused projection grouped by head."""
        p = eqn.primitive.name
        nout = len(eqn.outvars)
        views = [v for _, v in acts if isinstance(v, _Heads)]
        scores = [v for _, v in acts if isinstance(v, _Scores)]
        if len(views) + len(scores) != len(acts):  # an activation of another kind joins in
            return self.unsupported(eqn, vals, scope)
        if p == "dot_general" and len(views) == 2:  # q k^T
            q, k = views
            work = _eqn_flops(eqn) / self.batch
            if q.node == k.node:
                return [_Scores(q.node, q.heads, q.kv_heads, flops=work)]
            if q.kv_heads is None and k.kv_heads is None and q.heads % k.heads == 0:
                return [_Scores(q.node, q.heads, k.heads, key_node=k.node, flops=work)]
        if p == "dot_general" and len(views) == 1 and len(scores) == 1:
            sc, v = scores[0], views[0]
            fused = sc.key_node is None and v.node == sc.node
            separate = sc.key_node is not None and len({sc.node, sc.key_node, v.node}) == 3 \
                and v.kv_heads is None and v.heads == sc.kv_heads
            if fused or separate:
                return [self.attention_layer(sc, None if fused else v.node, scope)]
        if scores and p in _ATTENTION_SOFTMAX:
            if p == "select_n":
                scores[0].masked = True
            scores[0].flops += _eqn_flops(eqn) / self.batch
            return [scores[0]] * nout
        nodes = {v.node for v in views}
        if views and not scores and len(nodes) == 1 and p in _HEAD_ELEMENTWISE and eqn.outvars:
            work = self.head_work.setdefault(views[0].node, _HeadWork())
            work.flops += _eqn_flops(eqn) / self.batch
            work.combined |= len(views) > 1
            return [_Heads(views[0].node, views[0].heads, views[0].kv_heads)] * nout
        if views and not scores and len(acts) == 1 and p in _VIEW_OPS:
            v = views[0]
            if p == "reshape" and out_shape == self.natural(v.node):
                return [v.node]  # heads merged back: the attention's output
            if p in ("slice", "split") and v.grouped and not self.grouped_slice(eqn):
                return self.unsupported(eqn, vals, scope, hint=_HEAD_GROUPING_HINT)
            keep = v.grouped and p in ("slice", "split", *_FREE)
            return [_Heads(v.node, v.heads, v.kv_heads, grouped=keep)] * nout
        return self.unsupported(eqn, vals, scope)

    def absorbed_flops(self, v: Any) -> float:
        """Where an unsupported operation (kept as a replicated layer) reads
        an attention in progress or rotated head views: the forward FLOPs per
        sample done on them so far, which no layer holds yet; counted once."""
        if isinstance(v, _Scores):
            flops, v.flops = v.flops, 0.0
            return flops + self.absorbed_flops(_Heads(v.node, v.heads)) + (
                self.absorbed_flops(_Heads(v.key_node, v.heads)) if v.key_node is not None else 0.0)
        if isinstance(v, _Heads):
            work = self.head_work.pop(v.node, None)
            return 0.0 if work is None else work.flops
        return 0.0

    def grouped_slice(self, eqn: Any) -> bool:
        """Whether a slice (or split) of a 5-D head view cuts only its grouped axis (3)."""
        if eqn.primitive.name == "split":
            return int(eqn.params["axis"]) == 3
        shape = tuple(eqn.invars[0].aval.shape)
        start, limit = tuple(eqn.params["start_indices"]), tuple(eqn.params["limit_indices"])
        return all(start[i] == 0 and limit[i] == shape[i] for i in range(len(shape)) if i != 3)

    def rotated(self, node: int, rotated_channels: int, scope: str) -> int:
        """``node``, or the rotary positions applied to it where its head
        views were combined (rotated) before the attention; element-wise work
        that only rescaled them folds away."""
        work = self.head_work.pop(node, None)
        if work is None or not work.combined:
            return node
        _, sp = self.b.shape(node)
        return self.emit(self.b.rotary_embedding, self.b.auto_name(scope, "rope"), node,
                         rotated_channels=rotated_channels, flops_per_element=work.flops / (rotated_channels * sp[0]))

    def attention_layer(self, sc: _Scores, values: int | None, scope: str) -> _Heads:
        """The probabilities meet the values: the attention is one layer, of
        one fused projection (``values`` None) or of the queries', keys' and
        values' projections, after the rotary positions where its queries and
        keys were rotated first."""
        kv = sc.heads if sc.kv_heads is None else sc.kv_heads
        if values is None:
            c, _ = self.b.shape(sc.node)
            x: int | list[int] = self.rotated(sc.node, (sc.heads + kv) * (c // (sc.heads + 2 * kv)), scope)
        else:
            q, k = (self.rotated(n, self.b.shape(n)[0], scope) for n in (sc.node, sc.key_node))
            x = [q, k, values]
        node = self.emit(self.b.attention, self.b.auto_name(scope, "attention"), x, heads=sc.heads,
                         kv_heads=sc.kv_heads, causal=sc.masked)
        sc.attention = node
        return _Heads(node, sc.heads)

    def multi_head_attention(self, reg: Any, x: int, where: str) -> tuple[int, int]:
        """An ``nnx.MultiHeadAttention`` call on one token sequence: its query,
        key and value projections as one dense layer ``<path>/qkv`` of ``3 x
        qkv_features`` grouped by head (the heads of the three kernels side by
        side), the attention (causal where a mask is applied) and its output
        projection ``<path>/out``. Returns the output node and the parameter
        count the graph gives the module."""
        info = reg.info
        m = dict(info.attributes)
        heads, feats, out = int(m["num_heads"]), int(m["qkv_features"]), int(m["out_features"])
        bias = bool(m["use_bias"])
        path = info.path
        qkv = self.emit(self.b.dense, layer_path(path, "qkv"), x, 3 * feats, bias=bias)
        h = self.emit(self.b.attention, self.b.auto_name(path, "attention"), qkv, heads=heads,
                      causal="select_n" in reg.prims)
        node = self.emit(self.b.dense, layer_path(path, "out"), h, out, bias=bias)
        self.check(node, reg.out_aval.shape, f"the output of {where}")
        c, _ = self.b.shape(x)
        return node, 3 * (c * feats + (feats if bias else 0)) + feats * out + (out if bias else 0)
