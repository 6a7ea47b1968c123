"""Transformers written the way people write them (tests/user_models.py),
end to end on 8 CPU devices: extracted with every parameter, planned under a
limit that forces model parallelism, validated against what XLA compiles,
and trained three steps under planner.shard with the unsharded model's
losses."""

import math

import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx

import planner
import user_models

BATCH = 8


def _model_parameters(model) -> int:
    """The oracle for the graph's count: the sum over the model's parameter leaves."""
    return sum(math.prod(v.shape) for v in jax.tree.leaves(nnx.state(model, nnx.Param)))


def _unsharded_losses(model, x, y, steps: int, lr: float) -> list[float]:
    """SGD on one device, by hand: the reference the sharded step must equal."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(p):
        logits = nnx.merge(graphdef, p, rest)(x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    out = []
    for _ in range(steps):
        value, grads = jax.value_and_grad(loss)(params)
        params = jax.tree.map(lambda p, g: p - lr * g, params, grads)
        out.append(float(value))
    return out


def test_a_llama_extracts_every_parameter_and_its_idioms():
    model, spec = user_models.llama(batch=2)
    g = planner.extract(model, spec)
    assert g.on_unsupported == "error"  # every operation mapped
    assert g.total("params") == _model_parameters(model)
    kinds = dict(zip(g.names, g.kind_names, strict=True))
    assert kinds["layers/0/attention/attention"] == "causal_attention"
    a = g.arrays
    i = g.names.index("layers/0/attention/attention")
    # 8 query heads over 2 key-value heads of 16 channels: wq, wk and wv read as one input
    assert (int(a.in_channels[i]), int(a.out_channels[i]), int(a.groups[i])) == (128 + 2 * 32, 128, 8)
    producers = sorted(g.names[u] for u, v in g.edges if v == i)
    assert producers == ["layers/0/attention/rope", "layers/0/attention/rope_1", "layers/0/attention/wv"]
    # rotate_half's rotation as written: x cos, -x2, rotate_half(x) sin, the sum: 3.5 FLOPs per element
    r = g.names.index("layers/0/attention/rope")
    assert float(a.flops_fwd[r]) == 3.5 * 128 * 64
    # the whole forward pass against XLA's count of the module's own operations
    graphdef, state = nnx.split(model)
    ca = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x)).lower(state, spec).cost_analysis()
    xla = (ca[0] if isinstance(ca, list) else ca)["flops"]
    assert g.total("flops_fwd") * 2 == pytest.approx(xla, rel=0.005)


def _trained_losses(model, plan, x, y, steps: int, lr: float) -> list[float]:
    step, state = planner.shard(model, plan, optax.sgd(lr))
    out = []
    for _ in range(steps):
        state, loss = step(state, x, y)
        out.append(float(loss))
    return out


def _limited_plan(g, fraction: float, levers: str = "auto"):
    """The plan for 8 devices under ``fraction`` of the data-parallel plan's memory."""
    free = planner.plan(g, devices=8, hardware="dgx-a100", batch=BATCH, platform="cpu")
    assert free.mesh == (8, 1)  # unconstrained: data parallel
    limit = int(fraction * free.evaluation.memory_bytes_per_device)
    p = planner.plan(g, devices=8, hardware="dgx-a100", batch=BATCH, memory_limit=limit, platform="cpu",
                     levers=levers)
    assert p.mesh[1] > 1 and {"filter", "channel"} & set(p.strategies.values())  # model parallel
    return p


@pytest.mark.slow
def test_a_llama_plans_model_parallel_validates_and_trains_like_one_device(devices):
    # without levers (with them, ZeRO on every layer fits 0.6 of the data-parallel plan's memory)
    model, spec = user_models.llama(batch=BATCH)
    p = _limited_plan(planner.extract(model, spec), 0.7, levers="none")
    # a head split only where every device gets whole key-value heads (2 of them)
    assert p.strategies["layers/0/attention/attention"] != "filter" or 2 % p.mesh[1] == 0
    report = planner.validate(model, p)
    assert report.ok, [r for r in (*report.memory, *report.collectives) if not r.ok]
    x = jax.random.randint(jax.random.key(1), spec.shape, 0, 512)
    y = jax.random.randint(jax.random.key(2), spec.shape, 0, 512)
    assert _trained_losses(model, p, x, y, 3, 0.1) == pytest.approx(_unsharded_losses(model, x, y, 3, 0.1), rel=1e-5)


