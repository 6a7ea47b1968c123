"""Linen models end to end on 8 CPU devices (tests/user_models.py's
``LinenCNN``): extracted with every parameter, planned under a limit that
forces model parallelism, validated against what XLA compiles, trained
three steps under planner.shard with the unsharded model's losses, and
their variables dicts laid out by Plan.partition_specs."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
import pytest
from jax.sharding import PartitionSpec as P

import planner
import user_models
from planner.runtime.linen import as_nnx

BATCH = 8


def _unsharded_losses(model, variables, x, y, steps: int, lr: float) -> list[float]:
    """SGD with batch statistics on one device, by hand: the reference."""

    def loss(params, stats):
        logits, upd = model.apply({"params": params, "batch_stats": stats}, x, train=True, mutable=["batch_stats"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), upd["batch_stats"]

    params, stats, out = variables["params"], variables["batch_stats"], []
    for _ in range(steps):
        (value, stats), grads = jax.value_and_grad(loss, has_aux=True)(params, stats)
        params = jax.tree.map(lambda p, g: p - lr * g, params, grads)
        out.append(float(value))
    return out


@pytest.mark.slow
def test_a_linen_cnn_plans_model_parallel_validates_and_trains_like_one_device(devices):
    model, spec = user_models.linen_cnn(BATCH)
    g = planner.extract(model, spec)
    variables = model.init(jax.random.key(0), jnp.zeros(spec.shape), train=True)
    assert g.total("params") == sum(v.size for v in jax.tree.leaves(variables["params"]))
    free = planner.plan(g, devices=8, hardware="dgx-a100", batch=BATCH, platform="cpu")
    limit = int(0.6 * free.evaluation.memory_bytes_per_device)
    p = planner.plan(g, devices=8, hardware="dgx-a100", batch=BATCH, memory_limit=limit, platform="cpu")
    assert p.mesh[1] > 1 and p.strategies["Dense_0"] == "filter"  # the wide classifier split
    report = planner.validate(model, p)
    assert report.ok, [r for r in (*report.memory, *report.collectives) if not r.ok]
    specs = p.partition_specs(variables)
    assert specs["params"]["Dense_0"] == {"kernel": P(None, "model"), "bias": P("model")}
    assert specs["batch_stats"]["BatchNorm_0"] == {"mean": P(), "var": P()}
    x = jax.random.normal(jax.random.key(1), spec.shape)
    y = jnp.arange(BATCH) % 10
    step, state = planner.shard(model, p, optax.sgd(0.1), variables=variables)
    got = []
    for _ in range(3):
        state, loss = step(state, x, y)
        got.append(float(loss))
    assert got == pytest.approx(_unsharded_losses(model, variables, x, y, 3, 0.1), rel=1e-5)


class _Dropped(nn.Module):
    @nn.compact
    def __call__(self, x, deterministic: bool = True):
        return nn.Dense(4)(nn.Dropout(0.5, deterministic=deterministic)(nn.Dense(8)(x)))


def test_the_bridge_keeps_random_state_only_where_training_draws_from_it():
    x = jax.ShapeDtypeStruct((2, 3), jnp.float32)
    assert as_nnx(_Dropped(), x, abstract=True).to_nnx__rngs is not None  # dropout in training
    assert as_nnx(user_models.LinenCNN(), jax.ShapeDtypeStruct((2, 16, 16, 3), jnp.float32),
                  abstract=True).to_nnx__rngs is None
    with pytest.raises(ValueError, match="'params' collection"):
        as_nnx(_Dropped(), x, {"weights": {}})


@pytest.mark.slow
def test_a_linen_gpt_extracts_plans_model_parallel_and_trains_like_one_device(devices):
    """nn.MultiHeadDotProductAttention under nn.make_causal_mask becomes the
    fused projection, a causal attention and its output projection (as
    nnx.MultiHeadAttention does); the positions the root module owns
    (self.param, sliced to the sequence) a position layer of their own."""
    model, spec = user_models.linen_gpt(BATCH)
    g = planner.extract(model, spec)
    variables = model.init(jax.random.key(0), jnp.zeros(spec.shape, jnp.int32))
    assert g.on_unsupported == "error"
    assert g.total("params") == sum(v.size for v in jax.tree.leaves(variables["params"]))
    kinds = dict(zip(g.names, g.kind_names, strict=True))
    mha = "LinenBlock_0/MultiHeadDotProductAttention_0"
    assert (kinds["pos_embedding"], kinds[f"{mha}/qkv"], kinds[f"{mha}/attention"]) == (
        "elementwise", "dense", "causal_attention")
    assert float(g.arrays.params[g.names.index("pos_embedding")]) == 128 * 128  # the whole table
    # levers="none": the linen export applies no ZeRO or recomputation (planner.runtime.linen)
    free = planner.plan(g, devices=8, hardware="dgx-a100", batch=BATCH, platform="cpu", levers="none")
    limit = int(0.7 * free.evaluation.memory_bytes_per_device)
    p = planner.plan(g, devices=8, hardware="dgx-a100", batch=BATCH, memory_limit=limit, platform="cpu",
                     levers="none")
    assert p.mesh[1] > 1 and p.strategies[f"{mha}/attention"] == "filter"  # its heads split
    specs = p.partition_specs(variables)["params"]["LinenBlock_0"]["MultiHeadDotProductAttention_0"]
    assert specs["query"]["kernel"] == P(None, "model", None)  # (features, heads, head_dim): by heads
    report = planner.validate(model, p)
    assert report.ok, report.to_dict()
    # the query, key and value projections' input gradients added on each device and reduced once over
    # model, as the fused layer counts them (planner.runtime.calls.fanned_out); the channel layers' partial
    # sums reduced as XLA:CPU chooses for a linen model (an all-reduce and a slice). Gathered over model:
    # the inputs of the fused projections and of the Dense_0s (filter, from data) and the output gradients
    # of the four channel layers (each block's out and Dense_1), 8 gathers of (4, 64, 128) float32; the
    # token ids for the filter embedding; and the positions' gradient, of the 64 rows of 128 read (the
    # table is sliced to the sequence), which XLA reduces over data split by features, as it reads the
    # embedding's output (collective_rows._split_over_model). Reduced over model: those four channel
    # layers' partial sums and the two blocks' fused and Dense_0 input gradients, 8 of that size
    assert p.strategies["Embed_0"] == "filter" and p.strategies["pos_embedding"] == "data"
    channel = [n for n, s in p.strategies.items() if s == "channel"]
    assert sorted(channel) == sorted(f"LinenBlock_{b}/{layer}" for b in (0, 1)
                                     for layer in ("MultiHeadDotProductAttention_0/out", "Dense_1"))
    rows = {(r.kind, r.axes): r for r in report.collectives}
    ag, ar = rows[("all-gather", ("model",))], rows[("all-reduce", ("model",))]
    assert ag.predicted_bytes == ag.compiled_bytes == 8 * 4 * 64 * 128 * 4 + 4 * 64 * 4 + 64 * 128 * 4
    assert "32,768 B" in ag.note  # the positions' gradient: 64 x 128 float32
    assert ar.predicted_bytes == ar.compiled_bytes == 8 * 4 * 64 * 128 * 4
    assert ("reduce-scatter", ("model",)) not in rows
    x = jax.random.randint(jax.random.key(1), spec.shape, 0, 512)
    y = jax.random.randint(jax.random.key(2), spec.shape, 0, 512)

    def loss(params):
        return optax.softmax_cross_entropy_with_integer_labels(model.apply({"params": params}, x), y).mean()

    params, want = variables["params"], []
    for _ in range(3):
        value, grads = jax.value_and_grad(loss)(params)
        params = jax.tree.map(lambda a, b: a - 0.1 * b, params, grads)
        want.append(float(value))
    step, state = planner.shard(model, p, optax.sgd(0.1), variables=variables)
    got = []
    for _ in range(3):
        state, value = step(state, x, y)
        got.append(float(value))
    assert got == pytest.approx(want, rel=1e-5)


def _policy_losses(model, variables, x, y, steps: int, lr: float, dtype) -> list[float]:
    """SGD by hand under the mixed-precision policy the cost model prices:
    fp32 master weights, the passes on a ``dtype`` copy of the weights and
    of float inputs, batch statistics kept in fp32, fp32 logits."""
    stats = variables.get("batch_stats")
    x = x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x

    def loss(low, stats):
        if stats is None:
            return optax.softmax_cross_entropy_with_integer_labels(
                model.apply({"params": low}, x).astype(jnp.float32), y).mean(), None
        logits, upd = model.apply({"params": low, "batch_stats": stats}, x, train=True, mutable=["batch_stats"])
        return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), y).mean(), \
            upd["batch_stats"]

    params, out = variables["params"], []
    for _ in range(steps):
        (value, stats), grads = jax.value_and_grad(loss, has_aux=True)(
            jax.tree.map(lambda p: p.astype(dtype), params), stats)
        params = jax.tree.map(lambda p, g: p - lr * g.astype(jnp.float32), params, grads)
        out.append(float(value))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("factory", ["linen_cnn", "linen_gpt"])
def test_a_bfloat16_plan_of_a_linen_model_trains_in_bfloat16(devices, factory):
    """A linen model's bfloat16 plan (model parallel) trains as the policy it
    was costed for: the bfloat16 policy's losses by hand, closer to them than
    to float32's, with fp32 master weights (a small step, 0.02: at 0.1 the
    CNN's loss rises and amplifies rounding)."""
    model, spec = getattr(user_models, factory)(BATCH)
    g = planner.extract(model, spec)
    tokens = factory == "linen_gpt"
    example = jnp.zeros(spec.shape, jnp.int32 if tokens else jnp.float32)
    variables = model.init(jax.random.key(0), example) if tokens else \
        model.init(jax.random.key(0), example, train=True)
    free = planner.plan(g, devices=8, hardware="dgx-a100", batch=BATCH, platform="cpu", dtype="bfloat16")
    p = planner.plan(g, devices=8, hardware="dgx-a100", batch=BATCH, platform="cpu", dtype="bfloat16",
                     memory_limit=int(0.6 * free.evaluation.memory_bytes_per_device))
    assert p.mesh[1] > 1
    if tokens:
        x = jax.random.randint(jax.random.key(1), spec.shape, 0, 512)
        y = jax.random.randint(jax.random.key(2), spec.shape, 0, 512)
    else:
        x, y = jax.random.normal(jax.random.key(1), spec.shape), jnp.arange(BATCH) % 10
    step, state = planner.shard(model, p, optax.sgd(0.02), variables=variables)
    got = []
    for _ in range(3):
        state, loss = step(state, x, y)
        got.append(float(loss))
    assert {leaf.dtype for leaf in jax.tree.leaves(state.params)} == {jnp.dtype(jnp.float32)}  # master weights
    low = _policy_losses(model, variables, x, y, 3, 0.02, jnp.bfloat16)
    high = _policy_losses(model, variables, x, y, 3, 0.02, jnp.float32)
    # within bfloat16's unit roundoff (2^-8) of the policy's losses, and at least twice closer to them than to
    # float32's: batch norm's statistics and the sharded sums round in another order than on one device
    assert got == pytest.approx(low, rel=2.0**-8)
    assert max(abs(a - b) for a, b in zip(got, high, strict=True)) > 2 * max(
        abs(a - b) for a, b in zip(got, low, strict=True))
