"""Transformer layer kinds (attention, embedding, position embedding,
products) against independent oracles: XLA's FLOP counts of the JAX
operations they stand for, hand-computed collective sizes, and the
Megatron-LM pattern derived by hand from the layout tables."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from costmodels import CostSettings, cost_table, hardware_arrays, load_hardware
from costmodels.collective_list import auxiliary_collectives, plan_collectives
from costmodels.layers import token_lookups
from costmodels.strategies import Strategy, strategy_mask
from planner.unavailable import unavailable_reason
from planner.ir import flops as F
from planner.ir.builder import GraphBuilder

B, S, H, HD = 2, 16, 4, 8
D = H * HD


def _xla_flops(f, *args) -> float:
    """XLA's FLOPs of ``f`` as lowered (the program's own operations)."""
    ca = jax.jit(f).lower(*args).cost_analysis()
    return float((ca[0] if isinstance(ca, list) else ca).get("flops", 0.0))


@pytest.mark.parametrize("causal", [False, True])
def test_attention_flops_match_xla(causal):
    q = jnp.ones((B, S, H, HD))

    def attn(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=causal)

    fl = F.attention_flops(S, D, H, causal)
    assert _xla_flops(attn, q, q, q) / B == pytest.approx(fl.forward, rel=0.01)
    # jax.vjp's program runs the forward without its last matmul (P V), then the backward.
    vjp = _xla_flops(lambda q, k, v, dy: jax.vjp(attn, q, k, v)[1](dy), q, q, q, q) / B
    assert vjp == pytest.approx(fl.forward - 2 * S * S * D + fl.backward_data, rel=0.02)
    assert fl.backward_weight == 0


def test_embedding_position_and_product_flops_match_xla():
    table, ids = jnp.ones((100, D)), jnp.zeros((B, S), jnp.int32)
    x, pos = jnp.ones((B, S, D)), jnp.ones((S, D))
    fl = F.embed_flops(S, D)
    grad = _xla_flops(lambda t, dy: jax.vjp(lambda t: t[ids], t)[1](dy), table, x) / B
    assert (fl.forward, fl.backward_data, fl.backward_weight) == (0.0, 0.0, grad)
    b = GraphBuilder("t", (D, S))
    b.position_embedding("pos", b.input)
    assert b.build().total("flops_fwd") == _xla_flops(lambda x, p: x + p, x, pos) / B
    fl = F.multiply_flops(S * D, 2)
    assert fl.forward == _xla_flops(lambda a, c: a * c, x, x) / B
    assert fl.backward_data == _xla_flops(lambda a, c, dy: jax.vjp(lambda a, c: a * c, a, c)[1](dy), x, x, x) / B


def test_builder_shapes_and_parameters():
    b = GraphBuilder("t", (1, S))
    x = b.embed("embed", b.input, 100, D)
    x = b.position_embedding("pos", x)
    qkv = b.dense("qkv", x, 3 * D)
    a = b.attention("attn", qkv, heads=H, causal=True)
    y = b.dense("head", a, 100, tied=True)
    g = b.build()
    assert [b.shape(i) for i in (x, qkv, a, y)] == [(D, (S,)), (3 * D, (S,)), (D, (S,)), (100, (S,))]
    params = np.asarray(g.arrays.params)[: g.num_layers]
    assert params.tolist() == [100 * D, S * D, D * 3 * D + 3 * D, 0, 0]  # the tied head owns none
    assert g.kind_names == ("embed", "elementwise", "dense", "causal_attention", "dense")
    assert int(g.arrays.groups[3]) == H
    # saved: queries, keys, values and the H x S x S probabilities
    assert float(g.arrays.saved_elements[3]) == 3 * D * S + H * S * S
    with pytest.raises(ValueError, match="heads"):
        b.attention("bad", qkv, heads=5)
    with pytest.raises(ValueError, match=r"\(heads \+ 2 kv_heads\) x head_dim"):
        b.attention("bad", x, heads=H)
    with pytest.raises(ValueError, match="token ids"):
        b.embed("bad", x, 100, D)
    cls = GraphBuilder("c", (D, S))
    cls.position_embedding("pos", cls.input, class_token=True)
    g2 = cls.build()
    assert float(g2.arrays.out_spatial[0, 0]) == S + 1 and float(g2.arrays.params[0]) == (S + 1) * D + D


def test_token_ids_mean_a_label_per_token():
    """An embedding no edge feeds reads token ids: the input batch is S ids and S labels
    per sample, and the loss's labels, gathered to a replicated head, are S int32 per
    sample of the group's batch (a classifier: one)."""
    lm = GraphBuilder("lm", (1, S))
    lm.dense("head", lm.embed("embed", lm.input, 100, D), 100)
    g = lm.build()
    vit = GraphBuilder("c", (D, S))
    vit.dense("head", vit.first_token("cls", vit.position_embedding("pos", vit.input, class_token=True)), 10)
    c = vit.build()
    assert token_lookups(g) == (0,) and g.reads_token_ids
    assert token_lookups(c) == () and not c.reads_token_ids
    assert g.input_bytes_per_sample == 4.0 * (S + S)
    assert c.input_bytes_per_sample == 4.0 * (D * S + 1)
    batch, d, m = 16, 2, 4
    rep = int(Strategy.REPLICATED)

    def labels(graph):
        recs = auxiliary_collectives(graph, [rep] * graph.num_layers, batch, d, m)
        return [(r.kind, r.axes, r.bytes_per_device) for r in recs if r.where == "labels -> loss"]

    assert labels(g) == [("all-gather", ("model",), batch / d * 4.0 * S)]
    assert labels(c) == [("all-gather", ("model",), batch / d * 4.0)]