@pytest.mark.slow
def test_a_llama_under_megatron_splits_its_heads_and_trains_like_one_device(devices):
    """Column-parallel wq, wk, wv (one key-value head per device on a model
    axis of 2) and the attention on their heads, row-parallel wo; the MLP
    likewise: the three projections feed the attention without a
    conversion, the losses are the unsharded model's."""
    from planner.runtime.validation import fixed_plan

    model, spec = user_models.llama(batch=BATCH)
    g = planner.extract(model, spec)
    megatron = {"wq": "filter", "wk": "filter", "wv": "filter", "rope": "filter", "rope_1": "filter",
                "attention": "filter", "wo": "channel", "w1": "filter", "w3": "filter", "silu": "filter",
                "multiply": "filter", "w2": "channel"}
    strategies = {n: megatron[n.rpartition("/")[2]] for n in g.names if n.rpartition("/")[2] in megatron}
    p = fixed_plan(model, spec, (4, 2), strategies=strategies, batch=BATCH)
    assert {n: p.strategies[n] for n in strategies} == strategies  # none substituted
    i = g.names.index("layers/0/attention/attention")
    assert p.evaluation.layers[i].reshard_s == 0  # the resharding into it, over its three inputs
    report = planner.validate(model, p, memory_rtol=0.5, activation_rtol=0.6)
    assert all(r.ok for r in report.collectives), [r for r in report.collectives if not r.ok]
    x = jax.random.randint(jax.random.key(1), spec.shape, 0, 512)
    y = jax.random.randint(jax.random.key(2), spec.shape, 0, 512)
    assert _trained_losses(model, p, x, y, 3, 0.1) == pytest.approx(_unsharded_losses(model, x, y, 3, 0.1), rel=1e-5)


def test_nanogpt_extracts_every_parameter_and_its_idioms():
    """The fused c_attn cut by jnp.split into three parts read as the
    attention's queries, keys and values; the hand-written attention; the
    positions looked up at arange(T) (a table of 128 rows, 64 used) added to
    the tokens; the output tied to wte."""
    model, spec = user_models.nanogpt(batch=2)
    g = planner.extract(model, spec)
    assert g.on_unsupported == "error"
    assert g.total("params") == _model_parameters(model)
    kinds = dict(zip(g.names, g.kind_names, strict=True))
    assert (kinds["wpe"], kinds["h/0/attn/split"], kinds["h/0/attn/attention"]) == (
        "elementwise", "flatten", "causal_attention")
    a = g.arrays
    assert float(a.params[g.names.index("wpe")]) == 128 * 128
    assert float(a.params[g.names.index("wte/attend")]) == 0  # tied: the table is wte's
    i = g.names.index("h/0/attn/attention")
    assert sorted(g.names[u] for u, v in g.edges if v == i) == ["h/0/attn/split", "h/0/attn/split_1",
                                                                 "h/0/attn/split_2"]
    graphdef, state = nnx.split(model)
    ca = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x)).lower(state, spec).cost_analysis()
    xla = (ca[0] if isinstance(ca, list) else ca)["flops"]
    assert g.total("flops_fwd") * 2 == pytest.approx(xla, rel=0.005)


@pytest.mark.slow
def test_nanogpt_plans_model_parallel_and_trains_like_one_device(devices):
    model, spec = user_models.nanogpt(batch=BATCH)
    p = _limited_plan(planner.extract(model, spec), 0.8)
    report = planner.validate(model, p)
    # every row, the collectives of the positions' lookup (wpe(arange(T)): none beyond its table's gradient) among them
    assert report.ok, [r for r in (*report.memory, *report.collectives) if not r.ok]
    x = jax.random.randint(jax.random.key(1), spec.shape, 0, 512)
    y = jax.random.randint(jax.random.key(2), spec.shape, 0, 512)
    assert _trained_losses(model, p, x, y, 3, 0.1) == pytest.approx(_unsharded_losses(model, x, y, 3, 0.1), rel=1e-5)


