"""Extraction of transformer operations from Flax (nnx and linen): the
attention of one fused projection grouped by head, embeddings of token ids
and their tied output layer, position embeddings; and the errors for what
is not mapped. Oracles: the Flax modules' own parameter counts, and the
layer kinds and shapes derived by hand."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from planner import extract

B, S, D, H = 2, 16, 32, 4


class _Attn(nnx.Module):
    def __init__(self, grouping, causal, rngs):
        self.grouping, self.causal = grouping, causal
        self.qkv = nnx.Linear(D, 3 * D, rngs=rngs)
        self.out = nnx.Linear(D, D, rngs=rngs)

    def __call__(self, x):
        b, s, c = x.shape
        if self.grouping == "heads":
            qkv = self.qkv(x).reshape(b, s, H, 3, c // H)
            q, k, v = qkv[:, :, :, 0], qkv[:, :, :, 1], qkv[:, :, :, 2]
        else:  # [q | k | v]: (b, s, 3, heads, head_dim)
            qkv = self.qkv(x).reshape(b, s, 3, H, c // H)
            q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        return self.out(jax.nn.dot_product_attention(q, k, v, is_causal=self.causal).reshape(b, s, c))


@pytest.mark.parametrize("causal", [False, True])
def test_attention_of_a_fused_projection_grouped_by_head(causal):
    g = extract(_Attn("heads", causal, nnx.Rngs(0)), jax.ShapeDtypeStruct((B, S, D), jnp.float32))
    assert g.names == ("qkv", "attention", "out")
    assert g.kind_names == ("dense", "causal_attention" if causal else "attention", "dense")
    a = g.unpadded()
    assert (a.in_channels[1], a.out_channels[1], a.groups[1], a.in_spatial[1][0]) == (3 * D, D, H, S)
    assert g.edges == ((0, 1), (1, 2))


def test_a_projection_grouped_by_q_k_v_is_refused_with_the_grouping_to_use():
    with pytest.raises(ValueError, match=r"grouped by head.*\(batch, tokens, heads, 3, head_dim\)"):
        extract(_Attn("qkv", False, nnx.Rngs(0)), jax.ShapeDtypeStruct((B, S, D), jnp.float32))


class _LinenLM(nn.Module):
    @nn.compact
    def __call__(self, ids):
        emb = nn.Embed(100, D, name="embed")
        x = emb(ids)
        x = nn.LayerNorm(name="norm")(nn.Dense(D, name="fc")(x))
        return emb.attend(x)


def test_linen_embedding_and_its_tied_output_layer():
    g = extract(_LinenLM(), jax.ShapeDtypeStruct((B, S), jnp.int32))
    assert g.names == ("embed", "fc", "norm", "embed/attend")
    assert g.kind_names == ("embed", "dense", "norm", "dense")
    a = g.unpadded()
    assert list(a.params) == [100 * D, D * D + D, 2 * D, 0]  # the output layer is the table's
    assert a.out_channels[3] == 100 and g.input_shape == (1, S) and g.reads_token_ids


class _Pos(nnx.Module):
    def __init__(self, cls, rngs):
        self.cls = nnx.Param(jnp.zeros((1, 1, D))) if cls else None
        self.pos = nnx.Param(jnp.zeros((1, S + int(cls), D)))

    def __call__(self, x):
        if self.cls is not None:
            x = jnp.concatenate([jnp.broadcast_to(self.cls[...], (x.shape[0], 1, D)), x], axis=1)
        return x + self.pos[...]


class _WithPos(nnx.Module):
    def __init__(self, cls, rngs):
        self.fc = nnx.Linear(D, D, rngs=rngs)
        self.pos = _Pos(cls, rngs)

    def __call__(self, x):
        return self.pos(self.fc(x))


@pytest.mark.parametrize("cls", [False, True])
def test_a_position_embedding_module(cls):
    g = extract(_WithPos(cls, nnx.Rngs(0)), jax.ShapeDtypeStruct((B, S, D), jnp.float32))
    assert g.names == ("fc", "pos") and g.kind_names == ("dense", "elementwise")
    a = g.unpadded()
    assert a.params[1] == (S + int(cls)) * D + (D if cls else 0)
    assert a.out_spatial[1][0] == S + int(cls)


class _Gate(nnx.Module):  # owns a parameter it multiplies by: not a position embedding
    def __init__(self):
        self.g = nnx.Param(jnp.ones((1, S, D)))

    def __call__(self, x):
        return x * self.g[...]


def test_a_module_owning_parameters_that_are_not_positions_stays_unsupported():
    class M(nnx.Module):
        def __init__(self, rngs):
            self.fc = nnx.Linear(D, D, rngs=rngs)
            self.gate = _Gate()

        def __call__(self, x):
            return self.gate(self.fc(x))

    with pytest.raises(ValueError, match=r"module type .*_Gate.* at module path 'gate'.*on_unsupported"):
        extract(M(nnx.Rngs(0)), jax.ShapeDtypeStruct((B, S, D), jnp.float32))
    g = extract(M(nnx.Rngs(0)), jax.ShapeDtypeStruct((B, S, D), jnp.float32), on_unsupported="replicate")
    assert g.kind_names == ("dense", "other") and g.on_unsupported == "replicate"


class _WithMHA(nnx.Module):
    def __init__(self, rngs, **kw):
        self.norm = nnx.LayerNorm(D, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(num_heads=H, in_features=D, decode=False, rngs=rngs, **kw)

    def __call__(self, x):
        return x + self.attn(self.norm(x))


def test_flax_multi_head_attention_is_a_fused_projection_the_attention_and_its_output():
    model = _WithMHA(nnx.Rngs(0))
    g = extract(model, jax.ShapeDtypeStruct((B, S, D), jnp.float32))
    assert g.names == ("norm", "attn/qkv", "attn/attention", "attn/out", "add")
    assert g.kind_names == ("norm", "dense", "attention", "dense", "add")
    attn = nnx.state(model.attn, nnx.Param)
    assert g.total("params") - 2 * D == sum(v.size for v in jax.tree.leaves(attn))  # Flax's own count
    a = g.unpadded()
    assert (a.out_channels[1], a.groups[2]) == (3 * D, H)
    # with query-key norms it is not the planner's attention: unsupported, said so
    with pytest.raises(ValueError, match=r"nnx\.MultiHeadAttention.*'attn'"):
        extract(_WithMHA(nnx.Rngs(0), normalize_qk=True), jax.ShapeDtypeStruct((B, S, D), jnp.float32))


def test_head_projection_parameters_are_split_along_their_heads_axis():
    """The export's PartitionSpecs, derived by hand: an nnx.MultiHeadAttention's
    query/key/value kernels (C, heads, head_dim) follow the fused layer
    "<path>/qkv", its out kernel (heads, head_dim, F) "<path>/out"; an
    nnx.Linear "out" beside a fused nnx.Linear "qkv" is an ordinary dense layer."""
    from jax.sharding import PartitionSpec as P

    from planner.plans.specs import partition_specs

    state = {"mha": {"query": {"kernel": jnp.zeros((D, H, 8)), "bias": jnp.zeros((H, 8))},
                     "out": {"kernel": jnp.zeros((H, 8, D)), "bias": jnp.zeros((D,))}},
             "fused": {"qkv": {"kernel": jnp.zeros((D, 3 * D))}, "out": {"kernel": jnp.zeros((D, D))}}}
    strategies = {"mha/qkv": "filter", "mha/out": "channel", "fused/qkv": "filter", "fused/out": "channel"}
    specs = partition_specs(state, strategies)
    assert specs["mha"]["query"] == {"kernel": P(None, "model", None), "bias": P("model", None)}
    assert specs["mha"]["out"] == {"kernel": P("model", None, None), "bias": P()}
    assert specs["fused"]["qkv"]["kernel"] == P(None, "model")
    assert specs["fused"]["out"]["kernel"] == P("model", None)  # rows: the input features
    specs = partition_specs(state, {"mha/qkv": "channel", "mha/out": "filter"})
    assert specs["mha"]["query"] == {"kernel": P("model", None, None), "bias": P()}
    assert specs["mha"]["out"] == {"kernel": P(None, None, "model"), "bias": P("model")}
    # the model itself an nnx.MultiHeadAttention: its layers are "qkv", "attention" and "out"
    specs = partition_specs(state["mha"], {"qkv": "filter", "out": "channel"})
    assert specs["query"]["kernel"] == P(None, "model", None) and specs["out"]["kernel"] == P("model", None, None)


class _LinenAttn(nn.Module):
    @nn.compact
    def __call__(self, x):
        b, s, c = x.shape
        h = nn.LayerNorm(name="norm")(x)
        qkv = nn.Dense(3 * c, name="qkv")(h).reshape(b, s, H, 3, c // H)
        a = jax.nn.dot_product_attention(qkv[:, :, :, 0], qkv[:, :, :, 1], qkv[:, :, :, 2], is_causal=True)
        return x + nn.Dense(c, name="out")(a.reshape(b, s, c))


def test_linen_attention_of_a_fused_projection():
    g = extract(_LinenAttn(), jax.ShapeDtypeStruct((B, S, D), jnp.float32))
    assert g.names == ("norm", "qkv", "attention", "out", "add") and g.on_unsupported == "error"
    assert g.kind_names == ("norm", "dense", "causal_attention", "dense", "add")
