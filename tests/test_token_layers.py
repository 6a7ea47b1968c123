"""The layers of a transformer the planner maps: layer and RMS normalisation
(LayerKind.NORM; counts by hand and against XLA's cost analysis, the
strategies a norm can run) and patches turned into tokens (a reshape); a small
patch-and-tokens model trained sharded with the unsharded loss."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from costmodels import LayerKind, Strategy
from costmodels.strategies import strategy_mask
from planner import GraphBuilder, extract
from planner.unavailable import unavailable_reason


def test_norm_counts_by_hand():
    # 32 channels at 16 positions: n = 512 elements, t = 16 positions.
    b = GraphBuilder("norms", (32, 16))
    ln = b.norm("ln", b.input)
    rms = b.norm("rms", ln, rms=True)
    bare = b.norm("bare", rms, scale=False, bias=False)
    a = b.build().unpadded()
    assert list(a.kind[:3]) == [LayerKind.NORM] * 3
    assert list(a.params[:3]) == [64, 32, 0]  # scale + bias; RMS: scale only
    # forward: LayerNorm 5n + 5t, RMS 3n + t, plus n per scale and per bias
    assert list(a.flops_fwd[:3]) == [5 * 512 + 5 * 16 + 2 * 512, 3 * 512 + 16 + 512, 5 * 512 + 5 * 16]
    # input gradient: none into the model input; LayerNorm 6n, RMS half (no mean)
    assert list(a.flops_bwd_data[:3]) == [0, 3 * 512, 6 * 512]
    assert list(a.flops_bwd_weight[:3]) == [3 * 512, 2 * 512, 0]
    assert list(a.saved_elements[:3]) == [512] * 3
    assert (ln, rms, bare) == (0, 1, 2)


class _Norms(nnx.Module):
    def __init__(self, rngs):
        self.ln = nnx.LayerNorm(32, rngs=rngs)
        self.rms = nnx.RMSNorm(32, rngs=rngs)
        self.fc = nnx.Linear(32, 10, rngs=rngs)

    def __call__(self, x):
        return self.fc(self.rms(self.ln(x)).mean(axis=1))


class _LinenNorms(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(10)(nn.RMSNorm()(nn.LayerNorm()(x)).mean(axis=1))


def _xla_flops(f, *args):
    ca = jax.jit(f).lower(*args).compile().cost_analysis()
    return (ca[0] if isinstance(ca, list) else ca)["flops"]


@pytest.mark.parametrize("linen", [False, True])
def test_extracted_norms_match_flax_and_xla(linen):
    x = jnp.ones((8, 16, 32))
    if linen:
        model = _LinenNorms()
        variables = model.init(jax.random.key(0), x)
        g = extract(model, jax.ShapeDtypeStruct(x.shape, x.dtype))
        subs = [lambda v, x: nn.LayerNorm().apply({"params": v["params"]["LayerNorm_0"]}, x),
                lambda v, x: nn.RMSNorm().apply({"params": v["params"]["RMSNorm_0"]}, x)]
        sizes = [variables["params"]["LayerNorm_0"], variables["params"]["RMSNorm_0"]]
        args = variables
    else:
        model = _Norms(nnx.Rngs(0))
        g = extract(model, jax.ShapeDtypeStruct(x.shape, x.dtype))
        gd, st = nnx.split(model)
        subs = [lambda s, x: nnx.merge(gd, s).ln(x), lambda s, x: nnx.merge(gd, s).rms(x)]
        sizes = [nnx.state(model.ln, nnx.Param), nnx.state(model.rms, nnx.Param)]
        args = st
    assert g.kind_names[:2] == ("norm", "norm")
    a = g.unpadded()
    for i in range(2):
        assert a.params[i] == sum(v.size for v in jax.tree.leaves(sizes[i]))  # Flax's own parameters
        assert a.flops_fwd[i] * 8 == _xla_flops(subs[i], args, x)  # XLA's count, per sample x batch 8


def test_a_norm_runs_data_spatial_or_replicated_never_split_by_channels():
    b = GraphBuilder("n", (32, 16))
    b.norm("ln", b.dense("fc", b.input, 32))
    g = b.build()
    mask = np.asarray(strategy_mask(g.arrays, 16.0, 2.0, 4.0))[1]
    assert mask[Strategy.DATA] and mask[Strategy.SPATIAL] and mask[Strategy.REPLICATED]
    assert not mask[Strategy.FILTER] and not mask[Strategy.CHANNEL]
    assert "statistics" in unavailable_reason(g, 1, "filter", 16, 2, 4)
    assert "conv or dense" in unavailable_reason(g, 1, "channel", 16, 2, 4)


def test_patches_become_tokens():
    b = GraphBuilder("t", (3, 8, 8))
    t = b.tokens("reshape", b.conv("patch", b.input, 16, 4, stride=4))
    assert b.shape(t) == (16, (4,))  # 2 x 2 patches of 16 channels: 4 tokens
    a = b.build().unpadded()
    assert a.kind[1] == LayerKind.FLATTEN and a.flops_fwd[1] == 0 and a.params[1] == 0


class _Tokens(nnx.Module):
    """16x16 images -> 4x4 patches -> 16 tokens -> dense -> LayerNorm -> mean -> classes."""

    def __init__(self, rngs):
        self.patch = nnx.Conv(3, 16, (4, 4), strides=(4, 4), rngs=rngs)
        self.fc1 = nnx.Linear(16, 32, rngs=rngs)
        self.ln = nnx.LayerNorm(32, rngs=rngs)
        self.fc2 = nnx.Linear(32, 10, rngs=rngs)

    def __call__(self, x):
        x = self.patch(x)
        x = x.reshape(x.shape[0], -1, x.shape[-1])
        return self.fc2(self.ln(nnx.relu(self.fc1(x))).mean(axis=1))


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["data", "spatial"])
def test_a_model_with_a_norm_trains_sharded_with_the_unsharded_loss(devices, strategy):
    import planner
    from planner.runtime.validation import fixed_plan, validate

    model = _Tokens(nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (16, 16, 16, 3))  # 16 images: 16 tokens each
    y = jnp.arange(16) % 10
    spec = jax.ShapeDtypeStruct(x.shape, x.dtype)
    g = extract(model, spec)  # every layer mapped: no on_unsupported needed
    assert g.kind_names[:3] == ("conv2d", "flatten", "dense") and g.on_unsupported == "error"
    assert g.unpadded().out_spatial[1][0] == 16
    plan = fixed_plan(model, spec, (2, 4), strategies={"ln": strategy}, batch=16)
    assert plan.strategies["ln"] == strategy
    want = optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()
    step, state = planner.shard(model, plan, optax.sgd(0.1))
    _, loss = step(state, x, y)
    assert float(loss) == pytest.approx(float(want), rel=1e-5)
    report = validate(model, plan, memory_rtol=0.5)
    assert all(r.ok for r in report.collectives), [r for r in report.collectives if not r.ok]


@pytest.mark.slow
def test_parametric_graphs_cost_norms_as_the_builder_does():
    """A norm after a widened dense layer is costed at its new width, not as
    nothing: the parametric arrays at width 2 are the builder's at 64."""
    from planner.automl.parametric import ArchParams, parametric_graph

    def build(width):
        b = GraphBuilder("n", (32, 16))
        b.dense("head", b.norm("ln", b.dense("fc", b.input, width)), 10)
        return b.build()

    got = parametric_graph(build(32), {"fc": 0})(ArchParams(jnp.asarray([2.0]), jnp.float32(1.0), jnp.float32(8)))
    want = build(64).arrays
    for field in ("params", "flops_fwd", "flops_bwd_data", "flops_bwd_weight", "saved_elements"):
        np.testing.assert_allclose(np.asarray(getattr(got, field)), np.asarray(getattr(want, field)), rtol=1e-6)