@pytest.mark.slow
def test_nanogpt_at_its_tightest_limit_recomputes_its_attention_and_trains_like_one_device(devices):
    """The lightest plan recomputes attentions and GELUs (what recomputing
    a GELU frees is its tanh), each a run of its own cut from the traced
    step; the positions looked up at arange(T) belong to no layer of that
    cut (they are parameters until added to the tokens)."""
    model, spec = user_models.nanogpt(batch=BATCH)
    g = planner.extract(model, spec)
    kw = {"devices": 8, "hardware": "dgx-a100", "batch": BATCH, "platform": "cpu", "verify": False}
    with pytest.raises(planner.InfeasibleMemoryError) as e:
        planner.plan(g, memory_limit=1.0, **kw)
    p = planner.plan(g, memory_limit=e.value.required_bytes * 1.02, **kw)
    runs = p.recompute_runs
    assert any(r[0].endswith("attn/attention") for r in runs), runs
    assert all(len(r) == 1 and r[0].endswith(("attn/attention", "mlp/gelu")) for r in runs), runs
    x = jax.random.randint(jax.random.key(1), spec.shape, 0, 512)
    y = jax.random.randint(jax.random.key(2), spec.shape, 0, 512)
    assert _trained_losses(model, p, x, y, 3, 0.1) == pytest.approx(_unsharded_losses(model, x, y, 3, 0.1), rel=1e-5)


def test_a_parameter_no_layer_holds_is_an_error_naming_its_module():
    """A parameter used in a way the planner does not map is never dropped
    silently: the error names the module and the count."""

    class Biased(nnx.Module):
        def __init__(self, rngs):
            self.fc = nnx.Linear(8, 8, rngs=rngs)
            self.shift = nnx.Linear(4, 8, rngs=rngs)

        def __call__(self, x):
            return self.fc(x) + self.shift(jnp.ones((1, 4)))  # a layer of constants: no activation flows in

    with pytest.raises(ValueError, match=r"holds 72 of the model's 112 parameters.*'shift' \(nnx.Linear, 40\)"):
        planner.extract(Biased(nnx.Rngs(0)), jax.ShapeDtypeStruct((2, 8), jnp.float32))


def _policy_losses(model, x, y, steps: int, lr: float, dtype) -> list[float]:
    """SGD by hand under the mixed-precision policy the cost model prices:
    fp32 master weights, the passes on a ``dtype`` copy, fp32 logits."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(low):
        logits = nnx.merge(graphdef, low, rest)(x).astype(jnp.float32)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    out = []
    for _ in range(steps):
        value, grads = jax.value_and_grad(loss)(jax.tree.map(lambda p: p.astype(dtype), params))
        params = jax.tree.map(lambda p, g: p - lr * g.astype(jnp.float32), params, grads)
        out.append(float(value))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("factory", ["llama", "nanogpt"])
def test_a_bfloat16_plan_trains_in_bfloat16_with_fp32_master_weights(devices, factory):
    """A bfloat16 plan (model parallel) trains as the policy it was costed
    for, not in float32: its losses are the bfloat16 policy's by hand, and
    further from float32's than that."""
    model, spec = getattr(user_models, factory)(batch=BATCH)
    g = planner.extract(model, spec)
    free = planner.plan(g, devices=8, hardware="dgx-a100", batch=BATCH, platform="cpu", dtype="bfloat16")
    p = planner.plan(g, devices=8, hardware="dgx-a100", batch=BATCH, platform="cpu", dtype="bfloat16",
                     memory_limit=int(0.6 * free.evaluation.memory_bytes_per_device))
    assert p.mesh[1] > 1
    x = jax.random.randint(jax.random.key(1), spec.shape, 0, 512)
    y = jax.random.randint(jax.random.key(2), spec.shape, 0, 512)
    step, state = planner.shard(model, p, optax.sgd(0.1))
    got = []
    for _ in range(3):
        state, loss = step(state, x, y)
        got.append(float(loss))
    assert {leaf.dtype for leaf in jax.tree.leaves(state.params)} == {jnp.dtype(jnp.float32)}  # master weights
    low = _policy_losses(model, x, y, 3, 0.1, jnp.bfloat16)
    high = _policy_losses(model, x, y, 3, 0.1, jnp.float32)
    assert got == pytest.approx(low, rel=1e-4)
    assert max(abs(a - b) for a, b in zip(got, high, strict=True)) > 10 * max(
        abs(a - b) for a, b in zip(got, low, strict=True))


def test_validate_refuses_a_bfloat16_plan_on_xla_cpu_and_says_why(devices):
    model, spec = user_models.llama(batch=BATCH)
    p = planner.plan(planner.extract(model, spec), devices=8, hardware="dgx-a100", batch=BATCH, dtype="bfloat16")
    with pytest.raises(ValueError, match="XLA:CPU computes bfloat16 in float32"):
        planner.validate(model, p)