def _mask(g, m, batch=8):
    return np.asarray(strategy_mask(g.arrays, batch, 1, m))[: g.num_layers]


def test_strategy_rules_and_reasons():
    b = GraphBuilder("t", (1, S))
    x = b.embed("embed", b.input, 100, 48)
    x = b.position_embedding("pos", x, class_token=True)
    qkv = b.dense("qkv", x, 3 * 48)
    b.attention("attn", qkv, heads=12)
    g = b.build()
    m4, m8 = _mask(g, 4), _mask(g, 8)
    assert m4[3, Strategy.FILTER] and not m8[3, Strategy.FILTER]  # 12 heads: 4 divides them, 8 does not
    assert "divide the 12 heads" in unavailable_reason(g, 3, "filter", 8, 1, 8)
    assert not m4[3, Strategy.CHANNEL]
    assert not m4[0, Strategy.CHANNEL] and m4[0, Strategy.FILTER]  # the table splits by columns only
    assert "token ids" in unavailable_reason(g, 0, "channel", 8, 1, 4)
    assert not m4[1, Strategy.SPATIAL]  # a class token would shift every shard's rows
    assert "adds positions" in unavailable_reason(g, 1, "spatial", 8, 1, 4)
    assert m4[2, Strategy.SPATIAL] and m4[3, Strategy.SPATIAL]  # 17 tokens: rows for 4 shards


def test_a_tied_table_is_never_split():
    b = GraphBuilder("lm", (1, S))
    x = b.embed("embed", b.input, 64, D)
    b.dense("embed/attend", b.dense("fc", x, D), 64, tied=True)
    g = b.build()
    m = _mask(g, 4)
    for i in (0, 2):  # the lookup and the tied output layer
        assert not m[i, Strategy.FILTER] and not m[i, Strategy.CHANNEL]
        assert m[i, Strategy.DATA] and m[i, Strategy.SPATIAL] and m[i, Strategy.REPLICATED]
        assert "tied embedding table" in unavailable_reason(g, i, "filter", 8, 1, 4)
    assert m[1, Strategy.FILTER] and m[1, Strategy.CHANNEL]  # other dense layers split as usual
    untied = GraphBuilder("lm", (1, S))
    untied.dense("head", untied.embed("embed", untied.input, 64, D), 64)
    assert _mask(untied.build(), 4)[0, Strategy.FILTER]


def _choice(g, strategies):
    return [int(Strategy[strategies[n].upper()]) for n in g.names]


