"""Export to jax.sharding: parameters land with the planned shardings, and
one training step gives the same loss and parameters under every sharding
of the same model (sharded against sharded, no batch norm: jax-notes.md §2)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from planner import extract
from planner.runtime.export import (
    activation_spec,
    consumer_layouts,
    lower_training,
    make_mesh,
    param_spec,
    partition_specs,
    producer_layouts,
    scatter_layouts,
    shard_training,
)


class Tiny(nnx.Module):
    def __init__(self, rngs):
        self.convs = nnx.List([nnx.Conv(3, 8, (3, 3), rngs=rngs), nnx.Conv(8, 16, (3, 3), rngs=rngs)])
        self.fcs = nnx.List([nnx.Linear(16 * 4 * 4, 32, rngs=rngs), nnx.Linear(32, 16, rngs=rngs)])

    def __call__(self, x):
        for c in self.convs:
            x = nnx.max_pool(nnx.relu(c(x)), (2, 2), (2, 2))
        x = x.reshape(x.shape[0], -1)
        return self.fcs[1](nnx.relu(self.fcs[0](x)))


PLANS = {
    "data": ((8, 1), {}),
    "splitbrain": ((2, 4), {"fcs/0": "filter", "fcs/1": "filter"}),
    "megatron": ((2, 4), {"fcs/0": "filter", "fcs/1": "channel"}),
    "filter-convs": ((1, 8), {"convs/0": "filter", "convs/1": "filter"}),
    "spatial": ((2, 4), {"convs/0": "spatial", "convs/1": "spatial"}),
    "replicated": ((4, 2), {"convs/0": "replicated", "fcs/0": "replicated"}),
    # a channel conv: its partial sums reduce-scattered over the batch (relu_1 is data)
    "channel-conv": ((2, 4), {"convs/1": "channel"}),
    # ... over the channels (relu_1 filter) and over the rows (relu_1 spatial: 8 rows, 2 a device)
    "channel-to-filter": ((2, 4), {"convs/0": "filter", "relu": "filter", "max_pool": "filter",
                                   "convs/1": "channel", "relu_1": "filter"}),
    "channel-to-spatial": ((2, 4), {"convs/0": "filter", "relu": "filter", "max_pool": "filter",
                                    "convs/1": "channel", "relu_1": "spatial"}),
}
# ZeRO (costmodels/levers.py) on every layer: optimizer state (1), also gradients (2), also
# weights (3) sharded over each layer's data-parallel group (8 devices for data, 2 for filter)
# (stages 1 and 2, layer by layer through planner.shard: test_a_zero_plan_shards_trains_and_validates)
ZERO_PLANS = {
    "zero3-splitbrain": ((2, 4), {"fcs/0": "filter", "fcs/1": "filter"}, 3),
}


@pytest.fixture(scope="module")
def runs(devices):
    return _train(PLANS)


@pytest.fixture(scope="module")
def zero_runs(devices):
    return _train(ZERO_PLANS)


def _train(plans):
    """Two steps of each plan (mesh, strategies[, ZeRO stage of every layer]):
    {name: (state, losses, strategies)}; SGD, or Adam under ZeRO."""
    model = Tiny(nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (16, 16, 16, 3))
    y = jax.random.randint(jax.random.key(2), (16,), 0, 16)
    graph = extract(model, x)
    out = {}
    for name, (mesh_shape, strategies, *zero) in plans.items():
        stage = zero[0] if zero else 0
        full = {p: "data" for p in ("convs/0", "convs/1", "fcs/0", "fcs/1")} | strategies
        every = {n: "data" for n in graph.names} | strategies
        mesh = make_mesh(*mesh_shape)
        # pinned as planner.shard pins: module inputs to their producers' layouts,
        # module outputs read by functional ops to those ops' layouts
        step, state = shard_training(model, full, mesh, optax.adam(0.01) if stage else optax.sgd(0.1),
                                     input_layouts=producer_layouts(graph, every),
                                     output_layouts=consumer_layouts(graph, every),
                                     scatters=scatter_layouts(graph, every, mesh_shape[1]),
                                     zero_stages={p: stage for p in full} if stage else None)
        losses = []
        for _ in range(2):
            state, loss = step(state, x, y)
            losses.append(float(loss))
        out[name] = (state, losses, full)
    return out


@pytest.mark.slow
def test_every_sharding_trains_the_same(runs):
    ref_state, ref_losses, _ = runs["data"]
    ref = jax.tree.leaves(ref_state.params)
    for name, (state, losses, _) in runs.items():
        np.testing.assert_allclose(losses, ref_losses, rtol=2e-5, err_msg=name)
        for a, b in zip(jax.tree.leaves(state.params), ref, strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6, err_msg=name)


@pytest.mark.slow
def test_parameters_land_with_planned_shardings(runs):
    state, _, _ = runs["megatron"]
    p = state.params
    assert p["fcs"][0]["kernel"].sharding.spec == P(None, "model")
    assert p["fcs"][0]["bias"].sharding.spec == P("model")
    assert p["fcs"][1]["kernel"].sharding.spec == P("model", None)
    assert p["fcs"][1]["bias"].sharding.spec == P()
    assert p["convs"][0]["kernel"].sharding.spec == P()
    assert p["fcs"][0]["kernel"].addressable_shards[0].data.shape == (256, 8)
    state, _, _ = runs["filter-convs"]
    assert state.params["convs"][1]["kernel"].sharding.spec == P(None, None, None, "model")


@pytest.mark.slow
def test_zero_trains_the_same_and_shards_its_state(zero_runs):
    ref_losses, params = _adam_reference()  # the same Adam steps unsharded (one device's plain jit)
    for name in ZERO_PLANS:
        state, losses, _ = zero_runs[name]
        np.testing.assert_allclose(losses, ref_losses, rtol=2e-5, err_msg=name)
        for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(params), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6, err_msg=name)
    group = ("data", "model")
    mu = lambda st: st.opt_state[0].mu  # noqa: E731 (adam's first moment, shaped as the parameters)
    for name, kernel, opt_kernel, head_bias in (
            ("zero3-splitbrain", P(None, None, None, group), P(None, None, None, group), P(("model", "data"))),):
        state = zero_runs[name][0]
        assert state.params["convs"][1]["kernel"].sharding.spec == kernel, name
        assert mu(state)["convs"][1]["kernel"].sharding.spec == opt_kernel, name
        assert mu(state)["fcs"][1]["bias"].sharding.spec == head_bias, name
    state = zero_runs["zero3-splitbrain"][0]  # filter: the output features over model, then over data
    assert state.params["fcs"][0]["kernel"].sharding.spec == P(None, ("model", "data"))
    assert state.params["fcs"][0]["kernel"].addressable_shards[0].data.shape == (256, 4)
    assert state.params["convs"][0]["kernel"].addressable_shards[0].data.shape == (3, 3, 3, 1)


def test_zero_specs_by_hand():
    from planner.plans.specs import zero_group_axes, zero_spec_entries

    assert zero_spec_entries("data", 4) == (None, None, None, ("data", "model"))
    assert zero_spec_entries("spatial", 1) == (("data", "model"),)
    assert zero_spec_entries("filter", 2) == (None, ("model", "data"))
    assert zero_spec_entries("filter", 1) == (("model", "data"),)
    assert zero_spec_entries("channel", 2) == ("model", "data")
    assert zero_spec_entries("replicated", 4) == (None, None, None, "data")
    assert zero_spec_entries("data", 0) == ()
    assert zero_group_axes("filter") == ("data",) and zero_group_axes("data") == ("data", "model")
    from planner.plans.specs import shardings

    state = {"fc": {"kernel": jax.ShapeDtypeStruct((4, 3), jnp.float32)}}  # 3 outputs over 8 devices
    with pytest.raises(ValueError, match="'kernel' of layer 'fc' has a dimension of 3"):
        shardings(state, {"fc": "data"}, make_mesh(8, 1), frozenset({"fc"}))
    assert shardings(state, {"fc": "data"}, make_mesh(8, 1))["fc"]["kernel"].spec == P()  # without ZeRO: fine
    model = nnx.eval_shape(lambda: Tiny(nnx.Rngs(0)))
    with pytest.raises(ValueError, match="ZeRO stage"):
        shard_training(model, {"fcs/1": "data"}, make_mesh(8, 1), optax.sgd(0.1), zero_stages={"fcs/1": 4})
    with pytest.raises(ValueError, match="does not name"):
        shard_training(model, {"fcs/1": "data"}, make_mesh(8, 1), optax.sgd(0.1), zero_stages={"fcs/0": 1})


def test_specs_by_hand():
    assert param_spec("filter", 4) == P(None, None, None, "model")
    assert param_spec("channel", 2) == P("model", None)
    assert param_spec("channel", 1) == P() and param_spec("filter", 1) == P("model")
    assert param_spec("spatial", 4) == P() and param_spec("data", 2) == P()
    assert activation_spec("batch", 4) == P(("data", "model"))
    assert activation_spec("channel", 4) == P("data", None, None, "model")
    assert activation_spec("spatial", 4) == P("data", "model")
    assert activation_spec("partial", 2) is None
    with pytest.raises(ValueError, match="unknown strategy"):
        param_spec("diagonal", 2)


def test_partition_specs_follow_layer_paths():
    model = nnx.eval_shape(lambda: Tiny(nnx.Rngs(0)))
    params = nnx.state(model, nnx.Param)
    specs = partition_specs(params, {"fcs/0": "filter"})
    assert specs["fcs"][0]["kernel"] == P(None, "model")
    assert specs["convs"][0]["kernel"] == P()


def test_mesh_size_must_match_devices(devices):
    with pytest.raises(ValueError, match="needs 6 devices"):
        make_mesh(3, 2)


@pytest.mark.slow
def test_compiled_collectives_follow_the_plan(devices):
    from planner.runtime.hlo import parse_collectives

    model = Tiny(nnx.Rngs(0))
    x = jnp.zeros((16, 16, 16, 3))
    y = jnp.zeros((16,), jnp.int32)
    full = {"convs/0": "data", "convs/1": "data", "fcs/0": "filter", "fcs/1": "filter"}
    step, state = shard_training(model, full, make_mesh(2, 4), optax.sgd(0.1))
    colls = parse_collectives(step.lower(state, x, y).compile().as_text(), (2, 4), ("data", "model"))
    gathers = {(c.axes, c.bytes_per_device) for c in colls if c.kind == "all-gather"}
    # SplitBrain's L_M: the group's 8 samples x 256 features gathered over the model axis.
    assert (("model",), 8 * 256 * 4) in gathers
    # Only the FC shards' gradients are reduced over data alone: fcs/0 kernel + bias
    # (256 x 8 + 8) and fcs/1 (32 x 4 + 4), split 4 ways; conv gradients over both axes.
    grads = [c for c in colls if c.kind == "all-reduce" and c.axes == ("data",)]
    assert sum(c.bytes_per_device for c in grads) >= (256 * 8 + 8 + 32 * 4 + 4) * 4


@pytest.mark.slow
def test_shard_applies_a_plan_from_the_planner(devices):
    """planner.plan on the extracted model, then planner.shard trains it; a plan
    for another model is refused."""
    import planner

    model = Tiny(nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (16, 16, 16, 3))
    y = jax.random.randint(jax.random.key(2), (16,), 0, 16)
    graph = planner.extract(model, x)
    p = planner.plan(graph, devices=8, hardware="dgx-a100", batch=16, method="dp")
    assert p.graph_fingerprint == graph.fingerprint
    step, state = planner.shard(model, p, optax.sgd(0.1))
    ref_step, ref_state = shard_training(model, {}, make_mesh(8, 1), optax.sgd(0.1))
    _, loss = step(state, x, y)
    _, ref_loss = ref_step(ref_state, x, y)
    assert float(loss) == pytest.approx(float(ref_loss), rel=2e-5)
    specs = p.partition_specs(nnx.state(model, nnx.Param))
    for name, s in p.strategies.items():
        if name == "fcs/0":
            assert specs["fcs"][0]["kernel"] == param_spec(s, 2)
    other = planner.plan("vgg16-cifar10", devices=8, hardware="dgx-a100", batch=16, method="dp")
    with pytest.raises(ValueError, match="another model"):
        planner.shard(model, other, optax.sgd(0.1))


def test_consumer_layouts_by_hand():
    model = nnx.eval_shape(lambda: Tiny(nnx.Rngs(0)))
    g = extract(model, jax.ShapeDtypeStruct((16, 16, 16, 3), jnp.float32))
    s = {n: "data" for n in g.names} | {"convs/0": "filter", "relu": "filter", "max_pool": "filter",
                                         "convs/1": "channel"}
    cl = consumer_layouts(g, s)
    assert cl["convs/0"] == {"relu": "channel"}  # relu split by channels, as the filter conv leaves it
    assert cl["convs/1"] == {"relu_1": "batch"}  # the channel conv's partial sums reduce-scattered to relu_1's batch
    assert cl["fcs/0"] == {"relu_2": "batch"}
    assert "fcs/1" not in cl  # the model output: the loss decides


def test_scatter_layouts_by_hand():
    # The channel layers whose partial sums the export reduce-scatters: into their consumers' one split
    # layout, on a model axis that divides the split dim (convs/1: 16 channels, 8x8 maps).
    model = nnx.eval_shape(lambda: Tiny(nnx.Rngs(0)))
    g = extract(model, jax.ShapeDtypeStruct((16, 16, 16, 3), jnp.float32))
    base = {n: "data" for n in g.names} | {"convs/0": "filter", "relu": "filter", "max_pool": "filter",
                                            "convs/1": "channel"}
    assert scatter_layouts(g, base, 4) == {"convs/1": "batch"}  # relu_1 data: over the batch
    assert scatter_layouts(g, base | {"relu_1": "filter"}, 4) == {"convs/1": "channel"}
    assert scatter_layouts(g, base | {"relu_1": "spatial"}, 4) == {"convs/1": "spatial"}  # 8 rows, 2 a device
    assert scatter_layouts(g, base | {"relu_1": "spatial"}, 3) == {}  # 3 does not divide 8 rows: XLA pads
    assert scatter_layouts(g, base | {"relu_1": "filter"}, 3) == {}  # nor 16 channels
    assert scatter_layouts(g, base | {"relu_1": "replicated"}, 4) == {}  # an all-reduce
    assert scatter_layouts(g, base, 1) == {}  # no model axis, no partial sums
    # fcs/1 (channel) feeds the loss, which gathers it: left to XLA
    assert scatter_layouts(g, base | {"fcs/1": "channel"}, 4) == {"convs/1": "batch"}
    # a channel layer at ZeRO stage 3 gathers its weights in its own call: left to XLA
    assert scatter_layouts(g, base, 4, {"convs/1": 3}) == {}
    assert scatter_layouts(g, base, 4, {"convs/1": 2}) == {"convs/1": "batch"}
    with pytest.raises(ValueError, match="which ZeRO stage 3 shards"):
        shard_training(Tiny(nnx.Rngs(0)), base, make_mesh(2, 4), optax.sgd(0.1), zero_stages={"convs/1": 3},
                       scatters={"convs/1": "batch"})
    with pytest.raises(ValueError, match="only channel layers"):
        shard_training(Tiny(nnx.Rngs(0)), {"convs/1": "filter"}, make_mesh(2, 4), optax.sgd(0.1),
                       scatters={"convs/1": "batch"})


def _adam_reference(steps: int = 2):
    """Tiny's losses and weights after ``steps`` Adam steps on one device (plain jit)."""
    model = Tiny(nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (16, 16, 16, 3))
    y = jax.random.randint(jax.random.key(2), (16,), 0, 16)
    graphdef, params = nnx.split(model, nnx.Param)
    tx = optax.adam(0.01)
    opt = tx.init(params)
    losses = []
    for _ in range(steps):
        def loss_of(p):
            logits = nnx.merge(graphdef, p)(x)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        loss, g = jax.value_and_grad(loss_of)(params)
        updates, opt = tx.update(g, opt, params)
        params = optax.apply_updates(params, updates)
        losses.append(float(loss))
    return losses, params


