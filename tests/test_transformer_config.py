"""Transformers described by their sizes (planner.models.transformer): the
published parameter counts of the GPT and Llama families, the config file
as MODEL on the command line, and grouped-query attention and rotary
positions against XLA's FLOP counts and hand-computed collective sizes."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from costmodels import CostSettings, cost_table, hardware_arrays, load_hardware
from costmodels.collective_list import plan_collectives
from costmodels.strategies import Strategy, strategy_mask
from planner.cli import main
from planner.unavailable import unavailable_reason
from planner.ir import flops as F
from planner.ir.builder import GraphBuilder
from planner.models.transformer import TransformerConfig, build_transformer
from planner.models.zoo import get_model


def _llama_params(width, depth, heads, kv_heads, hidden, vocab):
    """Parameters of a Llama by hand: per block the four projections (keys and
    values over kv_heads), three SwiGLU matrices and two RMSNorm scales; an
    untied embedding and output layer, a final norm."""
    kv = width // heads * kv_heads
    block = 2 * width * width + 2 * width * kv + 3 * width * hidden + 2 * width
    return depth * block + 2 * vocab * width + width


@pytest.mark.parametrize("name, published", [
    ("llama2-7b", 6_738_415_616),  # Touvron et al. 2023b; its checkpoint's count
    ("llama3-8b", 8_030_261_248),  # Meta Llama 3 8B's checkpoint
    ("gpt3-175b", 174_604_259_328),  # Brown et al. 2020's "175B": 12 d^2 + 13 d per block, tied table, positions
])
def test_the_large_zoo_transformers_have_their_published_parameter_counts(name, published):
    assert get_model(name).total("params") == published


def test_a_llama_config_counts_its_parameters_as_by_hand():
    cfg = TransformerConfig.llama(512, 3, 8, hidden=1376, tokens=128, vocab=1000, kv_heads=2)
    assert build_transformer(cfg).total("params") == _llama_params(512, 3, 8, 2, 1376, 1000)
    gpt = TransformerConfig.gpt(96, 2, 4, tokens=32, vocab=100, tied=False)
    # per block 12 d^2 + 13 d, a final LayerNorm 2 d, the token table, the positions, an untied output
    assert build_transformer(gpt).total("params") == 2 * (12 * 96 ** 2 + 13 * 96) + 2 * 96 + 2 * 100 * 96 + 32 * 96


def test_config_file_round_trip_and_refusals():
    cfg = TransformerConfig.llama(64, 2, 8, hidden=176, tokens=64, vocab=512, kv_heads=2)
    back, name = TransformerConfig.from_dict(json.loads(cfg.to_json("mine")))
    assert (back, name) == (cfg, "mine")
    good = cfg.to_dict()
    bad = [
        ({"width": 64.0}, "width must be a whole number"),
        ({"heads": True}, "heads must be a whole number"),
        ({"kv_heads": 3}, "kv_heads (3) must divide heads (8)"),
        ({"heads": 7}, "heads (7) must divide the width (64)"),
        ({"norm": "batch"}, "norm must be one of layer, rms"),
        ({"bias": "false"}, "bias must be true or false"),
        ({"widht": 64}, "unknown fields ['widht']"),
        ({"version": 2}, "newer than this shardplan understands"),
        ({"image": 32}, "patch, classes must be at least 1 for a ViT"),
        ({"vocab": 0}, "vocab must be at least 1 for a decoder"),
    ]
    for change, message in bad:
        with pytest.raises(ValueError) as e:
            TransformerConfig.from_dict({**good, **change})
        assert message in str(e.value), (change, str(e.value))
    with pytest.raises(ValueError, match="missing hidden"):
        TransformerConfig.from_dict({k: v for k, v in good.items() if k != "hidden"})
    with pytest.raises(ValueError, match="head dim \\(5\\) must be even"):
        TransformerConfig.llama(40, 1, 8, hidden=64, tokens=8, vocab=10)


@pytest.mark.slow
def test_a_config_file_is_a_model_for_layers_plan_and_evaluate(capsys, tmp_path):
    path = tmp_path / "llama.json"
    cfg = TransformerConfig.llama(256, 2, 8, hidden=688, tokens=128, vocab=1000, kv_heads=2)
    path.write_text(cfg.to_json("my-llama"))
    assert main(["layers", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["totals"]["params"] == _llama_params(256, 2, 8, 2, 688, 1000)
    assert data["model"] == "my-llama" if "model" in data else True
    args = ["--devices", "8", "--hardware", "dgx-a100", "--batch", "8", "--json"]
    assert main(["plan", str(path), *args]) == 0
    assert json.loads(capsys.readouterr().out)["fits_memory"]
    assert main(["evaluate", str(path), *args, "--mesh", "4x2", "--strategy", "filter"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["layers"]}
    assert rows["blocks/0/attn/attention"]["strategy"] == "filter"  # 2 kv heads, one per device
    path.write_text(json.dumps({**cfg.to_dict(), "kv_heads": 3}))
    assert main(["layers", str(path)]) == 2
    assert "kv_heads (3) must divide heads (8)" in capsys.readouterr().err


B, S, H, KV, HD = 2, 16, 8, 2, 8


def _xla_flops(f, *args) -> float:
    ca = jax.jit(f).lower(*args).cost_analysis()
    return float((ca[0] if isinstance(ca, list) else ca).get("flops", 0.0))


def test_grouped_query_attention_flops_match_xla():
    """Fewer key-value heads leave the attention's FLOPs those of its query
    heads: XLA's count of jax.nn.dot_product_attention with 2 key-value heads
    for 8 query heads, forward and through jax.vjp."""
    q, kv = jnp.ones((B, S, H, HD)), jnp.ones((B, S, KV, HD))

    def attn(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=True)

    fl = F.attention_flops(S, H * HD, H, True)
    assert _xla_flops(attn, q, kv, kv) / B == pytest.approx(fl.forward, rel=0.01)
    vjp = _xla_flops(lambda q, k, v, dy: jax.vjp(attn, q, k, v)[1](dy), q, kv, kv, q) / B
    assert vjp == pytest.approx(fl.forward - 2 * S * S * H * HD + fl.backward_data, rel=0.02)


def test_rotary_flops_match_xla():
    """XLA's count of the rotation (planner.models.flax_transformers.rotary)
    per sample: the difference between two batch sizes, so that the angles,
    constants of the positions computed once, drop out."""
    rotary = pytest.importorskip("planner.models.flax_transformers").rotary
    x2, x4 = jnp.ones((2, S, H, HD)), jnp.ones((4, S, H, HD))
    fl = F.rotary_flops(S * H * HD)
    assert (_xla_flops(rotary, x4) - _xla_flops(rotary, x2)) / 2 == fl.forward

    def grad(x, dy):
        return jax.vjp(rotary, x)[1](dy)

    assert (_xla_flops(grad, x4, x4) - _xla_flops(grad, x2, x2)) / 2 == fl.backward_data


def _gqa_graph():
    b = GraphBuilder("gqa", (H * HD, S))
    qkv = b.dense("qkv", b.input, (H + 2 * KV) * HD)
    r = b.rotary_embedding("rope", qkv, rotated_channels=(H + KV) * HD)
    a = b.attention("attn", r, heads=H, kv_heads=KV, causal=True)
    b.dense("out", a, H * HD)
    return b.build()


def test_grouped_query_attention_shapes_and_head_split_rule():
    g = _gqa_graph()
    a = g.arrays
    i = g.names.index("attn")
    assert (int(a.in_channels[i]), int(a.out_channels[i]), int(a.groups[i])) == ((H + 2 * KV) * HD, H * HD, H)
    # keeps its queries, keys and values and the probabilities
    assert float(a.saved_elements[i]) == (H + 2 * KV) * HD * S + H * S * S
    r = g.names.index("rope")
    assert float(a.flops_fwd[r]) == 3 * (H + KV) * HD * S and float(a.saved_elements[r]) == 0
    for m, ok in [(1, True), (2, True), (4, False), (8, False)]:
        mask = np.asarray(strategy_mask(a, 8, 8 // m, m))
        assert bool(mask[i, Strategy.FILTER]) is ok, m
        reason = unavailable_reason(g, i, "filter", 8, 8 // m, m)
        assert (reason == "") is ok and (ok or f"divide the {KV} key-value heads" in reason)


def test_sequence_parallel_grouped_query_attention_gathers_its_keys_and_values():
    """Under grouped-query attention a sequence-parallel shard gathers the
    key-value heads, not as many as the query heads: sizes by hand."""
    g = _gqa_graph()
    batch, d, m = 8, 1, 4
    choice = np.full(g.num_layers, int(Strategy.SPATIAL))
    recs = [r for r in plan_collectives(g, choice, batch, d, m) if r.phase != "gradient" and "attn (" in r.where]
    kv = KV * HD * S * batch * 4.0  # the keys (or values) of the group, float32
    assert [(r.kind, r.bytes_per_device) for r in recs] == [
        ("all-gather", kv), ("all-gather", kv), ("reduce-scatter", kv / m), ("reduce-scatter", kv / m)]
    t = cost_table(g.arrays, hardware_arrays(load_hardware("dgx-a100")), batch, d, m, CostSettings())
    i = g.names.index("attn")
    saved = ((H + 2 * KV) * HD * S / m + 2 * KV * HD * S * (1 - 1 / m) + H * S * S / m) * batch * 4.0
    assert float(t.activation_bytes[i, Strategy.SPATIAL]) == pytest.approx(saved, rel=1e-6)