def test_megatron_pattern_is_one_all_reduce_each_way():
    """Column-parallel fc1, row-parallel fc2, everything else replicated: the
    layout tables give one all-reduce forward (fc2's partial sums) and one
    backward (fc1's partial input gradient), and nothing else on the model
    axis (Megatron-LM §3, its g and f operators)."""
    b = GraphBuilder("mlp", (D, S))
    x = b.dense("in", b.input, D)
    h = b.norm("norm", x)
    h = b.dense("fc1", h, 4 * D)
    h = b.elementwise("gelu", h, flops_per_element=8)
    h = b.dense("fc2", h, D)
    b.add("add", [x, h])
    g = b.build()
    plan = {"in": "replicated", "norm": "replicated", "fc1": "filter", "gelu": "filter", "fc2": "channel",
            "add": "replicated"}
    batch, d, m = 8, 2, 4
    recs = [r for r in plan_collectives(g, _choice(g, plan), batch, d, m) if r.phase != "gradient"]
    nbytes = D * S * (batch / d) * 4.0
    assert [(r.kind, r.phase, r.where, r.bytes_per_device) for r in recs] == [
        ("all-reduce", "backward", "norm -> fc1", nbytes),
        ("all-reduce", "forward", "fc2 -> add", nbytes),
    ]


def _attention_graph():
    b = GraphBuilder("attn", (D, S))
    x = b.dense("in", b.input, D)
    qkv = b.dense("qkv", x, 3 * D)
    a = b.attention("attn", qkv, heads=H)
    b.dense("out", a, D)
    return b.build()


def test_sequence_parallel_attention_gathers_keys_and_values():
    g = _attention_graph()
    batch, d, m = 8, 1, 4
    spatial = {n: "spatial" for n in g.names}
    recs = [r for r in plan_collectives(g, _choice(g, spatial), batch, d, m) if r.phase != "gradient"]
    kv = D * S * batch * 4.0  # the group's keys (or values), float32
    assert [(r.kind, r.phase, r.where, r.bytes_per_device) for r in recs] == [
        ("all-gather", "forward", "attn (keys)", kv),
        ("all-gather", "forward", "attn (values)", kv),
        ("reduce-scatter", "backward", "attn (keys)", kv / m),
        ("reduce-scatter", "backward", "attn (values)", kv / m),
        ("all-gather", "forward", "out -> loss", kv),  # the loss reads whole outputs
    ]
    hw = hardware_arrays(load_hardware("dgx-a100"))
    t = cost_table(g.arrays, hw, batch, d, m, CostSettings())
    i = g.names.index("attn")
    assert float(t.halo_s[i, Strategy.SPATIAL]) > 0 and float(t.halo_s[i, Strategy.FILTER]) == 0
    # a shard keeps its queries, every key and value, and its rows of the probabilities
    saved = (D * S / m + 2 * D * S + H * S * S / m) * batch * 4.0
    assert float(t.activation_bytes[i, Strategy.SPATIAL]) == pytest.approx(saved, rel=1e-6)
    full = (3 * D * S + H * S * S) * batch * 4.0
    assert float(t.activation_bytes[i, Strategy.FILTER]) == pytest.approx(full / m, rel=1e-6)


def test_head_split_attention_compute_shrinks_with_the_heads():
    g = _attention_graph()
    hw = hardware_arrays(load_hardware("dgx-a100"))
    i = g.names.index("attn")
    big = GraphBuilder("attn", (512, 1024))
    a = big.attention("attn", big.dense("qkv", big.input, 3 * 512), heads=8)
    assert a == 1
    gb = big.build()
    t = cost_table(gb.arrays, hw, 64, 1, 8, CostSettings())
    data, heads = float(t.compute_s[a, Strategy.DATA]), float(t.compute_s[a, Strategy.FILTER])
    # Large shards: both are compute-bound GEMMs over the same FLOPs per device (8 x fewer
    # samples vs 8 x fewer heads), so the times agree within the model's tile effects.
    assert heads == pytest.approx(data, rel=0.1)
    assert float(cost_table(g.arrays, hw, 8, 1, 4, CostSettings()).compute_s[i, Strategy.REPLICATED]) > 0