def test_a_zero_plan_shards_trains_and_validates(devices):
    """A plan whose layers carry ZeRO stages 1-3 (planner.fixed_plan with
    ``strategy+zeroN`` options): planner.shard trains it with unsharded Adam's
    losses and weights, its state sharded as the stages say, and validate
    finds XLA's parameter and optimizer bytes exact and every collective,
    the reduce-scatters (compiled as reduce-scatters: the export issues them)
    and weight all-gathers included, within 5%."""
    import planner
    from planner.runtime.validation import fixed_plan

    model = Tiny(nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (16, 16, 16, 3))
    y = jax.random.randint(jax.random.key(2), (16,), 0, 16)
    plan = fixed_plan(model, x, (4, 2), batch=16, optimizer="adam",
                      strategies={"convs/1": "data+zero2", "fcs/0": "filter+zero1", "fcs/1": "data+zero3"})
    assert plan.zero_stages == {"convs/1": 2, "fcs/0": 1, "fcs/1": 3} and plan.levers == "zero"
    assert planner.Plan.from_json(plan.to_json()) == plan
    step, state = planner.shard(model, plan, optax.adam(0.01))
    losses = []
    for _ in range(2):
        state, loss = step(state, x, y)
        losses.append(float(loss))
    ref_losses, ref_params = _adam_reference()
    np.testing.assert_allclose(losses, ref_losses, rtol=2e-5)
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(ref_params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
    group = ("data", "model")
    mu = state.opt_state[0].mu
    assert state.params["fcs"][1]["kernel"].sharding.spec == P(None, group)  # stage 3: the weights themselves
    assert state.params["convs"][1]["kernel"].sharding.spec == P()  # stage 2: weights whole
    assert mu["convs"][1]["kernel"].sharding.spec == P(None, None, None, group)
    assert mu["fcs"][0]["kernel"].sharding.spec == P(None, ("model", "data"))  # filter: out channels, then data

    report = planner.validate(nnx.eval_shape(lambda: Tiny(nnx.Rngs(0))), plan)
    rows = {r.part: r for r in report.memory}
    for part in ("parameters", "optimizer state"):
        assert rows[part].ok and rows[part].predicted_bytes == rows[part].compiled_bytes, part
    kinds = {(c.kind, c.axes) for c in report.collectives}
    assert ("all-gather", ("data", "model")) in kinds  # the weights gathered (stages 2 and 3)
    # The stage-2 and -3 gradients are reduce-scattered by the export itself (psum_scatter), a
    # reduce-scatter on CPU too: convs/1 (3x3x8x16 + 16) and fcs/1 (32x16 + 16), an eighth each, 4 B
    rs = {(c.kind, c.axes): c for c in report.collectives}[("reduce-scatter", ("data", "model"))]
    assert rs.compiled_bytes == rs.predicted_bytes == (9 * 8 * 16 + 16 + 32 * 16 + 16) / 8 * 4
    assert rs.note == ""
    bad = [c for c in report.collectives if not c.ok]
    assert not bad, bad


def test_a_layer_recomputed_alone_outside_attention_is_a_run_of_one(devices):
    """shard_training's remat_layers recompute the attention of an
    nnx.MultiHeadAttention on the module; any other layer given there (here
    decoder-tiny's hand-written attentions) is recomputed as a run of one
    layer, cut from the traced step: the run holds the scores and the
    softmax (the lowered step computes each attention's exponential once
    more), and at the compiled step's peak neither block's attention
    probabilities nor XLA:CPU's transposed copy of them (for dV = P^T dO)
    are kept: 2 attentions x 2 x 4 heads x 64^2 tokens x 2 samples x 4 B per
    device (within 1%: XLA's buffer alignment)."""
    from planner.models.flax_zoo import flax_model

    model, _ = flax_model("decoder-tiny")
    x = jax.ShapeDtypeStruct((16, 64), jnp.int32)
    strategies = {n: "data" for n in extract(model, x).names}
    attention = [n for n in strategies if n.endswith("attn/attention")]

    def compiled(**kw):
        lowered, _ = lower_training(model, strategies, make_mesh(8, 1), optax.adam(0.01), x, **kw)
        return lowered.as_text().count("stablehlo.exponential"), lowered.compile().memory_analysis().temp_size_in_bytes

    assert len(attention) == 2
    (kept_exp, kept_temp), (again_exp, again_temp) = compiled(), compiled(remat_layers=attention)
    assert again_exp == kept_exp + 2
    assert kept_temp - again_temp >= 0.99 * 2 * 2 * 4 * 64 * 64 * 2 * 4


@pytest.mark.slow
def test_zero3_batch_norm_updates_its_statistics(devices):
    """A batch norm at ZeRO stage 3 gathers its sharded scale and bias on the
    module itself (planner.runtime.calls.gathering): it trains like the unsharded step and
    its running statistics are updated as there (not lost in a copy of the
    module), while a stage-3 conv beside it regathers and reduce-scatters."""
    from builders import TinyCNN

    model = TinyCNN(nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (16, 16, 16, 3))
    y = jax.random.randint(jax.random.key(2), (16,), 0, 16)
    graph = extract(model, x)
    every = {n: "data" for n in graph.names}
    pins = {"input_layouts": producer_layouts(graph, every), "output_layouts": consumer_layouts(graph, every)}
    runs = {}
    for label, zero in (("plain", None), ("zero3", {"bn": 3, "convs/1": 3})):
        step, state = shard_training(model, every, make_mesh(8, 1), optax.adam(0.01), zero_stages=zero, **pins)
        losses = []
        for _ in range(2):
            state, loss = step(state, x, y)
            losses.append(float(loss))
        runs[label] = (state, losses)
    (ref, ref_losses), (got, losses) = runs["plain"], runs["zero3"]
    np.testing.assert_allclose(losses, ref_losses, rtol=2e-5)
    for a, b in zip(jax.tree.leaves(got.params), jax.tree.leaves(ref.params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
    stats, ref_stats = jax.tree.leaves(got.other), jax.tree.leaves(ref.other)
    assert stats and not all(np.allclose(np.asarray(s), 0.0) for s in stats)
    for a, b in zip(stats, ref_stats, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    assert got.params["bn"]["scale"].sharding.spec == P(("data", "model"))


class _Attention(nnx.Module):
    """Tokens through an embedding, one nnx.MultiHeadAttention and a classifier."""

    def __init__(self, rngs):
        self.embed = nnx.Embed(32, 16, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(num_heads=2, in_features=16, decode=False, rngs=rngs)
        self.head = nnx.Linear(16, 8, rngs=rngs)

    def __call__(self, x):
        h = self.embed(x)
        return self.head(self.attn(h).mean(axis=1))


def test_zero_shards_the_projections_of_a_multi_head_attention(devices):
    """ZeRO on an nnx.MultiHeadAttention's fused layers (``attn/qkv``,
    ``attn/out``) shards its query, key, value and output kernels along their
    last axis (head_dim, output features) over the data-parallel group, as it
    shards a plain kernel's output channels: by hand, (16, 2, 8) -> P(None,
    None, (data, model)) and (2, 8, 16) -> P(None, None, (data, model)); and
    the step trains like the unsharded one."""
    from planner.plans.specs import partition_specs

    model = _Attention(nnx.Rngs(0))
    x = jax.random.randint(jax.random.key(1), (16, 8), 0, 32)
    y = jax.random.randint(jax.random.key(2), (16,), 0, 8)
    every = {n: "data" for n in extract(model, x).names}
    zero = {"attn/qkv": 3, "attn/out": 3}
    specs = partition_specs(nnx.state(model, nnx.Param), every, frozenset(zero))
    assert specs["attn"]["query"]["kernel"] == P(None, None, ("data", "model"))
    assert specs["attn"]["out"]["kernel"] == P(None, None, ("data", "model"))
    runs = {}
    for label, stages in (("plain", None), ("zero3", zero)):
        step, state = shard_training(_Attention(nnx.Rngs(0)), every, make_mesh(8, 1), optax.sgd(0.1),
                                     zero_stages=stages)
        losses = []
        for _ in range(3):
            state, loss = step(state, x, y)
            losses.append(float(loss))
        runs[label] = losses, state
    (losses, got), (ref_losses, ref) = runs["zero3"], runs["plain"]
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(got.params), jax.tree.leaves(ref.params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
    assert got.params["attn"]["query"]["kernel"].sharding.spec == P(None, None, ("data", "model"))
